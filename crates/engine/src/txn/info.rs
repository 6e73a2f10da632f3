//! What `txfs status` shows of live transactions: a read-only snapshot,
//! taken under the lock, of each one's size and read set. Nothing here
//! changes a transaction.

use super::Engine;
use crate::ids::TxId;

/// One live transaction, as [`Engine::live_tx_info`] saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxInfo {
    pub id: TxId,
    /// Bytes it has written so far: held in memory, spilled, and in its
    /// staged and shadow data files.
    pub bytes: u64,
    /// Entries of its read set: page ranges, names, directory listings and
    /// attributes it read (what its commit validates).
    pub reads: u64,
    /// Whether it already lost a conflict or went past a cap (its commit
    /// will fail).
    pub doomed: bool,
    /// Memory it holds in the daemon, by the count its caps are held to
    /// (`Options::tx_mem`; budget.rs).
    pub mem: u64,
    /// Paths it touched, as counted without working the change set out:
    /// names it set or removed, and objects whose content or attributes
    /// (explicitly) it changed in place.
    pub paths: u64,
}

impl Engine {
    /// Every live transaction's [`TxInfo`], oldest (lowest id) first.
    pub fn live_tx_info(&self) -> Vec<TxInfo> {
        let st = self.lock();
        let mut out: Vec<TxInfo> = st
            .txs
            .values()
            .map(|t| {
                let files: u64 = t.data_file_ids().filter_map(|id| st.data_files.get(&id)).map(|f| f.len).sum();
                TxInfo {
                    id: t.id,
                    bytes: t.mem_bytes + files,
                    reads: t.read_entries(),
                    doomed: t.doomed.is_some(),
                    mem: t.held(),
                    paths: t.delta.dirs.values().map(|d| d.len() as u64).sum::<u64>()
                        + t.delta
                            .objs
                            .iter()
                            .filter(|(o, d)| {
                                !t.delta.created.contains_key(o) && (d.file.is_some() || t.explicit.contains(o))
                            })
                            .count() as u64,
                }
            })
            .collect();
        out.sort_by_key(|i| i.id.0);
        out
    }
}
