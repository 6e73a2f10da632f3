//! `txfs umount`: unmount, then wait until the daemon has checkpointed
//! and exited, so that BACKING holds the committed state as plain files.
//!
//! A mount kept busy only by the descriptors libtxfs keeps between
//! transactions ([`super::busy`]) is detached and its connection ended;
//! anything else keeping it busy is named in the error.

use super::busy;
use super::status::read_status;
use crate::attribution::mountinfo;
use std::path::Path;
use std::time::{Duration, Instant};

pub fn umount(point: &Path) -> Result<(), String> {
    let m = mountinfo::find(point).ok_or_else(|| format!("{}: not a txfs mount", point.display()))?;
    let c = std::ffi::CString::new(m.point.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // The mount's device; its minor is the FUSE connection's number.
    let id = busy::ident(&m.point);
    let conn = id.map(|i| i.minor);
    let mut detached = false;
    if let Err(err) = umount_settling(&c, &m.point, id) {
        // Not root: fusermount3 may unmount what we may not.
        let done = err.raw_os_error() != Some(libc::EBUSY) && fusermount3(&["-u"], &m.point);
        if !done {
            let busy = matches!(err.raw_os_error(), Some(libc::EBUSY) | Some(libc::EPERM));
            if let (true, Some(id)) = (busy, id) {
                detached = detach_if_only_kept(&m.point, id, &c)?;
            }
            if !detached {
                return Err(format!("umount {}: {err}", m.point.display()));
            }
        }
    }
    // The daemon checkpoints when the kernel ends the session. A non-lazy
    // unmount leaves nobody who could still use the connection, yet in
    // about one run of ten (tests/durability.rs, kernel 6.18, with entries
    // cached) the kernel kept it — and the daemon waiting — with no mount,
    // no open file and no request left. End it then, as `fusermount -u`
    // of a dead mount would: the daemon still checkpoints on its way out.
    // A mount detached because only libtxfs's kept descriptors held it is
    // ended at once (they would keep it alive for good) — unless something
    // else got hold of it meanwhile: then it ends when they let go.
    let abort_now = detached && id.is_some_and(|id| nothing_else_after_detach(&m.point, id));
    if detached && !abort_now {
        return Ok(());
    }
    if let Some(conn) = conn {
        let dir = fusectl_dir(conn);
        let t0 = Instant::now();
        while !abort_now && dir.exists() && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if abort_now {
            if std::fs::write(dir.join("abort"), "1").is_err() {
                eprintln!(
                    "txfs umount: detached {}; could not end FUSE connection {conn} (fusectl): the daemon \
                     checkpoints and exits when the processes holding libtxfs descriptors exit",
                    m.point.display()
                );
                return Ok(());
            }
        } else if dir.exists() {
            eprintln!("txfs umount: the kernel kept FUSE connection {conn} after the unmount: aborting it");
            let _ = std::fs::write(dir.join("abort"), "1");
        }
    }
    if let Some(backing) = m.backing() {
        wait_for_daemon(&backing, &m.point)?;
        // The daemon leaves this when its final checkpoint failed: the
        // commits are in the journal, but BACKING does not hold them as
        // plain files.
        let failed = backing.join(txfs_engine::checkpoint_failed_path());
        if let Ok(why) = std::fs::read_to_string(&failed) {
            return Err(format!(
                "unmounted {}, but the daemon's final checkpoint failed ({}): BACKING does not hold the \
                 committed state as plain files yet; the journal does. Run `txfs recover {}` (see {})",
                m.point.display(),
                why.trim(),
                backing.display(),
                backing.join(".txfs/daemon.log").display()
            ));
        }
    }
    Ok(())
}

/// Waits until no process holds BACKING/.txfs/lock (the daemon drops it
/// once its final checkpoint is done; a pid in daemon.pid may be stale or
/// reused, the lock is not). Gives up, with an error, after 600 s.
fn wait_for_daemon(backing: &Path, point: &Path) -> Result<(), String> {
    #[allow(unused_mut)]
    let mut limit = Duration::from_secs(600);
    // For tests/umount.rs only: a shorter wait.
    #[cfg(any(feature = "testing", debug_assertions))]
    if let Some(s) = std::env::var("TXFS_TEST_UMOUNT_WAIT_S").ok().and_then(|v| v.parse().ok()) {
        limit = Duration::from_secs(s);
    }
    let lock = backing.join(".txfs/lock");
    let t0 = Instant::now();
    let mut said = false;
    loop {
        let holders = super::lock_holders(&lock);
        if holders.is_empty() {
            return Ok(());
        }
        let who = holders.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
        if t0.elapsed() >= limit {
            return Err(format!(
                "unmounted {}, but gave up after {} s waiting for the daemon (pid {who}) to finish its final \
                 checkpoint: it still holds {} (see {})",
                point.display(),
                limit.as_secs(),
                lock.display(),
                backing.join(".txfs/daemon.log").display()
            ));
        }
        if !said && t0.elapsed() > Duration::from_secs(5) {
            eprintln!("txfs umount: waiting for the daemon (pid {who}) to finish its final checkpoint");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `umount2(point)`; a busy answer while no process visibly holds the
/// mount is tried again for up to 2 s. A holder that has just closed its
/// last descriptor on the mount, or exited, can keep it busy a moment
/// longer: the kernel releases files closed by an exiting process, an
/// io_uring or a kernel worker asynchronously. A holder that shows (a
/// descriptor, working directory or mapping in /proc, another mount of the
/// same connection) is reported at once, as before.
fn umount_settling(c: &std::ffi::CStr, point: &Path, id: Option<busy::Ident>) -> std::io::Result<()> {
    let t0 = Instant::now();
    loop {
        // SAFETY: valid C string.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        let settling = err.raw_os_error() == Some(libc::EBUSY)
            && t0.elapsed() < Duration::from_secs(2)
            && id.is_some_and(|id| busy::entangled_mounts(point, id).is_empty() && busy::scan(id).is_empty());
        if !settling {
            return Err(err);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `fusermount3 ARGS POINT` succeeded.
fn fusermount3(args: &[&str], point: &Path) -> bool {
    std::process::Command::new("fusermount3").args(args).arg(point).status().map(|s| s.success()).unwrap_or(false)
}

/// Live transactions of the mount, through `dir` (a descriptor of its root).
fn live_txs(dir: &std::fs::File, point: &Path) -> Result<u64, String> {
    Ok(read_status(dir, point)?.iter().find(|(n, _)| *n == "live_txs").map_or(0, |(_, v)| *v))
}

/// After a busy unmount: detaches the mount if descriptors libtxfs keeps
/// between transactions are all that hold it (busy.rs), no other mount
/// shares it and no transaction is live. Ok(false): not detached, nothing
/// to add to the busy error (holders we cannot see, e.g. in another mount
/// namespace). Err: refused, saying why.
fn detach_if_only_kept(point: &Path, id: busy::Ident, c: &std::ffi::CStr) -> Result<bool, String> {
    let refuse = |why: &[String]| {
        let more = if why.len() > 8 { format!(" and {} more", why.len() - 8) } else { String::new() };
        Err(format!("umount {}: busy ({}{more})", point.display(), why[..why.len().min(8)].join("; ")))
    };
    let tangled = busy::entangled_mounts(point, id);
    if !tangled.is_empty() {
        return refuse(&tangled);
    }
    let h = busy::scan(id);
    if !h.other.is_empty() {
        return refuse(&h.other);
    }
    if h.kept.is_empty() {
        return Ok(false);
    }
    // A thread inside a transaction holds its (marked) descriptor too.
    // Plain operations run as short transactions: look a few times.
    let dir = std::fs::File::open(point).map_err(|e| format!("{}: {e}", point.display()))?;
    let mut live = 0;
    for _ in 0..20 {
        live = live_txs(&dir, point)?;
        if live == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    drop(dir);
    if live > 0 {
        return refuse(&[format!(
            "{live} live transaction(s): their threads hold the mount until they commit or abort"
        )]);
    }
    // For tests/umount.rs only: a window in which others get hold of it.
    #[cfg(any(feature = "testing", debug_assertions))]
    if let Some(ms) = std::env::var("TXFS_TEST_UMOUNT_PAUSE_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(Duration::from_millis(ms));
    }
    // SAFETY: valid C string.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if r != 0 && !fusermount3(&["-u", "-z"], point) {
        return Err(format!("umount {} (detach): {}", point.display(), std::io::Error::last_os_error()));
    }
    Ok(true)
}

/// After the detach: whether ending the connection now cuts off nobody
/// but idle libtxfs descriptors. Between the scan before the detach and
/// the detach, a process may have opened a file or begun a transaction;
/// after it, nothing new can reach the mount by a path (and libtxfs sees
/// the path's device change and does not use its kept descriptor), so a
/// second look settles it. Otherwise the detached mount lives on until its
/// holders let go, said on stderr.
fn nothing_else_after_detach(point: &Path, id: busy::Ident) -> bool {
    // Let path walks that began before the detach finish their open.
    std::thread::sleep(Duration::from_millis(50));
    let h = busy::scan(id);
    let mut why = h.other;
    if let Some(k) = h.kept.first() {
        // A kept descriptor reaches the detached mount: ask through it.
        match std::fs::File::open(k).map_err(|e| e.to_string()).and_then(|d| live_txs(&d, point)) {
            Ok(0) => {}
            Ok(n) => why.push(format!("{n} transaction(s) began meanwhile")),
            Err(e) => why.push(format!("its transactions could not be counted ({e})")),
        }
    }
    if why.is_empty() {
        return true;
    }
    eprintln!(
        "txfs umount: detached {}, but it is in use again ({}): the daemon checkpoints and exits when they let go",
        point.display(),
        why.join("; ")
    );
    false
}

/// FUSE connection `conn`'s directory in fusectl (its `abort` ends it),
/// mounting fusectl at /sys/fs/fuse/connections first if it is not (root
/// only; otherwise there is nothing to look at).
pub(super) fn fusectl_dir(conn: u32) -> std::path::PathBuf {
    let ctl = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(ctl).is_ok_and(|mut d| d.next().is_none()) {
        // SAFETY: constant C strings.
        unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    }
    ctl.join(conn.to_string())
}
