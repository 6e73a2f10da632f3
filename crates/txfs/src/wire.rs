//! The wire protocol between txfs clients and the daemon, in one place:
//! ioctl numbers, the argument structs, and the batch WRITE.
//!
//! FUSE forwards only "restricted" ioctls, whose argument size is encoded
//! in the number, so every argument is a fixed-size `#[repr(C)]` struct and
//! every number is computed from the struct's size, as `_IOW`/`_IOR` do in
//! C. Fields are little-endian on the wire; each struct's bytes are written
//! and read at the offsets the compiler gives its fields ([`offset_of!`]),
//! so the layout is stated once, here, by the struct.
//!
//! The clients keep their own copies — `clients/c/txfs.h` for C (and the
//! SQLite VFS), `clients/python/txfs/_wire.py` for Python — and
//! `tests/wire_headers.rs` parses both and fails if any ioctl number,
//! struct size or field offset there differs from this file. That test
//! includes this file by path: it must not use anything else of the crate.
//!
//! ```text
//! ioctl            nr dir   argument                 reply
//! BEGIN             1  W    Flags                    -
//! COMMIT            2  W    Flags (COMMIT_ORDERED)   -
//! ABORT             3  W    Flags                    -
//! SYNC              4  W    Flags                    -
//! RUN               5  W    Run                      -
//! STATUS            6  R    -                        Status
//! STATE             7  R    -                        State
//! BEGIN_STATE       8  WR   BeginState (last_tx)     BeginState
//! COMMIT_IF         9  W    CommitIf                 -     (ESTALE: not that tx)
//! BATCH            10  W    Flags                    -     (the handle's WRITEs are batches)
//! BEGIN_FILE       11  WR   BeginFile (last_tx)      BeginFile
//! CACHE            12  R    -                        Cache (`txfs status` only; not in txfs.h)
//! TXS              13  R    -                        Txs   (`txfs status` only; not in txfs.h)
//! CHANGES          14  WR   Changes                  Changes (a page of the change set)
//! FAULT            15  R    -                        Fault (`txfs status` only; not in txfs.h)
//! ```

use std::mem::{offset_of, size_of};

/// The ioctl type byte of every txfs ioctl (`TXFS_IOC_MAGIC`).
pub const MAGIC: u32 = 0xE7;

/// `_IOC(dir, MAGIC, nr, size)` in the asm-generic encoding (x86, arm,
/// arm64, riscv, ...): 8 bits of number, 8 of type, 14 of size, 2 of
/// direction.
const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    assert!(size < 1 << 14, "an ioctl argument must fit in 14 bits of size");
    (dir << 30) | ((size as u32) << 16) | (MAGIC << 8) | nr
}

const fn iow(nr: u32, size: usize) -> u32 {
    ioc(1, nr, size)
}

const fn ior(nr: u32, size: usize) -> u32 {
    ioc(2, nr, size)
}

const fn iowr(nr: u32, size: usize) -> u32 {
    ioc(3, nr, size)
}

/// A field type of a wire struct: how it is written and read.
trait Field: Sized {
    fn put(&self, out: &mut [u8]);
    fn get(b: &[u8]) -> Self;
}

impl Field for u32 {
    fn put(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
    }
}

impl Field for u64 {
    fn put(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
    }
}

impl Field for u8 {
    fn put(&self, out: &mut [u8]) {
        out[0] = *self;
    }
    fn get(b: &[u8]) -> Self {
        b[0]
    }
}

/// The bytes a [`Changes`] answer carries.
pub const CHANGES_DATA: usize = 16320;

/// A plain byte array field too long for `Default` ([`Page`], [`Why`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bytes<const N: usize>(pub [u8; N]);

impl<const N: usize> Default for Bytes<N> {
    fn default() -> Self {
        Bytes([0; N])
    }
}

impl<const N: usize> std::fmt::Debug for Bytes<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(f, "Bytes<{N}>({:?})", String::from_utf8_lossy(&self.0[..used.min(64)]))
    }
}

impl<const N: usize> Field for Bytes<N> {
    fn put(&self, out: &mut [u8]) {
        out[..N].copy_from_slice(&self.0);
    }
    fn get(b: &[u8]) -> Self {
        Bytes(b[..N].try_into().expect("N bytes"))
    }
}

/// [`Changes::data`].
pub type Page = Bytes<CHANGES_DATA>;

impl<T: Field + Copy + Default, const N: usize> Field for [T; N] {
    fn put(&self, out: &mut [u8]) {
        let size = size_of::<T>();
        for (i, v) in self.iter().enumerate() {
            v.put(&mut out[i * size..]);
        }
    }
    fn get(b: &[u8]) -> Self {
        let size = size_of::<T>();
        std::array::from_fn(|i| T::get(&b[i * size..]))
    }
}

/// One field of a wire struct: its name, offset and size (for the test
/// that compares the clients' copies).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldLayout {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

/// Declares a `#[repr(C)]` wire struct with its C name, its byte codec and
/// its layout table.
macro_rules! wire_struct {
    ($(#[$m:meta])* $name:ident = $c:literal { $($(#[$fm:meta])* $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
        }

        impl $name {
            /// The struct's name in `clients/c/txfs.h`.
            #[cfg(test)]
            pub const C_NAME: &'static str = $c;
            pub const SIZE: usize = size_of::<$name>();
            #[cfg(test)]
            pub const FIELDS: &'static [FieldLayout] =
                &[$(FieldLayout { name: stringify!($f), offset: offset_of!($name, $f), size: size_of::<$t>() },)*];

            /// The struct's bytes on the wire. (Each struct is encoded on
            /// one side and decoded on the other: not every one uses both.)
            #[allow(dead_code)]
            pub fn encode(&self) -> Vec<u8> {
                let mut out = vec![0u8; Self::SIZE];
                self.put(&mut out);
                out
            }

            /// The struct in `b`; bytes missing at the end read as zeros.
            #[allow(dead_code)]
            pub fn decode(b: &[u8]) -> Self {
                let mut z = [0u8; size_of::<$name>()];
                let n = b.len().min(Self::SIZE);
                z[..n].copy_from_slice(&b[..n]);
                Self::get(&z)
            }
        }

        impl Field for $name {
            fn put(&self, out: &mut [u8]) {
                $(self.$f.put(&mut out[offset_of!($name, $f)..]);)*
            }
            fn get(b: &[u8]) -> Self {
                $name { $($f: Field::get(&b[offset_of!($name, $f)..]),)* }
            }
        }
    };
}

wire_struct! {
    /// BEGIN, COMMIT, ABORT, SYNC and BATCH.
    Flags = "txfs_ioc_flags" {
        /// [`COMMIT_ORDERED`] for COMMIT; else 0.
        flags: u32,
        reserved: u32,
    }
}

wire_struct! {
    /// RUN: make a process tree one transaction, or end it (`txfs run`).
    Run = "txfs_ioc_run" {
        /// The tree's root: it and all its descendants.
        pid: u32,
        /// [`RUN_BEGIN`], [`RUN_COMMIT`] or [`RUN_ABORT`].
        op: u32,
        /// [`COMMIT_ORDERED`] for RUN_COMMIT; [`RUN_VIEW`] for RUN_BEGIN.
        flags: u32,
        /// With [`RUN_VIEW`]: the caller's `/dev/fuse` descriptor of the
        /// view (`reserved` in txfs.h, which has no views).
        view_fd: u32,
    }
}

wire_struct! {
    /// STATUS: the engine's counters (`txfs status`).
    Status = "txfs_ioc_status" {
        commits: u64,
        aborts: u64,
        conflicts: u64,
        live_txs: u64,
        journal_bytes: u64,
        journal_syncs: u64,
        checkpoints: u64,
        last_seq: u64,
    }
}

wire_struct! {
    /// STATE: the caller's transaction and nesting depth.
    State = "txfs_ioc_state" {
        /// 0: none.
        tx: u64,
        /// 0: none (or joined to a `txfs run` tree without a begin).
        depth: u32,
        /// [`STATE_DOOMED`]; 0 from daemons before it.
        flags: u32,
    }
}

/// [`State::flags`]: the transaction lost a conflict; it can only abort.
pub const STATE_DOOMED: u32 = 0x1;

wire_struct! {
    /// BEGIN_STATE: a begin, answered with the state after it and how a
    /// transaction of the caller's own ended.
    BeginState = "txfs_ioc_begin_state" {
        /// Out: the transaction now.
        tx: u64,
        /// Out: the nesting depth now.
        depth: u32,
        /// Out: 1 if `last_tx` committed.
        last_committed: u32,
        /// In: the transaction to ask about, 0: the thread's last. Out: it,
        /// 0 if not known.
        last_tx: u64,
        /// Out: the transaction the thread was in before the begin (a
        /// `txfs run` tree's or view's too), 0: none.
        prior_tx: u64,
    }
}

wire_struct! {
    /// BEGIN_FILE: BEGIN_STATE issued on a regular file, also answering
    /// what the new transaction sees of it (SQLite's change counter).
    BeginFile = "txfs_ioc_begin_file" {
        /// In/out: as BEGIN_STATE.
        bs: BeginState,
        /// Out: the file's size.
        size: u64,
        /// Out: its bytes 24..40.
        head: [u8; 16],
        /// Out: 1 if `size` and `head` are set (a regular file at least 40
        /// bytes long, read without error).
        file_valid: u32,
        reserved: u32,
    }
}

wire_struct! {
    /// COMMIT_IF: commit one level, only if the caller's transaction is `tx`.
    CommitIf = "txfs_ioc_commit_if" {
        /// [`COMMIT_ORDERED`] or 0.
        flags: u32,
        reserved: u32,
        tx: u64,
    }
}

/// The bytes of [`Fault::why`].
pub const FAULT_WHY: usize = 1016;

/// [`Fault::why`].
pub type Why = Bytes<FAULT_WHY>;

wire_struct! {
    /// FAULT: why the mount stopped acknowledging anything, for `txfs status`.
    Fault = "txfs_ioc_fault" {
        /// [`FAULT_NONE`], [`FAULT_READS_GO_ON`], [`FAULT_ALL`] or
        /// [`FAULT_RETRIED`].
        state: u32,
        /// Bytes of `why` used.
        len: u32,
        /// The first failure, UTF-8, cut at [`FAULT_WHY`] bytes.
        why: Why,
    }
}

/// [`Fault::state`]: healthy.
pub const FAULT_NONE: u32 = 0;
/// [`Fault::state`]: nothing is acknowledged; plain reads are served.
pub const FAULT_READS_GO_ON: u32 = 1;
/// [`Fault::state`]: every request fails with EIO.
pub const FAULT_ALL: u32 = 2;
/// [`Fault::state`]: a checkpoint failed writing contents and is retried;
/// everything goes on.
pub const FAULT_RETRIED: u32 = 3;

wire_struct! {
    /// CACHE: the kernel cache gate (DESIGN §9), for `txfs status`.
    Cache = "txfs_ioc_cache" {
        /// 1 while the kernel may cache entries and attributes.
        open: u64,
        /// Replies sent with a nonzero TTL.
        cached_replies: u64,
        /// Gate closes that dropped something.
        closes: u64,
        /// LOOKUP and GETATTR requests served.
        attr_requests: u64,
    }
}

wire_struct! {
    /// One live transaction in a [`Txs`] answer.
    TxInfo = "txfs_ioc_txinfo" {
        tx: u64,
        /// Milliseconds since it began.
        age_ms: u64,
        /// Bytes it has written (memory, spill and data files).
        bytes: u64,
        /// Entries in its read set (page ranges, names, listings, attributes).
        reads: u64,
        /// The process that began it ([`TX_THREAD`]), or the `txfs run`
        /// that registered it ([`TX_RUN`]); 0: not known.
        pid: u32,
        /// The uid it began with.
        uid: u32,
        /// [`TX_THREAD`], [`TX_RUN`] or 0 (not known); [`TX_DOOMED`] added
        /// when it already lost a conflict or went past a cap.
        kind: u32,
        /// Paths it touched (names set or removed, objects changed in
        /// place; at most u32::MAX): `txfs diff` lists them.
        paths: u32,
        /// Memory it holds in the daemon, as its caps count it (`-o tx_mem`).
        mem: u64,
    }
}

/// How many transactions one TXS answer lists (the oldest first).
pub const TXS_MAX: usize = 32;

wire_struct! {
    /// TXS: the live transactions, for `txfs status`.
    Txs = "txfs_ioc_txs" {
        /// Entries of `txs` that are set.
        count: u32,
        /// Live transactions in all (more than `count` when past [`TXS_MAX`]).
        total: u32,
        txs: [TxInfo; TXS_MAX],
    }
}

wire_struct! {
    /// CHANGES: a page of a live transaction's change set, or of one side
    /// of one changed file (`txfs diff`, `txfs run --dry-run`,
    /// `txfs_changes`). The listing is a snapshot taken at offset 0; later
    /// pages name it by `snap` (ESTALE: a newer listing replaced it, start
    /// again). Its records: [`encode_change`].
    Changes = "txfs_ioc_changes" {
        /// 0: the caller's own transaction (thread, `txfs run` tree or
        /// view); else the `txfs run` tree of this pid, asked by the
        /// process that registered it.
        pid: u32,
        /// [`CHANGES_LIST`], [`CHANGES_OLD`] or [`CHANGES_NEW`].
        op: u32,
        /// LIST: a byte offset in the listing; OLD, NEW: in the file.
        offset: u64,
        /// OLD, NEW: the change's position in the listing.
        index: u64,
        /// Out: LIST: the listing's length in bytes; OLD, NEW: the file's size.
        total: u64,
        /// Out: bytes of `data` that are set.
        len: u32,
        /// In (offset > 0, OLD, NEW) and out: the listing's snapshot.
        snap: u32,
        /// Out: [`CHANGES_LOST`].
        flags: u32,
        reserved: u32,
        data: Page,
    }
}

pub const CHANGES_LIST: u32 = 1;
/// The committed content of a change's file (before).
pub const CHANGES_OLD: u32 = 2;
/// Its content as the transaction would commit it (after).
pub const CHANGES_NEW: u32 = 3;
/// [`Changes::flags`]: the transaction already lost a conflict (its commit
/// will fail; a rerun may see other data).
pub const CHANGES_LOST: u32 = 0x1;

/// [`ChangeRec::what`] bits (txfs_engine::what, by value).
pub mod what {
    pub const CREATED: u32 = 0x1;
    pub const DELETED: u32 = 0x2;
    pub const MODIFIED: u32 = 0x4;
    pub const RENAMED: u32 = 0x8;
    pub const LINKED: u32 = 0x10;
    pub const MODE: u32 = 0x20;
    pub const OWNER: u32 = 0x40;
    pub const XATTR: u32 = 0x80;
    pub const TIMES: u32 = 0x100;
    pub const REPLACED: u32 = 0x200;
}

/// One record of a CHANGES listing, as the clients decode it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeRec {
    pub what: u32,
    /// `S_IFMT` bits of what the path names (named before, if deleted).
    pub kind: u32,
    /// `st_mode`, uid, gid and size before (0: nothing before) and after.
    pub old_mode: u32,
    pub new_mode: u32,
    pub old_uid: u32,
    pub old_gid: u32,
    pub new_uid: u32,
    pub new_gid: u32,
    pub old_size: u64,
    pub new_size: u64,
    /// Bytes written into the file.
    pub bytes: u64,
    /// Below a created or deleted directory: what was created or deleted with it.
    pub files: u64,
    pub dirs: u64,
    pub path: Vec<u8>,
    /// Empty unless renamed.
    pub from: Vec<u8>,
    pub old_target: Vec<u8>,
    pub target: Vec<u8>,
    /// Names of extended attributes set or removed.
    pub xattrs: Vec<Vec<u8>>,
}

/// Bytes of a record before its strings.
pub const CHANGE_HEAD: usize = 80;

/// A record's bytes: its length (u32, all of it), `what`, `kind`, modes,
/// uids and gids (u32 each), a u32 0, sizes, bytes, files and dirs (u64
/// each), then five strings, each a u32 length and its bytes: path, from,
/// old target, target, and the xattr names each followed by a NUL. All
/// little-endian.
pub fn encode_change(c: &ChangeRec, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    for v in [c.what, c.kind, c.old_mode, c.new_mode, c.old_uid, c.old_gid, c.new_uid, c.new_gid, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [c.old_size, c.new_size, c.bytes, c.files, c.dirs] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let xattrs: Vec<u8> = c.xattrs.iter().flat_map(|x| x.iter().copied().chain([0])).collect();
    for s in [&c.path, &c.from, &c.old_target, &c.target, &xattrs] {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
    }
    let len = (out.len() - start) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// The records of a whole listing, or `None` if it is not exactly some.
pub fn decode_changes(mut b: &[u8]) -> Option<Vec<ChangeRec>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let len = u32::get(b.get(..4)?) as usize;
        let rec = b.get(..len).filter(|_| len >= CHANGE_HEAD)?;
        let u = |i: usize| u32::get(&rec[4 + 4 * i..]);
        let q = |i: usize| u64::get(&rec[40 + 8 * i..]);
        let mut strs = Vec::with_capacity(5);
        let mut at = CHANGE_HEAD;
        for _ in 0..5 {
            let n = u32::get(rec.get(at..at + 4)?) as usize;
            strs.push(rec.get(at + 4..at + 4 + n)?.to_vec());
            at += 4 + n;
        }
        if at != len {
            return None;
        }
        let x = strs.pop()?;
        let xattrs = x.split(|&c| c == 0).filter(|n| !n.is_empty()).map(<[u8]>::to_vec).collect();
        let [path, from, old_target, target]: [Vec<u8>; 4] = strs.try_into().ok()?;
        out.push(ChangeRec {
            what: u(0),
            kind: u(1),
            old_mode: u(2),
            new_mode: u(3),
            old_uid: u(4),
            old_gid: u(5),
            new_uid: u(6),
            new_gid: u(7),
            old_size: q(0),
            new_size: q(1),
            bytes: q(2),
            files: q(3),
            dirs: q(4),
            path,
            from,
            old_target,
            target,
            xattrs,
        });
        b = &b[len..];
    }
    Some(out)
}

/// [`TxInfo::kind`]: begun by a thread (TXFS_IOC_BEGIN, libtxfs, Python).
pub const TX_THREAD: u32 = 1;
/// [`TxInfo::kind`]: a `txfs run` process tree.
pub const TX_RUN: u32 = 2;
/// [`TxInfo::kind`] flag: it lost a conflict; its commit will fail.
pub const TX_DOOMED: u32 = 0x100;

pub const BEGIN: u32 = iow(1, Flags::SIZE);
pub const COMMIT: u32 = iow(2, Flags::SIZE);
pub const ABORT: u32 = iow(3, Flags::SIZE);
pub const SYNC: u32 = iow(4, Flags::SIZE);
pub const RUN: u32 = iow(5, Run::SIZE);
pub const STATUS: u32 = ior(6, Status::SIZE);
pub const STATE: u32 = ior(7, State::SIZE);
/// BEGIN, answered with the state after it and how a transaction of the
/// caller's own ended: the one it names, or its last.
pub const BEGIN_STATE: u32 = iowr(8, BeginState::SIZE);
/// COMMIT of one level, only if the caller's transaction is the one named;
/// ESTALE otherwise.
pub const COMMIT_IF: u32 = iow(9, CommitIf::SIZE);
/// Issued on a file opened for writing: every WRITE through that descriptor
/// is a batch of writes to its file ([`parse_batch`]).
pub const BATCH: u32 = iow(10, Flags::SIZE);
/// BEGIN_STATE issued on a regular file, also answering what the caller's
/// transaction now sees of that file: its size and bytes 24..40, both
/// entering the read set as if read.
pub const BEGIN_FILE: u32 = iowr(11, BeginFile::SIZE);
/// The kernel cache gate's counters (`txfs status`).
pub const CACHE: u32 = ior(12, Cache::SIZE);
/// The live transactions (`txfs status`).
pub const TXS: u32 = ior(13, Txs::SIZE);
/// A live transaction's change set, a page at a time.
pub const CHANGES: u32 = iowr(14, Changes::SIZE);
/// Why the mount stopped acknowledging (`txfs status`).
pub const FAULT: u32 = ior(15, Fault::SIZE);

/// Every ioctl: its name in txfs.h (without `TXFS_IOC_`), its number, and
/// the C name of its argument.
#[cfg(test)]
pub const IOCTLS: &[(&str, u32, &str)] = &[
    ("BEGIN", BEGIN, Flags::C_NAME),
    ("COMMIT", COMMIT, Flags::C_NAME),
    ("ABORT", ABORT, Flags::C_NAME),
    ("SYNC", SYNC, Flags::C_NAME),
    ("RUN", RUN, Run::C_NAME),
    ("STATUS", STATUS, Status::C_NAME),
    ("STATE", STATE, State::C_NAME),
    ("BEGIN_STATE", BEGIN_STATE, BeginState::C_NAME),
    ("COMMIT_IF", COMMIT_IF, CommitIf::C_NAME),
    ("BATCH", BATCH, Flags::C_NAME),
    ("BEGIN_FILE", BEGIN_FILE, BeginFile::C_NAME),
    ("CACHE", CACHE, Cache::C_NAME),
    ("TXS", TXS, Txs::C_NAME),
    ("CHANGES", CHANGES, Changes::C_NAME),
    ("FAULT", FAULT, Fault::C_NAME),
];

/// Every argument struct: C name, size, fields.
#[cfg(test)]
pub const STRUCTS: &[(&str, usize, &[FieldLayout])] = &[
    (Flags::C_NAME, Flags::SIZE, Flags::FIELDS),
    (Run::C_NAME, Run::SIZE, Run::FIELDS),
    (Status::C_NAME, Status::SIZE, Status::FIELDS),
    (State::C_NAME, State::SIZE, State::FIELDS),
    (BeginState::C_NAME, BeginState::SIZE, BeginState::FIELDS),
    (BeginFile::C_NAME, BeginFile::SIZE, BeginFile::FIELDS),
    (CommitIf::C_NAME, CommitIf::SIZE, CommitIf::FIELDS),
    (Cache::C_NAME, Cache::SIZE, Cache::FIELDS),
    (TxInfo::C_NAME, TxInfo::SIZE, TxInfo::FIELDS),
    (Txs::C_NAME, Txs::SIZE, Txs::FIELDS),
    (Changes::C_NAME, Changes::SIZE, Changes::FIELDS),
    (Fault::C_NAME, Fault::SIZE, Fault::FIELDS),
];

/// Used by the daemon and `txfs status` only: not in the clients' copies.
#[cfg(test)]
pub const INTERNAL: &[&str] =
    &["CACHE", "txfs_ioc_cache", "TXS", "txfs_ioc_txs", "txfs_ioc_txinfo", "FAULT", "txfs_ioc_fault"];

/// COMMIT, COMMIT_IF and RUN_COMMIT flag: return once the commit's order is
/// fixed; durable later (SYNC).
pub const COMMIT_ORDERED: u32 = 0x1;

pub const RUN_BEGIN: u32 = 1;
pub const RUN_COMMIT: u32 = 2;
pub const RUN_ABORT: u32 = 3;
/// RUN_BEGIN flag: serve the tree a transaction view on the `/dev/fuse`
/// descriptor [`Run::view_fd`] (in the caller).
pub const RUN_VIEW: u32 = 0x2;

/// The first bytes of a batch WRITE (`TXFS_IOC_BATCH`).
pub const BATCH_MAGIC: &[u8; 8] = b"TXFSBAT1";
/// The largest batch: one WRITE (the daemon's `max_write`).
pub const BATCH_MAX: u32 = 1 << 20;

/// The writes of a batch WRITE, or `None` if `data` is not exactly one.
///
/// The layout: [`BATCH_MAGIC`], the whole batch's length as a u64 (so a
/// WRITE the kernel split is refused, not half applied), then records of
/// (offset u64, length u32, 0 u32, `length` bytes), all little-endian.
pub fn parse_batch(data: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    let u64_at = |b: &[u8], i: usize| u64::get(&b[i..]);
    let u32_at = |b: &[u8], i: usize| u32::get(&b[i..]);
    if data.len() < 16 || &data[..8] != BATCH_MAGIC || u64_at(data, 8) != data.len() as u64 {
        return None;
    }
    let mut out = Vec::new();
    let mut at = 16;
    while at < data.len() {
        let hdr = data.get(at..at + 16)?;
        let (off, len) = (u64_at(hdr, 0), u32_at(hdr, 8) as usize);
        if u32_at(hdr, 12) != 0 || len == 0 || off.checked_add(len as u64).is_none_or(|e| e > i64::MAX as u64) {
            return None;
        }
        out.push((off, data.get(at + 16..at + 16 + len)?));
        at += 16 + len;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers `_IOW`/`_IOR` give in C for the structs of txfs.h.
    #[test]
    fn numbers_match_the_c_header() {
        assert_eq!(BEGIN, 0x4008_e701);
        assert_eq!(RUN, 0x4010_e705);
        assert_eq!(STATUS, 0x8040_e706);
        assert_eq!(STATE, 0x8010_e707);
        assert_eq!(BEGIN_STATE, 0xc020_e708);
        assert_eq!(COMMIT_IF, 0x4010_e709);
        assert_eq!(BATCH, 0x4008_e70a);
        assert_eq!(BEGIN_FILE, 0xc040_e70b);
        assert_eq!(CACHE, 0x8020_e70c);
        assert_eq!(TXS, 0x8708_e70d);
        assert_eq!(CHANGES, 0xfff0_e70e);
        assert_eq!(FAULT, 0x8400_e70f);
    }

    #[test]
    fn change_records_round_trip_and_a_cut_listing_is_refused() {
        let a = ChangeRec {
            what: what::RENAMED | what::MODIFIED,
            kind: 0o100000,
            old_size: 3,
            new_size: 1 << 40,
            path: b"d/new name".to_vec(),
            from: b"old".to_vec(),
            xattrs: vec![b"user.a".to_vec(), b"user.b".to_vec()],
            ..ChangeRec::default()
        };
        let b = ChangeRec { what: what::CREATED, target: b"../x".to_vec(), path: b"l".to_vec(), ..Default::default() };
        let mut out = Vec::new();
        encode_change(&a, &mut out);
        assert_eq!(u32::get(&out), out.len() as u32);
        encode_change(&b, &mut out);
        assert_eq!(decode_changes(&out), Some(vec![a, b]));
        assert_eq!(decode_changes(&out[..out.len() - 1]), None);
        assert_eq!(decode_changes(&[]), Some(vec![]));
    }

    /// Each number carries its struct's size, and no struct has padding
    /// (the Python client packs them with none).
    #[test]
    fn numbers_carry_their_struct_and_structs_are_packed() {
        for (name, number, c) in IOCTLS {
            let (_, size, _) = STRUCTS.iter().find(|s| s.0 == *c).expect("every argument is in STRUCTS");
            assert_eq!(((number >> 16) & 0x3fff) as usize, *size, "{name}");
        }
        for (c, size, fields) in STRUCTS {
            let mut at = 0;
            for f in *fields {
                assert_eq!(f.offset, at, "{c}.{}: padding before it", f.name);
                at += f.size;
            }
            assert_eq!(at, *size, "{c}: padding at its end");
        }
        assert!(INTERNAL.iter().all(|n| IOCTLS.iter().any(|i| i.0 == *n) || STRUCTS.iter().any(|s| s.0 == *n)));
    }

    #[test]
    fn structs_round_trip_at_their_offsets() {
        let bf = BeginFile {
            bs: BeginState { tx: 7, depth: 2, last_committed: 1, last_tx: 5, prior_tx: 3 },
            size: 4096,
            head: [9; 16],
            file_valid: 1,
            reserved: 0,
        };
        let b = bf.encode();
        assert_eq!(b.len(), 64);
        assert_eq!(&b[12..16], &1u32.to_le_bytes());
        assert_eq!(&b[24..32], &3u64.to_le_bytes());
        assert_eq!(&b[40..56], &[9; 16]);
        assert_eq!(BeginFile::decode(&b), bf);
        assert_eq!(State::decode(&[1, 0, 0]), State { tx: 1, ..State::default() });
    }

    #[test]
    fn batches_parse_whole_or_not_at_all() {
        let mut b = BATCH_MAGIC.to_vec();
        b.extend_from_slice(&0u64.to_le_bytes());
        for (off, data) in [(0u64, &b"ab"[..]), (100, b"xyz")] {
            b.extend_from_slice(&off.to_le_bytes());
            b.extend_from_slice(&(data.len() as u32).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(data);
        }
        let len = b.len() as u64;
        b[8..16].copy_from_slice(&len.to_le_bytes());
        assert_eq!(parse_batch(&b), Some(vec![(0, &b"ab"[..]), (100, &b"xyz"[..])]));
        assert_eq!(parse_batch(&b[..b.len() - 1]), None);
    }
}
