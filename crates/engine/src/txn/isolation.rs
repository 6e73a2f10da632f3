//! Commit versions of everything a transaction can read, for validation.
//!
//! Every committed change stamps the items it changed with its commit
//! sequence number: file pages (ranges of 4 KiB pages), directory names,
//! directory listings, and object metadata (size, mode, owner, link count,
//! xattrs, a directory's parent). A transaction that began at `start` may
//! read an item only while the item's stamp is `<= start` (invariant I2):
//! the read is then exactly what the item held at `start`. Commit checks the
//! whole read set again (I3). Stamps older than every live transaction's
//! start can never fail a check; all of them are dropped whenever no
//! transaction is live ([`Versions::prune_all`]), and those older than the
//! oldest live transaction's start whenever their number has doubled since
//! the last pruning ([`Versions::prune_older`]): a long transaction does
//! not make every later commit's stamps stay (issue 23).
//!
//! Tests: the unit tests below; `tests/isolation.rs`, one test per anomaly
//! (`dirty_read_is_impossible`, `non_repeatable_read_is_impossible`,
//! `read_skew_is_impossible`, `lost_update_is_impossible`,
//! `write_skew_is_impossible`, `phantom_is_impossible`), and
//! `tests/model.rs` (`interleaved_transactions_are_serializable`).

use crate::ids::{ObjId, Seq};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;

pub const PAGE: u64 = 4096;

/// Page range -> newest stamp, non-overlapping.
#[derive(Default, Debug, Clone)]
pub struct RangeStamps {
    map: BTreeMap<u64, (u64, Seq)>,
}

impl RangeStamps {
    pub fn stamp(&mut self, start: u64, end: u64, seq: Seq) {
        if start >= end {
            return;
        }
        if let Some((&s, &(e, q))) = self.map.range(..start).next_back() {
            if e > start {
                self.map.insert(s, (start, q));
                if e > end {
                    self.map.insert(end, (e, q));
                }
            }
        }
        let inside: Vec<u64> = self.map.range(start..end).map(|(s, _)| *s).collect();
        for s in inside {
            let (e, q) = self.map.remove(&s).expect("listed");
            if e > end {
                self.map.insert(end, (e, q));
            }
        }
        self.map.insert(start, (end, seq));
    }

    /// How many ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Drops the stamps no check can fail on: `<= floor`.
    fn prune(&mut self, floor: Seq) {
        self.map.retain(|_, (_, q)| *q > floor);
    }

    pub fn newest(&self, start: u64, end: u64) -> Seq {
        let mut best = Seq(0);
        if let Some((_, &(e, q))) = self.map.range(..start).next_back() {
            if e > start {
                best = best.max(q);
            }
        }
        for (_, &(_, q)) in self.map.range(start..end) {
            best = best.max(q);
        }
        best
    }
}

#[derive(Default, Debug)]
pub struct Versions {
    pub pages: HashMap<ObjId, RangeStamps>,
    pub names: HashMap<(ObjId, OsString), Seq>,
    pub lists: HashMap<ObjId, Seq>,
    pub metas: HashMap<ObjId, Seq>,
    /// Page ranges in `pages`, all files together.
    pub page_ranges: usize,
    /// Entries left by the last pruning.
    pub kept: usize,
}

/// Fewer stamps than this are never pruned while transactions are live.
const PRUNE_MIN: usize = 1 << 16;

impl Versions {
    pub fn prune_all(&mut self) {
        *self = Versions::default();
    }

    /// Entries held (a page range counts one).
    pub fn len(&self) -> usize {
        self.names.len() + self.lists.len() + self.metas.len() + self.page_ranges
    }

    /// Drops every stamp `<= floor`, the start of the oldest live
    /// transaction: every live transaction began at or after it, and a
    /// later one begins later still, so none of them can fail on it.
    pub fn prune_older(&mut self, floor: Seq) {
        self.names.retain(|_, q| *q > floor);
        self.lists.retain(|_, q| *q > floor);
        self.metas.retain(|_, q| *q > floor);
        self.pages.retain(|_, r| {
            r.prune(floor);
            !r.is_empty()
        });
        self.page_ranges = self.pages.values().map(RangeStamps::len).sum();
        self.kept = self.len();
    }

    /// After a commit: prunes once the stamps have doubled since the last
    /// time (amortized constant time per stamp). `floor`: the oldest live
    /// transaction's start, `None` if none is live.
    pub fn maybe_prune(&mut self, floor: Option<Seq>) {
        let n = self.len();
        if n < PRUNE_MIN || n < 2 * self.kept {
            return;
        }
        match floor {
            None => self.prune_all(),
            Some(f) => self.prune_older(f),
        }
    }
}

/// What a transaction read (beyond its own writes).
#[derive(Default, Debug)]
pub struct ReadSet {
    /// Page ranges `[start, end)` in page units.
    pub pages: HashMap<ObjId, Vec<(u64, u64)>>,
    pub names: HashSet<(ObjId, OsString)>,
    pub lists: HashSet<ObjId>,
    pub metas: HashSet<ObjId>,
}

impl ReadSet {
    /// The first item changed after `start`, described for the error.
    pub fn first_stale(&self, v: &Versions, start: Seq) -> Option<String> {
        for (o, ranges) in &self.pages {
            if let Some(st) = v.pages.get(o) {
                for &(s, e) in ranges {
                    if st.newest(s, e) > start {
                        return Some(format!("data of {o} (pages {s}..{e})"));
                    }
                }
            }
        }
        for key in &self.names {
            if v.names.get(key).is_some_and(|q| *q > start) {
                return Some(format!("name {:?} in {}", key.1, key.0));
            }
        }
        for o in &self.lists {
            if v.lists.get(o).is_some_and(|q| *q > start) {
                return Some(format!("listing of {o}"));
            }
        }
        for o in &self.metas {
            if v.metas.get(o).is_some_and(|q| *q > start) {
                return Some(format!("attributes of {o}"));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_override_and_split() {
        let mut r = RangeStamps::default();
        r.stamp(0, 10, Seq(1));
        r.stamp(3, 5, Seq(2));
        assert_eq!(r.newest(0, 3), Seq(1));
        assert_eq!(r.newest(4, 6), Seq(2));
        assert_eq!(r.newest(5, 10), Seq(1));
        assert_eq!(r.newest(10, 20), Seq(0));
    }
}
