//! FUSE over io_uring (vendor/fuser/src/uring.rs): requests served by ring
//! threads on the requester's CPU, the request rebuilt from the kernel's
//! pieces, replies of every size written back, the threads gone at unmount.
//!
//! These tests need the fuse module's `enable_uring` (`.ci/run` sets it). On
//! a kernel without it they say so and check the `/dev/fuse` path instead.

mod common;

use common::*;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

fn uring_enabled() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|v| v.trim() == "Y")
}

/// (queue, CPU time in ns) of every ring thread of the daemon.
fn ring_threads(pid: u32) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let Some(rest) = comm.trim().strip_prefix("fuser-ring-") else { continue };
        let queue: usize = rest.split('.').next().unwrap().parse().unwrap();
        let sched = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        let ns: u64 = sched.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
        out.push((queue, ns));
    }
    out
}

fn per_queue(pid: u32) -> Vec<u64> {
    let threads = ring_threads(pid);
    let n = threads.iter().map(|t| t.0 + 1).max().unwrap_or(0);
    let mut q = vec![0u64; n];
    for (queue, ns) in threads {
        q[queue] += ns;
    }
    q
}

fn pin_self(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
    }
}

fn online_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Requests that reach the daemon every time: create, write, close, unlink.
fn churn(dir: &Path, n: usize) {
    for i in 0..n {
        let p = dir.join(format!("churn{i}"));
        std::fs::write(&p, b"x").unwrap();
        std::fs::remove_file(&p).unwrap();
    }
}

/// Story: the daemon was built with the ring but the kernel kept sending
/// everything to /dev/fuse (a flag not negotiated, a queue not registered)
/// and nobody noticed, because /dev/fuse still answers. Work done from each
/// CPU must be served by that CPU's ring threads.
#[test]
fn each_cpu_s_requests_are_served_by_its_own_ring_threads() {
    let m = Mount::new();
    let pid = m.daemon_pid().unwrap();
    if !uring_enabled() {
        eprintln!("enable_uring is off: checking that no ring thread exists");
        assert!(ring_threads(pid).is_empty());
        churn(m.mnt(), 50);
        return;
    }
    let cpus = online_cpus();
    // The ring threads start right after the mount shows up.
    let started = wait_until(Duration::from_secs(60), || {
        m.log_text().contains("requests arrive over io_uring") && per_queue(pid).len() >= cpus
    });
    assert!(started, "ring queues {:?} for {cpus} CPUs; log:\n{}", per_queue(pid), m.log_text());
    for cpu in 0..cpus {
        let m_path = m.mnt().to_path_buf();
        let before = per_queue(pid);
        std::thread::spawn(move || {
            pin_self(cpu);
            churn(&m_path, 400);
        })
        .join()
        .unwrap();
        let after = per_queue(pid);
        let grew: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        // Queue `cpu` did the work; the others at most a little (a request
        // may be queued from a CPU the requester was preempted onto).
        let own = grew[cpu];
        let others: u64 = grew.iter().sum::<u64>() - own;
        assert!(own > 0 && own > others, "work from CPU {cpu}: ring CPU time per queue grew {grew:?}");
    }
}

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Story: the ring hands the daemon a request in three pieces (header, the
/// operation's first argument, the rest); a wrong length for the middle one
/// shifts every byte of a WRITE, a reply written over a request still in use
/// garbles a READ. Writes and reads of every size class (small ones are
/// copied out of the ring, big ones rebuilt in place) must give back exactly
/// what a model holds, in and out of transactions.
#[test]
fn writes_and_reads_of_every_size_round_trip_exactly() {
    let m = Mount::new();
    let size = 6 << 20;
    let mut model = vec![0u8; size];
    let f = OpenOptions::new().create_new(true).read(true).write(true).open(m.path("f")).unwrap();
    f.set_len(size as u64).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let sizes = [1usize, 7, 4096, 65_535, 65_536, 65_537, 200_000, 1 << 20, (1 << 20) + 3, 3 << 20];
    for round in 0..3 {
        if round == 1 {
            m.begin().unwrap();
        }
        for &len in &sizes {
            let off = (xorshift(&mut seed) as usize) % (size - len);
            let data: Vec<u8> = (0..len).map(|_| xorshift(&mut seed) as u8).collect();
            f.write_all_at(&data, off as u64).unwrap();
            model[off..off + len].copy_from_slice(&data);
            // Read back around it with another size.
            let rlen = sizes[(xorshift(&mut seed) as usize) % sizes.len()].min(size);
            let roff = off.saturating_sub(rlen / 2).min(size - rlen);
            let mut got = vec![0u8; rlen];
            f.read_exact_at(&mut got, roff as u64).unwrap();
            assert!(got == model[roff..roff + rlen], "round {round}: read {rlen} at {roff} after write {len} at {off}");
        }
        if round == 1 {
            m.commit().unwrap();
        }
    }
    drop(f);
    // Through a fresh descriptor, with the page cache dropped, in one go.
    std::fs::write("/proc/sys/vm/drop_caches", "3").ok();
    let all = std::fs::read(m.path("f")).unwrap();
    assert!(all == model, "whole file differs from the model");
}

fn setxattr(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (p, n) = (CString::new(p.as_os_str().as_bytes()).unwrap(), CString::new(name).unwrap());
    // SAFETY: valid C strings and buffer.
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn getxattr(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let (p, n) = (CString::new(p.as_os_str().as_bytes()).unwrap(), CString::new(name).unwrap());
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: valid C strings and a buffer of its length.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// Story: operations whose first argument is empty (LOOKUP: just a name),
/// short (OPENDIR), or carries a name and a value after it (SETXATTR), and
/// replies that are large (a long listing, a 60 KiB attribute) or empty.
#[test]
fn names_listings_links_and_attributes_survive_the_ring() {
    let m = Mount::new();
    let long = "n".repeat(255);
    std::fs::create_dir(m.path("d")).unwrap();
    let mut names: Vec<String> = (0..600).map(|i| format!("entry-{i:04}-{}", "x".repeat(i % 200))).collect();
    for n in &names {
        File::create(m.path("d").join(n)).unwrap();
    }
    std::fs::write(m.path(&long), b"long").unwrap();
    std::os::unix::fs::symlink(&long, m.path("link")).unwrap();
    assert_eq!(std::fs::read_link(m.path("link")).unwrap(), Path::new(&long));
    assert_eq!(std::fs::read(m.path("link")).unwrap(), b"long");
    let value: Vec<u8> = (0..60_000u32).map(|i| (i * 7) as u8).collect();
    // Taken, or refused as the backing's own file system refuses it (the
    // engine asks it before accepting: ext4 without ea_inode says ENOSPC).
    let native = m.backing().parent().unwrap().join("native-xattr");
    std::fs::write(&native, b"").unwrap();
    let native_errno = setxattr(&native, "user.big", &value).err().and_then(|e| e.raw_os_error());
    match setxattr(&m.path(&long), "user.big", &value) {
        Ok(()) => assert_eq!(getxattr(&m.path(&long), "user.big").unwrap(), value),
        Err(e) => assert_eq!(e.raw_os_error(), native_errno, "setxattr: {e}"),
    }
    let mut listed: Vec<String> =
        std::fs::read_dir(m.path("d")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    listed.sort();
    names.sort();
    assert_eq!(listed, names);
    assert_errno(std::fs::metadata(m.path("missing")), libc::ENOENT, "lookup of a missing name");
    std::fs::rename(m.path(&long), m.path("short")).unwrap();
    assert_eq!(std::fs::read(m.path("short")).unwrap(), b"long");
}

/// Story: unmount left ring threads waiting in the kernel for requests that
/// would never come, so the daemon never exited. After `txfs umount` and
/// after an aborted connection, the daemon must be gone; with
/// `TXFS_URING_THREADS=0` it serves from /dev/fuse alone.
#[test]
fn the_daemon_exits_with_its_ring_threads_and_can_do_without_them() {
    let mut m = Mount::new();
    churn(m.mnt(), 20);
    // Unmounts cleanly first (asserting the daemon exited 0 within 30 s).
    m.restart_with_env("TXFS_URING_THREADS", "0");
    let pid = m.daemon_pid().unwrap();
    assert!(ring_threads(pid).is_empty(), "TXFS_URING_THREADS=0 still started ring threads");
    churn(m.mnt(), 20);
    std::fs::write(m.path("kept"), b"dev").unwrap();
    m.umount_clean();
    m.clear_env();
    m.start();
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), b"dev");
    // An aborted connection ends every ring thread too.
    let pid = m.daemon_pid().unwrap();
    assert!(m.abort_connection());
    let gone = wait_until(Duration::from_secs(60), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.split_whitespace().nth(2) == Some("Z"))
            .unwrap_or(true)
    });
    assert!(gone, "the daemon is still running 60 s after its connection was aborted");
    m.kill_daemon();
}

/// Story: over the ring, `/dev/fuse` still carries every FORGET (one per
/// inode the kernel evicts: each unlinked file). Sixteen threads slept in
/// `read` there, so every `unlink` woke one of them, on the other CPU, from
/// inside the caller's system call: W12's `rm` of 20 000 files took 50 µs
/// per file, 31 without. While FORGETs keep coming, the thread reading them
/// must poll (at most one pause per millisecond), not be woken per FORGET —
/// and the FORGETs must still be read. Here: they are read; how often the
/// threads woke for them is measured by the timing tier (tests/timing.rs,
/// `forgets_wake_the_dev_fuse_threads_at_most_once_per_millisecond`).
#[test]
fn forgets_are_read_without_a_wake_up_each() {
    let mut m = Mount::new();
    m.restart_with_env("TXFS_LOG", "info,fuser::request=debug");
    let pid = m.daemon_pid().unwrap();
    if !uring_enabled() {
        eprintln!("enable_uring is off: /dev/fuse threads serve every request");
        churn(m.mnt(), 20);
        return;
    }
    let up = wait_until(Duration::from_secs(60), || m.log_text().contains("requests arrive over io_uring"));
    assert!(up, "no ring; log:\n{}", m.log_text());
    churn(m.mnt(), 100);
    let forgot = wait_until(Duration::from_secs(60), || m.log_text().contains("FORGET"));
    assert!(forgot, "100 files created and unlinked, no FORGET read in 60 s; log:\n{}", m.log_text());
    let n = 3000;
    let before = m.log_text().matches("FORGET").count();
    let (switches, started) = (dev_fuse_switches(pid), std::time::Instant::now());
    churn(m.mnt(), n);
    let ms = started.elapsed().as_millis() as u64;
    let woke = dev_fuse_switches(pid) - switches;
    eprintln!("{n} create+unlinks in {ms} ms: {woke} wake-ups of the /dev/fuse threads");
    let more = wait_until(Duration::from_secs(60), || m.log_text().matches("FORGET").count() > before);
    assert!(more, "FORGETs of the last churn never read");
    m.umount_clean();
}
