//! fallocate(2) through the mount, compared call by call with the same
//! calls on a real directory of the machine's own file system ($TXFS_TEST_DIR,
//! else /var/tmp: ext4 here): the answer (errno), the size, the bytes and
//! whether mtime moved, for every mode and for ranges inside, across the end
//! of and past a file, and for what ext4 refuses; outside a transaction, in
//! a committed one and in an aborted one. Then what other processes see of
//! a transaction's fallocate, and fallocate inside `txfs run`.

mod common;

use common::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
/// Linux 6.17's FALLOC_FL_WRITE_ZEROES.
const WRITE_ZEROES: i32 = 0x80;

/// Every mode compared with ext4: the five txfs does, and the refused ones
/// ext4 refuses too (collapse and insert, which ext4 does and FUSE cannot
/// forward, are checked apart).
const MODES: [i32; 10] = [
    PUNCH,
    PUNCH | ZERO | KEEP,
    libc::FALLOC_FL_UNSHARE_RANGE,
    WRITE_ZEROES,
    0x100,
    0,
    KEEP,
    PUNCH | KEEP,
    ZERO,
    ZERO | KEEP,
];

/// The size every case file starts with.
const FILE: usize = 10_000;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29) | 1).collect()
}

/// A folder on the machine's own disk to compare with.
fn native_root() -> tempfile::TempDir {
    let base = std::env::var_os("TXFS_TEST_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp"));
    tempfile::Builder::new().prefix("txfs-falloc-").tempdir_in(base).expect("a native scratch folder")
}

/// The largest file the native file system holds (ext4, 4 KiB blocks:
/// 16 TiB − 4 KiB), found with ftruncate.
fn native_max_size(dir: &Path) -> u64 {
    let f = std::fs::File::create(dir.join("max-probe")).unwrap();
    let (mut ok, mut bad) = (0u64, i64::MAX as u64 + 1);
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        if f.set_len(mid).is_ok() {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    ok
}

/// What one call left: its errno (0: done), the file's size, its first
/// 64 KiB and its last 4 KiB, and whether mtime moved.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    errno: i32,
    size: u64,
    head: Vec<u8>,
    tail: Vec<u8>,
    mtime_moved: bool,
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Size, head and tail of the file at `path` (read through a new descriptor).
fn look(path: &Path) -> (u64, Vec<u8>, Vec<u8>) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).expect("open to look");
    let size = f.metadata().unwrap().len();
    let read = |off: u64, n: u64| {
        let mut b = vec![0u8; n as usize];
        f.read_exact_at(&mut b, off).expect("read");
        b
    };
    let head = read(0, size.min(64 << 10));
    let tail = if size > 64 << 10 { read(size - 4096, 4096) } else { Vec::new() };
    (size, head, tail)
}

/// fallocate(`mode`, `off`, `len`) on `path` opened with `flags`, after
/// setting its mtime to 1000 s (when writable).
fn call(path: &Path, flags: i32, mode: i32, off: i64, len: i64) -> Outcome {
    let c = cpath(path);
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open {}: {}", path.display(), std::io::Error::last_os_error());
    let old = libc::timespec { tv_sec: 1000, tv_nsec: 0 };
    if flags & libc::O_ACCMODE != libc::O_RDONLY {
        // SAFETY: our descriptor and two valid timespecs.
        assert_eq!(unsafe { libc::futimens(fd, [old, old].as_ptr()) }, 0, "futimens");
    }
    // SAFETY: our descriptor.
    let r = unsafe { libc::fallocate(fd, mode, off, len) };
    let errno = if r == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap() };
    // SAFETY: our descriptor and a zeroed stat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    unsafe { libc::close(fd) };
    let (size, head, tail) = look(path);
    let moved = flags & libc::O_ACCMODE != libc::O_RDONLY && st.st_mtime != 1000;
    Outcome { errno, size, head, tail, mtime_moved: moved }
}

struct Case {
    name: String,
    flags: i32,
    mode: i32,
    off: i64,
    len: i64,
}

fn cases(max: u64) -> Vec<Case> {
    let max = max as i64;
    let ranges: [(i64, i64); 13] = [
        (4096, 4096),
        (100, 7),
        (0, FILE as i64),
        (8000, 8192),
        (FILE as i64, 50),
        (20_000, 5000),
        (0, 0),
        (-1, 10),
        (0, -1),
        (i64::MAX, 2),
        (1 << 50, 1),
        (max - 1, 1),
        (max, 1),
    ];
    let mut v = Vec::new();
    for mode in MODES {
        for (off, len) in ranges {
            v.push(Case { name: format!("mode {mode:#x} at {off}+{len}"), flags: libc::O_RDWR, mode, off, len });
        }
    }
    v.push(Case { name: "read-only descriptor".into(), flags: libc::O_RDONLY, mode: 0, off: 0, len: 100 });
    v.push(Case { name: "read-only, punch".into(), flags: libc::O_RDONLY, mode: PUNCH | KEEP, off: 0, len: 100 });
    v.push(Case {
        name: "O_APPEND descriptor".into(),
        flags: libc::O_WRONLY | libc::O_APPEND,
        mode: 0,
        off: 0,
        len: 20_000,
    });
    v.push(Case { name: "write-only zero range".into(), flags: libc::O_WRONLY, mode: ZERO, off: 5, len: 10 });
    v
}

/// Runs every case on the native folder and on the mount (`tx`: "" plain,
/// "commit" or "abort", a thread transaction of this thread around all of
/// them); the differences.
fn compare(m: &Mount, tx: &str) -> Vec<String> {
    let native = native_root();
    let max = native_max_size(native.path());
    let dir = m.path(format!("cases-{}", if tx.is_empty() { "plain" } else { tx }));
    std::fs::create_dir(&dir).unwrap();
    let old = pattern(FILE);
    let cases = cases(max);
    for (i, _) in cases.iter().enumerate() {
        std::fs::write(native.path().join(i.to_string()), &old).unwrap();
        std::fs::write(dir.join(i.to_string()), &old).unwrap();
    }
    if !tx.is_empty() {
        m.begin().expect("begin");
    }
    let mut diffs = Vec::new();
    let mut want_after = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let mut want = call(&native.path().join(i.to_string()), c.flags, c.mode, c.off, c.len);
        let got = call(&dir.join(i.to_string()), c.flags, c.mode, c.off, c.len);
        // The kernel checks the end against the file system's largest
        // file before it asks the file system: for FUSE that is i64's, so
        // past ext4's 16 TiB a mode FUSE cannot forward is EOPNOTSUPP (the
        // kernel's own answer, before txfs hears of it) where ext4 says
        // EFBIG. (An end past i64 is EFBIG for both.)
        let fuse_refuses = [libc::FALLOC_FL_UNSHARE_RANGE, WRITE_ZEROES].contains(&c.mode);
        if fuse_refuses && want.errno == libc::EFBIG && c.off.checked_add(c.len).is_some() {
            want.errno = libc::EOPNOTSUPP;
        }
        if got != want {
            diffs.push(format!("{}: ext4 {} / txfs {}", c.name, show(&want), show(&got)));
        }
        want_after.push(if tx == "abort" {
            (FILE as u64, old.clone(), Vec::new())
        } else {
            (want.size, want.head, want.tail)
        });
    }
    match tx {
        "commit" => m.commit().expect("commit"),
        "abort" => m.abort().expect("abort"),
        _ => {}
    }
    for (i, c) in cases.iter().enumerate() {
        let got = look(&dir.join(i.to_string()));
        if got != want_after[i] {
            diffs.push(format!("{}: after the {tx}: size {} (want {})", c.name, got.0, want_after[i].0));
        }
    }
    // ext4 collapses and inserts (aligned ranges); FUSE forwards neither.
    let f = dir.join("0");
    for mode in [libc::FALLOC_FL_COLLAPSE_RANGE, libc::FALLOC_FL_INSERT_RANGE] {
        let got = call(&f, libc::O_RDWR, mode, 0, 4096);
        if got.errno != libc::EOPNOTSUPP {
            diffs.push(format!("mode {mode:#x}: txfs answered {}, not EOPNOTSUPP", got.errno));
        }
    }
    diffs
}

fn show(o: &Outcome) -> String {
    let errno = if o.errno == 0 { "ok".to_string() } else { errname(o.errno) };
    let zeros = o.head.iter().filter(|b| **b == 0).count();
    format!("{errno}, size {}, {zeros} zero bytes of the first 64 KiB, mtime moved: {}", o.size, o.mtime_moved)
}

/// Story: every mode and range, and what ext4 refuses, fallocated through
/// the mount outside any transaction: each answer, size, byte and mtime
/// move is ext4's, and the kernel keeps asking after refusals (txfs never
/// answers ENOSYS). The plain changes survive an unmount and remount.
#[test]
fn fallocate_outside_a_transaction_matches_ext4() {
    let mut m = Mount::new();
    let diffs = compare(&m, "");
    assert!(diffs.is_empty(), "{} differences from ext4:\n{}", diffs.len(), diffs.join("\n"));
    let all = |m: &Mount| {
        let n = std::fs::read_dir(m.path("cases-plain")).unwrap().count();
        (0..n).map(|i| look(&m.path(format!("cases-plain/{i}")))).collect::<Vec<_>>()
    };
    let before = all(&m);
    m.umount_clean();
    m.start();
    assert!(all(&m) == before, "the files changed across a remount");
}

/// Story: the same calls inside a thread transaction that commits: inside
/// it each answer and content is ext4's, and after the commit everyone sees
/// that content.
#[test]
fn fallocate_in_a_committed_transaction_matches_ext4() {
    let m = Mount::new();
    let diffs = compare(&m, "commit");
    assert!(diffs.is_empty(), "{} differences from ext4:\n{}", diffs.len(), diffs.join("\n"));
}

/// Story: the same calls inside a thread transaction that aborts: inside it
/// each answer is ext4's; after the abort every file is as it was.
#[test]
fn fallocate_in_an_aborted_transaction_matches_ext4_then_leaves_nothing() {
    let m = Mount::new();
    let diffs = compare(&m, "abort");
    assert!(diffs.is_empty(), "{} differences from ext4:\n{}", diffs.len(), diffs.join("\n"));
}

/// Story: a thread transaction grows a file with a zero range and punches
/// its middle; another process sees the old file until the commit, then the
/// new one at once. The same in a transaction that aborts: the other
/// process never sees it.
#[test]
fn a_transactions_fallocate_is_invisible_to_other_processes_until_commit() {
    let m = Mount::new();
    let old = pattern(FILE);
    let mut agent = Agent::spawn(m.mnt());
    let probe = "st = os.stat(M + '/f'); d = open(M + '/f', 'rb').read(); \
                 out = [st.st_size, d.count(0), d[:4].hex()]";
    for end in ["commit", "abort"] {
        std::fs::write(m.path("f"), &old).unwrap();
        let before = agent.ok(probe);
        assert_eq!(before, serde_json::json!([FILE, 0, hex(&old[..4])]));
        m.begin().unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(m.path("f")).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: our descriptor.
        assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), ZERO, 9000, 3000) }, 0, "zero range");
        assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), PUNCH | KEEP, 0, 4096) }, 0, "punch");
        drop(f);
        assert_eq!(std::fs::metadata(m.path("f")).unwrap().len(), 12_000, "the transaction sees its growth");
        assert_eq!(agent.ok(probe), before, "another process sees the old file before the {end}");
        if end == "commit" {
            m.commit().unwrap();
            // 4096 punched, 1000 zeroed inside, 2000 grown.
            assert_eq!(agent.ok(probe), serde_json::json!([12_000, 4096 + 3000, "00000000"]), "after the commit");
        } else {
            m.abort().unwrap();
            assert_eq!(agent.ok(probe), before, "after the abort");
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Story: a command run by `txfs run` (served a transaction view) fallocates
/// in every mode: inside, it sees ext4's sizes; a failing run leaves
/// nothing, a succeeding one commits them all.
#[test]
fn fallocate_inside_txfs_run() {
    let m = Mount::new();
    let old = pattern(FILE);
    let script = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
sizes = []
for name, mode, off, n in [("a", 0, 0, 20000), ("b", 1, 0, 20000), ("c", 3, 100, 100000),
                           ("d", 0x10, 5000, 10000), ("e", 0x11, 5000, 10000)]:
    fd = os.open(name, os.O_RDWR)
    if libc.fallocate(fd, mode, off, n) != 0:
        raise SystemExit("fallocate %s: errno %d" % (name, ctypes.get_errno()))
    os.close(fd)
    sizes.append(os.stat(name).st_size)
print(sizes)
sys.exit(int(sys.argv[1]))
"#;
    let names = ["a", "b", "c", "d", "e"];
    for n in names {
        std::fs::write(m.path(n), &old).unwrap();
    }
    let want_sizes = "[20000, 10000, 10000, 15000, 10000]";
    let out = m.run_cmd(&[], &[python(), "-c", script, "3"]).output().expect("txfs run");
    assert_eq!(out.status.code(), Some(3), "the failing run: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want_sizes, "sizes inside the run");
    for n in names {
        assert_eq!(std::fs::read(m.path(n)).unwrap(), old, "{n} after a failed run");
    }
    let out = m.run_cmd(&[], &[python(), "-c", script, "0"]).output().expect("txfs run");
    assert!(out.status.success(), "the run: {}", String::from_utf8_lossy(&out.stderr));
    let mut grown = old.clone();
    grown.resize(20_000, 0);
    let mut punched = old.clone();
    punched[100..].fill(0);
    let mut zeroed = old.clone();
    zeroed.resize(15_000, 0);
    zeroed[5000..].fill(0);
    let mut zeroed_in = old.clone();
    zeroed_in[5000..].fill(0);
    for (n, want) in names.iter().zip([grown, old.clone(), punched, zeroed, zeroed_in]) {
        assert!(std::fs::read(m.path(n)).unwrap() == want, "{n} after the run");
    }
}
