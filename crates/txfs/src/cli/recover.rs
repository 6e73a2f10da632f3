//! `txfs recover`: offline, replay BACKING's journal into plain files.

use super::{init_logs, lock_backing, open_engine, Progress};
use std::path::Path;
use txfs_engine::Options;

pub fn recover(backing: &Path, progress: bool) -> Result<(), String> {
    init_logs();
    super::require_backing(backing)?;
    let _lock = lock_backing(backing)?;
    let _progress = Progress::start("recover", backing, progress);
    let engine = open_engine(backing, Options { flush_interval: None, ..Default::default() })?;
    engine.close().map_err(|e| format!("{}: {e}", backing.display()))?;
    println!("{}: recovered; it holds the committed state as plain files", backing.display());
    Ok(())
}
