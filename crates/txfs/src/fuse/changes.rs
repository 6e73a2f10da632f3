//! CHANGES: a live transaction's change set for `txfs diff`, `txfs run
//! --dry-run/--confirm`, `txfs_changes()` and `txfs.changes()`, a page at a
//! time ([`wire::Changes`]).
//!
//! A listing from offset 0 takes a snapshot of the change set
//! ([`Engine::changes`](txfs_engine::Engine::changes)) and keeps it, encoded,
//! until the next listing from 0 or the transaction's end; later pages and
//! the reads of a change's two sides ([`wire::CHANGES_OLD`],
//! [`wire::CHANGES_NEW`]) name the snapshot, so a reader never mixes two.
//! Nothing here records a read in the transaction: looking at it cannot
//! make it conflict.
//!
//! Who may look: the transaction's own threads and processes (`pid` 0),
//! and the `txfs run` that registered a tree (its pid; ENOENT for anyone
//! else). File contents are
//! answered only to a caller whose credentials may read the file by its
//! mode, on the side asked for.

use super::{errno, TxFs};
use crate::attribution::procfs;
use crate::attribution::txmap::{Caller, Claim};
use crate::wire;
use fuser::Errno;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use txfs_engine::{Attr, Change, FileKind, ObjId, TxId};

/// One snapshot of a change set: its records, and the objects on the two
/// sides of each change, by position.
struct Listing {
    snap: u32,
    /// [`Engine::changes_version`](txfs_engine::Engine::changes_version)
    /// when it was taken: a listing from 0 at the same version is this one
    /// again (repeated listings do not hold the engine lock each time).
    version: (u64, u64),
    bytes: Vec<u8>,
    sides: Vec<(Option<ObjId>, Option<ObjId>)>,
}

/// The latest listing of each live transaction.
#[derive(Default)]
pub struct Listings {
    map: Mutex<HashMap<TxId, Arc<Listing>>>,
    next: AtomicU32,
}

impl Listings {
    /// `tx` ended: its listing goes.
    pub fn forget(&self, tx: TxId) {
        self.map.lock().remove(&tx);
    }
}

/// A change as the wire carries it.
fn record(c: &Change) -> wire::ChangeRec {
    let mode = |a: &Option<Attr>| a.as_ref().map_or(0, |a| (a.mode & 0o7777) | a.kind.mode_bits());
    let bytes = |p: &Option<std::path::PathBuf>| p.as_ref().map_or(Vec::new(), |p| p.as_os_str().as_bytes().to_vec());
    let text = |s: &Option<std::ffi::OsString>| s.as_ref().map_or(Vec::new(), |s| s.as_bytes().to_vec());
    wire::ChangeRec {
        what: c.what,
        kind: c.kind.mode_bits(),
        old_mode: mode(&c.old),
        new_mode: mode(&c.new),
        old_uid: c.old.as_ref().map_or(0, |a| a.uid),
        old_gid: c.old.as_ref().map_or(0, |a| a.gid),
        new_uid: c.new.as_ref().map_or(0, |a| a.uid),
        new_gid: c.new.as_ref().map_or(0, |a| a.gid),
        old_size: c.old.as_ref().map_or(0, |a| a.size),
        new_size: c.new.as_ref().map_or(0, |a| a.size),
        bytes: c.bytes,
        files: c.files,
        dirs: c.dirs,
        path: c.path.as_os_str().as_bytes().to_vec(),
        from: bytes(&c.from),
        old_target: text(&c.old_target),
        target: text(&c.target),
        xattrs: c.xattrs.iter().map(|x| x.as_bytes().to_vec()).collect(),
    }
}

impl TxFs {
    /// The transaction CHANGES asks about: the caller's own (`pid` 0), or
    /// the `txfs run` tree of `pid`, if the caller is the live process that
    /// registered it.
    fn changes_tx(&self, me: Caller, pid: u32) -> Result<TxId, Errno> {
        if pid == 0 {
            if self.txs.claim(me) == Claim::Foreign {
                return Err(Errno::from_i32(libc::EPERM));
            }
            return self.tx_of(me).or_else(|| self.ancestors_tx(me)).ok_or(Errno::from_i32(libc::EINVAL));
        }
        if self.view().is_some() {
            return Err(Errno::from_i32(libc::EINVAL));
        }
        let caller = procfs::process_of(me.tid).ok_or(Errno::from_i32(libc::ESRCH))?;
        // ENOENT alike for no tree and another's: which pids are runs is
        // not the caller's to learn.
        let (tx, owner, owner_start, alive) = self.txs.tree(pid).ok_or(Errno::from_i32(libc::ENOENT))?;
        if !alive || owner != caller || procfs::start_time(caller) != Some(owner_start) {
            return Err(Errno::from_i32(libc::ENOENT));
        }
        Ok(tx)
    }

    /// For a caller in no transaction: the thread transaction of the
    /// nearest process above it that has exactly one, begun with the
    /// caller's credentials (or any, for root) — `txfs diff` run by a
    /// program from a thread inside `fs_tx_begin()` (`system`, `popen`,
    /// `subprocess`), which the thread's transaction does not include.
    /// Only listings: nothing else of the transaction is the child's.
    fn ancestors_tx(&self, me: Caller) -> Option<TxId> {
        let mut p = procfs::process_of(me.tid)?;
        for _ in 0..16 {
            p = procfs::parent_of(p).filter(|&q| q > 1)?;
            let mine: Vec<TxId> = self
                .txs
                .threads_of(p)
                .into_iter()
                .filter(|(_, c)| me.uid == 0 || *c == me.creds())
                .map(|(tx, _)| tx)
                .collect();
            match mine[..] {
                [tx] => return Some(tx),
                [] => continue,
                // Several threads in transactions: which one is not ours to guess.
                _ => return None,
            }
        }
        None
    }

    /// CHANGES's answer.
    pub(super) fn changes(&self, me: Caller, data: &[u8]) -> Result<Vec<u8>, Errno> {
        let req = wire::Changes::decode(data);
        let tx = self.changes_tx(me, req.pid)?;
        let listings = &self.listings;
        let cached = || {
            listings.map.lock().get(&tx).filter(|l| l.snap == req.snap).cloned().ok_or(Errno::from_i32(libc::ESTALE))
        };
        let mut out =
            wire::Changes { pid: req.pid, op: req.op, offset: req.offset, index: req.index, ..Default::default() };
        match req.op {
            wire::CHANGES_LIST => {
                let version = self.engine.changes_version(tx).map_err(|e| errno(&e))?;
                let same = || listings.map.lock().get(&tx).filter(|l| l.version == version).cloned();
                let l = if let Some(l) = same().filter(|_| req.offset == 0) {
                    l
                } else if req.offset == 0 {
                    let set = self.engine.changes(tx).map_err(|e| errno(&e))?;
                    let mut bytes = Vec::new();
                    for c in &set {
                        wire::encode_change(&record(c), &mut bytes);
                    }
                    let sides = set.iter().map(|c| (c.old.as_ref().map(|a| a.obj), c.new.as_ref().map(|a| a.obj)));
                    let snap = listings.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
                    let l = Arc::new(Listing { snap, version, bytes, sides: sides.collect() });
                    listings.map.lock().insert(tx, l.clone());
                    l
                } else {
                    cached()?
                };
                let at = (req.offset as usize).min(l.bytes.len());
                let page = &l.bytes[at..(at + wire::CHANGES_DATA).min(l.bytes.len())];
                out.data.0[..page.len()].copy_from_slice(page);
                out.len = page.len() as u32;
                out.total = l.bytes.len() as u64;
                out.snap = l.snap;
                if self.engine.lost_conflict(tx) {
                    out.flags |= wire::CHANGES_LOST;
                }
            }
            wire::CHANGES_OLD | wire::CHANGES_NEW => {
                let l = cached()?;
                let new = req.op == wire::CHANGES_NEW;
                let (old_obj, new_obj) = *l.sides.get(req.index as usize).ok_or(Errno::from_i32(libc::EINVAL))?;
                let o = if new { new_obj } else { old_obj }.ok_or(Errno::from_i32(libc::ENOENT))?;
                // One engine call: the bytes read are dropped unanswered
                // when the caller may not have them.
                let (a, got) =
                    self.engine.read_change(tx, o, new, req.offset, wire::CHANGES_DATA).map_err(|e| errno(&e))?;
                if a.kind != FileKind::File {
                    return Err(Errno::from_i32(if a.kind == FileKind::Dir { libc::EISDIR } else { libc::EINVAL }));
                }
                if !self.may_read_attr(me, &a) {
                    return Err(Errno::EACCES);
                }
                out.data.0[..got.len()].copy_from_slice(&got);
                out.len = got.len() as u32;
                out.total = a.size;
                out.snap = l.snap;
            }
            _ => return Err(Errno::EINVAL),
        }
        Ok(out.encode())
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::what as w;
    use txfs_engine::what as e;

    /// The wire's bits (and so txfs.h's and _wire.py's, which
    /// tests/wire_headers.rs holds to them) are the engine's, passed on
    /// as they are by `record`.
    #[test]
    fn the_wire_spells_the_engines_change_bits() {
        let pairs = [
            (w::CREATED, e::CREATED),
            (w::DELETED, e::DELETED),
            (w::MODIFIED, e::MODIFIED),
            (w::RENAMED, e::RENAMED),
            (w::LINKED, e::LINKED),
            (w::MODE, e::MODE),
            (w::OWNER, e::OWNER),
            (w::XATTR, e::XATTR),
            (w::TIMES, e::TIMES),
            (w::REPLACED, e::REPLACED),
        ];
        for (wire, engine) in pairs {
            assert_eq!(wire, engine);
        }
    }
}
