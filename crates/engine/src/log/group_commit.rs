//! Group commit (invariant J4): many committers, one `fdatasync`.
//!
//! Appends happen under the engine lock; [`SyncState::wait_durable`] runs
//! outside it. The first waiter becomes the leader and issues one
//! `fdatasync` covering every record appended before it started; the others
//! wait on a condition variable. A commit is durable once a sync that
//! started after its append has returned.
//!
//! A failed `fdatasync` is not retried: it sets the engine's one poison
//! latch ([`Poison`], shared with the engine state), and every waiter, now
//! and later, gets [`Error::Poisoned`] (after a failed sync the kernel may
//! have dropped the dirty pages, so a retry that succeeds proves nothing).
//! Because the latch is the engine's, plain operations and ordered commits
//! are refused from then on too: nothing more is acknowledged until the
//! engine is reopened (`tests/limits.rs`,
//! `a_failed_journal_sync_stops_every_acknowledgement`). Tests: `tests/crash.rs` (`power_cuts_leave_a_durable_prefix`:
//! every commit acknowledged durable survives a power cut at any sync),
//! `tests/isolation.rs` (`bank_transfers_keep_the_total`: many durable
//! committers at once).

use crate::error::{Error, Result};
use crate::ids::{Epoch, Lsn};
use crate::storage::StoredFile;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The engine's one poison latch: set by a failed journal sync and by a
/// checkpoint that failed half way; once set, every operation, commit and
/// durable wait fails with [`Error::Poisoned`] until the engine is reopened.
/// The first reason is kept. Reads outside transactions go on only while
/// every reason left the in-memory state exact (a journal write or sync
/// that failed: memory holds what was appended); a checkpoint that failed
/// half way leaves the tree and the node table apart, and stops them too.
#[derive(Default)]
pub struct Poison(Mutex<Option<(String, bool)>>);

impl Poison {
    pub fn get(&self) -> Option<String> {
        self.0.lock().as_ref().map(|(why, _)| why.clone())
    }

    /// The first reason and whether plain reads are still served.
    pub fn fault(&self) -> Option<(String, bool)> {
        self.0.lock().clone()
    }

    /// Whether plain reads may still be served.
    pub fn reads_ok(&self) -> bool {
        self.0.lock().as_ref().is_none_or(|(_, ok)| *ok)
    }

    pub fn set(&self, why: String, reads_ok: bool) {
        let mut g = self.0.lock();
        let p = g.get_or_insert((why, reads_ok));
        p.1 &= reads_ok;
    }
}

/// Group commit: one `fdatasync` for every commit appended before it began.
pub struct SyncState {
    inner: Mutex<SyncInner>,
    cv: Condvar,
    /// Highest position appended (updated under the engine lock).
    pub written: Mutex<Lsn>,
    pub syncs: AtomicU64,
    poison: Arc<Poison>,
}

struct SyncInner {
    synced: Lsn,
    leader: bool,
    file: Option<Arc<dyn StoredFile>>,
    epoch: Epoch,
}

impl SyncState {
    pub fn new(epoch: Epoch, file: Arc<dyn StoredFile>, end: u64, poison: Arc<Poison>) -> SyncState {
        let pos = Lsn { epoch, off: end };
        SyncState {
            inner: Mutex::new(SyncInner { synced: pos, leader: false, file: Some(file), epoch }),
            cv: Condvar::new(),
            written: Mutex::new(pos),
            syncs: AtomicU64::new(0),
            poison,
        }
    }

    pub fn synced(&self) -> Lsn {
        self.inner.lock().synced
    }

    /// Switches to a new epoch's file. Everything of the old epoch must be
    /// durable already (a checkpoint synced it).
    pub fn rotate(&self, epoch: Epoch, file: Arc<dyn StoredFile>, end: u64) {
        let mut g = self.inner.lock();
        while g.leader {
            self.cv.wait(&mut g);
        }
        let pos = Lsn { epoch, off: end };
        g.synced = pos;
        g.epoch = epoch;
        g.file = Some(file);
        *self.written.lock() = pos;
        self.cv.notify_all();
    }

    /// Returns once everything up to `target` is durable.
    pub fn wait_durable(&self, target: Lsn) -> Result<()> {
        let mut g = self.inner.lock();
        loop {
            if let Some(e) = self.poison.get() {
                return Err(Error::Poisoned(e));
            }
            if g.synced >= target {
                return Ok(());
            }
            if g.leader {
                self.cv.wait(&mut g);
                continue;
            }
            g.leader = true;
            let file = g.file.clone();
            let epoch = g.epoch;
            drop(g);
            let upto = *self.written.lock();
            let res = match &file {
                Some(f) if upto.epoch == epoch => f.sync_data(),
                _ => Ok(()),
            };
            self.syncs.fetch_add(1, Ordering::Relaxed);
            g = self.inner.lock();
            g.leader = false;
            match res {
                Ok(()) => {
                    if upto > g.synced && upto.epoch == g.epoch {
                        g.synced = upto;
                    }
                }
                Err(e) => self.poison.set(format!("journal fdatasync: {e}"), true),
            }
            self.cv.notify_all();
        }
    }
}
