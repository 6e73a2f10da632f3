//! Stalls and hangs of the FUSE-over-io_uring transport
//! (vendor/fuser/src/uring.rs): deferred replies that pin ring entries
//! while page faults or write-back need them, a ring that cannot start,
//! interrupts of requests that came over the ring. Each test reproduces a
//! defect found reviewing the transport.

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn uring_enabled() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|v| v.trim() == "Y")
}

fn pin_self(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
    }
}

fn ring_thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("fuser-ring-")))
                .count()
        })
        .unwrap_or(0)
}

const FILE_LEN: usize = 1 << 20;

/// Maps the files (argv[2:]) read-only on CPU argv[1] and touches every
/// page, one '.' per pass, until its stdin ends (see [`STOP`]).
const READER: &str = r#"
import mmap, os, select, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
maps = []
for p in sys.argv[2:]:
    f = open(p, 'rb')
    maps.append((f, mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ)))
n = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    for _, m in maps:
        for i in range(0, len(m), 4096):
            n += m[i]
    sys.stdout.write('.')
    sys.stdout.flush()
"#;

/// Maps the files (argv[1:]) shared and writable and writes into every
/// page, one '.' per pass, until its stdin ends (see [`STOP`]).
const DIRTIER: &str = r#"
import mmap, os, select, sys
maps = []
for p in sys.argv[1:]:
    f = open(p, 'r+b')
    maps.append((f, mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)))
n = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    n = (n + 1) % 256
    for _, m in maps:
        for i in range(0, len(m), 4096):
            m[i] = n
    sys.stdout.write('.')
    sys.stdout.flush()
"#;

/// The end of a mapping script, appended to it: unmaps and closes every
/// file itself before it exits. A killed mapper's mappings go away when its
/// memory is torn down, which need not happen before it is reaped: the
/// daemon reading its /proc/PID/stat holds that memory for a moment, and
/// an unmount right after the reap then fails with EBUSY. (That is how
/// `deferred_replies_do_not_starve_page_faults_of_ring_entries` failed a
/// fresh-clone CI run on a loaded machine.)
const STOP: &str = r#"
for f, m in maps:
    m.close()
    f.close()
"#;

/// Runs a mapping script (a separate process: an aborted connection makes
/// its mapping SIGBUS) and counts its passes; [`stop_mapper`] ends it.
fn spawn_mapper(script: &str, args: &[String]) -> (std::process::Child, Arc<AtomicU64>) {
    let mut child = std::process::Command::new(python())
        .arg("-c")
        .arg(format!("{script}{STOP}"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let passes = Arc::new(AtomicU64::new(0));
    let (mut out, counter) = (child.stdout.take().unwrap(), passes.clone());
    std::thread::spawn(move || {
        let mut b = [0u8; 64];
        while let Ok(n) = std::io::Read::read(&mut out, &mut b) {
            if n == 0 {
                break;
            }
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    });
    (child, passes)
}

/// Asks a mapper to stop (its stdin ends): it unmaps and closes its files
/// and exits. False if it did not within [`STALL`] (it is killed then).
fn stop_mapper(child: &mut std::process::Child) -> bool {
    drop(child.stdin.take());
    wait_timeout(child, STALL).is_some_and(|s| s.success())
}

/// How long nothing may move before a workload counts as deadlocked. A
/// deadlock never moves again; a loaded machine can pause a healthy
/// workload for seconds, so this is no speed limit.
const STALL: Duration = Duration::from_secs(60);

/// Each of these tests restarts its mount and runs workloads for up to a
/// minute: the harness's default watchdog would cut a slow machine's run.
const WATCHDOG: Duration = Duration::from_secs(600);

/// Samples the counters every 200 ms for `secs` seconds, and then until
/// every one of them has moved once more (a stall that began just before
/// the end is seen too): false as soon as one of them has not moved for
/// [`STALL`].
fn keeps_moving(secs: u64, sample: impl Fn() -> Vec<u64>) -> bool {
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut last: Vec<(u64, Instant)> = sample().into_iter().map(|v| (v, Instant::now())).collect();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        for (l, now) in last.iter_mut().zip(sample()) {
            if now != l.0 {
                *l = (now, Instant::now());
            }
        }
        if last.iter().any(|l| l.1.elapsed() > STALL) {
            return false;
        }
        if Instant::now() >= end && last.iter().all(|l| l.1 >= end) {
            return true;
        }
    }
}

/// The daemon's kernel stacks, then its connection aborted, so that a
/// stalled workload can be cleaned up.
fn report_stall(m: &Mount) {
    eprintln!("no progress for {STALL:?}; daemon threads:\n{}", kernel_stacks(m.daemon_pid().unwrap()));
    m.abort_connection();
}

/// `workload(m, secs)` on /dev/fuse (the control, 8 s), then over io_uring
/// with the default threads (20 s); both must keep moving.
fn control_then_ring(workload: impl Fn(&Mount, u64) -> (bool, u64, u64), what: &str) {
    let mut m = Mount::with_watchdog(WATCHDOG);
    m.restart_with_env("TXFS_URING_THREADS", "0");
    let (ok_dev, w, f) = workload(&m, 8);
    eprintln!("/dev/fuse: progress={ok_dev} writes={w} mapping passes={f}");
    assert!(ok_dev, "the control (/dev/fuse) deadlocked too");
    m.umount_clean();
    m.clear_env();
    m.start();
    let pid = m.daemon_pid().unwrap();
    assert!(wait_until(STALL, || ring_thread_count(pid) > 0), "no ring thread started");
    let (ok_ring, w, f) = workload(&m, 20);
    eprintln!("io_uring: progress={ok_ring} writes={w} mapping passes={f}");
    if ok_ring {
        m.umount_clean();
        // Deferred replies gave ring threads more than one entry; at
        // unmount each thread still reaps every command before freeing
        // them (a thread that dropped the rest of a batch of completions
        // timed out and leaked its entries).
        assert!(!m.log_text().contains("buffers are leaked"), "a ring thread leaked its entries:\n{}", m.log_text());
    } else {
        m.kill_daemon();
    }
    assert!(ok_ring, "{what} deadlocked over io_uring");
}

/// `writers` threads each writing its own mmapped file and a reader
/// page-faulting all those files, all on one CPU, for `secs` seconds.
/// Returns whether everything kept making progress (false: nothing moved
/// for [`STALL`]), and the writes and mapping passes done.
fn writers_and_faults_on_one_cpu(m: &Mount, writers: usize, secs: u64) -> (bool, u64, u64) {
    let paths: Vec<PathBuf> = (0..writers).map(|i| m.path(format!("mapped{i}"))).collect();
    for p in &paths {
        std::fs::write(p, vec![7u8; FILE_LEN]).unwrap();
    }
    let cpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) - 1;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    // The reader maps the files and touches every page; the writers' plain
    // writes make the daemon drop a file's pages (inval_inode, on its
    // invalidation thread) before answering, so the reader keeps faulting
    // them back in (READs sent with the folios locked).
    let args: Vec<String> =
        std::iter::once(cpu.to_string()).chain(paths.iter().map(|p| p.display().to_string())).collect();
    let (mut reader, faults) = spawn_mapper(READER, &args);
    for (w, p) in paths.iter().enumerate() {
        let (p, stop, writes) = (p.clone(), stop.clone(), writes.clone());
        hs.push(std::thread::spawn(move || {
            pin_self(cpu);
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            let buf = vec![w as u8; 512];
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let off = (i * 4096) % FILE_LEN as u64;
                if f.write_all_at(&buf, off).is_err() {
                    break; // the connection was aborted below
                }
                writes.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            0
        }));
    }
    let mut alive = keeps_moving(secs, || vec![writes.load(Ordering::Relaxed) + faults.load(Ordering::Relaxed)]);
    stop.store(true, Ordering::Relaxed);
    if alive && !stop_mapper(&mut reader) {
        eprintln!("the reader did not stop within {STALL:?}");
        alive = false;
    }
    if !alive {
        eprintln!(
            "no progress for {STALL:?} ({} writes, {} mapping passes); daemon threads:\n{}",
            writes.load(Ordering::Relaxed),
            faults.load(Ordering::Relaxed),
            kernel_stacks(m.daemon_pid().unwrap())
        );
        // Does killing the daemon get everyone out? (A thread stuck on a
        // folio lock cannot die, so /dev/fuse is never released.)
        let pid = m.daemon_pid().unwrap();
        m.sigkill();
        let died = wait_until(Duration::from_secs(5), || {
            std::fs::read_dir(format!("/proc/{pid}/task")).map_or(true, |d| {
                d.flatten().all(|t| {
                    std::fs::read_to_string(t.path().join("stat"))
                        .map_or(true, |s| s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) == Some("Z"))
                })
            })
        });
        eprintln!("SIGKILLed daemon exited within 5 s: {died}; its threads now:\n{}", kernel_stacks(pid));
        // Unstick everyone so the test can clean up.
        m.abort_connection();
        let _ = reader.kill();
        let _ = reader.wait();
    }
    for h in hs {
        let _ = h.join();
    }
    (alive, writes.load(Ordering::Relaxed), faults.load(Ordering::Relaxed))
}

/// `committers` threads on the last CPU, each committing (durably) a
/// transaction that changed its own mmapped file, a plain writer on CPU 0
/// changing another mmapped file, and a reader on the last CPU
/// page-faulting all of them, for `secs` seconds. Same result as
/// [`writers_and_faults_on_one_cpu`].
fn commits_and_faults_on_one_cpu(m: &Mount, committers: usize, secs: u64) -> (bool, u64, u64) {
    let mut paths: Vec<PathBuf> = (0..committers).map(|i| m.path(format!("committed{i}"))).collect();
    paths.push(m.path("plain"));
    for p in &paths {
        std::fs::write(p, vec![7u8; FILE_LEN]).unwrap();
    }
    let cpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) - 1;
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let args: Vec<String> =
        std::iter::once(cpu.to_string()).chain(paths.iter().map(|p| p.display().to_string())).collect();
    let (mut reader, faults) = spawn_mapper(READER, &args);
    let mut alive = true;
    std::thread::scope(|sc| {
        for (k, p) in paths.iter().enumerate().take(committers) {
            let (stop, writes) = (&stop, &writes);
            sc.spawn(move || {
                pin_self(cpu);
                let buf = vec![k as u8; 256 << 10];
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if m.begin().is_err() {
                        break;
                    }
                    let ok = std::fs::OpenOptions::new()
                        .write(true)
                        .open(p)
                        .and_then(|f| f.write_all_at(&buf, (i * 4096) % (FILE_LEN as u64 / 2)))
                        .is_ok();
                    if !ok || m.commit().is_err() {
                        break;
                    }
                    writes.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
        {
            let (p, stop, writes) = (paths.last().unwrap(), &stop, &writes);
            sc.spawn(move || {
                pin_self(0);
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if f.write_all_at(b"plain", (i * 4096) % FILE_LEN as u64).is_err() {
                        break;
                    }
                    writes.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
        alive = keeps_moving(secs, || vec![writes.load(Ordering::Relaxed) + faults.load(Ordering::Relaxed)]);
        stop.store(true, Ordering::Relaxed);
        if alive && !stop_mapper(&mut reader) {
            eprintln!("the reader did not stop within {STALL:?}");
            alive = false;
        }
        if !alive {
            report_stall(m);
            let _ = reader.kill();
            let _ = reader.wait();
        }
    });
    (alive, writes.load(Ordering::Relaxed), faults.load(Ordering::Relaxed))
}

/// Story: as below, with the brief's "group commit with 8 committers": 8
/// durable commits on one CPU whose files are mapped hold that CPU's 8
/// entries until the invalidation thread has dropped their pages; a plain
/// write from the other CPU has that thread drop the pages of a file the
/// reader is faulting in on the first CPU.
#[test]
fn committers_on_one_cpu_do_not_starve_page_faults_of_ring_entries() {
    if !uring_enabled() {
        eprintln!("enable_uring is off: nothing to check");
        return;
    }
    control_then_ring(|m, secs| commits_and_faults_on_one_cpu(m, 8, secs), "commits and page faults on one CPU");
}

/// `per_cpu` plain writers on every CPU, each writing its own file, and one
/// process writing into every page of all those files through shared
/// writable mappings, for `secs` seconds. Same result as
/// [`writers_and_faults_on_one_cpu`].
fn writers_and_mmap_writer(m: &Mount, per_cpu: usize, secs: u64) -> (bool, u64, u64) {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let paths: Vec<PathBuf> = (0..per_cpu * cpus).map(|i| m.path(format!("dirtied{i}"))).collect();
    for p in &paths {
        std::fs::write(p, vec![7u8; FILE_LEN]).unwrap();
    }
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let args: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let (mut dirtier, passes) = spawn_mapper(DIRTIER, &args);
    let mut alive = true;
    std::thread::scope(|sc| {
        for (k, p) in paths.iter().enumerate() {
            let (stop, writes) = (&stop, &writes);
            sc.spawn(move || {
                pin_self(k % cpus);
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if f.write_all_at(b"plain", (i * 4096 + 100) % FILE_LEN as u64).is_err() {
                        break;
                    }
                    writes.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
        // Both must keep moving: the writers and the mapping's writer.
        alive = keeps_moving(secs, || vec![writes.load(Ordering::Relaxed), passes.load(Ordering::Relaxed)]);
        stop.store(true, Ordering::Relaxed);
        if alive && !stop_mapper(&mut dirtier) {
            eprintln!("the mapping's writer did not stop within {STALL:?}");
            alive = false;
        }
        if !alive {
            report_stall(m);
            let _ = dirtier.kill();
            let _ = dirtier.wait();
        }
    });
    (alive, writes.load(Ordering::Relaxed), passes.load(Ordering::Relaxed))
}

/// Story: the same, without page faults: dropping the pages of a file with
/// dirty pages (written through a shared mapping) writes them back first
/// (launder: a WRITE sent by the invalidation thread, on its own CPU's
/// queue) and waits for write-backs in flight. With 8 deferred replies on
/// that CPU, the invalidation thread waits for an entry that only it can
/// free.
#[test]
fn deferred_replies_do_not_starve_write_back_of_ring_entries() {
    if !uring_enabled() {
        eprintln!("enable_uring is off: nothing to check");
        return;
    }
    control_then_ring(|m, secs| writers_and_mmap_writer(m, 10, secs), "plain writers and a mapping's writer");
}

/// Story (fuse/mod.rs module docs): "Invalidation never runs on a request thread:
/// inval_inode locks the file's folios, and a page fault holds one while its
/// READ waits for a free worker. A dedicated thread invalidates, then sends
/// the reply." With /dev/fuse, handing the reply to that thread frees the
/// worker; a ring thread instead waits for the reply before it can fetch the
/// next request, so a deferred reply pins its ring entry. With 8 writers on
/// one CPU, every entry of that CPU's queue waits for the invalidation
/// thread, which waits for a folio locked by a fault whose READ waits for an
/// entry of that same queue: a deadlock.
#[test]
fn deferred_replies_do_not_starve_page_faults_of_ring_entries() {
    if !uring_enabled() {
        eprintln!("enable_uring is off: nothing to check");
        return;
    }
    let mut m = Mount::with_watchdog(WATCHDOG);
    // TXFS_URING_THREADS: 0 is the control (/dev/fuse only); with 1 entry
    // per queue one deferred reply is enough; 8 (the default) needs 8
    // deferred replies on one CPU at the moment a fault's READ is queued.
    let mut results = Vec::new();
    for threads in ["0", "1", "8"] {
        m.clear_env();
        m.restart_with_env("TXFS_URING_THREADS", threads);
        let pid = m.daemon_pid().unwrap();
        if threads != "0" {
            assert!(wait_until(STALL, || ring_thread_count(pid) > 0), "no ring thread started");
        }
        let (ok, w, f) = writers_and_faults_on_one_cpu(&m, 12, 10);
        eprintln!("TXFS_URING_THREADS={threads}: progress={ok} writes={w} mapping passes={f}");
        results.push((threads, ok));
        if !ok {
            m.kill_daemon();
            m.start();
        }
    }
    m.umount_clean();
    for (threads, ok) in results {
        assert!(ok, "TXFS_URING_THREADS={threads}: writers and page faults on one CPU deadlocked");
    }
}

/// The FUSE connection number of a mount point (minor of its st_dev).
fn conn_of(point: &std::path::Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let mp = f.nth(1)?;
        (std::path::Path::new(mp) == point).then(|| dev.split_once(':')?.1.parse().ok()).flatten()
    })
}

/// Runs `stat` on `p` in a child; `Some(success)` if it ended within `t`.
fn stat_within(p: &std::path::Path, t: Duration) -> Option<bool> {
    let mut c = std::process::Command::new("stat")
        .arg(p)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_timeout(&mut c, t).map(|s| s.success())
}

/// `txfs mount` with `RLIMIT_NOFILE` lowered to `nofile` (as on a machine
/// with many possible CPUs: 8 rings per CPU, so 128 possible CPUs need 1024
/// io_uring descriptors, the default soft limit) and `env`; whether a stat
/// of the mount root answered (within [`STALL`]: a hang). Always cleans up.
fn stat_answers_with_nofile(nofile: u32, env: &[(&str, &str)]) -> (bool, String) {
    let tmp = tempfile::Builder::new().prefix(PREFIX).tempdir().unwrap();
    let (b, mnt) = (tmp.path().join("b"), tmp.path().join("m"));
    std::fs::create_dir(&b).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let log = tmp.path().join("log");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -n {nofile} && exec {TXFS} mount \"$0\" \"$1\" -f 2>\"$2\""))
        .arg(&b)
        .arg(&mnt)
        .arg(&log)
        .env("TXFS_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut daemon = cmd.spawn().unwrap();
    assert!(wait_until(STALL, || is_mounted(&mnt)), "not mounted");
    let conn = conn_of(&mnt).unwrap();
    let answered = stat_within(&mnt, STALL) == Some(true);
    let rings = std::fs::read_dir(format!("/proc/{}/task", daemon.id()))
        .map(|d| {
            d.flatten()
                .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("fuser-ring-")))
                .count()
        })
        .unwrap_or(0);
    // `txfs umount` itself stats the mount point: give it as long.
    let mut um = std::process::Command::new(TXFS).arg("umount").arg(&mnt).spawn().unwrap();
    let um_ok = wait_timeout(&mut um, STALL).is_some_and(|s| s.success());
    if !um_ok {
        abort_fuse_conn(conn);
        let _ = std::process::Command::new("umount").arg("-l").arg(&mnt).status();
    }
    if wait_timeout(&mut daemon, STALL).is_none() {
        abort_fuse_conn(conn);
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    (answered, format!("ring threads alive: {rings}; txfs umount worked: {um_ok}; log:\n{text}"))
}

/// Story: uring.rs says everything "before every queue has an entry" arrives
/// on /dev/fuse, and the session falls back to /dev/fuse when the ring
/// threads cannot start. But once FUSE_OVER_IO_URING is granted at INIT,
/// the kernel (fuse_block_alloc) holds every request until every queue has
/// an entry. A ring that can never be set up (io_uring_setup refused by a
/// seccomp profile or kernel.io_uring_disabled, EMFILE, a thread that cannot
/// be spawned) leaves the mount hanging forever, `txfs umount` included.
#[test]
fn a_ring_that_cannot_start_does_not_hang_the_mount() {
    if !uring_enabled() {
        eprintln!("enable_uring is off: nothing to check");
        return;
    }
    let (ok, diag) = stat_answers_with_nofile(16, &[("TXFS_URING_THREADS", "0")]);
    assert!(ok, "control (/dev/fuse) with 16 descriptors failed: {diag}");
    let (ok, diag) = stat_answers_with_nofile(16, &[]);
    assert!(ok, "with io_uring and too few descriptors for every queue's ring, stat of the mount hangs; {diag}");
}

/// A process that commits big transactions while its thread keeps being
/// signalled (a handler, no SA_RESTART): the kernel sends FUSE_INTERRUPT for
/// a request already in the daemon.
const SIGNALLED_COMMITS: &str = r#"
import os, sys, fcntl, struct, signal, threading, time
M = sys.argv[1]
signal.signal(signal.SIGUSR1, lambda *a: None)
fd = os.open(M, os.O_RDONLY)
main = threading.get_ident()
for round in range(3):
    fcntl.ioctl(fd, 0x4008e701, struct.pack('II', 0, 0))  # begin
    f = os.open(M + '/big%d' % round, os.O_CREAT | os.O_WRONLY)
    for i in range(100):
        os.write(f, b'x' * (1 << 20))
    os.close(f)
    done = False
    def k():
        while not done:
            time.sleep(0.001)
            signal.pthread_kill(main, signal.SIGUSR1)
    t = threading.Thread(target=k); t.start()
    fcntl.ioctl(fd, 0x4008e702, struct.pack('II', 0, 0))  # commit
    done = True; t.join()
"#;

/// Story: FUSE_INTERRUPT still arrives on /dev/fuse, where fuser answers
/// ENOSYS (so that the kernel stops sending them, `fc->no_interrupt`). For a
/// request that came over the ring the kernel cannot find the request that
/// answer names in /dev/fuse's processing list: the write fails with ENOENT,
/// fuser logs an ERROR, and the kernel never learns to stop interrupting.
#[test]
fn interrupting_a_ring_request_logs_no_errors() {
    if !uring_enabled() {
        eprintln!("enable_uring is off: nothing to check");
        return;
    }
    let mut m = Mount::new();
    let mut errors = Vec::new();
    for threads in ["0", "8"] {
        m.restart_with_env("TXFS_URING_THREADS", threads);
        let before = m.log_text().len();
        let out = std::process::Command::new(python()).arg("-c").arg(SIGNALLED_COMMITS).arg(m.mnt()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let log = m.log_text()[before..].to_string();
        let n = log.lines().filter(|l| l.contains("Failed to send FUSE reply")).count();
        eprintln!("TXFS_URING_THREADS={threads}: {n} failed replies");
        errors.push((threads, n, log));
    }
    m.umount_clean();
    for (threads, n, log) in errors {
        assert_eq!(n, 0, "TXFS_URING_THREADS={threads}: failed replies in the log:\n{log}");
    }
}
