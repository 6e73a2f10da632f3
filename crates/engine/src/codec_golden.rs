//! Golden bytes of the journal record and the checkpoint plan: what
//! `codec`'s encoding makes of one value of every kind, compared with
//! checked-in bytes that bincode 1.x wrote before the engine had its own
//! codec (`tests/fixtures/golden/`; the `-v2` plans, with a path table,
//! were written by this encoder), and how strictly decoding refuses what
//! is not a whole value.
use crate::checkpoint::plan::{decode_plan, encode_plan, AttrOp, DataOp, MoveOut, Place, PlanV1};
use crate::codec::encode;
use crate::delta::NO_CUT;
use crate::ids::{Epoch, Seq};
use crate::journal::{CommitRecord, FileRef, ObjRef, RecAttr, RecDir, RecFile, RecNew, RecObj};
use crate::journal::{REC_VERSION, REC_VERSION_FILES};
use crate::log::record::PATH_ROOT;
use crate::storage::{FileKind, Timestamp};

const RECORD_V1: &[u8] = include_bytes!("../tests/fixtures/golden/record-v1.bin");
const RECORD_V2: &[u8] = include_bytes!("../tests/fixtures/golden/record-v2.bin");
/// `record(file_refs())` with checksums and its base objects named through
/// a path table (this encoder wrote it).
const RECORD_PATHS: &[u8] = include_bytes!("../tests/fixtures/golden/record-paths.bin");
const PLAN: &[u8] = include_bytes!("../tests/fixtures/golden/plan.bin");
/// The same plan in the second format (a path table; this encoder wrote it).
const PLAN_V2: &[u8] = include_bytes!("../tests/fixtures/golden/plan-v2.bin");
/// Written by hand from the layout in docs/design/journal.md (not by this
/// encoder): the kinds added after bincode's time, fifo to block device.
const RECORD_SPECIAL: &[u8] = include_bytes!("../tests/fixtures/golden/record-special.bin");
const PLAN_SPECIAL: &[u8] = include_bytes!("../tests/fixtures/golden/plan-special.bin");
const PLAN_SPECIAL_V2: &[u8] = include_bytes!("../tests/fixtures/golden/plan-special-v2.bin");

fn ts(secs: i64, nanos: u32) -> Option<Timestamp> {
    Some(Timestamp { secs, nanos })
}

/// A record with every kind of change: each `FileKind`, both `ObjRef`s,
/// names added, replaced and removed, attributes set and left alone,
/// xattrs set (one empty) and removed, a file with a cut and extents,
/// one without contents; non-UTF-8 names.
fn record(files: Vec<FileRef>) -> CommitRecord {
    CommitRecord {
        created: vec![
            RecNew { id: 1, kind: FileKind::File, target: None, rdev: 0 },
            RecNew { id: 2, kind: FileKind::Dir, target: None, rdev: 0 },
            RecNew { id: 3, kind: FileKind::Symlink, target: Some(b"../to\xff".to_vec()), rdev: 0 },
            RecNew { id: 4, kind: FileKind::Other, target: None, rdev: 0 },
        ],
        dirs: vec![
            RecDir {
                dir: ObjRef::Base(b"".to_vec()),
                entries: vec![
                    (b"new".to_vec(), Some(ObjRef::New(1))),
                    (b"moved\xfe".to_vec(), Some(ObjRef::Base(b"a/b".to_vec()))),
                    (b"gone".to_vec(), None),
                ],
            },
            RecDir { dir: ObjRef::New(2), entries: vec![] },
        ],
        objs: vec![
            RecObj {
                obj: ObjRef::New(1),
                attr: RecAttr {
                    mode: Some(0o100644),
                    uid: Some(1000),
                    gid: None,
                    atime: ts(-1, 999_999_999),
                    mtime: ts(1_700_000_000, 5),
                    ctime: None,
                    nlink: -1,
                    xattrs: vec![
                        (b"user.a".to_vec(), Some(b"value".to_vec())),
                        (b"user.empty".to_vec(), Some(vec![])),
                        (b"user.gone".to_vec(), None),
                    ],
                },
                file: Some(RecFile {
                    cut: NO_CUT,
                    exact: true,
                    size: 1 << 40,
                    extents: vec![(0, 6, 0), (u64::MAX - 1, 1, 6)],
                }),
            },
            RecObj {
                obj: ObjRef::Base(b"a/b".to_vec()),
                attr: RecAttr::default(),
                file: Some(RecFile { cut: 3, exact: false, size: 0, extents: vec![] }),
            },
            RecObj { obj: ObjRef::New(2), attr: RecAttr { nlink: 2, ..RecAttr::default() }, file: None },
        ],
        files,
        crcs: vec![],
        paths: vec![],
    }
}

fn file_refs() -> Vec<FileRef> {
    vec![
        FileRef { obj: 0, off: 0, len: 20 << 10, file: 0, file_off: 0 },
        FileRef { obj: u32::MAX, off: 7, len: 1, file: 0x0123_4567_89ab_cdef, file_off: u64::MAX },
    ]
}

/// A plan with every step: both moves out, every placement, data from
/// the journal and from data files, attributes set and left alone.
fn plan() -> PlanV1 {
    PlanV1 {
        epoch: Epoch(7),
        last_seq: Seq(41),
        out: vec![
            MoveOut::Stage { from: b"d/f".to_vec(), stage: b".txfs/stage/o9".to_vec() },
            MoveOut::Unlink { from: b"link2".to_vec() },
        ],
        place: vec![
            Place::Rename { stage: b".txfs/stage/o9".to_vec(), to: b"e/f".to_vec() },
            Place::File { to: b"new".to_vec() },
            Place::Dir { to: b"dir\xff".to_vec() },
            Place::Symlink { to: b"ln".to_vec(), target: b"new".to_vec() },
            Place::Link { existing: b"new".to_vec(), to: b"hard".to_vec() },
            Place::Replace {
                data: b".txfs/data/0000000000000003".to_vec(),
                to: b"big".to_vec(),
                size: 1 << 20,
                keep: Some(b".txfs/data/0000000000000004".to_vec()),
            },
            Place::Replace { data: b".txfs/data/0000000000000005".to_vec(), to: b"b2".to_vec(), size: 0, keep: None },
        ],
        data: vec![
            DataOp {
                path: b"new".to_vec(),
                cut: NO_CUT,
                size: 10,
                extents: vec![(0, 4, 48), (4, 6, 100)],
                files: vec![(10, 5, 2, 0)],
            },
            DataOp { path: b"e/f".to_vec(), cut: 0, size: 0, extents: vec![], files: vec![] },
        ],
        attrs: vec![
            AttrOp {
                path: b"new".to_vec(),
                is_symlink: false,
                mode: Some(0o600),
                owner: Some((Some(0), None)),
                times: Some((ts(1, 2), None)),
                xattrs: vec![(b"user.x".to_vec(), Some(b"1".to_vec())), (b"user.y".to_vec(), None)],
            },
            AttrOp { path: b"ln".to_vec(), is_symlink: true, mode: None, owner: None, times: None, xattrs: vec![] },
        ],
        dead: vec![b".txfs/stage/o3".to_vec(), vec![]],
    }
}

/// glibc's `makedev`: /dev/null, and a number past 12 bits of major and 8
/// of minor (both halves of each part are used).
const DEV_NULL: u64 = 0x103;
const DEV_WIDE: u64 = 0x1000_1230_0345;

/// A record creating one object of each kind added with fifos (and one
/// `Other`, which needs no number): a device's number follows its kind,
/// the others' does not.
fn special_record() -> CommitRecord {
    let attr = |mode, t: Option<Timestamp>| RecAttr {
        mode: Some(mode),
        uid: Some(0),
        gid: Some(0),
        atime: t,
        mtime: t,
        ctime: t,
        nlink: 1,
        xattrs: vec![],
    };
    CommitRecord {
        created: vec![
            RecNew { id: 5, kind: FileKind::Fifo, target: None, rdev: 0 },
            RecNew { id: 6, kind: FileKind::Socket, target: None, rdev: 0 },
            RecNew { id: 7, kind: FileKind::CharDev, target: None, rdev: DEV_NULL },
            RecNew { id: 8, kind: FileKind::BlockDev, target: None, rdev: DEV_WIDE },
            RecNew { id: 9, kind: FileKind::Other, target: None, rdev: 0 },
        ],
        dirs: vec![
            RecDir {
                dir: ObjRef::Base(b"".to_vec()),
                entries: vec![
                    (b"fifo".to_vec(), Some(ObjRef::New(5))),
                    (b"sock".to_vec(), Some(ObjRef::New(6))),
                    (b"null".to_vec(), Some(ObjRef::New(7))),
                    (b"disk\xff".to_vec(), Some(ObjRef::New(8))),
                ],
            },
            RecDir {
                dir: ObjRef::Base(b"dev".to_vec()),
                entries: vec![(b"old-fifo".to_vec(), Some(ObjRef::Base(b"fifo2".to_vec()))), (b"gone".to_vec(), None)],
            },
        ],
        objs: vec![
            RecObj {
                obj: ObjRef::New(5),
                attr: attr(0o644, Some(Timestamp { secs: 1_700_000_000, nanos: 1 })),
                file: None,
            },
            RecObj { obj: ObjRef::New(7), attr: attr(0o666, None), file: None },
            RecObj {
                obj: ObjRef::Base(b"fifo2".to_vec()),
                attr: RecAttr { nlink: 1, ..RecAttr::default() },
                file: None,
            },
        ],
        files: vec![],
        crcs: vec![],
        paths: vec![],
    }
}

/// A plan that makes every special kind, and links to one.
fn special_plan() -> PlanV1 {
    PlanV1 {
        epoch: Epoch(8),
        last_seq: Seq(50),
        out: vec![],
        place: vec![
            Place::Dir { to: b"dev".to_vec() },
            Place::Special { to: b"dev/fifo".to_vec(), kind: FileKind::Fifo, rdev: 0 },
            Place::Special { to: b"dev/sock".to_vec(), kind: FileKind::Socket, rdev: 0 },
            Place::Special { to: b"dev/null".to_vec(), kind: FileKind::CharDev, rdev: DEV_NULL },
            Place::Special { to: b"dev/disk\xff".to_vec(), kind: FileKind::BlockDev, rdev: DEV_WIDE },
            Place::Link { existing: b"dev/fifo".to_vec(), to: b"fifo-link".to_vec() },
        ],
        data: vec![],
        attrs: vec![
            AttrOp {
                path: b"dev/fifo".to_vec(),
                is_symlink: false,
                mode: Some(0o644),
                owner: Some((Some(1000), Some(1000))),
                times: Some((ts(1, 2), ts(3, 4))),
                xattrs: vec![],
            },
            AttrOp {
                path: b"dev/null".to_vec(),
                is_symlink: false,
                mode: Some(0o666),
                owner: Some((Some(0), Some(0))),
                times: None,
                xattrs: vec![],
            },
        ],
        dead: vec![],
    }
}

fn encoded(rec: &CommitRecord) -> (Vec<u8>, u16) {
    rec.encode().expect("a record always encodes")
}

#[test]
fn record_without_data_files_is_version_1_and_its_golden_bytes() {
    let (meta, version) = encoded(&record(vec![]));
    assert_eq!(version, REC_VERSION);
    assert!(meta == RECORD_V1, "record v1 bytes changed:\n{meta:02x?}");
    let back = CommitRecord::decode(RECORD_V1, REC_VERSION).expect("decodes");
    assert_eq!(encoded(&back), (RECORD_V1.to_vec(), REC_VERSION));
}

#[test]
fn record_with_data_files_is_version_2_and_its_golden_bytes() {
    let (meta, version) = encoded(&record(file_refs()));
    assert_eq!(version, REC_VERSION_FILES);
    assert!(meta == RECORD_V2, "record v2 bytes changed:\n{meta:02x?}");
    // The file refs follow the version-1 body.
    assert_eq!(&RECORD_V2[..RECORD_V1.len()], RECORD_V1);
    let back = CommitRecord::decode(RECORD_V2, REC_VERSION_FILES).expect("decodes");
    assert_eq!(back.files, file_refs());
    assert_eq!(encoded(&back), (RECORD_V2.to_vec(), REC_VERSION_FILES));
    // Read as version 1, the file refs are bytes after the record.
    let v1 = CommitRecord::decode(RECORD_V2, REC_VERSION).expect("decodes");
    assert!(v1.files.is_empty());
    assert_eq!(encoded(&v1).0, RECORD_V1);
}

/// Data-file checksums (journal.md, "Data files"): one crc32c per file ref,
/// a `Vec<u32>` after the file refs, written by hand from that page. The
/// record stays version 2: a reader that knows no checksums (an older
/// binary) decodes `RECORD_V2` from these bytes and ignores the rest.
#[test]
fn record_with_data_file_checksums_is_version_2_followed_by_the_crcs() {
    let mut rec = record(file_refs());
    rec.crcs = vec![0x0403_0201, 0xffff_fffe];
    let (meta, version) = encoded(&rec);
    assert_eq!(version, REC_VERSION_FILES);
    let mut want = RECORD_V2.to_vec();
    want.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 0xfe, 0xff, 0xff, 0xff]);
    assert!(meta == want, "record with crcs:\n{meta:02x?}");
    let back = CommitRecord::decode(&want, REC_VERSION_FILES).expect("decodes");
    assert_eq!(back.crcs, rec.crcs);
    assert_eq!(back.files, file_refs());
    // Fewer checksums than file refs: refused, not half-read.
    let mut short = RECORD_V2.to_vec();
    short.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]);
    assert!(CommitRecord::decode(&short, REC_VERSION_FILES).is_err());
    // What an older reader keeps: the record without them.
    let mut old = CommitRecord::decode(&want, REC_VERSION_FILES).expect("decodes");
    old.crcs.clear();
    assert_eq!(encoded(&old), (RECORD_V2.to_vec(), REC_VERSION_FILES));
}

/// The same record with its base objects as entries of a path table
/// (`ObjRef::Path`), each path entered component by component.
fn with_path_table(mut rec: CommitRecord) -> CommitRecord {
    let mut table: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut enter = |r: &mut ObjRef| {
        let ObjRef::Base(p) = r else { return };
        let mut at = PATH_ROOT;
        for name in p.split(|b| *b == b'/').filter(|n| !n.is_empty()) {
            at = match table.iter().position(|(pp, n)| *pp == at && n == name) {
                Some(i) => i as u32,
                None => {
                    table.push((at, name.to_vec()));
                    (table.len() - 1) as u32
                }
            };
        }
        // The root is no entry: it stays a path (empty).
        if at != PATH_ROOT {
            *r = ObjRef::Path(at);
        }
    };
    for d in &mut rec.dirs {
        enter(&mut d.dir);
        for (_, e) in &mut d.entries {
            if let Some(r) = e {
                enter(r);
            }
        }
    }
    for o in &mut rec.objs {
        enter(&mut o.obj);
    }
    rec.paths = table;
    rec
}

/// A record naming base objects through its path table (issue 23: whole
/// paths made a deep tree's record grow with the square of its depth)
/// stays version 2: the table follows the checksums, which are then always
/// written. A binary older than the table refuses the record's refs (an
/// unknown `ObjRef` variant: `Corrupt`), never cuts it as a torn tail.
#[test]
fn record_with_a_path_table_is_version_2_and_its_golden_bytes() {
    let mut plain = record(file_refs());
    plain.crcs = vec![7, 8];
    let rec = with_path_table(plain.clone());
    assert!(!rec.paths.is_empty());
    let (meta, version) = encoded(&rec);
    assert_eq!(version, REC_VERSION_FILES);
    assert!(meta == RECORD_PATHS, "record with a path table changed:\n{meta:02x?}");
    let back = CommitRecord::decode(RECORD_PATHS, REC_VERSION_FILES).expect("decodes");
    assert_eq!(encoded(&back).0, RECORD_PATHS);
    assert_eq!(back.paths, rec.paths);
    // Each ref names the path the plain record named.
    let whole = |r: &CommitRecord| -> Vec<Vec<u8>> {
        r.refs()
            .map(|o| match o {
                ObjRef::Base(p) => p.clone(),
                ObjRef::Path(i) => r.path_of(*i),
                ObjRef::New(id) => format!("new {id}").into_bytes(),
            })
            .collect()
    };
    assert_eq!(whole(&back), whole(&plain));
    // A table without checksums would be read as them: both are written.
    let mut no_crcs = rec.clone();
    no_crcs.crcs.clear();
    no_crcs.files.clear();
    let (meta, version) = encoded(&no_crcs);
    assert_eq!(version, REC_VERSION_FILES);
    let back = CommitRecord::decode(&meta, version).expect("decodes");
    assert_eq!((back.files.len(), back.crcs.len(), back.paths), (0, 0, rec.paths.clone()));
    // A ref past the table, a parent after its entry, or a table read as
    // version 1 (which ends at the body): refused.
    let mut past = rec.clone();
    past.objs[0].obj = ObjRef::Path(rec.paths.len() as u32);
    assert!(CommitRecord::decode(&encoded(&past).0, REC_VERSION_FILES).is_err());
    let mut forward = rec.clone();
    forward.paths[0].0 = 1;
    assert!(CommitRecord::decode(&encoded(&forward).0, REC_VERSION_FILES).is_err());
    assert!(CommitRecord::decode(RECORD_PATHS, REC_VERSION).is_err());
}

/// Fifos, sockets and devices need no new record version: their kinds
/// are new variants at the end of the kind's enum (tags 4..7), a device's
/// number rides after its tag, and everything an earlier build wrote
/// (the goldens above) decodes and encodes as before. A build older than
/// these kinds refuses such a record as undecodable (recovery stops with
/// `Corrupt`), never cuts it as a torn tail.
#[test]
fn record_with_special_files_is_version_1_and_its_golden_bytes() {
    let (meta, version) = encoded(&special_record());
    assert_eq!(version, REC_VERSION);
    assert!(meta == RECORD_SPECIAL, "special record bytes changed:\n{meta:02x?}");
    let back = CommitRecord::decode(RECORD_SPECIAL, REC_VERSION).expect("decodes");
    let kinds: Vec<_> = back.created.iter().map(|n| (n.id, n.kind, n.rdev)).collect();
    assert_eq!(
        kinds,
        [
            (5, FileKind::Fifo, 0),
            (6, FileKind::Socket, 0),
            (7, FileKind::CharDev, DEV_NULL),
            (8, FileKind::BlockDev, DEV_WIDE),
            (9, FileKind::Other, 0)
        ]
    );
    assert_eq!(encoded(&back), (RECORD_SPECIAL.to_vec(), REC_VERSION));
    // The number is the 8 bytes right after a device's tag.
    let null_at = [&7u64.to_le_bytes()[..], &6u32.to_le_bytes()].concat();
    let at = RECORD_SPECIAL.windows(12).position(|w| w == null_at).expect("the char device") + 12;
    assert_eq!(RECORD_SPECIAL[at..at + 8], DEV_NULL.to_le_bytes());
    // A fifo's or socket's number is not recorded: 0 whatever was asked.
    let mut rec = special_record();
    rec.created[0].rdev = 42;
    assert_eq!(encoded(&rec).0, RECORD_SPECIAL);
}

/// A plan of the first format (whole paths, no version) still decodes, to
/// the same plan; it is written in the second (a path table), whose
/// bytes are golden too.
fn plan_formats(v1: PlanV1, v1_bytes: &[u8], v2_bytes: &[u8], what: &str) {
    let body = encode(&v1);
    assert!(body == v1_bytes, "{what}: first-format bytes changed:\n{body:02x?}");
    let back = decode_plan(v1_bytes).expect("the first format decodes");
    assert_eq!(encode(&back.to_v1()), v1_bytes, "{what}: the same plan");
    let body = encode_plan(&back);
    assert!(body == v2_bytes, "{what}: second-format bytes changed:\n{body:02x?}");
    let again = decode_plan(v2_bytes).expect("the second format decodes");
    assert_eq!(encode_plan(&again), v2_bytes);
    assert_eq!(encode(&again.to_v1()), v1_bytes, "{what}: the same plan");
}

#[test]
fn plan_with_special_files_golden_bytes() {
    plan_formats(special_plan(), PLAN_SPECIAL, PLAN_SPECIAL_V2, "special plan");
    let back = decode_plan(PLAN_SPECIAL_V2).expect("decodes");
    assert!(matches!(back.place[3], Place::Special { kind: FileKind::CharDev, rdev: DEV_NULL, .. }));
}

#[test]
fn plan_golden_bytes() {
    plan_formats(plan(), PLAN, PLAN_V2, "plan");
}

/// A second-format plan whose steps name a path its table does not have
/// is refused.
#[test]
fn a_plan_naming_a_path_outside_its_table_is_refused() {
    let mut p = decode_plan(PLAN_V2).expect("decodes");
    assert!(decode_plan(&encode_plan(&p)).is_some());
    let last = p.paths.entries() - 1;
    p.dead.push(decode_plan(PLAN_V2).unwrap().dead[0]);
    assert!(decode_plan(&encode_plan(&p)).is_some());
    let mut body = encode_plan(&p);
    // The last dead path is the body's last 4 bytes: one past the table.
    let n = body.len();
    body[n - 4..].copy_from_slice(&((last + 1) as u32).to_le_bytes());
    assert!(decode_plan(&body).is_none());
}

/// Every prefix of a record or plan is refused, with the reason that
/// bincode gave (it is part of `txfs check`'s report).
#[test]
fn truncation_is_refused() {
    for n in 0..RECORD_V2.len() {
        let err = CommitRecord::decode(&RECORD_V2[..n], REC_VERSION_FILES).expect_err("a prefix");
        assert_eq!(err.to_string(), "io error: failed to fill whole buffer", "prefix {n}");
    }
    for n in 0..RECORD_V1.len() {
        assert!(CommitRecord::decode(&RECORD_V1[..n], REC_VERSION).is_err(), "prefix {n}");
    }
    for n in 0..PLAN.len() {
        assert!(decode_plan(&PLAN[..n]).is_none(), "prefix {n}");
    }
    for n in 0..PLAN_V2.len() {
        assert!(decode_plan(&PLAN_V2[..n]).is_none(), "prefix {n}");
    }
    for n in 0..RECORD_SPECIAL.len() {
        assert!(CommitRecord::decode(&RECORD_SPECIAL[..n], REC_VERSION).is_err(), "prefix {n}");
    }
    for n in 0..PLAN_SPECIAL.len() {
        assert!(decode_plan(&PLAN_SPECIAL[..n]).is_none(), "prefix {n}");
    }
}

/// Bytes after a whole version-1 record or plan are ignored (as bincode
/// 1's `deserialize` and `deserialize_from` do). After a version-2 record's
/// file refs they are its data-file checksums (no encoder ever wrote other
/// bytes there), so junk there is refused.
#[test]
fn trailing_bytes_are_ignored() {
    let mut meta = RECORD_V1.to_vec();
    meta.extend_from_slice(&[0xff; 9]);
    let back = CommitRecord::decode(&meta, REC_VERSION).expect("decodes");
    assert_eq!(encoded(&back).0, RECORD_V1);
    let mut meta = RECORD_V2.to_vec();
    meta.extend_from_slice(&[0xff; 9]);
    assert!(CommitRecord::decode(&meta, REC_VERSION_FILES).is_err());
    for (plan, v2) in [(PLAN, PLAN_V2), (PLAN_V2, PLAN_V2)] {
        let mut body = plan.to_vec();
        body.extend_from_slice(&[0xff; 9]);
        assert_eq!(encode_plan(&decode_plan(&body).expect("decodes")), v2);
    }
}

/// Bytes that no encoder writes are refused: a bool, an `Option` tag or
/// an enum variant out of range, a length past the end.
#[test]
fn garbage_is_refused() {
    let decode = |meta: &[u8]| CommitRecord::decode(meta, REC_VERSION).map(|_| ()).map_err(|e| e.to_string());
    // created: len 1, id, kind, target tag
    let mut one = vec![1, 0, 0, 0, 0, 0, 0, 0];
    one.extend_from_slice(&9u64.to_le_bytes());
    let with = |tail: &[u8]| [&one[..], tail, &[0u8; 24][..]].concat();
    assert_eq!(decode(&with(&[0, 0, 0, 0, 0])), Ok(()));
    // Kinds 4..7 are fifo, socket and devices; 8 is past the last.
    assert_eq!(decode(&with(&[4, 0, 0, 0, 0])), Ok(()));
    assert_eq!(
        decode(&with(&[8, 0, 0, 0, 0])),
        Err("invalid value: integer `8`, expected variant index 0 <= i < 8".into())
    );
    // A device's number is part of its kind: the bytes of a whole record
    // creating a fifo are a record cut short if the kind is a device.
    let fifo = |kind: u8| [&one[..], &[kind, 0, 0, 0, 0], &[0u8; 16]].concat();
    assert_eq!(decode(&fifo(4)), Ok(()));
    assert_eq!(decode(&fifo(6)), Err("io error: failed to fill whole buffer".into()));
    assert_eq!(decode(&with(&[0, 0, 0, 0, 2])), Err("tag for enum is not valid, found 2".into()));
    // objs: len 1, ObjRef variant 3 (2 is an entry of a path table, which
    // a record without one refuses: `record_with_a_path_table_...`)
    let objs = [&[0u8; 16][..], &[1, 0, 0, 0, 0, 0, 0, 0], &[3, 0, 0, 0]].concat();
    assert_eq!(decode(&objs), Err("invalid value: integer `3`, expected variant index 0 <= i < 3".into()));
    // A length that runs past the end.
    let long = [&u64::MAX.to_le_bytes()[..], &[0u8; 16]].concat();
    assert_eq!(decode(&long), Err("io error: failed to fill whole buffer".into()));
    // A RecFile's `exact` that is not 0 or 1.
    let mut meta = RECORD_V1.to_vec();
    let at = find_exact_flag(&meta);
    meta[at] = 7;
    assert_eq!(decode(&meta), Err("invalid u8 while decoding bool, expected 0 or 1, found 7".into()));
}

/// Where RECORD_V1 holds the first `RecFile::exact`: between its
/// `cut = NO_CUT` and its `size = 1 << 40`.
fn find_exact_flag(meta: &[u8]) -> usize {
    let file = [&NO_CUT.to_le_bytes()[..], &[1], &(1u64 << 40).to_le_bytes()].concat();
    let at = meta.windows(file.len()).position(|w| w == file).expect("the first RecFile");
    at + 8
}
