//! The control plane: the ioctls of `clients/c/txfs.h`, decoded and
//! answered in the layouts of [`crate::wire`].
//!
//! Thread transactions (`fs_tx_begin`, nested by depth), process-tree
//! transactions (`txfs run`, with or without a view), durable and ordered
//! commits, `txfs status` counters. Each ioctl returns its reply bytes and
//! the node ids whose cached pages must go before the caller hears of it
//! (a commit's changes).

use super::{errno, TxFs};
use crate::attribution::procfs;
use crate::attribution::txmap::{Caller, Claim};
use crate::wire;
use fuser::{Errno, INodeNo};
use std::sync::atomic::Ordering;
use txfs_engine::{Durability, Error, FileKind, TxId};

impl TxFs {
    /// The node ids whose dirty pages the kernel must write back into
    /// `cmd`'s transaction before it commits (`COMMIT`, `COMMIT_IF`,
    /// `RUN_COMMIT`): its nodes that may have pages — private ones, and
    /// shared ones of files it created. A shared writable mapping's writes
    /// stay in the kernel's page cache until it writes them back; dropping
    /// those pages (`inval_inode`) has it write the dirty ones first, as
    /// write-backs the daemon applies to the transaction that owns the node
    /// (`write`). None: nothing to flush, commit at once.
    pub(super) fn flush_before(&self, me: Caller, cmd: u32, data: &[u8]) -> Option<Vec<INodeNo>> {
        let s = self.shared_mount()?;
        let tx = match cmd {
            wire::COMMIT | wire::COMMIT_IF => self.txs.thread(me.tid)?.0,
            wire::RUN if data.len() >= wire::Run::SIZE => match wire::Run::decode(data) {
                r if r.op == wire::RUN_COMMIT => self.txs.tree(r.pid)?.0,
                _ => return None,
            },
            _ => return None,
        };
        // Shared ids are object ids (`shared_id`).
        let shared: std::collections::HashSet<txfs_engine::ObjId> = {
            let paged = s.paged.0.lock();
            if paged.is_empty() {
                return None;
            }
            paged.iter().filter(|k| !super::is_private(**k)).map(|k| txfs_engine::ObjId(k.0)).collect()
        };
        let mut nodes = s.paged.keep(s.private.lock().of_tx.get(&tx).cloned().unwrap_or_default());
        nodes.extend(self.engine.created_among(tx, &shared).into_iter().map(super::shared_id));
        (!nodes.is_empty()).then_some(nodes)
    }

    /// TXS's answer: the live transactions, oldest first, with who began
    /// them (the process of the thread that began, or the `txfs run`).
    fn live_txs(&self) -> wire::Txs {
        let infos = self.engine.live_tx_info();
        let mut out = wire::Txs { count: 0, total: infos.len() as u32, ..Default::default() };
        for (slot, i) in out.txs.iter_mut().zip(&infos) {
            let origin = self.txs.origin(i.id);
            let pid = origin.map_or(0, |o| if o.run { o.pid } else { procfs::process_of(o.pid).unwrap_or(o.pid) });
            let kind = origin.map_or(0, |o| if o.run { wire::TX_RUN } else { wire::TX_THREAD });
            *slot = wire::TxInfo {
                tx: i.id.0,
                age_ms: origin.map_or(0, |o| o.since.elapsed().as_millis() as u64),
                bytes: i.bytes,
                reads: i.reads,
                pid,
                uid: origin.map_or(0, |o| o.uid),
                kind: kind | if i.doomed { wire::TX_DOOMED } else { 0 },
                paths: i.paths.min(u32::MAX as u64) as u32,
                mem: i.mem,
            };
            out.count += 1;
        }
        out
    }

    /// STATE's answer for the caller.
    fn state(&self, c: Caller) -> wire::State {
        let (tx, depth) = self.state_of(c);
        // A lost conflict only (not a cap: rerunning that fails again).
        let doomed = tx.is_some_and(|t| self.engine.lost_conflict(t));
        wire::State { tx: tx.map_or(0, |t| t.0), depth, flags: if doomed { wire::STATE_DOOMED } else { 0 } }
    }

    /// Whether the caller may read file `ino` through handle `fh`
    /// (`BEGIN_FILE`): EBADF unless the descriptor is open for reading (as
    /// read(2)); EACCES unless the caller's credentials may read the file by
    /// its mode (owner, group — the header's or a supplementary one from
    /// /proc, read only when that decides — or other; root always). In a
    /// view the kernel opens files without a handle (0): there only the
    /// mode is checked. Directories are not read by `BEGIN_FILE`: any
    /// descriptor of one will do.
    fn may_read(&self, c: Caller, ino: INodeNo, fh: fuser::FileHandle) -> Result<(), Errno> {
        let readable = self.handles.lock().get(&fh).map(|h| h.readable);
        match readable {
            Some(true) => {}
            Some(false) => return Err(Errno::EBADF),
            None if self.dirs.lock().contains_key(&fh) => return Ok(()),
            None if self.view().is_some() && fh.0 == 0 => {}
            None => return Err(Errno::EBADF),
        }
        let a = self.engine.getattr(self.tx_of(c), self.obj(ino)).map_err(|e| errno(&e))?;
        if a.kind == FileKind::Dir || self.may_read_attr(c, &a) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// Whether the caller's credentials may read a file of attributes `a`
    /// by its mode: owner, group (the header's, or a supplementary one
    /// from /proc, read only when that decides) or other; root always.
    pub(super) fn may_read_attr(&self, c: Caller, a: &txfs_engine::Attr) -> bool {
        if c.uid == 0 {
            return true;
        }
        let (group, other) = (a.mode & 0o040 != 0, a.mode & 0o004 != 0);
        if a.uid == c.uid {
            a.mode & 0o400 != 0
        } else if a.gid == c.gid {
            group
        } else if group == other {
            other
        } else if procfs::in_group(c.tid, a.gid) {
            group
        } else {
            other
        }
    }

    /// Runs one ioctl; returns the reply data and the files whose cached
    /// pages must go before the reply.
    pub(super) fn ioctl_cmd(
        &self,
        me: Caller,
        ino: INodeNo,
        fh: fuser::FileHandle,
        cmd: u32,
        data: &[u8],
    ) -> Result<(Vec<u8>, Vec<INodeNo>), Errno> {
        let tid = me.tid;
        // The caller's thread id in a transaction begun with other
        // credentials (a setuid program its owner executed): not the
        // caller's to begin into, commit or abort. A dead thread's entry
        // is dropped here (the caller has its id, not its transaction).
        let foreign = self.txs.claim(me) == Claim::Foreign;
        let eperm = || Errno::from_i32(libc::EPERM);
        let e = |r: Result<(), Error>| r.map_err(|e| errno(&e));
        // A process of a `txfs run` whose view left the gate open: shut it.
        let _ = self.tx_of(me);
        match cmd {
            wire::BEGIN | wire::BEGIN_STATE | wire::BEGIN_FILE => {
                if foreign {
                    return Err(eperm());
                }
                if cmd == wire::BEGIN_FILE {
                    // It answers bytes of the file: only on a descriptor
                    // open for reading, to a caller allowed to read it.
                    self.may_read(me, ino, fh)?;
                }
                // BEGIN_STATE only, before the begin: how the caller's
                // transaction of its own that it asks about (0: its last)
                // ended, and the transaction it was in (a `txfs run` tree's
                // or view's too, which it joins at depth 1 without owning).
                let before = (cmd != wire::BEGIN).then(|| {
                    let ask = wire::BeginState::decode(data).last_tx;
                    let last = self.txs.outcome(tid, (ask != 0).then_some(TxId(ask)));
                    (last, self.view().or(self.state_of(me).0))
                });
                if let Some(view) = self.view() {
                    // Nests into the view's transaction, whoever asks.
                    self.txs.join(me, view);
                } else {
                    let engine = &self.engine;
                    let tx = self
                        .gate
                        .close_then(self.notifier(), || self.txs.begin(me, || engine.begin_as(me.uid, me.gid)));
                    let tx = tx.map_err(|e| {
                        // Refused (a transaction of other credentials
                        // appeared meanwhile): the gate reopens if it can.
                        self.gate.reopen(engine);
                        Errno::from_i32(e)
                    })?;
                    tracing::debug!(tid, %tx, "begin");
                }
                let Some((last, prior)) = before else { return Ok((Vec::new(), Vec::new())) };
                let state = self.state(me);
                let (last_tx, committed) = last.map_or((0, false), |(tx, c)| (tx.0, c));
                let bs = wire::BeginState {
                    tx: state.tx,
                    depth: state.depth,
                    last_committed: u32::from(committed),
                    last_tx,
                    prior_tx: prior.map_or(0, |p| p.0),
                };
                if cmd != wire::BEGIN_FILE {
                    return Ok((bs.encode(), Vec::new()));
                }
                // Then the file's size, bytes 24..40 and whether they are
                // there (a regular file at least 40 bytes long, read without
                // error). Read in the new transaction, so both are in its
                // read set, exactly as the GETATTR and READ they replace
                // would be.
                let mut bf = wire::BeginFile { bs, ..wire::BeginFile::default() };
                let tx = self.tx_of(me);
                let o = self.obj(ino);
                if let Ok(a) = self.engine.getattr(tx, o) {
                    if a.kind == FileKind::File && a.size >= 40 {
                        if let Ok(head) = self.engine.read(tx, o, 24, 16) {
                            if let Ok(head) = <[u8; 16]>::try_from(&head[..]) {
                                bf.size = a.size;
                                bf.head = head;
                                bf.file_valid = 1;
                            }
                        }
                    }
                }
                Ok((bf.encode(), Vec::new()))
            }
            wire::COMMIT | wire::COMMIT_IF => {
                let arg = wire::CommitIf::decode(data);
                let flags = arg.flags;
                let durability =
                    if flags & wire::COMMIT_ORDERED != 0 { Durability::Ordered } else { Durability::Durable };
                if foreign {
                    return Err(eperm());
                }
                match self.txs.thread(tid) {
                    None if cmd == wire::COMMIT_IF => return Err(Errno::from_i32(libc::ESTALE)),
                    None => return Err(Errno::from_i32(libc::EINVAL)),
                    // Not the transaction the caller's level lived in (it
                    // ended, and another began): leave it alone.
                    Some((tx, _, _)) if cmd == wire::COMMIT_IF && tx.0 != arg.tx => {
                        return Err(Errno::from_i32(libc::ESTALE))
                    }
                    Some(_) => {}
                }
                match self.txs.end(tid) {
                    Some((tx, true)) => {
                        let (r, pages) = self.end_tx(tx, Some(durability));
                        self.txs.ended(tid, tx, r.is_ok());
                        match r {
                            Ok(()) => Ok((Vec::new(), pages)),
                            Err(err) => {
                                // A conflict is routine (the caller retries): not an INFO line each.
                                if err.is_conflict() {
                                    tracing::debug!(tid, %tx, "commit failed: {err}");
                                } else {
                                    tracing::info!(tid, %tx, "commit failed: {err}");
                                }
                                self.after(pages, || {});
                                Err(errno(&err))
                            }
                        }
                    }
                    _ => Ok((Vec::new(), Vec::new())),
                }
            }
            wire::ABORT if foreign => Err(eperm()),
            wire::ABORT => match self.txs.drop_thread(tid) {
                Some((tx, owned)) => {
                    // Inside a tree transaction an abort dooms the whole tree.
                    let (_, pages) = self.end_tx(tx, None);
                    if owned {
                        self.txs.ended(tid, tx, false);
                    }
                    Ok((Vec::new(), pages))
                }
                None => Err(Errno::from_i32(libc::EINVAL)),
            },
            wire::SYNC => e(self.engine.sync()).map(|_| (Vec::new(), Vec::new())),
            wire::RUN => {
                let wire::Run { pid, op, flags, view_fd } = wire::Run::decode(data);
                let caller = procfs::process_of(tid).ok_or(Errno::from_i32(libc::ESRCH))?;
                match op {
                    wire::RUN_BEGIN => {
                        // Only the parent may make a process tree a transaction.
                        if procfs::parent_of(pid) != Some(caller) {
                            return Err(Errno::from_i32(libc::EPERM));
                        }
                        if self.txs.tree(pid).is_some() {
                            return Err(Errno::from_i32(libc::EEXIST));
                        }
                        if self.view().is_some() {
                            // `txfs run` inside `txfs run`: the view is already one transaction.
                            return Err(Errno::from_i32(libc::EBUSY));
                        }
                        // A non-root caller makes only a child of its own
                        // credentials a transaction: one that runs with
                        // others (a setuid program) stays outside.
                        if me.uid != 0 && !procfs::has_only_creds(pid, me.uid, me.gid) {
                            return Err(eperm());
                        }
                        let Some(starts) = procfs::tree_starts(pid, caller) else {
                            tracing::warn!(pid, caller, "cannot read the start times of a process tree in /proc");
                            return Err(Errno::from_i32(libc::EAGAIN));
                        };
                        // TXFS_NO_VIEWS=1: serve none (as daemons before views did).
                        // Only for root: a view is served without the daemon
                        // checking permissions (the kernel does, by the mount's
                        // default_permissions, which only root's mount guarantees).
                        let views_allowed = self.config.views;
                        let with_view = flags & wire::RUN_VIEW != 0 && me.uid == 0 && views_allowed;
                        // A tree that reaches this mount only through its view
                        // (or by requests, which pin the gate) leaves it open.
                        let escape = if with_view { self.way_in(pid) } else { Some("no view".into()) };
                        let begin = || {
                            let tx = self.engine.begin_as(me.uid, me.gid);
                            self.txs.add_tree(pid, caller, tx, starts, me.creds());
                            tx
                        };
                        let tx = match &escape {
                            None => self.gate.begin_free(begin),
                            Some(_) => self.gate.close_then(self.notifier(), begin),
                        };
                        if let Some(why) = escape.as_deref().filter(|_| with_view) {
                            tracing::info!(pid, %tx, "the kernel stops caching while this run lives: {why}");
                        }
                        if with_view {
                            let devfd = view_fd as i32;
                            if let Err(e) = self.serve_view(caller, devfd, tx) {
                                tracing::warn!(pid, %tx, "cannot serve a transaction view: {e}");
                                self.txs.remove_tree(pid);
                                let (_, pages) = self.end_tx(tx, None);
                                self.after(pages, || {});
                                return Err(Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)));
                            }
                        }
                        tracing::info!(pid, %tx, "process tree transaction begins");
                        Ok((Vec::new(), Vec::new()))
                    }
                    wire::RUN_COMMIT | wire::RUN_ABORT if self.view().is_some() => Err(Errno::from_i32(libc::EBUSY)),
                    wire::RUN_COMMIT | wire::RUN_ABORT => {
                        let (tx, owner, owner_start, alive) =
                            self.txs.tree(pid).ok_or(Errno::from_i32(libc::ENOENT))?;
                        // The owner's process, not one that got its pid
                        // after it died (its tree is aborted by the reaper).
                        if !alive || owner != caller || procfs::start_time(caller) != Some(owner_start) {
                            return Err(eperm());
                        }
                        self.txs.remove_tree(pid);
                        if op == wire::RUN_ABORT {
                            // EDEADLK tells `txfs run` that the command failed
                            // because it lost a conflict: worth a rerun.
                            // Not one that went past a cap: a rerun would too.
                            let doomed = self.engine.lost_conflict(tx);
                            let (_, pages) = self.end_tx(tx, None);
                            tracing::info!(pid, %tx, doomed, "process tree transaction aborted");
                            // NB: the pages are dropped before the reply only on success.
                            self.after(pages, || {});
                            return if doomed {
                                Err(Errno::from_i32(libc::EDEADLK))
                            } else {
                                Ok((Vec::new(), Vec::new()))
                            };
                        }
                        let d =
                            if flags & wire::COMMIT_ORDERED != 0 { Durability::Ordered } else { Durability::Durable };
                        let (r, pages) = self.end_tx(tx, Some(d));
                        match r {
                            Ok(()) => {
                                tracing::info!(pid, %tx, "process tree transaction committed");
                                Ok((Vec::new(), pages))
                            }
                            Err(err) => {
                                if err.is_conflict() {
                                    tracing::debug!(pid, %tx, "process tree commit failed: {err}");
                                } else {
                                    tracing::info!(pid, %tx, "process tree commit failed: {err}");
                                }
                                self.after(pages, || {});
                                Err(errno(&err))
                            }
                        }
                    }
                    _ => Err(Errno::EINVAL),
                }
            }
            wire::STATUS => {
                let s = self.engine.stats();
                let status = wire::Status {
                    commits: s.commits,
                    aborts: s.aborts,
                    conflicts: s.conflicts,
                    live_txs: s.live_txs,
                    journal_bytes: s.journal_bytes,
                    journal_syncs: s.journal_syncs,
                    checkpoints: s.checkpoints,
                    last_seq: s.last_seq,
                };
                Ok((status.encode(), Vec::new()))
            }
            wire::CACHE => {
                let [open, cached_replies, closes] = self.shared_gate().counters();
                let attr_requests = self.attr_requests.load(Ordering::Relaxed);
                Ok((wire::Cache { open, cached_replies, closes, attr_requests }.encode(), Vec::new()))
            }
            wire::TXS => Ok((self.live_txs().encode(), Vec::new())),
            wire::FAULT => Ok((fault_answer(self.engine.fault()).encode(), Vec::new())),
            wire::CHANGES => Ok((self.changes(me, data)?, Vec::new())),
            wire::STATE => Ok((self.state(me).encode(), Vec::new())),
            _ => Err(Errno::from_i32(libc::ENOTTY)),
        }
    }
}

/// The FAULT answer for what [`Engine::fault`](txfs_engine::Engine::fault)
/// says, its reason cut at a character boundary to fit.
fn fault_answer(fault: Option<txfs_engine::Fault>) -> wire::Fault {
    let Some(f) = fault else { return wire::Fault::default() };
    let mut end = f.why.len().min(wire::FAULT_WHY);
    while !f.why.is_char_boundary(end) {
        end -= 1;
    }
    let mut why = wire::Why::default();
    why.0[..end].copy_from_slice(&f.why.as_bytes()[..end]);
    let state = match (f.retried, f.reads_go_on) {
        (true, _) => wire::FAULT_RETRIED,
        (false, true) => wire::FAULT_READS_GO_ON,
        (false, false) => wire::FAULT_ALL,
    };
    wire::Fault { state, len: end as u32, why }
}
