//! Memory budgets: what a live transaction holds in the daemon, counted as
//! it grows, and the caps that stop one user's transaction from taking the
//! memory every user of a shared mount depends on (SPEC §4a).
//!
//! ## What is counted
//! A transaction holds its written bytes that are still in memory
//! (`Tx::mem_bytes`) and the *bookkeeping* around them: the entries of its
//! delta (objects, extents, names, xattrs, new objects) and of its read set
//! (pages, names, listings, attributes). Each is charged a fixed cost per
//! entry plus its variable bytes (names, xattr values). The costs are the
//! sizes of the structures with their allocator overhead, rounded up, so
//! the count is an upper bound of the heap a transaction keeps alive, not
//! an exact figure (measured: `tests/tx_memory.rs` compares the count with
//! the daemon's RSS growth).
//!
//! Every count is kept in constant time per operation: the number of
//! entries of a hash map is known, and the entries that live inside one
//! map per object (a file's extents, a directory's names, an object's
//! xattrs) are recounted only for the object the operation changed
//! ([`Tx::recount`], called from [`State::touch`], which every content and
//! attribute change goes through) or charged where they are added
//! ([`Tx::set_entry`], the read recorders).
//!
//! ## The caps
//! * `Options::tx_mem`: what one transaction may hold;
//! * `Options::mount_tx_mem`: what all live transactions together may hold;
//! * `Options::tx_reads`: the entries of one read set (its commit validates
//!   each under the engine lock, so this bounds the commit's stall).
//!
//! A transaction's written bytes leave memory for its spill file once it
//! holds half of either memory cap ([`State::mem_room`]): payload alone
//! never reaches a cap, bookkeeping does. An operation that takes a
//! transaction past a cap fails with ENOSPC, and the transaction is
//! *doomed by the limit* ([`Doom::Limit`]): its memory is given back at
//! once, every later operation and its commit fail with ENOSPC, and it can
//! only be aborted. Unlike a conflict, a rerun would fail the same way, so
//! `txfs run` does not rerun it.

use super::api::Options;
use super::state::{State, Tx};

use crate::delta::Delta;
use crate::error::Error;
use crate::ids::ObjId;
use std::ffi::OsStr;

/// An object the delta changes: its `ObjDelta`, attribute maps, hash entry.
const OBJ: u64 = 320;
/// One extent of a file: its B-tree slot and, for bytes in memory, the
/// shared buffer's header and allocation rounding.
const EXTENT: u64 = 112;
/// One name in a directory's delta, beside the name's own bytes.
const ENTRY: u64 = 96;
/// One object the transaction created.
const NEW: u64 = 96;
/// One xattr in an object's delta, beside its name and value.
const XATTR: u64 = 96;
/// A directory's parent, an explicitly set object, a data file it owns.
const SMALL: u64 = 48;
/// One read-set entry (a page range, a name beside its bytes, a listing,
/// an object's attributes).
const READ: u64 = 64;

/// Why a transaction can only abort.
#[derive(Clone, Debug)]
pub(crate) enum Doom {
    /// It read something a transaction that committed first changed.
    Conflict(String),
    /// It went past a memory or read-set cap.
    Limit(String),
}

impl Doom {
    /// The error every later operation and the commit of `tx` give.
    pub(crate) fn error(&self, tx: crate::ids::TxId) -> Error {
        match self {
            Doom::Conflict(what) => Error::Conflict { tx, what: what.clone() },
            Doom::Limit(what) => Error::Limit { tx, what: what.clone() },
        }
    }
}

/// The caps, from [`Options`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    pub tx_mem: u64,
    pub mount_tx_mem: u64,
    pub tx_reads: u64,
}

impl Caps {
    pub(crate) fn of(opts: &Options) -> Caps {
        Caps { tx_mem: opts.tx_mem, mount_tx_mem: opts.mount_tx_mem, tx_reads: opts.tx_reads }
    }
}

/// What a transaction's per-object maps held at their last count.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ObjCount {
    bytes: u64,
}

impl Tx {
    /// Bytes this transaction holds in memory, by the engine's count.
    pub(crate) fn held(&self) -> u64 {
        let d: &Delta = &self.delta;
        let r = &self.reads;
        let maps = d.objs.len() as u64 * OBJ
            + d.dirs.len() as u64 * OBJ
            + d.created.len() as u64 * NEW
            + (d.parents.len() + self.explicit.len() + self.timed.len() + self.staged.len() + self.shadows.len())
                as u64
                * SMALL
            + (r.metas.len() + r.lists.len() + r.names.len() + r.pages.len()) as u64 * READ;
        self.mem_bytes + self.book + maps
    }

    /// Entries of its read set.
    pub(crate) fn read_entries(&self) -> u64 {
        let r = &self.reads;
        (r.metas.len() + r.lists.len() + r.names.len()) as u64 + self.page_ranges
    }

    /// Counts `o`'s extents and xattrs again after an operation changed
    /// them (constant time in the number of objects: one object's maps).
    pub(crate) fn recount(&mut self, o: ObjId) {
        let now = match self.delta.objs.get(&o) {
            None => 0,
            Some(od) => {
                let ext = od.file.as_ref().map_or(0, |f| f.ext.len() as u64) * EXTENT;
                let xattrs: u64 = od
                    .attr
                    .xattrs
                    .iter()
                    .map(|(k, v)| XATTR + k.len() as u64 + v.as_ref().map_or(0, |v| v.len() as u64))
                    .sum();
                ext + xattrs
            }
        };
        let was = self.counted.insert(o, ObjCount { bytes: now }).unwrap_or_default();
        self.book = (self.book + now).saturating_sub(was.bytes);
    }

    /// Sets the entry `name` of `dir` in the delta (`Some`: links an
    /// object, `None`: removes the name), charging a new one.
    pub(crate) fn set_entry(&mut self, dir: ObjId, name: &OsStr, e: Option<ObjId>) {
        if self.delta.dirs.entry(dir).or_default().insert(name.to_owned(), e).is_none() {
            self.book += ENTRY + name.len() as u64;
        }
    }

    /// A new read-set entry of `bytes` variable bytes (a name's).
    pub(crate) fn charge_read(&mut self, bytes: u64) {
        self.book += bytes;
    }

    /// A new page range in the read set.
    pub(crate) fn charge_page_range(&mut self) {
        self.page_ranges += 1;
        self.book += READ;
    }

    /// Bytes a symlink target or similar adds to a new object.
    pub(crate) fn charge_bytes(&mut self, bytes: u64) {
        self.book += bytes;
    }
}

impl State {
    /// Room for `len` more written bytes in memory for `tx`: under the
    /// spill threshold, and under half of each memory cap (past that its
    /// bytes go to its spill file, so that bookkeeping, not payload, is
    /// what meets a cap).
    pub(super) fn mem_fits(&self, tx: &Tx, len: u64) -> bool {
        let others = self.live_mem.saturating_sub(tx.charged);
        tx.mem_bytes + len <= self.spill_threshold
            && tx.held() + len <= self.caps.tx_mem / 2
            && others + tx.held() + len <= self.caps.mount_tx_mem / 2
    }

    /// After an operation of `tx`: brings the mount's count up to date and,
    /// past a cap, dooms `tx` by the limit, gives its memory back and
    /// returns the error the operation fails with.
    pub(super) fn charge(&mut self, tx: &mut Tx) -> Option<Error> {
        let held = tx.held();
        self.live_mem = (self.live_mem + held).saturating_sub(tx.charged);
        tx.charged = held;
        let reads = tx.read_entries();
        let what = if held > self.caps.tx_mem {
            format!("holds {} of memory, over tx_mem={}", mib(held), mib(self.caps.tx_mem))
        } else if reads > self.caps.tx_reads {
            format!("read {reads} items, over tx_reads={}", self.caps.tx_reads)
        } else if self.live_mem > self.caps.mount_tx_mem {
            format!(
                "holds {}; live transactions hold {}, over mount_tx_mem={}",
                mib(held),
                mib(self.live_mem),
                mib(self.caps.mount_tx_mem)
            )
        } else {
            return None;
        };
        tracing::info!(tx = %tx.id, "transaction over its limit: {what}; it can only be aborted");
        self.stats.limit_aborts += 1;
        self.empty_doomed(tx, Doom::Limit(what.clone()));
        Some(Error::Limit { tx: tx.id, what })
    }

    /// Dooms `tx` and gives back everything it holds: its delta, its read
    /// set, its data files. It can only be aborted now.
    fn empty_doomed(&mut self, tx: &mut Tx, why: Doom) {
        self.discard_tx(tx);
        // A conflict it met first stays the reason (a rerun may succeed).
        tx.doomed.get_or_insert(why);
        let parts = (
            std::mem::take(&mut tx.delta),
            std::mem::take(&mut tx.reads),
            std::mem::take(&mut tx.explicit),
            std::mem::take(&mut tx.counted),
            std::mem::take(&mut tx.timed),
        );
        self.graveyard.push(Box::new(parts));
        tx.staged.clear();
        tx.shadows.clear();
        tx.spill = None;
        tx.data_dirty = false;
        tx.mem_bytes = 0;
        tx.book = 0;
        tx.page_ranges = 0;
        tx.charged = 0;
        self.trim = true;
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// A transaction that ended holding this much asks for [`trim_heap`].
pub(crate) const TRIM_AFTER: u64 = 16 << 20;

/// A transaction that ended holding this much is freed without the lock.
const BURY_FROM: u64 = 1 << 20;

impl State {
    /// Drops `tx` now if it is small, else once the lock is let go
    /// ([`unlock`]).
    pub(super) fn bury(&mut self, tx: Tx) {
        if tx.held() >= BURY_FROM {
            self.graveyard.push(Box::new(tx));
        }
    }
}

/// Lets go of the engine lock, then frees what big transactions held and
/// gives the heap back if one ended: without the lock, so that other
/// requests do not wait for it.
pub(crate) fn unlock(mut st: parking_lot::MutexGuard<'_, State>) {
    let dead = std::mem::take(&mut st.graveyard);
    let trim = std::mem::take(&mut st.trim);
    drop(st);
    drop(dead);
    if trim {
        trim_heap();
    }
}

/// Hands freed heap back to the system after a big transaction ended
/// (glibc keeps freed memory in its arenas: without this, the daemon's RSS
/// stays at its peak after a transaction of a hundred MiB is gone). Called
/// without the engine lock: it walks the heap.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes no pointer.
    unsafe {
        libc::malloc_trim(0);
    }
}
