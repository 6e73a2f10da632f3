//! `txfs check`: offline, verify BACKING's journal and its references
//! into BACKING; changes nothing.

use super::Progress;
use std::path::Path;
use txfs_engine::storage::RealFs;

pub fn check(backing: &Path, progress: bool) -> Result<bool, String> {
    super::require_backing(backing)?;
    let fs = RealFs::open(backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    let rep = {
        let _progress = Progress::start("check", backing, progress);
        txfs_engine::check(&fs).map_err(|e| e.to_string())?
    };
    for j in &rep.journals {
        println!("{}: {} committed records, {} bytes", j.path.display(), j.records, j.valid_bytes);
        if let Some((at, why)) = &j.cut {
            if why.starts_with(txfs_engine::journal::STALE_END) {
                println!("  records end at offset {at} ({why}): recovery will cut it there");
            } else {
                println!("  torn tail at offset {at} ({why}): recovery will cut it there");
            }
        }
    }
    if let Some(p) = &rep.plan {
        println!("{}: an interrupted checkpoint; the next mount or `txfs recover` finishes it", p.display());
    }
    if !rep.lost_found.is_empty() {
        println!(
            "{}: {} data files recovery could not account for, kept for you to look at and remove",
            txfs_engine::lost_found().display(),
            rep.lost_found.len()
        );
    }
    for p in &rep.problems {
        println!("DAMAGE: {p}");
    }
    Ok(rep.problems.is_empty())
}
