//! Backing directories written by every on-disk format txfs has had, opened
//! by today's engine.
//!
//! Each fixture under `tests/fixtures/` is a real backing directory left by
//! the engine of one era after five committed transactions and a crash
//! (the process exited without a checkpoint), and its `-plan` twin left by
//! a crash the moment that era's checkpoint had persisted its plan.
//! `tests/fixtures/README.md` says which commit wrote each one and how, so a
//! future format gets its fixture the same way. Recovery must bring every
//! one of them to the same tree ([`expected`]), and after a clean close the
//! backing directory must hold it as plain files.
//!
//! | fixture       | journal header | record versions | data files | plan      |
//! |---------------|----------------|-----------------|------------|-----------|
//! | `jnl1-rec1`   | `TXFSJNL1`     | 1               | none (spill copied in) | data ops without `files` |
//! | `jnl1-rec2`   | `TXFSJNL1`     | 1 and 2         | staged, spilled | data ops name data files |
//! | `jnl2-rec2`   | `TXFSJNL2` (nonce) | 1 and 2     | staged, spilled | as `jnl1-rec2` (plus `Place::Replace`, unused here) |
//! | `jnl1-closed` | `TXFSJNL1`, empty  | -           | -          | -         |
//! | `jnl1-rec2-recycled`, `jnl2-rec2-recycled` | as above, a recycled file: an earlier epoch's record after the new ones, and a spare | 1 and 2 | as above | - |
//!
//! A plan of the first format does not decode today: that fixture pins the
//! refusal ([`txfsjnl1_version_1_records_with_a_persisted_plan_is_refused`]).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use txfs_engine::storage::{RealFs, Storage};
use txfs_engine::{Engine, Options};

/// One entry of a tree: what a recovered backing directory must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    File { mode: u32, data: Vec<u8>, xattrs: BTreeMap<String, Vec<u8>> },
    Dir { mode: u32, xattrs: BTreeMap<String, Vec<u8>> },
    Symlink { target: String },
}

/// `n` bytes of the fixture program's pattern: 16-byte lines, each the
/// seed letter, its own offset in 14 digits and a newline.
fn pattern(seed: &str, n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 16);
    let mut i = 0;
    while v.len() < n {
        v.extend_from_slice(format!("{seed}{i:014}\n").as_bytes());
        i += 16;
    }
    v.truncate(n);
    v
}

fn file(mode: u32, data: &[u8], xattrs: &[(&str, &[u8])]) -> Node {
    let xattrs = xattrs.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
    Node::File { mode, data: data.to_vec(), xattrs }
}

/// The tree every fixture's transactions leave (README: the program).
fn expected() -> BTreeMap<String, Node> {
    let mut patched = pattern("p", 4096);
    patched.truncate(1000);
    patched.extend_from_slice(&pattern("s", 24 << 10));
    let hello = file(0o640, b"hello\n", &[("user.color", b"blue")]);
    let mut t = BTreeMap::new();
    t.insert("keep.txt".into(), file(0o644, b"kept as is\n", &[]));
    let docs_xattrs = [("user.k2".to_string(), b"w".to_vec())].into_iter().collect();
    t.insert("docs".into(), Node::Dir { mode: 0o755, xattrs: docs_xattrs });
    t.insert("docs/readme.txt".into(), file(0o600, b"new readme\n", &[]));
    t.insert("dir".into(), Node::Dir { mode: 0o750, xattrs: BTreeMap::new() });
    t.insert("dir/new.txt".into(), hello.clone());
    t.insert("hardlink.txt".into(), hello);
    t.insert("dir/renamed.txt".into(), file(0o644, b"to be renamed\n", &[]));
    t.insert("link".into(), Node::Symlink { target: "dir/new.txt".into() });
    let log = [&b"line 1\n"[..], &pattern("a", 6000), b"line 2\n"].concat();
    t.insert("append.log".into(), file(0o644, &log, &[]));
    t.insert("trunc.txt".into(), file(0o644, b"0123", &[]));
    t.insert("patched.bin".into(), file(0o644, &patched, &[]));
    t.insert("big.bin".into(), file(0o644, &pattern("b", 20 << 10), &[]));
    t
}

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Copies a fixture's backing directory to `to` as its MANIFEST describes
/// it, with what git does not keep: modes, empty folders, hard links and
/// extended attributes (fixtures/README.md).
fn unpack(name: &str, to: &Path) {
    let src = fixture_dir(name);
    let manifest = fs::read_to_string(src.join("MANIFEST")).expect("fixture MANIFEST");
    let store = RealFs::open(to).expect("RealFs");
    for line in manifest.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let rel = f[2];
        let (from, dest) = (src.join("backing").join(rel), to.join(rel));
        match f[0] {
            "d" => fs::create_dir(&dest).unwrap_or_else(|e| panic!("mkdir {rel}: {e}")),
            "f" => _ = fs::copy(&from, &dest).unwrap_or_else(|e| panic!("copy {rel}: {e}")),
            "l" => std::os::unix::fs::symlink(fs::read_link(&from).unwrap(), &dest).unwrap(),
            "h" => fs::hard_link(to.join(f[3]), &dest).unwrap_or_else(|e| panic!("link {rel}: {e}")),
            "x" => {
                let (name, path) = (f[1], f[3]);
                let hex = f[2].as_bytes().chunks(2).map(|c| std::str::from_utf8(c).unwrap());
                let value: Vec<u8> = hex.map(|h| u8::from_str_radix(h, 16).expect("hex")).collect();
                store.set_xattr(Path::new(path), OsStr::new(name), &value).expect("set xattr");
                continue;
            }
            _ => panic!("MANIFEST line {line:?}"),
        }
        if f[0] != "l" {
            let mode = u32::from_str_radix(f[1], 8).expect("octal mode");
            fs::set_permissions(&dest, fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

/// The tree under `root` (its `.txfs/` aside), and its files' inode numbers.
fn read_tree(root: &Path) -> (BTreeMap<String, Node>, BTreeMap<String, u64>) {
    let store = RealFs::open(root).expect("RealFs");
    let xattrs = |rel: &str| -> BTreeMap<String, Vec<u8>> {
        let p = Path::new(rel);
        let names = store.list_xattrs(p).expect("list xattrs");
        let user = names.into_iter().filter(|n| n.as_encoded_bytes().starts_with(b"user."));
        user.map(|n| {
            let v = store.get_xattr(p, &n).expect("get xattr").expect("listed xattr");
            (n.to_string_lossy().into_owned(), v)
        })
        .collect()
    };
    let (mut tree, mut inos) = (BTreeMap::new(), BTreeMap::new());
    let mut todo = vec![String::new()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(root.join(&dir)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().expect("UTF-8 names");
            if dir.is_empty() && name == ".txfs" {
                continue;
            }
            let rel = if dir.is_empty() { name } else { format!("{dir}/{name}") };
            let m = fs::symlink_metadata(root.join(&rel)).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            let node = if m.file_type().is_symlink() {
                let target = fs::read_link(root.join(&rel)).unwrap();
                Node::Symlink { target: target.to_str().unwrap().into() }
            } else if m.is_dir() {
                todo.push(rel.clone());
                Node::Dir { mode, xattrs: xattrs(&rel) }
            } else {
                inos.insert(rel.clone(), m.ino());
                Node::File { mode, data: fs::read(root.join(&rel)).unwrap(), xattrs: xattrs(&rel) }
            };
            tree.insert(rel, node);
        }
    }
    (tree, inos)
}

fn opts() -> Options {
    Options { flush_interval: None, idle_checkpoint: None, ..Options::default() }
}

/// Recovers a copy of fixture `name` with today's engine, reads the tree
/// through it, closes it, and checks the plain files left behind. Returns
/// what `txfs check` said of the copy first.
fn recovers(name: &str) -> txfs_engine::CheckReport {
    let dir = tempfile::tempdir().expect("tempdir");
    let backing = dir.path().join("backing");
    fs::create_dir(&backing).unwrap();
    unpack(name, &backing);

    let report = txfs_engine::check(&RealFs::open(&backing).unwrap()).expect("check");
    assert!(report.problems.is_empty(), "{name}: check finds {:?}", report.problems);
    assert_eq!(report.plan.is_some(), name.ends_with("-plan"), "{name}: check's plan");

    let engine = Engine::open(Arc::new(RealFs::open(&backing).unwrap()), opts()).expect("open (recovery)");
    for (rel, want) in expected() {
        let o = engine.resolve(None, rel.as_ref()).unwrap_or_else(|e| panic!("{name}: {rel}: {e}"));
        let a = engine.getattr(None, o).unwrap();
        match &want {
            Node::File { mode, data, xattrs } => {
                assert_eq!(a.mode & 0o7777, *mode, "{name}: mode of {rel}");
                let got = engine.read(None, o, 0, data.len() + 1).unwrap();
                assert!(got == *data, "{name}: content of {rel} through the engine");
                for (k, v) in xattrs {
                    assert_eq!(engine.getxattr(None, o, OsStr::new(k)).unwrap().as_ref(), Some(v), "{name}: {rel} {k}");
                }
            }
            Node::Dir { mode, .. } => assert_eq!(a.mode & 0o7777, *mode, "{name}: mode of {rel}"),
            Node::Symlink { target } => {
                assert_eq!(engine.readlink(None, o).unwrap(), OsStr::new(target), "{name}: {rel}")
            }
        }
    }
    engine.close().expect("close (checkpoint)");

    let (tree, inos) = read_tree(&backing);
    let want = expected();
    for k in want.keys().chain(tree.keys()) {
        assert!(tree.get(k) == want.get(k), "{name}: {k}: recovered {:?}, expected {:?}", tree.get(k), want.get(k));
    }
    assert_eq!(inos["dir/new.txt"], inos["hardlink.txt"], "{name}: hard link");
    let txfs = backing.join(".txfs");
    let left: Vec<_> = fs::read_dir(&txfs).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!left.iter().any(|n| n.as_encoded_bytes().starts_with(b"ckpt-")), "{name}: plan left: {left:?}");
    if let Ok(data) = fs::read_dir(txfs.join("data")) {
        assert_eq!(data.count(), 0, "{name}: data files left after close");
    }

    // Idempotent: a second open finds nothing more to do.
    let engine = Engine::open(Arc::new(RealFs::open(&backing).unwrap()), opts()).expect("reopen");
    engine.close().expect("close again");
    assert_eq!(read_tree(&backing).0, want, "{name}: after a second open");
    report
}

/// The one journal `check` found: its whole records and its cut.
fn journal(report: &txfs_engine::CheckReport) -> (usize, Option<&str>) {
    assert_eq!(report.journals.len(), 1, "{:?}", report.journals);
    let j = &report.journals[0];
    (j.records, j.cut.as_ref().map(|(_, why)| why.as_str()))
}

#[test]
fn txfsjnl1_version_1_records() {
    assert_eq!(journal(&recovers("jnl1-rec1")), (5, None));
}

/// A plan of the first format (its data ops have no `files`) does not
/// decode as today's plan: `check` reports it and the engine refuses to
/// open, changing nothing. (Finish such a checkpoint with a binary of its
/// era: `txfs recover`.) Pinned so that a codec change cannot start
/// misreading it instead.
#[test]
fn txfsjnl1_version_1_records_with_a_persisted_plan_is_refused() {
    let name = "jnl1-rec1-plan";
    let dir = tempfile::tempdir().expect("tempdir");
    let backing = dir.path().join("backing");
    fs::create_dir(&backing).unwrap();
    unpack(name, &backing);
    let before = read_tree(&backing).0;

    let report = txfs_engine::check(&RealFs::open(&backing).unwrap()).expect("check");
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].ends_with("ckpt-0000000000000001.plan, offset 0: undecodable plan"),
        "{:?}",
        report.problems
    );

    let err = Engine::open(Arc::new(RealFs::open(&backing).unwrap()), opts()).err().expect("open refuses the plan");
    assert!(err.to_string().ends_with("undecodable plan"), "{err}");
    assert_eq!(read_tree(&backing).0, before, "a refused open changes nothing");
    assert!(backing.join(".txfs/ckpt-0000000000000001.plan").exists());
}

#[test]
fn txfsjnl1_version_2_records_and_data_files() {
    assert_eq!(journal(&recovers("jnl1-rec2")), (5, None));
}

#[test]
fn txfsjnl1_version_2_records_with_a_persisted_plan() {
    assert_eq!(journal(&recovers("jnl1-rec2-plan")), (5, None));
}

/// A cleanly closed backing directory of the first format: plain files and
/// an empty `TXFSJNL1` journal, which the engine rewrites keyed.
#[test]
fn txfsjnl1_closed_cleanly() {
    assert_eq!(journal(&recovers("jnl1-closed")), (0, None));
}

/// Checkpointed after transactions 2 and 3: the journal of epoch 3 is
/// epoch 1's file, the two new records followed by the rest of epoch 1's
/// bytes, among them a whole record (seq 2) that verifies in an unkeyed
/// journal. The scan ends after the new records; the old one must not pass
/// for a later durable record (J3's probe: its seq is not of this epoch),
/// or the journal would be reported damaged. Epoch 2's file is the spare.
#[test]
fn txfsjnl1_recycled_journal() {
    // The cut is told for what it is: old bytes, not a torn tail (issue 28).
    let old = "a record of an earlier epoch (seq 2) follows: the rest of a recycled journal (bad record magic here)";
    assert_eq!(journal(&recovers("jnl1-rec2-recycled")), (2, Some(old)));
}

#[test]
fn txfsjnl2_keyed_journal() {
    assert_eq!(journal(&recovers("jnl2-rec2")), (5, None));
}

#[test]
fn txfsjnl2_keyed_journal_with_a_persisted_plan() {
    assert_eq!(journal(&recovers("jnl2-rec2-plan")), (5, None));
}

/// As `jnl1-rec2-recycled`, keyed: epoch 1's record fails this journal's
/// header check (another nonce).
#[test]
fn txfsjnl2_recycled_journal() {
    // The cut is told for what it is: old bytes, not a torn tail (issue 28).
    let old = "a record of an earlier epoch (seq 2) follows: the rest of a recycled journal (bad record magic here)";
    assert_eq!(journal(&recovers("jnl2-rec2-recycled")), (2, Some(old)));
}

/// Every record meta in every fixture's journals (and spare) decodes, and
/// encodes again to the very bytes an earlier engine wrote (the codec's
/// golden bytes, in the wild).
#[test]
fn every_fixture_record_encodes_to_its_own_bytes() {
    use txfs_engine::journal::{CommitRecord, FILE_HEADER_LEN, REC_HEADER_LEN, REC_MAGIC};
    let mut seen = [0; 3];
    for fixture in fs::read_dir(fixture_dir("")).unwrap() {
        let txfs = fixture.unwrap().path().join("backing/.txfs");
        let Ok(journals) = fs::read_dir(txfs.join("journal")) else { continue };
        let mut paths: Vec<PathBuf> = journals.map(|e| e.unwrap().path()).collect();
        paths.extend(Some(txfs.join("journal-spare")).filter(|p| p.exists()));
        for path in paths {
            let bytes = fs::read(&path).unwrap();
            let mut at = FILE_HEADER_LEN as usize;
            let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
            while at + REC_HEADER_LEN as usize <= bytes.len() && u32_at(at) == REC_MAGIC {
                let version = u16::from_le_bytes([bytes[at + 4], bytes[at + 5]]);
                let meta_len = u32_at(at + 24) as usize;
                let data_len = u64::from_le_bytes(bytes[at + 32..at + 40].try_into().unwrap()) as usize;
                let meta = &bytes[at + REC_HEADER_LEN as usize..][..meta_len];
                let rec = CommitRecord::decode(meta, version).unwrap_or_else(|e| panic!("{path:?} at {at}: {e}"));
                let (again, v) = rec.encode().unwrap();
                assert_eq!((again.as_slice(), v), (meta, version), "{path:?}: record at {at}");
                seen[version as usize] += 1;
                at += REC_HEADER_LEN as usize + meta_len + data_len;
            }
        }
    }
    assert_eq!(seen, [0, 24, 12], "records of each version (fixtures/README.md)");
}
