//! `txfs recover`: offline, replay BACKING's journal into plain files.

use super::{init_logs, lock_backing, open_engine, Progress};
use std::io::Write;
use std::path::Path;
use txfs_engine::Options;

pub fn recover(backing: &Path, progress: bool, accept_loss: bool) -> Result<(), String> {
    init_logs();
    super::require_backing(backing)?;
    let _lock = lock_backing(backing)?;
    let _progress = Progress::start("recover", backing, progress);
    let engine = open_engine(backing, Options { flush_interval: None, accept_loss, ..Default::default() })?;
    let losses = engine.accepted_losses();
    if !losses.is_empty() {
        // Kept with the backing, beside the daemon's log, as well as on stderr.
        let log = backing.join(".txfs/daemon.log");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&log) {
            for l in &losses {
                let _ = writeln!(f, "[unix time {now}] txfs recover --accept-loss: accepted: {l}");
            }
        }
        for l in &losses {
            eprintln!("txfs recover: --accept-loss: accepted: {l}");
        }
    }
    engine.close().map_err(|e| format!("{}: {e}", backing.display()))?;
    let lf = backing.join(txfs_engine::lost_found());
    if let Ok(n) = std::fs::read_dir(&lf).map(|d| d.count()) {
        if n > 0 {
            eprintln!(
                "txfs recover: {} holds {n} data files no surviving record names (remove them when you are sure \
                 you do not need them)",
                lf.display()
            );
        }
    }
    println!("{}: recovered; it holds the committed state as plain files", backing.display());
    Ok(())
}
