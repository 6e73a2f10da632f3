//! fallocate(2) (`Engine::fallocate`): every mode ext4 does that the engine
//! does, against a model of ext4's answers, outside a transaction and in a
//! committed and an aborted one; what it reads and so what it conflicts
//! with; zero ranges too big for memory.

mod common;

use common::{dump_storage, leftovers, Node};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use txfs_engine::storage::{MemFs, Storage};
use txfs_engine::{Durability, Engine, ObjId, Options, TxId, META_DIR};

const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;

/// The modes the engine does, by name.
const MODES: [(&str, i32); 5] = [
    ("0", 0),
    ("KEEP_SIZE", KEEP),
    ("PUNCH_HOLE|KEEP_SIZE", PUNCH | KEEP),
    ("ZERO_RANGE", ZERO),
    ("ZERO_RANGE|KEEP_SIZE", ZERO | KEEP),
];

fn opts() -> Options {
    Options { flush_interval: None, idle_checkpoint: None, ..Default::default() }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// What ext4 leaves of `file` after fallocate(`mode`, `off`, `len`):
/// mode 0 grows it with zeros and changes no byte; KEEP_SIZE changes
/// nothing visible; a punch, or a zero range with KEEP_SIZE, zeroes the
/// part of the range inside the file; a zero range zeroes the range and
/// grows the file to its end.
fn model(file: &[u8], mode: i32, off: u64, len: u64) -> Vec<u8> {
    let mut v = file.to_vec();
    let (off, end) = (off as usize, (off + len) as usize);
    let grow = mode & KEEP == 0;
    if grow && v.len() < end {
        v.resize(end, 0);
    }
    if mode & (PUNCH | ZERO) != 0 {
        let to = end.min(v.len());
        if off < to {
            v[off..to].fill(0);
        }
    }
    v
}

fn content(e: &Engine, tx: Option<TxId>, f: ObjId) -> Vec<u8> {
    let size = e.getattr(tx, f).unwrap().size;
    let data = e.read(tx, f, 0, size as usize + 1).unwrap();
    assert_eq!(data.len() as u64, size, "size and content agree");
    data
}

fn stored(fs: &MemFs, name: &str) -> Vec<u8> {
    match dump_storage(fs).remove(Path::new(name)) {
        Some(Node::File { data, .. }) => data,
        other => panic!("{name}: {other:?}"),
    }
}

/// Ranges inside, across the end of, and past a file of 10 000 bytes.
const RANGES: [(u64, u64); 6] = [(4096, 4096), (100, 7), (0, 10_000), (8000, 8192), (10_000, 50), (20_000, 5000)];

/// Story: for every mode and range, a 10 000-byte file is fallocated
/// outside a transaction, in a transaction that commits, in one that
/// aborts, and in the transaction that created it. Each time the content
/// (size and bytes) is ext4's — inside the transaction at once, outside it
/// only after the commit, never after the abort — and stays so through a
/// checkpoint into the backing tree and a reopen.
#[test]
fn every_mode_gives_ext4s_content_in_and_out_of_transactions() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let old = pattern(10_000, 5);
    let mut want = Vec::new();
    for (name, mode) in MODES {
        for (i, &(off, len)) in RANGES.iter().enumerate() {
            let expect = model(&old, mode, off, len);
            let what = |how: &str| format!("{name} at {off}+{len} {how}");
            let mk = |tag: &str| {
                let n = format!("{tag}-{}-{i}", mode);
                let f = e.create(None, ObjId::ROOT, OsStr::new(&n), 0o644, 0, 0).unwrap().obj;
                e.write(None, f, 0, &old).unwrap();
                (n, f)
            };

            let (n, f) = mk("plain");
            e.fallocate(None, f, mode, off, len).unwrap();
            assert_eq!(content(&e, None, f), expect, "{}", what("plainly"));
            want.push((n, expect.clone()));

            let (n, f) = mk("commit");
            let tx = e.begin();
            e.fallocate(Some(tx), f, mode, off, len).unwrap();
            assert_eq!(content(&e, Some(tx), f), expect, "{}", what("seen by its transaction"));
            assert_eq!(content(&e, None, f), old, "{}", what("seen by others before the commit"));
            e.commit(tx, Durability::Durable).unwrap();
            assert_eq!(content(&e, None, f), expect, "{}", what("after the commit"));
            want.push((n, expect.clone()));

            let (n, f) = mk("abort");
            let tx = e.begin();
            e.fallocate(Some(tx), f, mode, off, len).unwrap();
            assert_eq!(content(&e, Some(tx), f), expect, "{}", what("seen by the aborting transaction"));
            e.abort(tx).unwrap();
            assert_eq!(content(&e, None, f), old, "{}", what("after the abort"));
            want.push((n, old.clone()));

            // Created by the transaction: the size is its own to read.
            let n = format!("new-{mode}-{i}");
            let tx = e.begin();
            let f = e.create(Some(tx), ObjId::ROOT, OsStr::new(&n), 0o644, 0, 0).unwrap().obj;
            e.write(Some(tx), f, 0, &old).unwrap();
            e.fallocate(Some(tx), f, mode, off, len).unwrap();
            assert_eq!(content(&e, Some(tx), f), expect, "{}", what("in the file's own transaction"));
            e.commit(tx, Durability::Durable).unwrap();
            want.push((n, expect));
        }
    }
    e.checkpoint().unwrap();
    for (n, data) in &want {
        assert_eq!(&stored(&fs, n), data, "{n} in the backing tree");
    }
    e.close().unwrap();
    let e = Engine::open(fs.clone(), opts()).unwrap();
    for (n, data) in &want {
        let f = e.resolve(None, Path::new(n)).unwrap();
        assert_eq!(&content(&e, None, f), data, "{n} after a reopen");
    }
    e.close().unwrap();
    assert!(leftovers(&*fs).is_empty());
}

/// Story: a crash (the engine dropped, no checkpoint) right after plain and
/// transactional fallocates: recovery replays them from the journal, so the
/// sizes and zeros are there after the reopen, in the backing tree too.
#[test]
fn fallocates_survive_a_crash_through_the_journal() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let old = pattern(10_000, 9);
    let mut want = Vec::new();
    for (i, (_, mode)) in MODES.iter().enumerate() {
        let n = format!("f{i}");
        let f = e.create(None, ObjId::ROOT, OsStr::new(&n), 0o644, 0, 0).unwrap().obj;
        e.write(None, f, 0, &old).unwrap();
        e.checkpoint().unwrap();
        e.fallocate(None, f, *mode, 6000, 1000).unwrap();
        let tx = e.begin();
        e.fallocate(Some(tx), f, *mode, 9000, 3000).unwrap();
        e.commit(tx, Durability::Durable).unwrap();
        want.push((n, model(&model(&old, *mode, 6000, 1000), *mode, 9000, 3000)));
    }
    drop(e);
    let e = Engine::open(fs.clone(), opts()).unwrap();
    for (n, data) in &want {
        let f = e.resolve(None, Path::new(n)).unwrap();
        assert_eq!(&content(&e, None, f), data, "{n} after recovery");
        assert_eq!(&stored(&fs, n), data, "{n} in the backing tree after recovery");
    }
    e.close().unwrap();
}

/// Story: every mode sets mtime and ctime, as ext4's `file_modified` does,
/// even the modes that change no byte.
#[test]
fn every_mode_sets_mtime_and_ctime() {
    let e = Engine::open(Arc::new(MemFs::new()), opts()).unwrap();
    for (name, mode) in MODES {
        let f = e.create(None, ObjId::ROOT, OsStr::new(name), 0o644, 0, 0).unwrap().obj;
        e.write(None, f, 0, b"0123456789").unwrap();
        let set =
            txfs_engine::SetAttr { mtime: Some(txfs_engine::Timestamp { secs: 1000, nanos: 0 }), ..Default::default() };
        let before = e.setattr(None, f, &set).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        e.fallocate(None, f, mode, 100, 10).unwrap();
        let after = e.getattr(None, f).unwrap();
        assert!(after.mtime > before.mtime, "{name}: mtime {:?} -> {:?}", before.mtime, after.mtime);
        assert!(after.ctime > before.ctime, "{name}: ctime {:?} -> {:?}", before.ctime, after.ctime);
    }
}

/// Story: what ext4 refuses, the engine refuses with the same errno and
/// changes nothing: a zero length, a value past i64 (EINVAL); a punch
/// without KEEP_SIZE, collapse, insert, unshare, write-zeroes, mixed and
/// unknown modes (EOPNOTSUPP, as Linux 6.17+ answers for mixed ones); a
/// directory (EISDIR) or symlink (ENODEV); an end past i64 (EFBIG).
#[test]
fn what_ext4_refuses_is_refused_with_its_errno_and_changes_nothing() {
    let e = Engine::open(Arc::new(MemFs::new()), opts()).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, b"0123456789").unwrap();
    let d = e.mkdir(None, ObjId::ROOT, OsStr::new("d"), 0o755, 0, 0).unwrap().obj;
    let l = e.symlink(None, ObjId::ROOT, OsStr::new("l"), OsStr::new("f"), 0, 0).unwrap().obj;
    let big = i64::MAX as u64;
    let cases: Vec<(&str, ObjId, i32, u64, u64, i32)> = vec![
        ("zero length", f, 0, 0, 0, libc::EINVAL),
        ("zero length punch", f, PUNCH | KEEP, 5, 0, libc::EINVAL),
        ("offset past i64", f, 0, big + 1, 1, libc::EINVAL),
        ("length past i64", f, KEEP, 0, big + 1, libc::EINVAL),
        ("punch without KEEP_SIZE", f, PUNCH, 0, 4, libc::EOPNOTSUPP),
        ("collapse range", f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096, libc::EOPNOTSUPP),
        ("insert range", f, libc::FALLOC_FL_INSERT_RANGE, 0, 4096, libc::EOPNOTSUPP),
        ("unshare range", f, libc::FALLOC_FL_UNSHARE_RANGE, 0, 4, libc::EOPNOTSUPP),
        ("write zeroes", f, 0x80, 0, 4, libc::EOPNOTSUPP),
        ("punch and zero", f, PUNCH | ZERO | KEEP, 0, 4, libc::EOPNOTSUPP),
        ("insert with KEEP_SIZE", f, libc::FALLOC_FL_INSERT_RANGE | KEEP, 0, 4096, libc::EOPNOTSUPP),
        ("unknown bit", f, 0x100, 0, 4, libc::EOPNOTSUPP),
        ("negative mode", f, -1, 0, 4, libc::EOPNOTSUPP),
        ("a directory", d, 0, 0, 4, libc::EISDIR),
        ("a symlink", l, 0, 0, 4, libc::ENODEV),
        ("end past i64", f, 0, big, 1, libc::EFBIG),
        ("end past i64, KEEP_SIZE", f, KEEP, big - 1, 2, libc::EFBIG),
        ("end past i64, punch", f, PUNCH | KEEP, big, big, libc::EFBIG),
        ("end past i64, zero range", f, ZERO, 1, big, libc::EFBIG),
    ];
    let journal = e.stats().journal_bytes;
    let before = e.getattr(None, f).unwrap();
    for (what, o, mode, off, len, errno) in cases {
        let plain = e.fallocate(None, o, mode, off, len).expect_err(what);
        assert_eq!(plain.errno(), errno, "{what}, plainly: {plain}");
        let tx = e.begin();
        let inside = e.fallocate(Some(tx), o, mode, off, len).expect_err(what);
        assert_eq!(inside.errno(), errno, "{what}, in a transaction: {inside}");
        e.commit(tx, Durability::Durable).unwrap();
    }
    assert_eq!(e.stats().journal_bytes, journal, "a refused fallocate journaled something");
    assert_eq!(e.getattr(None, f).unwrap(), before);
    assert_eq!(content(&e, None, f), b"0123456789");
}

/// Story: two transactions grow one file with mode 0 and write other pages
/// of it: all commit (nothing is read, as with writes), and the file ends
/// at the largest end with every write in place.
#[test]
fn mode_0_reads_nothing_and_commutes_with_writes() {
    let e = Engine::open(Arc::new(MemFs::new()), opts()).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, &[1u8; 8192]).unwrap();
    let (a, b, c) = (e.begin(), e.begin(), e.begin());
    e.fallocate(Some(a), f, 0, 0, 100_000).unwrap();
    e.fallocate(Some(b), f, 0, 50_000, 10_000).unwrap();
    e.write(Some(c), f, 4096, &[3u8; 4096]).unwrap();
    e.commit(c, Durability::Durable).unwrap();
    e.commit(a, Durability::Durable).unwrap();
    e.commit(b, Durability::Durable).unwrap();
    let mut want = vec![1u8; 4096];
    want.extend([3u8; 4096]);
    want.resize(100_000, 0);
    assert_eq!(content(&e, None, f), want);
}

/// Story: a transaction that looked at a file's size (stat, a read at its
/// end) loses when another commit grows it by fallocate, as when a write
/// grows it; a KEEP_SIZE fallocate, which changes no size, costs it
/// nothing. A plain fallocate never fails because of a transaction (I4).
#[test]
fn a_size_extension_conflicts_with_a_reader_of_the_size() {
    let e = Engine::open(Arc::new(MemFs::new()), opts()).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, b"0123456789").unwrap();

    let reader = e.begin();
    assert_eq!(e.getattr(Some(reader), f).unwrap().size, 10);
    e.fallocate(None, f, KEEP, 0, 1 << 20).unwrap();
    e.fallocate(None, f, 0, 0, 5).unwrap();
    assert_eq!(e.read(Some(reader), f, 0, 100).unwrap(), b"0123456789");
    e.commit(reader, Durability::Durable).expect("nothing the reader saw changed");

    let reader = e.begin();
    assert_eq!(e.read(Some(reader), f, 0, 100).unwrap(), b"0123456789");
    let writer = e.begin();
    e.fallocate(Some(writer), f, ZERO, 8, 100).unwrap();
    e.commit(writer, Durability::Durable).unwrap();
    let err = e.commit(reader, Durability::Durable).expect_err("the size it read changed");
    assert_eq!(err.errno(), txfs_engine::ECONFLICT, "{err}");
    assert_eq!(content(&e, None, f), [b"01234567".as_slice(), &[0u8; 100]].concat());
}

/// Story: a transaction punches the end of a file (it reads the size to
/// know where the file ends) while another grows the file and commits
/// first: the puncher conflicts instead of cutting the new bytes. A
/// transaction that punches inside a file another one only writes in
/// commits after it: punches and writes of pages commute as writes do.
#[test]
fn a_punch_reads_the_size_and_conflicts_with_a_growth() {
    let e = Engine::open(Arc::new(MemFs::new()), opts()).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, &[7u8; 20_000]).unwrap();

    let puncher = e.begin();
    e.fallocate(Some(puncher), f, PUNCH | KEEP, 12_000, 1 << 30).unwrap();
    e.write(None, f, 20_000, b"tail").unwrap();
    assert!(e.commit(puncher, Durability::Durable).is_err(), "the size it punched to changed");
    assert_eq!(content(&e, None, f), [vec![7u8; 20_000], b"tail".to_vec()].concat());

    let puncher = e.begin();
    let writer = e.begin();
    e.fallocate(Some(puncher), f, PUNCH | KEEP, 4096, 4096).unwrap();
    e.write(Some(writer), f, 12_288, b"xyz").unwrap();
    e.commit(writer, Durability::Durable).unwrap();
    e.commit(puncher, Durability::Durable).expect("a punch inside the file and a write elsewhere commute");
    let mut want = [vec![7u8; 20_000], b"tail".to_vec()].concat();
    want[4096..8192].fill(0);
    want[12_288..12_291].copy_from_slice(b"xyz");
    assert_eq!(content(&e, None, f), want);
}

/// Story: a transaction zeroes a small range past the end of a file while
/// another grows the file and commits first: both commit (a small zero
/// range is blind, like a write), and the zeros land over the other's bytes
/// as the commit order says. A zero range of a GiB past the end reads the
/// size instead of writing a GiB of zeros: it writes nothing, and it
/// conflicts with such a growth.
#[test]
fn a_big_zero_range_past_the_end_reads_the_size_a_small_one_is_blind() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, &[7u8; 10_000]).unwrap();

    let zeroer = e.begin();
    e.fallocate(Some(zeroer), f, ZERO, 9000, 5000).unwrap();
    e.write(None, f, 10_000, &[8u8; 2000]).unwrap();
    e.commit(zeroer, Durability::Durable).expect("a small zero range reads nothing");
    let mut want = vec![7u8; 9000];
    want.resize(14_000, 0);
    assert_eq!(content(&e, None, f), want);

    let journal = e.stats().journal_bytes;
    let zeroer = e.begin();
    e.fallocate(Some(zeroer), f, ZERO, 13_000, 1 << 30).unwrap();
    assert_eq!(data_bytes(&fs), 0, "no zero is written");
    assert_eq!(e.getattr(Some(zeroer), f).unwrap().size, 13_000 + (1 << 30));
    e.write(None, f, 14_000, b"grown").unwrap();
    assert!(e.commit(zeroer, Durability::Durable).is_err(), "the size it read changed");
    let zeroer = e.begin();
    e.fallocate(Some(zeroer), f, ZERO, 13_000, 1 << 30).unwrap();
    e.commit(zeroer, Durability::Durable).unwrap();
    assert!(e.stats().journal_bytes - journal < 8192, "a GiB of zeros cost a record, not bytes");
    want.resize(13_000 + (1 << 30), 0);
    assert_eq!(e.getattr(None, f).unwrap().size, want.len() as u64);
    assert_eq!(e.read(None, f, 0, 14_010).unwrap(), want[..14_010]);
}

/// Story: a transaction read the pages that a plain punch then zeroes: the
/// plain punch succeeds at once, and the transaction loses at its commit
/// (I4), as it would against a plain write of those pages.
#[test]
fn a_plain_punch_beats_a_transaction_that_read_its_pages() {
    let e = Engine::open(Arc::new(MemFs::new()), opts()).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, &[7u8; 20_000]).unwrap();
    let reader = e.begin();
    assert_eq!(e.read(Some(reader), f, 4096, 10).unwrap(), vec![7u8; 10]);
    e.write(Some(reader), f, 0, b"mine").unwrap();
    e.fallocate(None, f, PUNCH | KEEP, 0, 8192).unwrap();
    assert!(e.commit(reader, Durability::Durable).is_err(), "what it read was punched");
    assert_eq!(e.read(None, f, 0, 8192).unwrap(), vec![0u8; 8192]);
}

fn data_bytes(fs: &MemFs) -> u64 {
    let dir = Path::new(META_DIR).join("data");
    fs.read_dir(&dir).unwrap().iter().map(|(n, _)| fs.lstat(&dir.join(n)).unwrap().size).sum()
}

/// Story: with a 256 KiB memory budget, 30 MiB in the middle of a 32 MiB
/// file are zeroed, in a transaction and plainly. The zeros go through the
/// write path a MiB at a time, so past the budget they are on disk in the
/// transaction's data file, not in memory, and the commit journals only
/// the part that stayed in memory. Zeroing to the end of a 1 TiB file, or
/// growing it by a TiB, costs no bytes at all (a cut, a size).
#[test]
fn large_ranges_spill_past_the_memory_budget() {
    let fs = Arc::new(MemFs::new());
    let small = || Options { spill_threshold: 256 << 10, stage_threshold: 256 << 10, ..opts() };
    let e = Engine::open(fs.clone(), small()).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    let chunk = pattern(1 << 20, 3);
    for i in 0..32u64 {
        e.write(None, f, i << 20, &chunk).unwrap();
    }
    e.checkpoint().unwrap();
    assert_eq!(data_bytes(&fs), 0);

    let journal = e.stats().journal_bytes;
    let tx = e.begin();
    e.fallocate(Some(tx), f, PUNCH | KEEP, (1 << 20) + 7, 30 << 20).unwrap();
    assert!(data_bytes(&fs) >= 29 << 20, "the zeros past the budget are on disk: {} bytes", data_bytes(&fs));
    e.commit(tx, Durability::Durable).unwrap();
    let journaled = e.stats().journal_bytes - journal;
    assert!(journaled < 1 << 20, "only what stayed in memory is journaled: {journaled} bytes");
    let mut want = chunk.repeat(32);
    want[(1 << 20) + 7..(31 << 20) + 7].fill(0);
    assert_eq!(content(&e, None, f), want);
    e.checkpoint().unwrap();

    let journal = e.stats().journal_bytes;
    e.write(None, f, 0, &chunk).unwrap();
    e.fallocate(None, f, ZERO, 5, 30 << 20).unwrap();
    let journaled = e.stats().journal_bytes - journal;
    assert!(journaled < 2 << 20, "a plain zero range spills too: {journaled} bytes journaled");
    want[..chunk.len()].copy_from_slice(&chunk);
    want[5..(30 << 20) + 5].fill(0);
    assert_eq!(content(&e, None, f), want);
    e.checkpoint().unwrap();
    assert_eq!(stored(&fs, "f"), want);

    // A TiB: a size, then a cut; no zero is written anywhere.
    let journal = e.stats().journal_bytes;
    let tib = 1u64 << 40;
    e.fallocate(None, f, 0, 0, tib).unwrap();
    assert_eq!(e.getattr(None, f).unwrap().size, tib);
    let tx = e.begin();
    e.fallocate(Some(tx), f, PUNCH | KEEP, 100, tib).unwrap();
    e.fallocate(Some(tx), f, ZERO | KEEP, 50, tib).unwrap();
    assert_eq!(data_bytes(&fs), 0, "a cut writes no zeros");
    e.commit(tx, Durability::Durable).unwrap();
    assert!(e.stats().journal_bytes - journal < 4096, "sizes and cuts cost records, not bytes");
    assert_eq!(e.getattr(None, f).unwrap().size, tib);
    assert_eq!(e.read(None, f, 0, 60).unwrap(), [&want[..50], &[0u8; 10][..]].concat());
    assert_eq!(e.read(None, f, tib - 3, 10).unwrap(), vec![0u8; 3]);
    e.close().unwrap();
    assert!(leftovers(&*fs).is_empty());
}

/// Story: a transaction creates a file big enough to be staged in a data
/// file of its own, then grows it with mode 0 and zero range: the data
/// file grows with it (sparse), and the checkpoint renames it into place
/// with the right size and zeros.
#[test]
fn a_staged_new_file_grows_by_fallocate() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), Options { stage_threshold: 64 << 10, ..opts() }).unwrap();
    let tx = e.begin();
    let f = e.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    let data = pattern(100 << 10, 1);
    e.write(Some(tx), f, 0, &data).unwrap();
    e.fallocate(Some(tx), f, 0, 0, 200 << 10).unwrap();
    e.fallocate(Some(tx), f, ZERO, 50 << 10, 200 << 10).unwrap();
    e.fallocate(Some(tx), f, PUNCH | KEEP, 10, 10).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    let mut want = data.clone();
    want.resize(250 << 10, 0);
    want[50 << 10..].fill(0);
    want[10..20].fill(0);
    assert_eq!(content(&e, None, f), want);
    e.close().unwrap();
    assert_eq!(stored(&fs, "f"), want);
    assert!(leftovers(&*fs).is_empty());
}
