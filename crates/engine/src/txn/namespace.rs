//! Names: create (files, directories, symlinks, fifos, sockets, devices),
//! link, unlink, rename,
//! as changes to a transaction's delta. Nothing here touches the backing
//! tree (J1): the checkpoint applies the committed names.
//!
//! A name looked up, found or absent, is a read (I3): two transactions
//! that each find a name absent and create it conflict. Different names
//! in one directory do not: a directory's link count and times are not
//! validated (SPEC §3). Tests: `tests/isolation.rs`
//! (`name_found_absent_then_created_elsewhere`,
//! `creating_different_files_in_one_directory_is_no_conflict`,
//! `directories_moved_into_each_other_cannot_both_commit`), `tests/model.rs`.

use super::api::{Attr, RenameFlags, NAME_MAX};
use super::state::{State, Tx};

use crate::delta::{AttrDelta, FileDelta, NewObj};
use crate::error::{Error, Result};
use crate::ids::ObjId;
use crate::log::files::META_DIR;
use crate::storage::{FileKind, Timestamp};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

pub(crate) fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(Error::posix("name", format!("{name:?} is not a valid file name"), libc::EINVAL));
    }
    if b.len() > NAME_MAX {
        return Err(Error::posix("name", format!("{} bytes is longer than {NAME_MAX}", b.len()), libc::ENAMETOOLONG));
    }
    Ok(())
}

pub(super) fn reserved(parent: ObjId, name: &OsStr) -> bool {
    parent == ObjId::ROOT && name == META_DIR
}

impl State {
    // ----- mutations (into tx's delta) --------------------------------------

    pub(super) fn touch(tx: &mut Tx, o: ObjId, mtime: bool) {
        let now = Timestamp::now();
        let a = &mut tx.delta.obj(o).attr;
        a.ctime = Some(now);
        if mtime {
            a.mtime = Some(now);
        }
        // Every change of an object's content or attributes comes here.
        tx.recount(o);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn create(
        &mut self,
        tx: &mut Tx,
        parent: ObjId,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        owner: (u32, u32),
        target: Option<&OsStr>,
        rdev: u64,
    ) -> Result<Attr> {
        check_name(name)?;
        self.expect_live_dir(tx, parent)?;
        if reserved(parent, name) {
            return Err(Error::posix("create", format!("{META_DIR} is reserved for txfs"), libc::EPERM));
        }
        if self.lookup(tx, parent, name)?.is_some() {
            return Err(Error::posix("create", format!("{name:?} exists"), libc::EEXIST));
        }
        // The parent must still exist at commit: its metadata is stamped when
        // it is removed or moved, never by other names created in it (I3).
        self.read_meta(tx, parent)?;
        let pattr = self.attr_unrecorded(Some(tx), parent)?;
        let gid = if pattr.mode & libc::S_ISGID != 0 { pattr.gid } else { owner.1 };
        if !self.storage.may_own(owner.0, gid) {
            // The checkpoint could not give it that owner (issue 23).
            return Err(Error::posix("create", format!("{name:?} owned by {}:{gid}", owner.0), libc::EPERM));
        }
        let rdev = if kind.is_device() { rdev } else { 0 };
        if !self.storage.may_mknod(kind, rdev) {
            // The checkpoint could not make it (a daemon without CAP_MKNOD).
            return Err(Error::posix("mknod", format!("{name:?}: a device"), libc::EPERM));
        }
        let o = self.new_obj(kind);
        let (uid, mut gid) = owner;
        let mut mode = mode & 0o7777;
        if pattr.mode & libc::S_ISGID != 0 {
            gid = pattr.gid;
            if kind == FileKind::Dir {
                mode |= libc::S_ISGID;
            }
        }
        tx.delta.created.insert(o, NewObj { kind, target: target.map(|t| t.to_owned()), rdev });
        tx.charge_bytes(target.map_or(0, |t| t.len() as u64));
        tx.set_entry(parent, name, Some(o));
        let now = Timestamp::now();
        let od = tx.delta.obj(o);
        od.attr = AttrDelta {
            mode: Some(mode),
            uid: Some(uid),
            gid: Some(gid),
            atime: Some(now),
            mtime: Some(now),
            ctime: Some(now),
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            xattrs: Default::default(),
        };
        if kind == FileKind::File {
            od.file = Some(FileDelta::empty_new());
        }
        if kind == FileKind::Dir {
            tx.delta.obj(parent).attr.nlink += 1;
            tx.delta.parents.insert(o, parent);
        }
        Self::touch(tx, parent, true);
        self.attr_unrecorded(Some(tx), o)
    }

    pub(super) fn unlink_entry(&mut self, tx: &mut Tx, parent: ObjId, name: &OsStr, dir: bool) -> Result<()> {
        check_name(name)?;
        self.expect_dir(tx, parent)?;
        let o = self
            .lookup(tx, parent, name)?
            .ok_or_else(|| Error::posix(if dir { "rmdir" } else { "unlink" }, format!("{name:?}"), libc::ENOENT))?;
        let kind = self.node_kind(o)?;
        if dir {
            if kind != FileKind::Dir {
                return Err(Error::posix("rmdir", format!("{name:?}"), libc::ENOTDIR));
            }
            if !self.readdir(tx, o)?.is_empty() {
                return Err(Error::posix("rmdir", format!("{name:?}"), libc::ENOTEMPTY));
            }
        } else if kind == FileKind::Dir {
            return Err(Error::posix("unlink", format!("{name:?}"), libc::EISDIR));
        }
        self.drop_link(tx, parent, name, o, kind);
        Ok(())
    }

    /// Removes the entry `name -> o` from `parent` and adjusts link counts.
    fn drop_link(&mut self, tx: &mut Tx, parent: ObjId, name: &OsStr, o: ObjId, kind: FileKind) {
        tx.set_entry(parent, name, None);
        if kind == FileKind::Dir {
            tx.delta.obj(o).attr.nlink -= 2;
            tx.delta.obj(parent).attr.nlink -= 1;
        } else {
            tx.delta.obj(o).attr.nlink -= 1;
        }
        Self::touch(tx, o, false);
        Self::touch(tx, parent, true);
    }

    pub(super) fn rename(
        &mut self,
        tx: &mut Tx,
        from_dir: ObjId,
        from: &OsStr,
        to_dir: ObjId,
        to: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        check_name(from)?;
        check_name(to)?;
        self.expect_dir(tx, from_dir)?;
        self.expect_live_dir(tx, to_dir)?;
        if reserved(to_dir, to) || reserved(from_dir, from) {
            return Err(Error::posix("rename", format!("{META_DIR} is reserved for txfs"), libc::EPERM));
        }
        self.read_meta(tx, from_dir)?;
        self.read_meta(tx, to_dir)?;
        let src = self
            .lookup(tx, from_dir, from)?
            .ok_or_else(|| Error::posix("rename", format!("{from:?}"), libc::ENOENT))?;
        let dst = self.lookup(tx, to_dir, to)?;
        let skind = self.node_kind(src)?;
        if flags.noreplace && dst.is_some() {
            return Err(Error::posix("rename", format!("{to:?} exists"), libc::EEXIST));
        }
        if flags.exchange && dst.is_none() {
            return Err(Error::posix("rename", format!("{to:?}"), libc::ENOENT));
        }
        // A directory may not move into its own subtree.
        for (moving, kind, dest) in [(src, skind, to_dir), (dst.unwrap_or(src), skind, from_dir)] {
            if kind == FileKind::Dir || self.node_kind(moving)? == FileKind::Dir {
                let mut cur = Some(dest);
                let mut hops = 0;
                while let Some(c) = cur {
                    if c == moving {
                        return Err(Error::posix("rename", format!("{from:?} into its own subtree"), libc::EINVAL));
                    }
                    if c == ObjId::ROOT {
                        break;
                    }
                    if hops > super::state::MAX_DEPTH {
                        // Never let a rename through on a walk that did not end.
                        return Err(Error::posix("rename", format!("{from:?}: a cycle above {to:?}"), libc::ELOOP));
                    }
                    self.read_meta(tx, c)?;
                    cur = self.parent_of(tx, c);
                    hops += 1;
                }
            }
            if !flags.exchange {
                break;
            }
        }
        if dst == Some(src) {
            return Ok(());
        }
        if flags.exchange {
            let dst = dst.expect("checked");
            let dkind = self.node_kind(dst)?;
            tx.set_entry(from_dir, from, Some(dst));
            tx.set_entry(to_dir, to, Some(src));
            if from_dir != to_dir {
                for (o, k, newp, oldp) in [(src, skind, to_dir, from_dir), (dst, dkind, from_dir, to_dir)] {
                    if k == FileKind::Dir {
                        tx.delta.parents.insert(o, newp);
                        tx.delta.obj(newp).attr.nlink += 1;
                        tx.delta.obj(oldp).attr.nlink -= 1;
                    }
                }
            }
            for o in [src, dst, from_dir, to_dir] {
                Self::touch(tx, o, o == from_dir || o == to_dir);
            }
            return Ok(());
        }
        if let Some(d) = dst {
            let dkind = self.node_kind(d)?;
            match (skind == FileKind::Dir, dkind == FileKind::Dir) {
                (true, false) => {
                    return Err(Error::posix("rename", format!("{to:?} is not a directory"), libc::ENOTDIR))
                }
                (false, true) => return Err(Error::posix("rename", format!("{to:?} is a directory"), libc::EISDIR)),
                (true, true) if !self.readdir(tx, d)?.is_empty() => {
                    return Err(Error::posix("rename", format!("{to:?}"), libc::ENOTEMPTY));
                }
                _ => {}
            }
            self.drop_link(tx, to_dir, to, d, dkind);
        }
        tx.set_entry(from_dir, from, None);
        tx.set_entry(to_dir, to, Some(src));
        if skind == FileKind::Dir {
            tx.delta.parents.insert(src, to_dir);
            if from_dir != to_dir {
                tx.delta.obj(from_dir).attr.nlink -= 1;
                tx.delta.obj(to_dir).attr.nlink += 1;
            }
        }
        Self::touch(tx, src, false);
        Self::touch(tx, from_dir, true);
        Self::touch(tx, to_dir, true);
        Ok(())
    }
}
