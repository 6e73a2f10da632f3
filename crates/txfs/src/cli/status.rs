//! `txfs status`: the mount's counters (TXFS_IOC_STATUS and
//! TXFS_IOC_CACHE), once, as JSON, or as rates every few seconds; and a
//! fault that stopped it acknowledging (FAULT), which makes it exit 1.

use super::human;
use crate::wire;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;
use txfs_engine::Options;

/// An answer of `N` bytes from the mount with ioctl `cmd` through `dir`.
fn ask<const N: usize>(dir: &std::fs::File, cmd: u32) -> std::io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    // SAFETY: `cmd` writes its argument's size, N, into buf.
    if unsafe { libc::ioctl(dir.as_raw_fd(), cmd as _, buf.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(buf)
}

/// The mount's counters (TXFS_IOC_STATUS) under their field names, plus
/// what follows from them.
pub(super) fn read_status(dir: &std::fs::File, point: &Path) -> Result<Vec<(&'static str, u64)>, String> {
    let buf = ask::<{ wire::Status::SIZE }>(dir, wire::STATUS)
        .map_err(|e| format!("{}: not a txfs mount? ({e})", point.display()))?;
    let s = wire::Status::decode(&buf);
    let mut out: Vec<(&'static str, u64)> = vec![
        ("commits", s.commits),
        ("aborts", s.aborts),
        ("conflicts", s.conflicts),
        ("live_txs", s.live_txs),
        ("journal_bytes", s.journal_bytes),
        ("journal_syncs", s.journal_syncs),
        ("checkpoints", s.checkpoints),
        ("last_seq", s.last_seq),
    ];
    // The journal file starts with its header; the rest is committed
    // records that the next checkpoint applies to BACKING (it starts a
    // new, empty journal file).
    out.push(("checkpoint_lag", s.journal_bytes.saturating_sub(txfs_engine::journal::FILE_HEADER_LEN)));
    out.push(("checkpoint_threshold", Options::default().checkpoint_bytes));
    // The kernel cache gate (daemons before it answer ENOTTY: left out).
    if let Ok(buf) = ask::<{ wire::Cache::SIZE }>(dir, wire::CACHE) {
        let c = wire::Cache::decode(&buf);
        out.push(("kernel_cache_open", c.open));
        out.push(("cached_replies", c.cached_replies));
        out.push(("cache_closes", c.closes));
        out.push(("lookup_getattr_requests", c.attr_requests));
    }
    Ok(out)
}

/// The live transactions (TXFS_IOC_TXS), oldest first, and how many there
/// are in all; `None` from a daemon older than TXS.
fn read_txs(dir: &std::fs::File) -> Option<(Vec<wire::TxInfo>, u32)> {
    let t = wire::Txs::decode(&ask::<{ wire::Txs::SIZE }>(dir, wire::TXS).ok()?);
    Some((t.txs[..(t.count as usize).min(wire::TXS_MAX)].to_vec(), t.total))
}

/// A fault of the mount: why, and its [`wire::Fault::state`]; `None` while
/// healthy (or from a daemon older than FAULT).
type FaultState = (String, u32);

fn read_fault(dir: &std::fs::File) -> Option<FaultState> {
    let f = wire::Fault::decode(&ask::<{ wire::Fault::SIZE }>(dir, wire::FAULT).ok()?);
    if f.state == wire::FAULT_NONE {
        return None;
    }
    let why = String::from_utf8_lossy(&f.why.0[..(f.len as usize).min(wire::FAULT_WHY)]).into_owned();
    Some((why, f.state))
}

/// A fault in words: what still works, and what to do.
fn fault_text(why: &str, state: u32) -> String {
    if state == wire::FAULT_RETRIED {
        return format!(
            "FAULT: {why}; it is retried, and writes, commits and reads go on meanwhile \
             (the journal grows until it succeeds)"
        );
    }
    let serving =
        if state == wire::FAULT_READS_GO_ON { "plain reads are served" } else { "every request fails with EIO" };
    format!(
        "FAULT: nothing is acknowledged (no write, commit or sync) since: {why}; {serving}. \
         Unmount and mount again: recovery finishes what failed"
    )
}

fn kind_name(kind: u32) -> &'static str {
    match kind & !wire::TX_DOOMED {
        wire::TX_THREAD => "thread",
        wire::TX_RUN => "run",
        _ => "?",
    }
}

/// The transactions as JSON objects.
fn txs_json(txs: &[wire::TxInfo]) -> serde_json::Value {
    use serde_json::json;
    txs.iter()
        .map(|t| {
            json!({
                "tx": t.tx, "pid": t.pid, "uid": t.uid, "kind": kind_name(t.kind),
                "age_s": t.age_ms as f64 / 1000.0, "bytes": t.bytes, "reads": t.reads, "mem": t.mem, "paths": t.paths,
                "doomed": t.kind & wire::TX_DOOMED != 0,
            })
        })
        .collect()
}

/// The transactions as a table, two spaces in.
fn txs_text(txs: &[wire::TxInfo], total: u32) -> String {
    if txs.is_empty() {
        return "  no live transactions\n".into();
    }
    let mut s = format!(
        "  live transactions{}:\n",
        if total as usize > txs.len() { format!(" (oldest {} of {total})", txs.len()) } else { String::new() }
    );
    s += &format!(
        "    {:<8} {:>8} {:>6} {:<6} {:>9} {:>8} {:>10} {:>8} {:>10}\n",
        "TX", "PID", "UID", "KIND", "AGE", "PATHS", "BYTES", "READS", "MEM"
    );
    for t in txs {
        let doomed = if t.kind & wire::TX_DOOMED != 0 { "  (doomed: can only abort)" } else { "" };
        s += &format!(
            "    {:<8} {:>8} {:>6} {:<6} {:>8.1}s {:>8} {:>10} {:>8} {:>10}{doomed}\n",
            format!("tx#{}", t.tx),
            t.pid,
            t.uid,
            kind_name(t.kind),
            t.age_ms as f64 / 1000.0,
            t.paths,
            human(t.bytes),
            t.reads,
            human(t.mem)
        );
    }
    s
}

pub fn status(point: &Path, json: bool, watch: Option<f64>) -> Result<(), String> {
    match print_status(point, json, watch) {
        // A reader that has seen enough (`txfs status M | head -1`).
        Err(Failure::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(Failure::Io(e)) => Err(format!("stdout: {e}")),
        Err(Failure::Other(e)) => Err(e),
        Ok(()) => Ok(()),
    }
}

enum Failure {
    Io(std::io::Error),
    Other(String),
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::Io(e)
    }
}

impl From<String> for Failure {
    fn from(e: String) -> Failure {
        Failure::Other(e)
    }
}

/// Seconds since the epoch, and the time of day in UTC (`HH:MM:SS`).
fn now() -> (f64, String) {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let s = t.as_secs() % 86400;
    (t.as_secs_f64(), format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60))
}

fn json_line(
    vals: &[(&'static str, u64)],
    txs: Option<&[wire::TxInfo]>,
    fault: Option<&FaultState>,
    time: Option<f64>,
) -> String {
    let mut obj: serde_json::Map<String, serde_json::Value> =
        vals.iter().map(|(n, v)| (n.to_string(), serde_json::Value::from(*v))).collect();
    obj.insert(
        "fault".into(),
        fault.map_or(serde_json::Value::Null, |(why, state)| {
            serde_json::json!({
                "why": why,
                "reads_go_on": *state != wire::FAULT_ALL,
                "acknowledged": *state == wire::FAULT_RETRIED,
            })
        }),
    );
    if let Some(txs) = txs {
        obj.insert("transactions".into(), txs_json(txs));
    }
    if let Some(t) = time {
        obj.insert("time".into(), serde_json::Value::from((t * 1000.0).round() / 1000.0));
    }
    serde_json::Value::Object(obj).to_string()
}

fn print_status(point: &Path, json: bool, watch: Option<f64>) -> Result<(), Failure> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let dir = std::fs::File::open(point).map_err(|e| format!("{}: {e}", point.display()))?;
    let vals = read_status(&dir, point)?;
    let mut fault = read_fault(&dir);
    if json {
        // With --watch, one object a line (NDJSON), each with its time.
        let txs = read_txs(&dir);
        let line = json_line(&vals, txs.as_ref().map(|t| &t.0[..]), fault.as_ref(), watch.map(|_| now().0));
        writeln!(out, "{line}")?;
    } else if let (Some((why, state)), true) = (&fault, watch.is_some()) {
        writeln!(out, "{}", fault_text(why, *state))?;
    } else if watch.is_none() {
        writeln!(out, "{}", point.display())?;
        let width = vals.iter().map(|(n, _)| n.len()).max().unwrap_or(0) + 2;
        for (n, v) in &vals {
            let unit = if n.contains("bytes") || n.starts_with("checkpoint_") {
                format!("  ({})", human(*v))
            } else {
                String::new()
            };
            writeln!(out, "  {n:<width$}{v}{unit}")?;
        }
        if let Some((txs, total)) = read_txs(&dir) {
            write!(out, "{}", txs_text(&txs, total))?;
        }
        if let Some((why, state)) = &fault {
            writeln!(out, "  {}", fault_text(why, *state))?;
        }
    }
    out.flush()?;
    let Some(every) = watch else {
        return match fault {
            Some(_) => Err(format!("{}: the mount has a fault", point.display()).into()),
            None => Ok(()),
        };
    };
    let every = Duration::from_secs_f64(every.max(0.05));
    if !json {
        writeln!(
            out,
            "{:<8} {:>10} {:>9} {:>8} {:>9} {:>5} {:>11} {:>11}",
            "UTC", "commits/s", "aborts/s", "confl/s", "syncs/s", "live", "ckpt_lag", "checkpoints"
        )?;
        out.flush()?;
    }
    let mut prev = vals;
    loop {
        std::thread::sleep(every);
        let now_vals = read_status(&dir, point)?;
        let (t, clock) = now();
        let now_fault = read_fault(&dir);
        if json {
            let txs = read_txs(&dir);
            writeln!(out, "{}", json_line(&now_vals, txs.as_ref().map(|t| &t.0[..]), now_fault.as_ref(), Some(t)))?;
        } else {
            if let (Some((why, state)), None) = (&now_fault, &fault) {
                writeln!(out, "{clock:<8} {}", fault_text(why, *state))?;
            }
            let rate = |i: usize| (now_vals[i].1.saturating_sub(prev[i].1)) as f64 / every.as_secs_f64();
            writeln!(
                out,
                "{clock:<8} {:>10.0} {:>9.0} {:>8.0} {:>9.0} {:>5} {:>11} {:>11}",
                rate(0),
                rate(1),
                rate(2),
                rate(5),
                now_vals[3].1,
                human(now_vals[8].1),
                now_vals[6].1
            )?;
        }
        out.flush()?;
        prev = now_vals;
        fault = now_fault;
    }
}
