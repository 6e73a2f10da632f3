//! Durability (SPEC §1, §4): after `txfs umount` BACKING holds the committed
//! state as plain files; after the daemon is SIGKILLed, a remount recovers
//! every durable commit and nothing uncommitted.

mod common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `.txfs` holds no leftovers after a clean unmount: empty stage, data and
/// orphans, no checkpoint plan.
fn assert_meta_clean(backing: &Path) {
    let meta = backing.join(".txfs");
    for d in ["stage", "data", "orphans"] {
        let p = meta.join(d);
        if p.exists() {
            assert!(names(&p).is_empty(), "BACKING/.txfs/{d} is not empty: {:?}", names(&p));
        }
    }
    let plans: Vec<String> = names(&meta).into_iter().filter(|n| n.starts_with("ckpt-")).collect();
    assert!(plans.is_empty(), "checkpoint leftovers in BACKING/.txfs: {plans:?}");
}

fn getxattr_py(p: &Path, name: &str) -> String {
    let o = Command::new(python())
        .arg("-c")
        .arg("import os,sys; print(os.getxattr(sys.argv[1], sys.argv[2]).decode())")
        .arg(p)
        .arg(name)
        .output()
        .unwrap();
    check_ok(&o, "getxattr").trim_end().to_string()
}

fn txfs_check(backing: &Path) {
    let o = Command::new(TXFS).arg("check").arg(backing).output().unwrap();
    check_ok(&o, "txfs check");
}

#[test]
fn committed_state_is_plain_files_after_umount_and_remount() {
    let mut m = Mount::with_backing(|b| {
        std::fs::create_dir(b.join("pre")).unwrap();
        std::fs::write(b.join("pre/old.txt"), "old").unwrap();
        std::fs::write(b.join("pre/gone"), "gone").unwrap();
        std::fs::write(b.join("pre/moved"), "moved").unwrap();
    });
    m.begin().unwrap();
    std::fs::create_dir_all(m.path("new/deep/er")).unwrap();
    std::fs::write(m.path("new/deep/er/file"), "deep file").unwrap();
    std::fs::write(m.path("pre/old.txt"), "rewritten in a transaction").unwrap();
    std::fs::remove_file(m.path("pre/gone")).unwrap();
    std::fs::rename(m.path("pre/moved"), m.path("new/moved")).unwrap();
    std::os::unix::fs::symlink("../pre/old.txt", m.path("new/link")).unwrap();
    std::fs::hard_link(m.path("new/deep/er/file"), m.path("new/hard")).unwrap();
    std::fs::set_permissions(m.path("new/deep"), std::fs::Permissions::from_mode(0o711)).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(m.path("new/big"), &big).unwrap();
    m.commit().unwrap();
    // Non-transactional, and an ordered commit made durable by sync.
    std::fs::write(m.path("plain"), "not in a transaction").unwrap();
    m.begin().unwrap();
    std::fs::write(m.path("ordered"), "ordered").unwrap();
    let (p, n) = (
        std::ffi::CString::new(m.path("ordered").into_os_string().into_encoded_bytes()).unwrap(),
        std::ffi::CString::new("user.k").unwrap(),
    );
    // SAFETY: valid C strings and a 2-byte value (this thread: in the transaction).
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), b"xv".as_ptr().cast(), 2, 0) };
    assert_eq!(r, 0, "setxattr: {}", std::io::Error::last_os_error());
    m.commit_ordered().unwrap();
    m.sync().unwrap();
    // An aborted one, for contrast.
    m.begin().unwrap();
    std::fs::write(m.path("aborted"), "no").unwrap();
    m.abort().unwrap();

    let want = snapshot(m.mnt());
    assert!(want.contains_key(Path::new("new/deep/er/file")));
    assert!(!want.contains_key(Path::new("aborted")));
    m.umount_clean();

    let b = m.backing().to_path_buf();
    assert_eq!(snapshot(&b), want, "BACKING after txfs umount differs from what the mount showed");
    assert_eq!(std::fs::read(b.join("new/big")).unwrap(), big);
    let (f, h) =
        (std::fs::metadata(b.join("new/deep/er/file")).unwrap(), std::fs::metadata(b.join("new/hard")).unwrap());
    assert_eq!(f.ino(), h.ino(), "a hard link is a hard link in BACKING");
    assert_eq!(f.nlink(), 2);
    assert_eq!(std::fs::metadata(b.join("new/deep")).unwrap().mode() & 0o7777, 0o711);
    assert_eq!(getxattr_py(&b.join("ordered"), "user.k"), "xv", "xattrs reach BACKING");
    assert_meta_clean(&b);
    txfs_check(&b);

    m.start();
    assert_eq!(snapshot(m.mnt()), want, "the remount differs");
    assert_eq!(getxattr_py(&m.path("ordered"), "user.k"), "xv");
    let (f, h) =
        (std::fs::metadata(m.path("new/deep/er/file")).unwrap(), std::fs::metadata(m.path("new/hard")).unwrap());
    assert_eq!((f.ino(), f.nlink()), (h.ino(), 2));
    // Plain edits of BACKING while unmounted are seen by the next mount.
    m.umount_clean();
    std::fs::write(b.join("edited-offline"), "offline").unwrap();
    m.start();
    assert_eq!(std::fs::read_to_string(m.path("edited-offline")).unwrap(), "offline");
}

#[test]
fn sigkill_keeps_durable_commits_and_drops_open_transactions() {
    let mut m = Mount::with_backing(|b| {
        std::fs::write(b.join("base"), "base").unwrap();
        std::fs::write(b.join("base2"), "base2").unwrap();
    });
    // Durable commit.
    m.begin().unwrap();
    std::fs::create_dir(m.path("c")).unwrap();
    std::fs::write(m.path("c/a"), "A1").unwrap();
    std::fs::write(m.path("base"), "base, committed").unwrap();
    m.commit().unwrap();
    // Non-transactional write made durable by fsync.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(m.path("synced")).unwrap();
        f.write_all(b"fsynced").unwrap();
        f.sync_all().unwrap();
    }
    // A `txfs run` tree in the middle of its transaction.
    let flag = m.scratch().join("tree-ready");
    let script = format!("echo t > treefile && rm base2 && touch {} && sleep 30", flag.display());
    let mut run = m.run_cmd(&[], &["sh", "-c", &script]).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(60), || flag.exists()));
    // This thread's open transaction.
    m.begin().unwrap();
    std::fs::write(m.path("uncommitted"), "never").unwrap();
    std::fs::write(m.path("c/a"), "garbage").unwrap();
    std::fs::create_dir(m.path("c/newdir")).unwrap();
    std::fs::remove_file(m.path("base")).unwrap();
    let big = vec![7u8; 2 << 20];
    std::fs::write(m.path("c/bigtx"), &big).unwrap();

    m.kill_daemon();
    let _ = run.kill();
    let _ = run.wait();

    let b = m.backing().to_path_buf();
    let raw = snapshot(&b);
    for p in ["uncommitted", "treefile", "c/newdir", "c/bigtx"] {
        assert!(!raw.contains_key(Path::new(p)), "uncommitted {p} reached BACKING's tree");
    }
    assert!(raw.contains_key(Path::new("base2")), "the tree's unlink reached BACKING");
    txfs_check(&b);

    m.start();
    assert_eq!(std::fs::read_to_string(m.path("c/a")).unwrap(), "A1");
    assert_eq!(std::fs::read_to_string(m.path("base")).unwrap(), "base, committed");
    assert_eq!(std::fs::read_to_string(m.path("synced")).unwrap(), "fsynced");
    assert_eq!(std::fs::read_to_string(m.path("base2")).unwrap(), "base2");
    for p in ["uncommitted", "treefile", "c/newdir", "c/bigtx"] {
        assert_errno(std::fs::metadata(m.path(p)), libc::ENOENT, p);
    }
    assert_eq!(names(m.mnt()), ["base", "base2", "c", "synced"]);
    assert_eq!(names(&m.path("c")), ["a"]);
    assert_eq!(m.live_txs(), 0);
    let want = snapshot(m.mnt());
    m.umount_clean();
    assert_eq!(snapshot(&b), want);
    assert_meta_clean(&b);
}

#[test]
fn sigkill_during_a_stream_of_commits_recovers_a_prefix() {
    let mut m = Mount::new();
    std::fs::create_dir(m.path("seq")).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let streamed = std::sync::atomic::AtomicU32::new(0);
    let acked = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut acked: Option<u32> = None;
            for i in 0..100_000u32 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let step = || -> std::io::Result<()> {
                    m.begin()?;
                    std::fs::write(m.path(format!("seq/{i:06}")), format!("{i}"))?;
                    std::fs::write(m.path("last"), format!("{i}"))?;
                    m.commit()
                };
                match step() {
                    Ok(()) => acked = Some(i),
                    Err(_) => break,
                }
                streamed.store(i + 1, std::sync::atomic::Ordering::SeqCst);
            }
            acked
        });
        // The kill lands in a stream of commits: after the first twenty,
        // however long a loaded machine takes for them.
        let going = wait_until(Duration::from_secs(120), || {
            streamed.load(std::sync::atomic::Ordering::SeqCst) >= 20 || h.is_finished()
        });
        assert!(going, "20 commits took longer than 120 s");
        m.sigkill();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        h.join().unwrap()
    });
    m.kill_daemon();
    let acked = acked.expect("no commit was acknowledged before the kill");
    m.start();
    let files = names(&m.path("seq"));
    let last: u32 = std::fs::read_to_string(m.path("last")).unwrap().parse().unwrap();
    eprintln!("{} commits acknowledged before the SIGKILL; recovered through {last}", acked + 1);
    let want: Vec<String> = (0..=last).map(|i| format!("{i:06}")).collect();
    assert_eq!(files, want, "the recovered state is not a prefix of the commits (last = {last})");
    assert!(last >= acked, "acknowledged commit {acked} lost (recovered up to {last})");
    assert!(last <= acked + 1, "commit {last} recovered but only {acked} was ever begun+acked");
    for f in &files {
        assert_eq!(std::fs::read_to_string(m.path("seq").join(f)).unwrap(), f.parse::<u32>().unwrap().to_string());
    }
    m.umount_clean();
    assert_meta_clean(m.backing());
}

#[test]
fn large_transaction_spills_and_commits_or_aborts_cleanly() {
    let mut m = Mount::new();
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let write_big = |name: &str| {
        use std::io::Write;
        let mut f = std::fs::File::create(m.path(name)).unwrap();
        for i in 0..80u8 {
            let mut c = chunk.clone();
            c[0] = i;
            f.write_all(&c).unwrap();
        }
    };
    m.begin().unwrap();
    write_big("aborted");
    // A new file's content is staged in a data file of its own.
    let spill = m.backing().join(".txfs/data");
    let spilled = |p: &Path| -> u64 { walk_size(p) };
    assert!(spilled(&spill) >= 80 << 20, "80 MiB in one transaction did not go to BACKING/.txfs/data");
    m.abort().unwrap();
    assert!(wait_until(Duration::from_secs(60), || spilled(&spill) == 0), "data file not removed after abort");
    assert_errno(std::fs::metadata(m.path("aborted")), libc::ENOENT, "aborted");

    let journal = m.backing().join(".txfs/journal");
    let journal_before = walk_size(&journal);
    m.begin().unwrap();
    write_big("committed");
    m.commit().unwrap();
    // Selective data journaling: the new file's bytes stay in its data file
    // (written once, renamed into place by the checkpoint), not the journal.
    let journaled = walk_size(&journal).saturating_sub(journal_before);
    assert!(journaled < 4 << 20, "a durable commit of a new 80 MiB file journaled {journaled} bytes");
    let md = std::fs::metadata(m.path("committed")).unwrap();
    assert_eq!(md.len(), 80 << 20);
    let data = std::fs::read(m.path("committed")).unwrap();
    for i in 0..80usize {
        assert_eq!(data[i << 20], i as u8);
        assert_eq!(&data[(i << 20) + 1..(i + 1) << 20], &chunk[1..], "chunk {i}");
    }
    drop(data);
    // The daemon killed in the middle of a spilled transaction.
    let before = spilled(&spill);
    m.begin().unwrap();
    write_big("killed");
    assert!(spilled(&spill) >= before + (80 << 20));
    m.kill_daemon();
    m.start();
    assert_errno(std::fs::metadata(m.path("killed")), libc::ENOENT, "killed");
    // Recovered from its record and data file (no checkpoint ran before).
    let data = std::fs::read(m.path("committed")).unwrap();
    assert_eq!(data.len(), 80 << 20);
    assert!((0..80usize).all(|i| data[i << 20] == i as u8 && data[(i << 20) + 1..(i + 1) << 20] == chunk[1..]));
    drop(data);
    m.umount_clean();
    assert_eq!(std::fs::metadata(m.backing().join("committed")).unwrap().len(), 80 << 20);
    assert!(!m.backing().join("killed").exists());
    assert_meta_clean(m.backing());
}

fn walk_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.map(|e| {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        if md.is_dir() {
            walk_size(&e.path())
        } else {
            md.len()
        }
    })
    .sum()
}

/// The seq the durable high-water mark (`.txfs/mark`) records now.
fn mark_seq(backing: &Path) -> u64 {
    let b = std::fs::read(backing.join(".txfs/mark")).unwrap_or_default();
    let slot = |at: usize| {
        let s = b.get(at..at + 52)?;
        let u = |o: usize| u64::from_le_bytes(s[o..o + 8].try_into().unwrap());
        (&s[0..8] == b"TXFSMRK1").then(|| (u(8), u(24)))
    };
    [slot(0), slot(4096)].into_iter().flatten().max().map_or(0, |(_, seq)| seq)
}

/// Story (issue 28): a mount is killed; later someone truncates its
/// journal (a bad copy, a restore of an old file). `txfs check` exits 1,
/// `txfs recover` and `txfs mount` refuse and say how to proceed, and
/// `txfs recover --accept-loss` goes on, says what it accepted on stderr
/// and in daemon.log, and leaves a backing that checks clean.
#[test]
fn a_truncated_journal_is_refused_until_recover_accept_loss() {
    let mut m = Mount::new();
    for i in 0..5 {
        std::fs::write(m.path(format!("f{i}")), format!("v{i}")).unwrap();
    }
    m.sync().unwrap();
    // The background thread writes the mark about once a second.
    assert!(wait_until(Duration::from_secs(4), || mark_seq(m.backing()) >= 5), "mark at {}", mark_seq(m.backing()));
    m.sigkill();
    m.kill_daemon();
    let jdir = m.backing().join(".txfs/journal");
    let j = std::fs::read_dir(&jdir).unwrap().next().unwrap().unwrap().path();
    let f = std::fs::OpenOptions::new().write(true).open(&j).unwrap();
    f.set_len(32).unwrap();
    drop(f);
    let txfs = env!("CARGO_BIN_EXE_txfs");
    let check = Command::new(txfs).arg("check").arg(m.backing()).output().unwrap();
    let out = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "check of a truncated journal: {out}");
    assert!(out.contains("acknowledged commits are missing"), "{out}");
    let rec = Command::new(txfs).arg("recover").arg(m.backing()).output().unwrap();
    let err = String::from_utf8_lossy(&rec.stderr);
    assert!(!rec.status.success(), "recover went on past a truncated journal");
    assert!(err.contains("--accept-loss") && err.contains("missing"), "{err}");
    let mnt = Command::new(txfs).arg("mount").arg(m.backing()).arg(m.mnt()).arg("-f").output().unwrap();
    assert!(!mnt.status.success(), "mount went on past a truncated journal");
    assert!(String::from_utf8_lossy(&mnt.stderr).contains("--accept-loss"), "{}", String::from_utf8_lossy(&mnt.stderr));
    let rec = Command::new(txfs).arg("recover").arg("--accept-loss").arg(m.backing()).output().unwrap();
    let err = String::from_utf8_lossy(&rec.stderr);
    assert!(rec.status.success(), "{err}");
    assert!(err.contains("accepted"), "{err}");
    let log = std::fs::read_to_string(m.backing().join(".txfs/daemon.log")).unwrap_or_default();
    assert!(log.contains("--accept-loss: accepted"), "daemon.log: {log}");
    let check = Command::new(txfs).arg("check").arg(m.backing()).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    m.start();
    std::fs::write(m.path("after"), "x").unwrap();
    m.umount_clean();
}
