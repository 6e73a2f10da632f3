//! Group commit (invariant J4): many committers, one `fdatasync`.
//!
//! Appends happen under the engine lock; [`SyncState::wait_durable`] runs
//! outside it. The first waiter becomes the leader and issues one
//! `fdatasync` covering every record appended before it started; the others
//! wait on a condition variable. A commit is durable once a sync that
//! started after its append has returned.
//!
//! A failed `fdatasync` is not retried: the latch `failed` is set and every
//! waiter, now and later, gets [`Error::Poisoned`] (after a failed sync the
//! kernel may have dropped the dirty pages, so a retry that succeeds proves
//! nothing). Tests: `tests/crash.rs` (`power_cuts_leave_a_durable_prefix`:
//! every commit acknowledged durable survives a power cut at any sync),
//! `tests/isolation.rs` (`bank_transfers_keep_the_total`: many durable
//! committers at once).

use crate::error::{Error, Result};
use crate::ids::{Epoch, Lsn};
use crate::storage::StoredFile;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Group commit: one `fdatasync` for every commit appended before it began.
pub struct SyncState {
    inner: Mutex<SyncInner>,
    cv: Condvar,
    /// Highest position appended (updated under the engine lock).
    pub written: Mutex<Lsn>,
    pub syncs: AtomicU64,
}

struct SyncInner {
    synced: Lsn,
    leader: bool,
    file: Option<Arc<dyn StoredFile>>,
    epoch: Epoch,
    failed: Option<String>,
}

impl SyncState {
    pub fn new(epoch: Epoch, file: Arc<dyn StoredFile>, end: u64) -> SyncState {
        let pos = Lsn { epoch, off: end };
        SyncState {
            inner: Mutex::new(SyncInner { synced: pos, leader: false, file: Some(file), epoch, failed: None }),
            cv: Condvar::new(),
            written: Mutex::new(pos),
            syncs: AtomicU64::new(0),
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
            if let Some(e) = &g.failed {
                return Err(Error::Poisoned(e.clone()));
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
                Err(e) => g.failed = Some(format!("journal fdatasync: {e}")),
            }
            self.cv.notify_all();
        }
    }
}
