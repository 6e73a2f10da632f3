//! The FUSE operations: one method per kernel request, and nothing else.
//!
//! Each finds the view it answers for (the caller's transaction, a private
//! node's owner, or a view's transaction; see the parent module), calls the
//! engine, and replies — through the cache gate for anything the kernel
//! may cache, and after the invalidation thread for anything that changed
//! pages it may hold.

use super::{dev_from_fuse, errno, fattr, is_private, kind, stamp, Fs, TxFs, TTL};
use crate::wire;
use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::SystemTime;
use txfs_engine::{FileKind, ObjId, SetAttr, TxId};

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(wire::BATCH_MAX);
        // mmap of direct-I/O files (module docs); kernels before 6.6 refuse
        // shared mappings instead.
        if config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_err() {
            tracing::warn!("kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: shared mappings will fail with ENODEV");
        }
        // A view always lists with attributes (`readdirplus`; not the
        // adaptive mode, which asks for them only at offset 0 and after a
        // lookup, while git lists a whole directory before it stats it).
        if self.view().is_some() {
            let plus = fuser::InitFlags::FUSE_DO_READDIRPLUS;
            if config.add_capabilities(plus).is_err() {
                tracing::debug!("kernel lacks READDIRPLUS: a view looks every listed name up");
            }
        }
        tracing::info!(backing = %self.backing.display(), "mounted");
        Ok(())
    }

    fn destroy(&mut self) {
        if let Some(tx) = self.view() {
            tracing::debug!(%tx, "transaction view unmounted");
            return;
        }
        tracing::info!("unmounting: checkpointing");
        if let Err(e) = self.engine.shutdown() {
            tracing::error!("final checkpoint failed: {e}");
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let Some(s) = self.shared_mount().filter(|_| is_private(ino)) else { return };
        let mut p = s.private.lock();
        let Some(n) = p.nlookup.get_mut(&ino) else { return };
        *n = n.saturating_sub(nlookup);
        if *n > 0 {
            return;
        }
        p.nlookup.remove(&ino);
        // Its transaction still live: it may look the file up again (and
        // gets the same id); `end_tx` drops it.
        let live = p.owner.get(&ino).is_some_and(|(t, _)| self.engine.is_live(*t));
        if !live {
            p.remove(ino);
            drop(p);
            s.paged.0.lock().remove(&ino);
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.attr_requests.fetch_add(1, Ordering::Relaxed);
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        match self.engine.lookup(tx, self.obj(parent), name) {
            Ok(a) => {
                let (node, fa) = self.entry_attr(tx, &a, parent);
                self.gate.reply(tx, node, ticket, |ttl| reply.node_entry(node, ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr_requests.fetch_add(1, Ordering::Relaxed);
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = match fh {
            Some(fh) => self.tx_fh(req, fh),
            None => self.tx_at(req, ino),
        };
        // NB: the client libraries open the mount root to send ABORT, and the
        // kernel asks for its attributes first: a doomed transaction must get
        // that far, so the root's attributes come from the committed state.
        let tx = match tx {
            Some(t) if ino.0 == 1 && self.engine.is_doomed(t) => None,
            tx => tx,
        };
        match self.engine.getattr(tx, self.obj(ino)) {
            Ok(a) => self.gate.reply(tx, ino, ticket, |ttl| reply.attr(ttl, &fattr(&a))),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Sent by access(2) and chdir(2) only on a mount without
    /// `default_permissions` (root's own mount, see `txfs mount --help`),
    /// whose callers are all root: root may do anything but execute
    /// something other than a directory that has no execute bit.
    fn access(&self, req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let tx = self.tx_at(req, ino).filter(|t| !(ino.0 == 1 && self.engine.is_doomed(*t)));
        match self.engine.getattr(tx, self.obj(ino)) {
            Ok(a) if mask.contains(fuser::AccessFlags::X_OK) && a.kind != FileKind::Dir && a.mode & 0o111 == 0 => {
                reply.error(Errno::EACCES)
            }
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Before changing: the new attributes may be cached only if the gate
        // stayed open (in a view: always; git's utime of every object it
        // finds again is otherwise followed by a GETATTR).
        let ticket = self.gate.ticket();
        let tx = match fh {
            Some(fh) => self.tx_fh(req, fh),
            None => self.tx_at(req, ino),
        };
        // A truncation or chown by a caller other than root: the kernel
        // already sent the mode without setuid, and without setgid if
        // group-execute is set; like ext4, setgid also goes when the caller
        // is not in the file's (old) group (see `kill_suidgid`).
        let mode = match size.is_some() || uid.is_some() || gid.is_some() {
            true if req.uid() != 0 => match self.engine.getattr(tx, self.obj(ino)) {
                Ok(a) if a.kind == FileKind::File => {
                    let given = mode.unwrap_or(a.mode) & 0o7777;
                    match sgid_kept(given) || in_group(req, a.gid) {
                        true => mode,
                        false => Some(given & !libc::S_ISGID),
                    }
                }
                Ok(_) => mode,
                Err(e) => return reply.error(errno(&e)),
            },
            _ => mode,
        };
        let set = SetAttr { mode, uid, gid, size, atime: atime.map(stamp), mtime: mtime.map(stamp) };
        match self.engine.setattr(tx, self.obj(ino), &set) {
            Ok(a) => {
                self.view_saw(tx, Some(self.obj(ino)));
                let inval = if size.is_some() { self.committed_now(tx, self.obj(ino)) } else { Vec::new() };
                let gate = self.gate.clone();
                self.after(inval, move || gate.reply(tx, ino, ticket, |ttl| reply.attr(ttl, &fattr(&a))))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.engine.readlink(self.tx_at(req, ino), self.obj(ino)) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `mknod(2)`, `mkfifo(3)` and `bind(2)` of a unix socket. The kernel
    /// has already refused what Linux refuses before any file system is
    /// asked (`vfs_mknod`: a directory EPERM, an unknown type EINVAL, a
    /// device by a caller without `CAP_MKNOD` EPERM — but anyone's 0:0
    /// whiteout): callers get exactly ext4's answers. The type checks are
    /// made again so that no request reaches the engine with a kind it
    /// does not make; the caller's capabilities are the kernel's to judge
    /// (a check of its uid here would refuse a non-root caller holding
    /// `CAP_MKNOD`, which ext4 lets make devices).
    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let kind = match mode & libc::S_IFMT {
            // Linux: a type of 0 is a regular file.
            0 => FileKind::File,
            libc::S_IFDIR => return reply.error(Errno::EPERM),
            t => match FileKind::from_mode(t) {
                FileKind::Symlink | FileKind::Other => return reply.error(Errno::EINVAL),
                k => k,
            },
        };
        let rdev = if kind.is_device() { dev_from_fuse(rdev) } else { 0 };
        let tx = self.tx(req);
        let mode = mode & !umask & 0o7777;
        let (p, uid, gid) = (self.obj(parent), req.uid(), req.gid());
        match self.engine.mknod(tx, p, name, kind, mode, rdev, uid, gid) {
            Ok(a) => {
                let (node, fa) = self.entry_attr(tx, &a, parent);
                self.view_saw(tx, None);
                self.gate.reply(tx, node, ticket, |ttl| reply.node_entry(node, ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        match self.engine.mkdir(tx, self.obj(parent), name, mode & !umask, req.uid(), req.gid()) {
            Ok(a) => {
                let (node, fa) = self.entry_attr(tx, &a, parent);
                self.view_saw(tx, None);
                self.gate.reply(tx, node, ticket, |ttl| reply.node_entry(node, ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let tx = self.tx(req);
        match self.engine.unlink(tx, self.obj(parent), name) {
            Ok(()) => {
                self.view_saw(tx, None);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let tx = self.tx(req);
        let Some(heal) = self.dir_change_may_proceed(tx, &[(parent, name)]) else {
            return reply.error(Errno::ESTALE);
        };
        match self.engine.rmdir(tx, self.obj(parent), name) {
            Ok(()) => {
                self.view_saw(tx, None);
                reply.ok();
                self.heal(heal)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        match self.engine.symlink(tx, self.obj(parent), link_name, target.as_os_str(), req.uid(), req.gid()) {
            Ok(a) => {
                let (node, fa) = self.entry_attr(tx, &a, parent);
                self.view_saw(tx, None);
                self.gate.reply(tx, node, ticket, |ttl| reply.node_entry(node, ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(fuser::RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let f = txfs_engine::RenameFlags {
            noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
        };
        let tx = self.tx(req);
        let names = [(parent, name), (newparent, newname)];
        let Some(heal) = self.dir_change_may_proceed(tx, &names) else {
            return reply.error(Errno::ESTALE);
        };
        match self.engine.rename(tx, self.obj(parent), name, self.obj(newparent), newname, f) {
            Ok(()) => {
                self.view_saw(tx, None);
                reply.ok();
                self.heal(heal)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        match self.engine.link(tx, self.obj(ino), self.obj(newparent), newname) {
            Ok(a) => {
                let (node, fa) = self.entry_attr(tx, &a, newparent);
                self.view_saw(tx, None);
                self.gate.reply(tx, node, ticket, |ttl| reply.node_entry(node, ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // A view's kernel opens files itself after this (no OPEN, RELEASE
        // or handle: file handle 0, pages kept): two round trips less per
        // open(2). What a handle did for it, `handle_of` does.
        if self.view().is_some() {
            return reply.error(Errno::ENOSYS);
        }
        let tx = self.tx_at(req, ino);
        if flags.0 & libc::O_TRUNC != 0 {
            if let Err(e) = self.engine.truncate(tx, self.obj(ino), 0) {
                return reply.error(errno(&e));
            }
        }
        let inval = if flags.0 & libc::O_TRUNC != 0 {
            self.view_saw(tx, Some(self.obj(ino)));
            self.committed_now(tx, self.obj(ino))
        } else {
            Vec::new()
        };
        match self.open_handle(self.obj(ino), tx, flags.0) {
            Ok((fh, fopen)) => self.after(inval, move || reply.opened(fh, fopen)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some((o, _, _)) = self.handle_of(ino, fh, 0) else {
            return reply.error(Errno::EBADF);
        };
        // The kernel names a lock owner on direct reads only; a read without
        // one fills the page cache of this node for a mapping. A private
        // node's pages are its transaction's; a shared node's pages are
        // everyone's, so they hold committed data — except for an object
        // the caller's transaction created, which nobody else can reach.
        let fault = lock_owner.is_none() && self.view().is_none();
        let tx = if !fault {
            self.tx_fh(req, fh)
        } else {
            if let Some(s) = self.shared_mount() {
                s.paged.add(ino);
            }
            match self.private_owner(ino) {
                Some(owner) => owner,
                None => self.tx_fh(req, fh).filter(|t| self.engine.created_by(*t, o)),
            }
        };
        match self.engine.read(tx, o, offset, size as usize) {
            Ok(d) => reply.data(&d),
            // A fault of a transaction that lost a conflict (this read
            // found it, or an earlier one): an error here is SIGBUS, which
            // kills a program that only had to abort. Its commit fails
            // whatever it reads now, so the fault gets committed bytes.
            // (A file the transaction created has no committed bytes: an
            // empty answer, which the kernel fills with zeros.)
            Err(e) if fault && tx.is_some() && e.is_conflict() => {
                match self.engine.read(None, o, offset, size as usize) {
                    Ok(d) => reply.data(&d),
                    Err(_) => reply.data(&[]),
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // Write-back of a shared writable mapping: the kernel sends it
        // without the writer's identity, from whichever handle it picks. A
        // private node's pages are its transaction's (also once dropped for
        // an abort: then they are dropped here too); a shared node's pages
        // of a file a live transaction created are that transaction's
        // (nobody else reaches it); any other is a plain write (module docs).
        // In a transaction view even a write-back is the transaction's.
        let write_back = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) && self.view().is_none();
        let tx = if write_back {
            if let Some(s) = self.shared_mount() {
                s.paged.add(ino);
                if s.private.lock().discard.contains(&ino) {
                    return reply.written(data.len() as u32);
                }
            }
            match self.private_owner(ino) {
                Some(owner) => owner,
                None => self.engine.creator_of(self.obj(ino)),
            }
        } else {
            self.tx_fh(req, fh)
        };
        let Some((o, append, batch)) = self.handle_of(ino, fh, _flags.0) else {
            return reply.error(Errno::EBADF);
        };
        let batch = batch && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        // The kernel asks to drop setuid/setgid (the caller lacks
        // CAP_FSETID): before the data, in the write's transaction, as
        // ext4's `file_remove_privs` does before it writes. A view's kernel
        // writes through its page cache and does not ask (it sent a SETATTR
        // for what its own rule drops, which leaves setgid without
        // group-execute to a caller outside the file's group): there a
        // caller other than root counts as asking.
        let kill =
            write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) || (self.view().is_some() && req.uid() != 0);
        if kill && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            if let Err(e) = self.kill_suidgid(req, tx, o) {
                return reply.error(errno(&e));
            }
        }
        // O_APPEND appends at the end of the file as this transaction sees it.
        // A write-back carries its offset (the kernel picks any writable
        // handle for it, maybe an O_APPEND one).
        let r = if batch {
            // Checked whole before anything is applied; then in order.
            // Only inside a transaction: outside one each record would be a
            // transaction of its own, and a batch could land half.
            if tx.is_none() {
                return reply.error(Errno::EINVAL);
            }
            match wire::parse_batch(data) {
                Some(writes) => writes
                    .into_iter()
                    .try_for_each(|(off, d)| self.engine.write(tx, o, off, d).map(|_| ()))
                    .map(|()| data.len()),
                None => return reply.error(Errno::EINVAL),
            }
        } else if append && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            self.engine.append(tx, o, data).map(|_| data.len())
        } else {
            self.engine.write(tx, o, offset, data)
        };
        // A write-back's data comes from the page cache: nothing to drop (and
        // dropping would wait for this very write-back).
        let inval =
            if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) { Vec::new() } else { self.committed_now(tx, o) };
        match r {
            Ok(n) => {
                self.view_saw(tx, Some(o));
                self.after(inval, move || reply.written(n as u32))
            }
            // The pages of a file an aborted transaction created.
            Err(txfs_engine::Error::Stale(_)) if write_back && tx.is_none() => reply.written(data.len() as u32),
            Err(e) => {
                // The program wrote these bytes long ago: a transaction that
                // cannot take them must not commit without them.
                if let Some(t) = tx.filter(|_| write_back) {
                    self.engine.doom(t, format!("write-back of a mapping of {o} failed: {e}"));
                }
                reply.error(errno(&e))
            }
        }
    }

    /// fallocate(2): the kernel forwards only the modes FUSE knows
    /// (keep-size, punch hole, zero range), after checking the mode, the
    /// range, that the descriptor is open for writing and that the file is
    /// regular; the engine answers the rest as ext4 does
    /// (`Engine::fallocate`). Never ENOSYS: the kernel would stop asking
    /// for good.
    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let tx = self.tx_fh(req, fh);
        let Some((o, _, _)) = self.handle_of(ino, fh, 0) else {
            return reply.error(Errno::EBADF);
        };
        if self.handles.lock().get(&fh).is_some_and(|h| !h.writable) {
            return reply.error(Errno::EBADF);
        }
        // ext4's `file_modified` drops setuid/setgid first, as a write's
        // `file_remove_privs` does. The kernel already sent a SETATTR
        // without setuid (and setgid with group-execute); setgid without
        // group-execute for a caller outside the file's group is left to
        // the daemon, as for a truncation (`kill_suidgid`).
        if req.uid() != 0 {
            if let Err(e) = self.kill_suidgid(req, tx, o) {
                return reply.error(errno(&e));
            }
        }
        match self.engine.fallocate(tx, o, mode, offset, length) {
            Ok(()) => {
                self.view_saw(tx, Some(o));
                let inval = self.committed_now(tx, o);
                self.after(inval, move || reply.ok())
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Nothing to do here (the kernel writes dirty pages back before it
        // asks); a view's kernel stops asking.
        if self.view().is_some() {
            return reply.error(Errno::ENOSYS);
        }
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(h) = self.handles.lock().remove(&fh) {
            self.engine.release(h.obj);
        }
        reply.ok();
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.engine.fsync(self.tx_fh(req, fh)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let tx = self.tx(req);
        let fh = self.new_fh();
        self.dirs.lock().insert(fh, (tx, None));
        reply.opened(fh, FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let (_, list) = match self.dir_listing(ino, fh, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let mut i = offset as usize;
        loop {
            let full = match i {
                0 => reply.add(ino, 1, FileType::Directory, "."),
                1 => reply.add(ino, 2, FileType::Directory, ".."),
                _ => match list.get(i - 2) {
                    Some(e) => reply.add(INodeNo(e.obj.0), i as u64 + 1, kind(e.kind), &e.name),
                    None => break,
                },
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    /// Asked for only by a transaction view's kernel (`init`): the listing
    /// with each entry's attributes, which the view may cache — so a program
    /// that lists a directory and then stats or opens every name in it (git
    /// add, find, rsync) costs no LOOKUP per name. Each entry the kernel
    /// links counts as a lookup of its node, like a LOOKUP reply.
    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let (tx, list) = match self.dir_listing(ino, fh, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let ticket = self.gate.ticket();
        let here = match self.engine.getattr(tx, self.obj(ino)) {
            Ok(a) => fattr(&a),
            Err(e) => return reply.error(errno(&e)),
        };
        let mut i = offset as usize;
        loop {
            // The kernel links no entry for "." and "..": their attributes
            // are only filler.
            let full = match i {
                0 => reply.add(ino, 1, ".", &TTL, &here, Generation(0)),
                1 => reply.add(ino, 2, "..", &TTL, &here, Generation(0)),
                _ => match list.get(i - 2) {
                    Some(e) => match self.engine.getattr(tx, e.obj) {
                        Ok(a) => {
                            let (node, fa) = self.entry_attr(tx, &a, ino);
                            self.gate.reply(tx, node, ticket, |ttl| {
                                reply.add(node, i as u64 + 1, &e.name, ttl, &fa, Generation(0))
                            })
                        }
                        // Gone since the listing was taken: left out (fuser
                        // takes the entry's node id and type from the
                        // attributes, so there is no "plain" entry to send).
                        Err(err) if matches!(err.errno(), libc::ENOENT | libc::ESTALE) => false,
                        Err(err) => return reply.error(errno(&err)),
                    },
                    None => break,
                },
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.lock().remove(&fh);
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.engine.fsync(self.tx(req)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = match std::ffi::CString::new(self.backing.as_os_str().as_bytes()) {
            Ok(c) => c,
            Err(_) => return reply.error(Errno::EIO),
        };
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string and `s` a valid out-pointer.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(Errno::from(std::io::Error::last_os_error()));
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            txfs_engine::NAME_MAX as u32,
            s.f_frsize as u32,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let create = flags & libc::XATTR_CREATE != 0;
        let replace = flags & libc::XATTR_REPLACE != 0;
        match self.engine.setxattr(self.tx_at(req, ino), self.obj(ino), name, Some(value), create, replace) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.engine.getxattr(self.tx_at(req, ino), self.obj(ino), name) {
            Ok(Some(v)) => {
                if size == 0 {
                    reply.size(v.len() as u32)
                } else if v.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&v)
                }
            }
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.engine.listxattr(self.tx_at(req, ino), self.obj(ino)) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(n.as_bytes());
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32)
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&buf)
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.engine.setxattr(self.tx_at(req, ino), self.obj(ino), name, None, false, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        let attr = match self.engine.create(tx, self.obj(parent), name, mode & !umask, req.uid(), req.gid()) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        match self.open_handle(attr.obj, tx, flags) {
            Ok((fh, fopen)) => {
                self.view_saw(tx, None);
                let (node, fa) = self.entry_attr(tx, &attr, parent);
                self.gate.reply(tx, node, ticket, |ttl| reply.node_created(node, ttl, &fa, Generation(0), fh, fopen))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd == wire::BATCH {
            // Makes the handle it is issued on a batch handle. Not in a view:
            // its handles are not direct I/O, so the kernel would keep the
            // batch's raw bytes as the file's pages.
            if self.view().is_some() {
                return reply.error(Errno::EINVAL);
            }
            return match self.handles.lock().get_mut(&_fh) {
                Some(h) if h.writable => {
                    h.batch = true;
                    reply.ioctl(0, &[])
                }
                Some(_) => reply.error(Errno::EBADF),
                None => reply.error(Errno::EINVAL),
            };
        }
        let me = super::caller(req);
        if let Some(nodes) = self.flush_before(me, cmd, in_data) {
            // The commit runs on the invalidation thread once the pages are
            // written back (a request thread would wait for write-backs that
            // need request threads).
            let (fs, data) = (self.0.clone(), in_data.to_vec());
            return self.after(nodes, move || match fs.ioctl_cmd(me, _ino, _fh, cmd, &data) {
                Ok((out, inval)) => fs.after(inval, move || reply.ioctl(0, &out)),
                Err(e) => reply.error(e),
            });
        }
        match self.ioctl_cmd(me, _ino, _fh, cmd, in_data) {
            Ok((out, inval)) => self.after(inval, move || reply.ioctl(0, &out)),
            Err(e) => reply.error(e),
        }
    }
}

/// Setuid and setgid: what a write or truncation by a caller without
/// CAP_FSETID leaves of them, as Linux's `setattr_should_drop_suidgid`
/// decides for ext4: setuid always goes; setgid goes when group-execute is
/// set (the file is a setgid program), or when the caller is not a member
/// of the file's group.
impl TxFs {
    /// Drops setuid/setgid of `o` as the kernel asked (`FUSE_WRITE_KILL_SUIDGID`),
    /// in `tx`: an aborted transaction leaves the bits as they were, and a
    /// plain write drops them in a one-operation transaction of its own just
    /// before its data (ext4 too changes the mode before it writes).
    ///
    /// Every write of a caller other than root asks. Inside a transaction
    /// the committed mode is looked at first, which enters no read set: a
    /// transaction's writes do not start to conflict with other commits'
    /// attribute changes. Only a file that has the bits committed, or that
    /// the transaction created, is read in the transaction (a file the
    /// transaction itself made setuid with chmod keeps the bit, as if the
    /// chmod came after the write).
    fn kill_suidgid(&self, req: &Request, tx: Option<TxId>, o: ObjId) -> txfs_engine::Result<()> {
        let sxid = |m: u32| m & (libc::S_ISUID | libc::S_ISGID) != 0;
        if let Some(t) = tx {
            let committed = self.engine.getattr(None, o).map(|a| sxid(a.mode)).unwrap_or(false);
            if !committed && !self.engine.created_by(t, o) {
                return Ok(());
            }
        }
        let a = self.engine.getattr(tx, o)?;
        let old = a.mode & 0o7777;
        if a.kind != FileKind::File || !sxid(old) {
            return Ok(());
        }
        let mut mode = old & !libc::S_ISUID;
        if old & libc::S_ISGID != 0 && (old & libc::S_IXGRP != 0 || !in_group(req, a.gid)) {
            mode &= !libc::S_ISGID;
        }
        if mode == old {
            return Ok(());
        }
        self.engine.setattr(tx, o, &SetAttr { mode: Some(mode), ..SetAttr::default() })?;
        // Committed at once: the kernel may hold the old mode for the
        // cache's TTL (a transaction's change is private, and while one is
        // live nothing is cached). Attributes only, so no folio lock is
        // taken and this may run on a request thread.
        if let (None, Some(n)) = (tx, self.shared_mount().and_then(|s| s.notifier.get())) {
            for ino in self.all_ids(vec![o]) {
                // ENOENT: the kernel has no inode for it, nothing to drop.
                let _ = n.inval_inode(ino, -1, 0);
            }
        }
        Ok(())
    }
}

/// Whether a truncation or chown leaves setgid of a file with `mode` as
/// the kernel sent it: no setgid, or the group-execute case (the kernel
/// dropped setuid, and setgid with group-execute, itself). The caller's
/// group membership decides the rest. The kernel asks nothing of a caller
/// with CAP_FSETID; a non-root one is taken for a caller without it.
fn sgid_kept(mode: u32) -> bool {
    mode & libc::S_ISGID == 0 || mode & libc::S_IXGRP != 0
}

/// Whether the request's caller is a member of group `gid`: its file-system
/// gid, or one of its supplementary groups (the `Groups:` line of its
/// thread's /proc status). Read only for a setgid file without
/// group-execute; a caller /proc cannot tell about counts as no member.
fn in_group(req: &Request, gid: u32) -> bool {
    if req.gid() == gid {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
}
