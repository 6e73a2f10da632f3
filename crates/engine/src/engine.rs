//! The engine: objects, transactions, reads through deltas, commit.
//!
//! ## State
//! The committed state is the backing tree as of the last checkpoint
//! (*base*) with the *committed delta* on top: everything committed since.
//! A live transaction adds its own delta on top of that. All of it sits
//! behind one lock ([`State`]); journal `fdatasync` runs outside it (group
//! commit), so durable committers do not serialize on the disk.
//!
//! ## Transaction states
//! ```text
//!   begin() --> Live --op fails with Conflict--> Doomed --abort()--> gone
//!                 |                                 `--commit()--> Conflict, gone
//!                 |--commit(): validate (I3) --stale--> Conflict, gone
//!                 |            append record (J2), compose into committed
//!                 |            delta, stamp versions (I2) --> Committed
//!                 `--abort() / drop of the owner --> gone (nothing written)
//! ```
//! Isolation rules (numbered in docs/DESIGN.md):
//! * I1: a transaction's delta is reachable only through its `TxId`.
//! * I2: a read of an item stamped after the transaction's start fails with
//!   Conflict instead of returning a newer value: every read sees the
//!   committed state as of `begin()`.
//! * I3: commit re-validates the whole read set; it holds the lock from
//!   validation to publication, so commits are totally ordered.
//! * I4: an operation outside a transaction runs as a transaction of one
//!   operation, validated and committed under the same lock hold: it never
//!   conflicts. A transaction that read what it changed fails later (the
//!   documented policy: the transaction, not the plain writer, loses).

use crate::checkpoint;
use crate::delta::{AttrDelta, DataLoc, Delta, FileDelta, NewObj, NO_CUT};
use crate::error::{Error, IoContext, Result};
use crate::ids::{Epoch, ObjId, Seq, TxId};
use crate::journal::{self, JPos, JournalWriter, SyncState};
use crate::storage::{FileKind, Meta, Storage, StoredFile, Timestamp};
use crate::versions::{ReadSet, Versions, PAGE};
use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Name of the engine's own folder in the backing root, hidden from users.
pub const META_DIR: &str = ".txfs";
pub const NAME_MAX: usize = 255;

/// Reserved object ids: the root, `.txfs`, `.txfs/orphans`.
pub(crate) const META_OBJ: ObjId = ObjId(2);
pub(crate) const ORPHANS_OBJ: ObjId = ObjId(3);
pub(crate) const FIRST_FREE_OBJ: u64 = 16;

#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes of written data a transaction keeps in memory before spilling
    /// the rest to `.txfs/spill/`.
    pub spill_threshold: u64,
    /// A file created by a transaction whose content reaches this size is
    /// staged in a data file of its own: its bytes are written once, synced
    /// before the commit record, and renamed into place by the checkpoint
    /// instead of being journaled and copied (selective data journaling).
    /// Below it one journal `fdatasync` beats two syncs (measured: a 1 MiB
    /// new file + SQLite row, 2.6 ms journaled vs 5.8 ms staged).
    pub stage_threshold: u64,
    /// Journal size (plus committed data files) that triggers a background
    /// checkpoint.
    pub checkpoint_bytes: u64,
    /// How often the background thread makes ordered commits durable and
    /// checks the journal size; `None`: no background thread.
    pub flush_interval: Option<Duration>,
    /// A mount with committed changes and no commit for this long is
    /// checkpointed in the background (with `flush_interval`): reads then
    /// find untouched files, the committed delta's memory is given back,
    /// and a crash has less to replay. Not when the changes rename, create
    /// or remove more than [`IDLE_CHECKPOINT_MAX_NAMES`] names: a
    /// checkpoint moves names under the engine lock, and every request
    /// waits for that (bench/NOTES.md item 45). `None`: only by size.
    pub idle_checkpoint: Option<Duration>,
}

/// The most name changes an idle checkpoint moves (see
/// [`Options::idle_checkpoint`]): a few milliseconds of the lock.
pub const IDLE_CHECKPOINT_MAX_NAMES: usize = 256;

impl Default for Options {
    fn default() -> Self {
        Options {
            spill_threshold: 64 << 20,
            stage_threshold: 16 << 20,
            checkpoint_bytes: 256 << 20,
            flush_interval: Some(Duration::from_millis(500)),
            idle_checkpoint: Some(Duration::from_secs(5)),
        }
    }
}

/// How a commit returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Returns after the commit is durable.
    Durable,
    /// Returns once the commit's place in the order is fixed; durable at the
    /// next sync, durable commit or background flush. After a crash the
    /// recovered state is always a prefix of the commit order.
    Ordered,
}

/// Attributes of an object as a transaction (or everyone) sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub obj: ObjId,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: OsString,
    pub obj: ObjId,
    pub kind: FileKind,
}

/// Attribute changes for [`Engine::setattr`].
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
}

/// Flags of [`Engine::rename`] (as `renameat2`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

/// Live counters, for `txfs status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub commits: u64,
    pub aborts: u64,
    pub conflicts: u64,
    pub live_txs: u64,
    pub journal_bytes: u64,
    pub journal_syncs: u64,
    pub checkpoints: u64,
    pub last_seq: u64,
}

/// Where an object lives in the backing tree: a name in a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BaseLoc {
    pub parent: ObjId,
    pub name: OsString,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub kind: FileKind,
    /// `None`: created since the last checkpoint, or gone.
    pub base: Option<BaseLoc>,
    /// Other names of a hard-linked base file that lookups met.
    pub alts: Vec<BaseLoc>,
    pub open: u32,
    pub gone: bool,
    pub ino: Option<(u64, u64)>,
}

pub(crate) struct Tx {
    pub id: TxId,
    pub start: Seq,
    pub delta: Delta,
    pub reads: ReadSet,
    pub doomed: Option<String>,
    pub mem_bytes: u64,
    /// The transaction's spill data file and where its next bytes go.
    pub spill: Option<(u64, u64)>,
    /// Files it created whose content is staged in a data file.
    pub staged: HashMap<ObjId, u64>,
    /// Existing files it rewrites from the start, past `stage_threshold` or
    /// its memory: their shadow data files, which hold its bytes at the
    /// files' own offsets (DESIGN §2a).
    pub shadows: HashMap<ObjId, u64>,
    /// A data file of this transaction was written since it was last synced.
    pub data_dirty: bool,
    /// Objects whose attributes the transaction set itself (setattr), as
    /// opposed to times that its namespace changes bumped.
    pub explicit: std::collections::HashSet<ObjId>,
    /// Writes reserved in its data files whose bytes are still being copied
    /// outside the engine lock. Its commit waits for them: a shadow's bytes
    /// sit where the committed delta points, so a copy landing after the
    /// commit would change committed content.
    pub inflight: u32,
    /// Its commit is waiting for `inflight`: new writes take the locked
    /// path, so a stream of writes from other threads cannot starve it.
    pub committing: bool,
}

impl Tx {
    /// Its data files: the spill file and the staged files.
    fn data_file_ids(&self) -> impl Iterator<Item = u64> + '_ {
        let files = self.staged.values().chain(self.shadows.values()).copied();
        self.spill.iter().map(|(id, _)| *id).chain(files)
    }

    fn new(id: TxId, start: Seq) -> Tx {
        Tx {
            id,
            start,
            delta: Delta::default(),
            reads: ReadSet::default(),
            doomed: None,
            mem_bytes: 0,
            spill: None,
            staged: HashMap::new(),
            shadows: HashMap::new(),
            data_dirty: false,
            explicit: Default::default(),
            inflight: 0,
            committing: false,
        }
    }
}

pub(crate) struct State {
    pub storage: Arc<dyn Storage>,
    pub nodes: HashMap<ObjId, Node>,
    pub by_ino: HashMap<(u64, u64), ObjId>,
    pub committed: Delta,
    /// The committed delta a running checkpoint is writing into the backing
    /// tree, below `committed`. Its namespace is already in the tree (the
    /// checkpoint's phases 1–2 ran under the lock); its file contents and
    /// attributes are being written (phase 3, outside the lock), so reads
    /// lay them over the tree until the checkpoint ends (DESIGN §4).
    pub frozen: Option<Delta>,
    /// Bumped, under the lock, before anything renames or removes a file of
    /// the backing tree (a checkpoint's start, an orphan's removal) and when
    /// a checkpoint ends: a read that ran without the lock counts only if
    /// this did not move meanwhile ([`Engine::read`]).
    pub tree_gen: u64,
    /// Directory parents changed by the committed delta (dirs only).
    pub txs: HashMap<TxId, Tx>,
    pub ver: Versions,
    pub next_obj: u64,
    pub next_tx: u64,
    pub seq: Seq,
    pub journal: JournalWriter,
    pub journal_files: HashMap<Epoch, Arc<dyn StoredFile>>,
    /// Data files (`.txfs/data/`): of live transactions, and those that
    /// committed records name until the checkpoint retires them.
    pub data_files: HashMap<u64, DataFile>,
    pub next_data: u64,
    /// Bytes in data files that committed records name (checkpoint trigger).
    pub committed_data_bytes: u64,
    pub poisoned: Option<String>,
    /// Orphans whose last handle closed: removed once a checkpoint has
    /// retired the journal that may name them.
    pub released_orphans: Vec<ObjId>,
    pub stats: Stats,
    pub spill_threshold: u64,
    pub stage_threshold: u64,
    /// Spare data files: the old inodes of files a checkpoint replaced by
    /// their shadows, `(id, length)`. A new shadow takes one and overwrites
    /// blocks that are already allocated (DESIGN §2a).
    pub spares: Vec<(u64, u64)>,
}

/// Total bytes of spare data files kept (DESIGN §2a).
pub(crate) const SPARES_MAX: u64 = 2 << 30;

/// A rewrite gets a shadow once it reaches this far into the file: smaller
/// files stay in the spill file (one sync for all of them at the commit,
/// not one each, and no rename each at the checkpoint).
const SHADOW_MIN: u64 = 1 << 20;

/// A data file: a transaction's spilled bytes or a new file's staged content.
pub(crate) struct DataFile {
    /// Open while a live transaction writes it. Committed data files are
    /// read by path (the storage keeps a few read descriptors), so they do
    /// not hold a descriptor each until the checkpoint.
    pub file: Option<Arc<dyn StoredFile>>,
    /// The live transaction writing it; `None` once a commit names it.
    pub owner: Option<TxId>,
    /// Bytes written: a spill file's end, a staged file's size.
    pub len: u64,
    /// The journal epoch whose records name it (set by the commit): the
    /// checkpoint of that epoch retires it.
    pub epoch: Epoch,
}

impl DataFile {
    fn writer(&self) -> Result<&Arc<dyn StoredFile>> {
        self.file.as_ref().ok_or_else(|| Error::Poisoned("write to a committed data file".into()))
    }
}

/// Reads exactly `out.len()` bytes of `path` at `off` through the storage.
pub(crate) fn read_exact_at(s: &dyn Storage, path: &Path, mut off: u64, mut out: &mut [u8]) -> std::io::Result<()> {
    while !out.is_empty() {
        let n = s.read_at(path, off, out)?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        off += n as u64;
        out = &mut out[n..];
    }
    Ok(())
}

pub(crate) fn data_path(id: u64) -> PathBuf {
    Path::new(META_DIR).join("data").join(format!("{id:016x}"))
}

pub(crate) struct Shared {
    pub state: Mutex<State>,
    pub sync: SyncState,
    pub opts: Options,
    pub stop: AtomicBool,
    pub ckpt_lock: Mutex<()>,
    pub flushes: AtomicU64,
}

/// A transactional file system over a backing directory, in-process.
///
/// Dropping the engine stops its background thread; call [`Engine::close`]
/// to checkpoint first so the backing tree holds plain committed files.
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
    bg: Mutex<Option<std::thread::JoinHandle<()>>>,
}

pub(crate) fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(Error::posix("name", format!("{name:?} is not a valid file name"), libc::EINVAL));
    }
    if b.len() > NAME_MAX {
        return Err(Error::posix("name", format!("{} bytes is longer than {NAME_MAX}", b.len()), libc::ENAMETOOLONG));
    }
    Ok(())
}

fn reserved(parent: ObjId, name: &OsStr) -> bool {
    parent == ObjId::ROOT && name == META_DIR
}

impl State {
    /// Committed bytes the next checkpoint works through: the journal and
    /// the data files its records name.
    fn uncheckpointed(&self) -> u64 {
        self.journal.end + self.committed_data_bytes
    }

    pub(crate) fn new_obj(&mut self, kind: FileKind) -> ObjId {
        let o = ObjId(self.next_obj);
        self.next_obj += 1;
        self.nodes.insert(o, Node { kind, base: None, alts: Vec::new(), open: 0, gone: false, ino: None });
        o
    }

    /// Path of an object in the backing tree (J1: unchanged between checkpoints).
    pub(crate) fn base_path(&self, o: ObjId) -> Option<PathBuf> {
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = o;
        let mut guard = 0;
        while cur != ObjId::ROOT {
            let n = self.nodes.get(&cur)?;
            let loc = n.base.as_ref()?;
            parts.push(&loc.name);
            cur = loc.parent;
            guard += 1;
            if guard > 4096 {
                return None;
            }
        }
        let mut p = PathBuf::new();
        for s in parts.iter().rev() {
            p.push(s);
        }
        Some(p)
    }

    fn is_created(&self, tx: &Tx, o: ObjId) -> bool {
        tx.delta.created.contains_key(&o) || self.committed.created.contains_key(&o)
    }

    pub(crate) fn node_kind(&self, o: ObjId) -> Result<FileKind> {
        self.nodes.get(&o).map(|n| n.kind).ok_or(Error::Stale(o))
    }

    /// The kind of `o` if `tx` (or, with `None`, everyone) can reach it:
    /// objects created by a live transaction exist only for it (I1), and
    /// those of aborted transactions for nobody.
    pub(crate) fn kind_in(&self, tx: Option<&Tx>, o: ObjId) -> Result<FileKind> {
        let n = self.nodes.get(&o).ok_or(Error::Stale(o))?;
        let reachable = !n.gone
            && (n.base.is_some()
                || self.committed.created.contains_key(&o)
                || tx.is_some_and(|t| t.delta.created.contains_key(&o)));
        if reachable {
            Ok(n.kind)
        } else {
            Err(Error::Stale(o))
        }
    }

    /// The object named `name` in the backing directory `dir`, creating its
    /// node on first sight.
    pub(crate) fn base_child(&mut self, dir: ObjId, name: &OsStr) -> Result<Option<ObjId>> {
        let Some(dpath) = self.base_path(dir) else { return Ok(None) };
        let path = dpath.join(name);
        let meta = match self.storage.lstat(&path) {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) || e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(None),
            Err(e) => return Err(Error::io("lookup", path.display().to_string(), e)),
        };
        let key = (meta.dev, meta.ino);
        if let Some(&o) = self.by_ino.get(&key) {
            if let Some(n) = self.nodes.get_mut(&o) {
                if n.kind == meta.kind && !n.gone {
                    let loc = BaseLoc { parent: dir, name: name.to_owned() };
                    if n.base.as_ref() != Some(&loc) && !n.alts.contains(&loc) {
                        n.alts.push(loc);
                    }
                    return Ok(Some(o));
                }
            }
        }
        let o = self.new_obj(meta.kind);
        let n = self.nodes.get_mut(&o).expect("just made");
        n.base = Some(BaseLoc { parent: dir, name: name.to_owned() });
        n.ino = Some(key);
        self.by_ino.insert(key, o);
        Ok(Some(o))
    }

    /// The path of `o`'s backing file, if it has one.
    fn base_file(&self, o: ObjId) -> Result<Option<PathBuf>> {
        let n = self.nodes.get(&o).ok_or(Error::Stale(o))?;
        Ok(n.base.as_ref().and_then(|_| self.base_path(o)))
    }

    fn base_meta(&self, o: ObjId) -> Result<Option<Meta>> {
        let Some(p) = self.base_file(o)? else { return Ok(None) };
        match self.storage.lstat(&p) {
            Ok(m) => Ok(Some(m)),
            Err(e) => Err(Error::io("stat", p.display().to_string(), e)),
        }
    }

    pub(crate) fn fetch(&self, loc: &DataLoc, out: &mut [u8]) -> std::io::Result<()> {
        match loc {
            DataLoc::Mem(b, s) => {
                let src =
                    b.get(*s..*s + out.len()).ok_or_else(|| std::io::Error::other("memory extent out of range"))?;
                out.copy_from_slice(src);
                Ok(())
            }
            DataLoc::File(id, off) => {
                let df = self.data_files.get(id).ok_or_else(|| std::io::Error::other("data file gone"))?;
                match &df.file {
                    Some(f) => journal::read_exact(&**f, *off, out),
                    None => read_exact_at(&*self.storage, &data_path(*id), *off, out),
                }
            }
            DataLoc::Journal(e, off) => {
                let f = self.journal_files.get(e).ok_or_else(|| std::io::Error::other("journal file gone"))?;
                journal::read_exact(&**f, *off, out)
            }
        }
    }

    // ----- versions: eager checks (I2) -------------------------------------

    fn conflict(tx: &mut Tx, what: String) -> Error {
        tx.doomed = Some(what.clone());
        Error::Conflict { tx: tx.id, what }
    }

    fn read_meta(&self, tx: &mut Tx, o: ObjId) -> Result<()> {
        if self.ver.metas.get(&o).is_some_and(|q| *q > tx.start) {
            return Err(Self::conflict(tx, format!("attributes of {o}")));
        }
        tx.reads.metas.insert(o);
        Ok(())
    }

    fn read_name(&self, tx: &mut Tx, dir: ObjId, name: &OsStr) -> Result<()> {
        let key = (dir, name.to_owned());
        if self.ver.names.get(&key).is_some_and(|q| *q > tx.start) {
            return Err(Self::conflict(tx, format!("name {name:?} in {dir}")));
        }
        tx.reads.names.insert(key);
        Ok(())
    }

    fn read_list(&self, tx: &mut Tx, dir: ObjId) -> Result<()> {
        if self.ver.lists.get(&dir).is_some_and(|q| *q > tx.start) {
            return Err(Self::conflict(tx, format!("listing of {dir}")));
        }
        tx.reads.lists.insert(dir);
        Ok(())
    }

    fn read_pages(&self, tx: &mut Tx, o: ObjId, off: u64, end: u64) -> Result<()> {
        if end <= off {
            return Ok(());
        }
        let (p0, p1) = (off / PAGE, end.div_ceil(PAGE));
        if let Some(f) = tx.delta.objs.get(&o).and_then(|d| d.file.as_ref()) {
            if f.ext.covers(off, end) {
                return Ok(());
            }
        }
        if self.ver.pages.get(&o).is_some_and(|r| r.newest(p0, p1) > tx.start) {
            return Err(Self::conflict(tx, format!("data of {o}")));
        }
        tx.reads.pages.entry(o).or_default().push((p0, p1));
        Ok(())
    }

    // ----- views ------------------------------------------------------------

    /// The object under `name` in `dir` as `tx` sees it.
    pub(crate) fn lookup(&mut self, tx: &mut Tx, dir: ObjId, name: &OsStr) -> Result<Option<ObjId>> {
        if reserved(dir, name) {
            return Ok(None);
        }
        if let Some(e) = tx.delta.entry(dir, name) {
            return Ok(e);
        }
        self.read_name(tx, dir, name)?;
        if let Some(e) = self.committed.entry(dir, name) {
            return Ok(e);
        }
        if self.is_created(tx, dir) {
            return Ok(None);
        }
        self.base_child(dir, name)
    }

    /// Attributes of `o` as `tx` sees them; records the read.
    pub(crate) fn attr(&mut self, tx: &mut Tx, o: ObjId) -> Result<Attr> {
        self.read_meta(tx, o)?;
        self.attr_unrecorded(Some(tx), o)
    }

    /// Attributes without recording a read (for the committed view, `tx = None`).
    pub(crate) fn attr_unrecorded(&self, tx: Option<&Tx>, o: ObjId) -> Result<Attr> {
        self.kind_in(tx, o)?;
        let node = &self.nodes[&o];
        let orphan = node.base.as_ref().is_some_and(|b| b.parent == ORPHANS_OBJ);
        let mut a = match self.base_meta(o)? {
            Some(m) => Attr {
                obj: o,
                kind: m.kind,
                size: m.size,
                mode: m.mode,
                nlink: m.nlink,
                uid: m.uid,
                gid: m.gid,
                rdev: m.rdev,
                atime: m.atime,
                mtime: m.mtime,
                ctime: m.ctime,
            },
            None => Attr {
                obj: o,
                kind: node.kind,
                // What a new directory reports on the backing file system.
                size: if node.kind == FileKind::Dir { 4096 } else { 0 },
                mode: 0,
                nlink: 0,
                uid: 0,
                gid: 0,
                rdev: 0,
                atime: Timestamp::default(),
                mtime: Timestamp::default(),
                ctime: Timestamp::default(),
            },
        };
        if let Some(od) = self.frozen.as_ref().and_then(|d| d.objs.get(&o)) {
            // Link counts are in the tree already (namespace applied).
            apply_attr(&mut a, &AttrDelta { nlink: 0, ..od.attr.clone() });
            if let Some(f) = &od.file {
                a.size = f.size_after(a.size);
            }
        }
        let layers = [Some(&self.committed), tx.map(|t| &t.delta)];
        for d in layers.into_iter().flatten() {
            if let Some(od) = d.objs.get(&o) {
                apply_attr(&mut a, &od.attr);
                if let Some(f) = &od.file {
                    a.size = f.size_after(a.size);
                }
            }
        }
        if let Some(n) = tx.and_then(|t| t.delta.created.get(&o)).or_else(|| self.committed.created.get(&o)) {
            if let Some(t) = &n.target {
                a.size = t.len() as u64;
            }
        }
        if orphan {
            // The .txfs/orphans link is ours, not the user's.
            a.nlink = a.nlink.saturating_sub(1);
        }
        Ok(a)
    }

    /// Whether no layer changes `o`'s bytes, so that its backing file up to
    /// its end is its content (no checkpoint writes it either: that keeps
    /// its delta in `frozen` until done).
    fn bare(&self, tx: Option<&Tx>, o: ObjId) -> bool {
        let layers = [self.frozen.as_ref(), Some(&self.committed), tx.map(|t| &t.delta)];
        !layers.into_iter().flatten().any(|d| d.objs.get(&o).is_some_and(|od| od.file.is_some()))
    }

    /// Reads file content as `tx` (or, with `None`, everyone) sees it.
    pub(crate) fn read_content(&self, tx: Option<&Tx>, o: ObjId, off: u64, len: usize) -> Result<Vec<u8>> {
        let layers = [self.frozen.as_ref(), Some(&self.committed), tx.map(|t| &t.delta)];
        if self.bare(tx, o) {
            // No `lstat` for the size, which cost every READ an openat2
            // walk, a stat and a close (a fifth of a cold 4 KiB read's
            // daemon time).
            return match self.read_base(o, off, len) {
                // A daemon that may not open the file: a read at or past
                // its end still reads nothing, as the size says.
                Err(e) if matches!(e.errno(), libc::EACCES | libc::EPERM) => match self.base_meta(o) {
                    Ok(Some(m)) if off >= m.size => Ok(Vec::new()),
                    _ => Err(e),
                },
                r => r,
            };
        }
        let base_size = match self.base_file(o)? {
            Some(p) => self.storage.file_len(&p).map_err(|e| Error::io("stat", p.display().to_string(), e))?,
            None => 0,
        };
        let mut buf = match base_size.checked_sub(off) {
            Some(left) if left > 0 => self.read_base(o, off, (left as usize).min(len))?,
            _ => Vec::new(),
        };
        buf.resize(len, 0);
        let mut size = base_size;
        for d in layers.into_iter().flatten() {
            if let Some(f) = d.objs.get(&o).and_then(|od| od.file.as_ref()) {
                size = f
                    .overlay(size, off, &mut buf, &mut |loc, out| self.fetch(loc, out))
                    .ctx("read", || format!("{o} at {off}"))?;
            }
        }
        let keep = size.saturating_sub(off).min(len as u64) as usize;
        buf.truncate(keep);
        Ok(buf)
    }

    /// `len` bytes at `off` of `o`'s backing file, fewer at its end.
    fn read_base(&self, o: ObjId, off: u64, len: usize) -> Result<Vec<u8>> {
        let Some(path) = self.base_file(o)? else { return Ok(Vec::new()) };
        let mut buf = vec![0u8; len];
        // `read_at` is short only at the end of the file.
        let got = self.storage.read_at(&path, off, &mut buf).ctx("read", || path.display().to_string())?;
        buf.truncate(got);
        Ok(buf)
    }

    fn readlink_view(&self, tx: &Tx, o: ObjId) -> Result<OsString> {
        if let Some(n) = tx.delta.created.get(&o).or_else(|| self.committed.created.get(&o)) {
            return n.target.clone().ok_or_else(|| Error::posix("readlink", o.to_string(), libc::EINVAL));
        }
        let p = self.base_path(o).ok_or(Error::Stale(o))?;
        self.storage.readlink(&p).ctx("readlink", || p.display().to_string())
    }

    /// Entries of `dir` as `tx` sees them; records the listing read.
    pub(crate) fn readdir(&mut self, tx: &mut Tx, dir: ObjId) -> Result<Vec<DirEntry>> {
        self.read_list(tx, dir)?;
        let mut names: BTreeMap<OsString, Option<ObjId>> = BTreeMap::new();
        if !self.is_created(tx, dir) {
            if let Some(p) = self.base_path(dir) {
                let list = self.storage.read_dir(&p).ctx("readdir", || p.display().to_string())?;
                for (name, _) in list {
                    if reserved(dir, &name) {
                        continue;
                    }
                    names.insert(name, None);
                }
                let base_names: Vec<OsString> = names.keys().cloned().collect();
                for n in base_names {
                    let o = self.base_child(dir, &n)?;
                    names.insert(n, o);
                }
            }
        }
        for d in [&self.committed, &tx.delta] {
            if let Some(dd) = d.dirs.get(&dir) {
                for (n, e) in dd {
                    names.insert(n.clone(), *e);
                }
            }
        }
        let mut out = Vec::with_capacity(names.len());
        for (name, o) in names {
            if let Some(o) = o {
                out.push(DirEntry { name, obj: o, kind: self.node_kind(o)? });
            }
        }
        Ok(out)
    }

    fn parent_of(&self, tx: &Tx, dir: ObjId) -> Option<ObjId> {
        // A directory's parent: from the newest delta that placed it, else base.
        for d in [&tx.delta, &self.committed] {
            if let Some(p) = d.parents.get(&dir) {
                return Some(*p);
            }
        }
        self.nodes.get(&dir)?.base.as_ref().map(|b| b.parent)
    }

    fn expect_dir(&mut self, tx: &mut Tx, o: ObjId) -> Result<()> {
        match self.kind_in(Some(tx), o)? {
            FileKind::Dir => Ok(()),
            _ => Err(Error::posix("lookup", format!("{o} is not a directory"), libc::ENOTDIR)),
        }
    }

    // ----- mutations (into tx's delta) --------------------------------------

    fn touch(tx: &mut Tx, o: ObjId, mtime: bool) {
        let now = Timestamp::now();
        let a = &mut tx.delta.obj(o).attr;
        a.ctime = Some(now);
        if mtime {
            a.mtime = Some(now);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        tx: &mut Tx,
        parent: ObjId,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        owner: (u32, u32),
        target: Option<&OsStr>,
    ) -> Result<Attr> {
        check_name(name)?;
        self.expect_dir(tx, parent)?;
        if reserved(parent, name) {
            return Err(Error::posix("create", format!("{META_DIR} is reserved for txfs"), libc::EPERM));
        }
        if self.lookup(tx, parent, name)?.is_some() {
            return Err(Error::posix("create", format!("{name:?} exists"), libc::EEXIST));
        }
        // The parent must still exist at commit: its metadata is stamped when
        // it is removed or moved, never by other names created in it (I3).
        self.read_meta(tx, parent)?;
        let pattr = self.attr_unrecorded(Some(tx), parent)?;
        let o = self.new_obj(kind);
        let (uid, mut gid) = owner;
        let mut mode = mode & 0o7777;
        if pattr.mode & libc::S_ISGID != 0 {
            gid = pattr.gid;
            if kind == FileKind::Dir {
                mode |= libc::S_ISGID;
            }
        }
        tx.delta.created.insert(o, NewObj { kind, target: target.map(|t| t.to_owned()) });
        tx.delta.dirs.entry(parent).or_default().insert(name.to_owned(), Some(o));
        let now = Timestamp::now();
        let od = tx.delta.obj(o);
        od.attr = AttrDelta {
            mode: Some(mode),
            uid: Some(uid),
            gid: Some(gid),
            atime: Some(now),
            mtime: Some(now),
            ctime: Some(now),
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            xattrs: Default::default(),
        };
        if kind == FileKind::File {
            od.file = Some(FileDelta::empty_new());
        }
        if kind == FileKind::Dir {
            tx.delta.obj(parent).attr.nlink += 1;
            tx.delta.parents.insert(o, parent);
        }
        Self::touch(tx, parent, true);
        self.attr_unrecorded(Some(tx), o)
    }

    fn unlink_entry(&mut self, tx: &mut Tx, parent: ObjId, name: &OsStr, dir: bool) -> Result<()> {
        check_name(name)?;
        self.expect_dir(tx, parent)?;
        let o = self
            .lookup(tx, parent, name)?
            .ok_or_else(|| Error::posix(if dir { "rmdir" } else { "unlink" }, format!("{name:?}"), libc::ENOENT))?;
        let kind = self.node_kind(o)?;
        if dir {
            if kind != FileKind::Dir {
                return Err(Error::posix("rmdir", format!("{name:?}"), libc::ENOTDIR));
            }
            if !self.readdir(tx, o)?.is_empty() {
                return Err(Error::posix("rmdir", format!("{name:?}"), libc::ENOTEMPTY));
            }
        } else if kind == FileKind::Dir {
            return Err(Error::posix("unlink", format!("{name:?}"), libc::EISDIR));
        }
        self.drop_link(tx, parent, name, o, kind);
        Ok(())
    }

    /// Removes the entry `name -> o` from `parent` and adjusts link counts.
    fn drop_link(&mut self, tx: &mut Tx, parent: ObjId, name: &OsStr, o: ObjId, kind: FileKind) {
        tx.delta.dirs.entry(parent).or_default().insert(name.to_owned(), None);
        if kind == FileKind::Dir {
            tx.delta.obj(o).attr.nlink -= 2;
            tx.delta.obj(parent).attr.nlink -= 1;
        } else {
            tx.delta.obj(o).attr.nlink -= 1;
        }
        Self::touch(tx, o, false);
        Self::touch(tx, parent, true);
    }

    fn rename(
        &mut self,
        tx: &mut Tx,
        from_dir: ObjId,
        from: &OsStr,
        to_dir: ObjId,
        to: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        check_name(from)?;
        check_name(to)?;
        self.expect_dir(tx, from_dir)?;
        self.expect_dir(tx, to_dir)?;
        if reserved(to_dir, to) || reserved(from_dir, from) {
            return Err(Error::posix("rename", format!("{META_DIR} is reserved for txfs"), libc::EPERM));
        }
        self.read_meta(tx, from_dir)?;
        self.read_meta(tx, to_dir)?;
        let src = self
            .lookup(tx, from_dir, from)?
            .ok_or_else(|| Error::posix("rename", format!("{from:?}"), libc::ENOENT))?;
        let dst = self.lookup(tx, to_dir, to)?;
        let skind = self.node_kind(src)?;
        if flags.noreplace && dst.is_some() {
            return Err(Error::posix("rename", format!("{to:?} exists"), libc::EEXIST));
        }
        if flags.exchange && dst.is_none() {
            return Err(Error::posix("rename", format!("{to:?}"), libc::ENOENT));
        }
        // A directory may not move into its own subtree.
        for (moving, kind, dest) in [(src, skind, to_dir), (dst.unwrap_or(src), skind, from_dir)] {
            if kind == FileKind::Dir || self.node_kind(moving)? == FileKind::Dir {
                let mut cur = Some(dest);
                let mut hops = 0;
                while let Some(c) = cur {
                    if c == moving {
                        return Err(Error::posix("rename", format!("{from:?} into its own subtree"), libc::EINVAL));
                    }
                    if c == ObjId::ROOT || hops > 4096 {
                        break;
                    }
                    self.read_meta(tx, c)?;
                    cur = self.parent_of(tx, c);
                    hops += 1;
                }
            }
            if !flags.exchange {
                break;
            }
        }
        if dst == Some(src) {
            return Ok(());
        }
        if flags.exchange {
            let dst = dst.expect("checked");
            let dkind = self.node_kind(dst)?;
            tx.delta.dirs.entry(from_dir).or_default().insert(from.to_owned(), Some(dst));
            tx.delta.dirs.entry(to_dir).or_default().insert(to.to_owned(), Some(src));
            if from_dir != to_dir {
                for (o, k, newp, oldp) in [(src, skind, to_dir, from_dir), (dst, dkind, from_dir, to_dir)] {
                    if k == FileKind::Dir {
                        tx.delta.parents.insert(o, newp);
                        tx.delta.obj(newp).attr.nlink += 1;
                        tx.delta.obj(oldp).attr.nlink -= 1;
                    }
                }
            }
            for o in [src, dst, from_dir, to_dir] {
                Self::touch(tx, o, o == from_dir || o == to_dir);
            }
            return Ok(());
        }
        if let Some(d) = dst {
            let dkind = self.node_kind(d)?;
            match (skind == FileKind::Dir, dkind == FileKind::Dir) {
                (true, false) => {
                    return Err(Error::posix("rename", format!("{to:?} is not a directory"), libc::ENOTDIR))
                }
                (false, true) => return Err(Error::posix("rename", format!("{to:?} is a directory"), libc::EISDIR)),
                (true, true) if !self.readdir(tx, d)?.is_empty() => {
                    return Err(Error::posix("rename", format!("{to:?}"), libc::ENOTEMPTY));
                }
                _ => {}
            }
            self.drop_link(tx, to_dir, to, d, dkind);
        }
        tx.delta.dirs.entry(from_dir).or_default().insert(from.to_owned(), None);
        tx.delta.dirs.entry(to_dir).or_default().insert(to.to_owned(), Some(src));
        if skind == FileKind::Dir {
            tx.delta.parents.insert(src, to_dir);
            if from_dir != to_dir {
                tx.delta.obj(from_dir).attr.nlink -= 1;
                tx.delta.obj(to_dir).attr.nlink += 1;
            }
        }
        Self::touch(tx, src, false);
        Self::touch(tx, from_dir, true);
        Self::touch(tx, to_dir, true);
        Ok(())
    }

    fn write(&mut self, tx: &mut Tx, o: ObjId, off: u64, data: &[u8]) -> Result<()> {
        match self.kind_in(Some(tx), o)? {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::posix("write", o.to_string(), libc::EISDIR)),
            _ => return Err(Error::posix("write", o.to_string(), libc::EINVAL)),
        }
        if data.is_empty() {
            return Ok(());
        }
        off.checked_add(data.len() as u64)
            .filter(|e| *e <= i64::MAX as u64)
            .ok_or_else(|| Error::posix("write", format!("{o} at {off}"), libc::EFBIG))?;
        if self.stage(tx, o, off + data.len() as u64)? {
            let id = tx.staged[&o];
            let what = || data_path(id).display().to_string();
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            // Its length first: a write cut short (ENOSPC) may have
            // extended the file, and a data file is never shorter than its
            // `len` says when the checkpoint renames it into place.
            df.len = df.len.max(off + data.len() as u64);
            df.writer()?.write_at(off, data).ctx("write", what)?;
            tx.data_dirty = true;
            tx.delta.obj(o).file = Some(FileDelta::staged(id, df.len));
            Self::touch(tx, o, true);
            return Ok(());
        }
        if let Some(&id) = tx.shadows.get(&o) {
            let what = || data_path(id).display().to_string();
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            df.len = df.len.max(off + data.len() as u64);
            df.writer()?.write_at(off, data).ctx("write", what)?;
            self.spilled(tx, o, off, data.len() as u64, id, off);
            return Ok(());
        }
        let loc = if tx.mem_bytes + data.len() as u64 > self.spill_threshold {
            self.spill(tx, data)?
        } else {
            tx.mem_bytes += data.len() as u64;
            DataLoc::Mem(Arc::new(data.to_vec()), 0)
        };
        let od = tx.delta.obj(o);
        od.file.get_or_insert_with(FileDelta::default).write(off, data.len() as u64, loc);
        Self::touch(tx, o, true);
        Ok(())
    }

    /// For a write that goes to `tx`'s spill file: reserves where its bytes
    /// go and returns the file, so that the caller copies them without the
    /// engine lock and then calls [`State::spilled`]. `None`: the write
    /// takes the ordinary path (memory, a staged file, or an error).
    #[allow(clippy::type_complexity)]
    fn reserve_spill(
        &mut self,
        tx: &mut Tx,
        o: ObjId,
        off: u64,
        len: u64,
    ) -> Result<Option<(u64, u64, Arc<dyn StoredFile>)>> {
        if tx.committing {
            return Ok(None);
        }
        let fits = len > 0 && off.checked_add(len).is_some_and(|e| e <= i64::MAX as u64);
        if let Some(id) = if fits { self.shadow(tx, o, off, len)? } else { None } {
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            df.len = df.len.max(off + len);
            let file = df.writer()?.clone();
            tx.inflight += 1;
            return Ok(Some((id, off, file)));
        }
        let ordinary = len == 0
            || tx.mem_bytes + len <= self.spill_threshold
            || tx.delta.created.contains_key(&o)
            || off.checked_add(len).is_none_or(|e| e > i64::MAX as u64)
            || self.kind_in(Some(tx), o)? != FileKind::File;
        if ordinary {
            return Ok(None);
        }
        if tx.spill.is_none() {
            let id = self.new_data_file(tx, "spill")?;
            tx.spill = Some((id, 0));
        }
        let (id, end) = tx.spill.as_mut().expect("just set");
        let at = *end;
        *end += len;
        let df = self.data_files.get_mut(id).ok_or_else(|| Error::Poisoned("spill file gone".into()))?;
        df.len = *end;
        let file = df.writer()?.clone();
        tx.inflight += 1;
        Ok(Some((*id, at, file)))
    }

    /// The shadow data file of `o` in `tx`, if it has one or gets one now:
    /// a file `tx` did not create (in the tree with a single link, or
    /// created by a committed transaction) that `tx` rewrites from its
    /// start — its bytes are exactly everything below `off`, at most its
    /// memory budget, and this write reaches [`SHADOW_MIN`] — gets one when
    /// this write reaches `stage_threshold` (as a new file is staged) or
    /// would leave memory. `tx`'s bytes of `o` are moved into it
    /// once; from then on every write of `o` goes there, at its own offset.
    /// A checkpoint renames the shadow into place when it is all of the
    /// committed content (DESIGN §2a): those bytes are written once.
    fn shadow(&mut self, tx: &mut Tx, o: ObjId, off: u64, len: u64) -> Result<Option<u64>> {
        if let Some(&id) = tx.shadows.get(&o) {
            return Ok(Some(id));
        }
        // Like a new file's staging: once the rewrite reaches
        // `stage_threshold`, or its bytes would leave memory.
        if (tx.mem_bytes + len <= self.spill_threshold && off + len < self.stage_threshold)
            || tx.delta.created.contains_key(&o)
            || self.kind_in(Some(tx), o)? != FileKind::File
        {
            return Ok(None);
        }
        let mine = tx.delta.objs.get(&o).and_then(|od| od.file.as_ref());
        let prefix = |f: &FileDelta| f.ext.end() <= off && f.ext.covers(0, off);
        if off + len < SHADOW_MIN || off > self.spill_threshold.max(SHADOW_MIN) || !(mine.map_or(off == 0, prefix)) {
            return Ok(None);
        }
        let new = self.committed.created.contains_key(&o);
        if !new && !self.base_meta(o)?.is_some_and(|m| m.kind == FileKind::File && m.nlink == 1) {
            return Ok(None);
        }
        let pieces: Vec<_> =
            mine.map_or(Vec::new(), |f| f.ext.iter().map(|(at, e)| (at, e.len, e.loc.clone())).collect());
        // After O_TRUNC the transaction sees a short file: the tree's size
        // says more about how big the rewrite will be.
        let want = self.attr_unrecorded(Some(tx), o)?.size.max(self.attr_unrecorded(None, o)?.size);
        let id = match self.take_spare(tx, want) {
            Some(id) => id,
            None => self.new_data_file(tx, "shadow")?,
        };
        // Registered first: if the copy fails, the transaction still owns
        // (and its end removes) the file, and its extents still point where
        // they did.
        tx.shadows.insert(o, id);
        tx.data_dirty = true;
        let end = pieces.iter().map(|(at, l, _)| at + l).max().unwrap_or(0);
        let df = self.data_files.get_mut(&id).expect("just made");
        df.len = df.len.max(end);
        self.copy_into(id, &pieces, "shadow")?;
        let f = tx.delta.obj(o).file.get_or_insert_with(FileDelta::default);
        for (at, l, loc) in &pieces {
            f.write(*at, *l, DataLoc::File(id, *at));
            if let DataLoc::Mem(..) = loc {
                // Those bytes left memory: the delta points here now.
                tx.mem_bytes = tx.mem_bytes.saturating_sub(*l);
            }
        }
        Ok(Some(id))
    }

    /// The bytes reserved by [`State::reserve_spill`] are written: they are
    /// the transaction's content of `o` at `off`.
    fn spilled(&mut self, tx: &mut Tx, o: ObjId, off: u64, len: u64, id: u64, at: u64) {
        tx.data_dirty = true;
        tx.delta.obj(o).file.get_or_insert_with(FileDelta::default).write(off, len, DataLoc::File(id, at));
        Self::touch(tx, o, true);
    }

    /// Copies extents' bytes into the data file `id`, each at its own file
    /// offset, a MiB at a time (staging and shadows move a transaction's
    /// bytes into their file once).
    fn copy_into(&self, id: u64, pieces: &[(u64, u64, DataLoc)], op: &'static str) -> Result<()> {
        let what = || data_path(id).display().to_string();
        let file =
            self.data_files.get(&id).ok_or_else(|| Error::Poisoned(format!("{op}: data file gone")))?.writer()?;
        let mut buf = Vec::new();
        for (at, len, loc) in pieces {
            let mut done = 0u64;
            while done < *len {
                let n = ((len - done) as usize).min(1 << 20);
                buf.resize(n, 0);
                self.fetch(&loc.advance(done), &mut buf).ctx(op, what)?;
                file.write_at(at + done, &buf).ctx(op, what)?;
                done += n as u64;
            }
        }
        Ok(())
    }

    /// A spare data file for a shadow of `tx` of a file of `want` bytes, if
    /// one opens: the smallest that holds `want`, else the largest. Its
    /// length stays its `len` (the blocks past what the shadow writes hold
    /// old bytes: a checkpoint renames a shadow into place only when every
    /// byte below its size is the transaction's, cutting the rest).
    fn take_spare(&mut self, tx: &Tx, want: u64) -> Option<u64> {
        let fits = (0..self.spares.len()).filter(|&i| self.spares[i].1 >= want).min_by_key(|&i| self.spares[i].1);
        let i = fits.or_else(|| (0..self.spares.len()).max_by_key(|&i| self.spares[i].1))?;
        let (id, len) = self.spares.swap_remove(i);
        match self.storage.open_file(&data_path(id), false) {
            Ok(f) => {
                let epoch = self.journal.epoch;
                self.data_files.insert(id, DataFile { file: Some(f), owner: Some(tx.id), len, epoch });
                Some(id)
            }
            Err(e) => {
                tracing::warn!("{}: {e} (spare data file dropped)", data_path(id).display());
                let _ = self.storage.unlink(&data_path(id));
                None
            }
        }
    }

    /// Deletes the spare data files (disk space goes back).
    pub(crate) fn drop_spares(&mut self) {
        for (id, _) in std::mem::take(&mut self.spares) {
            match self.storage.unlink(&data_path(id)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("{}: {e} (removed at the next start)", data_path(id).display()),
            }
        }
    }

    /// A new, empty data file owned by `tx`.
    fn new_data_file(&mut self, tx: &Tx, what: &'static str) -> Result<u64> {
        let id = self.next_data;
        self.next_data += 1;
        let path = data_path(id);
        let f = self.storage.open_file(&path, true).ctx(what, || path.display().to_string())?;
        f.set_len(0).ctx(what, || path.display().to_string())?;
        let epoch = self.journal.epoch;
        self.data_files.insert(id, DataFile { file: Some(f), owner: Some(tx.id), len: 0, epoch });
        Ok(id)
    }

    fn spill(&mut self, tx: &mut Tx, data: &[u8]) -> Result<DataLoc> {
        if tx.spill.is_none() {
            let id = self.new_data_file(tx, "spill")?;
            tx.spill = Some((id, 0));
        }
        let (id, end) = tx.spill.as_mut().expect("just set");
        let df = self.data_files.get_mut(id).ok_or_else(|| Error::Poisoned("spill file gone".into()))?;
        df.writer()?.write_at(*end, data).ctx("spill write", || data_path(*id).display().to_string())?;
        let loc = DataLoc::File(*id, *end);
        *end += data.len() as u64;
        df.len = *end;
        tx.data_dirty = true;
        Ok(loc)
    }

    /// Whether `o`'s content lives in a staged data file of `tx`, staging
    /// it now if `tx` created it and its content reaches the threshold with
    /// `end` (its bytes so far are copied in once).
    fn stage(&mut self, tx: &mut Tx, o: ObjId, end: u64) -> Result<bool> {
        if tx.staged.contains_key(&o) {
            return Ok(true);
        }
        if !tx.delta.created.contains_key(&o) {
            return Ok(false);
        }
        let size = tx.delta.objs.get(&o).and_then(|od| od.file.as_ref()).map_or(0, |f| f.size_after(0));
        if size.max(end) < self.stage_threshold {
            return Ok(false);
        }
        let id = self.new_data_file(tx, "stage")?;
        let what = || data_path(id).display().to_string();
        // A new file's content is its extents over nothing (holes are zeros).
        let pieces =
            tx.delta.objs.get(&o).and_then(|od| od.file.as_ref()).map_or(Vec::new(), |f| f.ext.pieces(0, size));
        for (_, len, loc) in &pieces {
            if let DataLoc::Mem(..) = loc {
                // Those bytes leave memory once the delta points here.
                tx.mem_bytes = tx.mem_bytes.saturating_sub(*len);
            }
        }
        self.copy_into(id, &pieces, "stage")?;
        let df = self.data_files.get_mut(&id).expect("just made");
        df.writer()?.set_len(size).ctx("stage", what)?;
        df.len = size;
        tx.staged.insert(o, id);
        tx.data_dirty = true;
        tx.delta.obj(o).file = Some(FileDelta::staged(id, size));
        Ok(true)
    }

    fn truncate(&mut self, tx: &mut Tx, o: ObjId, size: u64) -> Result<()> {
        match self.kind_in(Some(tx), o)? {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::posix("truncate", o.to_string(), libc::EISDIR)),
            _ => return Err(Error::posix("truncate", o.to_string(), libc::EINVAL)),
        }
        if size > i64::MAX as u64 {
            return Err(Error::posix("truncate", format!("{o} to {size}"), libc::EFBIG));
        }
        if let Some(&id) = tx.staged.get(&o) {
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            df.writer()?.set_len(size).ctx("truncate", || data_path(id).display().to_string())?;
            df.len = size;
            tx.data_dirty = true;
            tx.delta.obj(o).file = Some(FileDelta::staged(id, size));
        } else {
            tx.delta.obj(o).file.get_or_insert_with(FileDelta::default).truncate(size);
        }
        Self::touch(tx, o, true);
        Ok(())
    }

    /// An extended attribute as `tx` sees it; records the read.
    fn xattr(&mut self, tx: &mut Tx, o: ObjId, name: &OsStr) -> Result<Option<Vec<u8>>> {
        self.kind_in(Some(tx), o)?;
        self.read_meta(tx, o)?;
        for d in [Some(&tx.delta), Some(&self.committed), self.frozen.as_ref()].into_iter().flatten() {
            if let Some(v) = d.objs.get(&o).and_then(|od| od.attr.xattrs.get(name)) {
                return Ok(v.clone());
            }
        }
        if self.is_created(tx, o) {
            return Ok(None);
        }
        let p = self.base_path(o).ok_or(Error::Stale(o))?;
        self.storage.get_xattr(&p, name).ctx("getxattr", || p.display().to_string())
    }

    /// Removes the data files `tx` still owns (none of its bytes
    /// survive; a commit has already taken the ones its record names).
    fn discard_tx(&mut self, tx: &Tx) {
        for id in tx.data_file_ids() {
            if self.data_files.get(&id).is_some_and(|d| d.owner == Some(tx.id)) {
                self.data_files.remove(&id);
                let _ = self.storage.unlink(&data_path(id));
            }
        }
    }
}

/// The data files of `tx` that hold bytes not yet synced, marking them
/// synced: the caller syncs them before the commit record is written.
fn take_unsynced(data_files: &HashMap<u64, DataFile>, tx: &mut Tx) -> Vec<(u64, Arc<dyn StoredFile>)> {
    if !std::mem::take(&mut tx.data_dirty) {
        return Vec::new();
    }
    let files = tx.data_file_ids().filter_map(|id| data_files.get(&id).and_then(|d| d.file.clone()).map(|f| (id, f)));
    files.collect()
}

fn sync_data_files(files: &[(u64, Arc<dyn StoredFile>)]) -> Result<()> {
    for (id, f) in files {
        f.sync_data().ctx("commit", || format!("syncing {}", data_path(*id).display()))?;
    }
    Ok(())
}

fn apply_attr(a: &mut Attr, d: &AttrDelta) {
    if let Some(m) = d.mode {
        a.mode = m;
    }
    if let Some(u) = d.uid {
        a.uid = u;
    }
    if let Some(g) = d.gid {
        a.gid = g;
    }
    if let Some(t) = d.atime {
        a.atime = t;
    }
    if let Some(t) = d.mtime {
        a.mtime = t;
    }
    if let Some(t) = d.ctime {
        a.ctime = t;
    }
    a.nlink = (a.nlink as i64 + d.nlink).max(0) as u64;
}

impl Engine {
    /// Opens (and, if needed, initializes and recovers) the backing store.
    /// Recovery replays the journal and checkpoints it, so afterwards the
    /// backing tree holds exactly the committed state as plain files.
    pub fn open(storage: Arc<dyn Storage>, opts: Options) -> Result<Engine> {
        let state = crate::recovery::recover(storage, &opts)?;
        let sync = SyncState::new(state.journal.epoch, state.journal.file.clone(), state.journal.end);
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            sync,
            opts: opts.clone(),
            stop: AtomicBool::new(false),
            ckpt_lock: Mutex::new(()),
            flushes: AtomicU64::new(0),
        });
        let engine = Engine { shared, bg: Mutex::new(None) };
        engine.checkpoint()?;
        // Orphans (files unlinked while open) were needed until the
        // journal naming them was checkpointed; no handle survives a restart.
        crate::recovery::clear_orphans(&engine.lock())?;
        if let Some(iv) = opts.flush_interval {
            let sh = engine.shared.clone();
            *engine.bg.lock() = Some(
                std::thread::Builder::new()
                    .name("txfs-flush".into())
                    .spawn(move || background(sh, iv))
                    .map_err(|e| Error::io("spawn", "background flusher", e))?,
            );
        }
        Ok(engine)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock()
    }

    pub fn begin(&self) -> TxId {
        let mut st = self.lock();
        st.next_tx += 1;
        let id = TxId(st.next_tx);
        let start = st.seq;
        st.txs.insert(id, Tx::new(id, start));
        st.stats.live_txs = st.txs.len() as u64;
        id
    }

    /// Runs `f` inside `tx`, or as a one-operation transaction committed
    /// (ordered) before the lock is released (I4).
    fn run<T>(&self, tx: Option<TxId>, f: impl FnOnce(&mut State, &mut Tx) -> Result<T>) -> Result<T> {
        let mut st = self.lock();
        if let Some(p) = &st.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        match tx {
            Some(id) => {
                let mut t = st.txs.remove(&id).ok_or(Error::NoSuchTx(id))?;
                let res = match &t.doomed {
                    Some(w) => Err(Error::Conflict { tx: id, what: w.clone() }),
                    None => f(&mut st, &mut t),
                };
                if let Err(Error::Conflict { .. }) = &res {
                    st.stats.conflicts += 1;
                }
                st.txs.insert(id, t);
                res
            }
            None => {
                st.next_tx += 1;
                let mut t = Tx::new(TxId(st.next_tx), st.seq);
                t.mem_bytes = 0;
                let out = f(&mut st, &mut t);
                match out {
                    Ok(v) => {
                        if !t.delta.is_empty() {
                            commit_locked(&mut st, &self.shared.sync, t, false)?;
                        }
                        Ok(v)
                    }
                    Err(e) => {
                        st.discard_tx(&t);
                        Err(e)
                    }
                }
            }
        }
    }

    /// Commits `tx`. On [`Error::Conflict`] the transaction is gone and
    /// nothing of it survives: retry it from the start.
    pub fn commit(&self, tx: TxId, durability: Durability) -> Result<()> {
        self.commit_changes(tx, durability).map(|_| ())
    }

    /// [`Engine::commit`], returning the files whose content the commit
    /// changed (the mount invalidates their kernel page cache).
    pub fn commit_changes(&self, tx: TxId, durability: Durability) -> Result<Vec<ObjId>> {
        // Data files are synced before the record that names them is
        // written; outside the lock, so other operations go on meanwhile.
        // A write that lands after this marks the file dirty again and
        // commit_locked syncs it under the lock.
        let unsynced = {
            let mut guard = self.lock();
            let st = &mut *guard;
            match st.txs.get_mut(&tx) {
                Some(t) if t.doomed.is_none() => take_unsynced(&st.data_files, t),
                _ => Vec::new(),
            }
        };
        if let Err(e) = sync_data_files(&unsynced) {
            let mut st = self.lock();
            if let Some(t) = st.txs.remove(&tx) {
                st.discard_tx(&t);
                st.stats.aborts += 1;
                st.stats.live_txs = st.txs.len() as u64;
            }
            return Err(e);
        }
        let (pos, changed) = {
            // Writes of this transaction still copying into its data files
            // finish first (`Tx::inflight`).
            let mut st = loop {
                let mut st = self.lock();
                match st.txs.get_mut(&tx) {
                    Some(t) if t.inflight > 0 => t.committing = true,
                    _ => break st,
                }
                drop(st);
                std::thread::sleep(Duration::from_micros(50));
            };
            let t = st.txs.remove(&tx).ok_or(Error::NoSuchTx(tx))?;
            st.stats.live_txs = st.txs.len() as u64;
            if let Some(p) = st.poisoned.clone() {
                st.discard_tx(&t);
                return Err(Error::Poisoned(p));
            }
            let r = commit_locked(&mut st, &self.shared.sync, t, durability == Durability::Durable);
            if let Err(Error::Conflict { .. }) = &r {
                st.stats.conflicts += 1;
                st.stats.aborts += 1;
            }
            if st.txs.is_empty() {
                st.ver.prune_all();
            }
            r?
        };
        if durability == Durability::Durable {
            self.shared.sync.wait_durable(pos)?;
        }
        self.maybe_checkpoint();
        Ok(changed)
    }

    pub fn abort(&self, tx: TxId) -> Result<()> {
        let mut st = self.lock();
        let t = st.txs.remove(&tx).ok_or(Error::NoSuchTx(tx))?;
        st.discard_tx(&t);
        st.stats.aborts += 1;
        st.stats.live_txs = st.txs.len() as u64;
        if st.txs.is_empty() {
            st.ver.prune_all();
        }
        Ok(())
    }

    /// True if `o` was created by the live transaction `tx` (nobody else
    /// can reach it).
    pub fn created_by(&self, tx: TxId, o: ObjId) -> bool {
        self.lock().txs.get(&tx).is_some_and(|t| t.delta.created.contains_key(&o))
    }

    /// True if `tx` lost a conflict: it can only abort.
    pub fn is_doomed(&self, tx: TxId) -> bool {
        self.lock().txs.get(&tx).is_some_and(|t| t.doomed.is_some())
    }

    /// How many transactions are live.
    pub fn live_txs(&self) -> usize {
        self.lock().txs.len()
    }

    /// True if every live transaction satisfies `f` (none live: true).
    pub fn all_live(&self, mut f: impl FnMut(TxId) -> bool) -> bool {
        self.lock().txs.keys().all(|t| f(*t))
    }

    /// True if `tx` is live.
    pub fn is_live(&self, tx: TxId) -> bool {
        self.lock().txs.contains_key(&tx)
    }

    pub fn lookup(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr) -> Result<Attr> {
        check_name(name)?;
        self.run(tx, |st, t| {
            st.expect_dir(t, parent)?;
            let o = st
                .lookup(t, parent, name)?
                .ok_or_else(|| Error::posix("lookup", format!("{name:?} in {parent}"), libc::ENOENT))?;
            st.attr(t, o)
        })
    }

    pub fn getattr(&self, tx: Option<TxId>, o: ObjId) -> Result<Attr> {
        self.run(tx, |st, t| st.attr(t, o))
    }

    pub fn setattr(&self, tx: Option<TxId>, o: ObjId, set: &SetAttr) -> Result<Attr> {
        self.run(tx, |st, t| {
            let cur = st.attr(t, o)?;
            if let Some(s) = set.size {
                st.truncate(t, o, s)?;
            }
            // Linux cannot chmod a symlink itself: the mode stays 0o777.
            let mut mode = set.mode.map(|m| m & 0o7777).filter(|_| cur.kind != FileKind::Symlink);
            if (set.uid.is_some() || set.gid.is_some()) && mode.is_none() && cur.kind == FileKind::File {
                // As Linux (even for root): chown drops setuid, and setgid
                // when group-execute is set.
                let mut m = cur.mode & !libc::S_ISUID;
                if cur.mode & libc::S_IXGRP != 0 {
                    m &= !libc::S_ISGID;
                }
                if m != cur.mode {
                    mode = Some(m);
                }
            }
            t.explicit.insert(o);
            let a = &mut t.delta.obj(o).attr;
            a.mode = mode.or(a.mode);
            a.uid = set.uid.or(a.uid);
            a.gid = set.gid.or(a.gid);
            a.atime = set.atime.or(a.atime);
            a.mtime = set.mtime.or(a.mtime);
            a.ctime = Some(Timestamp::now());
            st.attr_unrecorded(Some(t), o)
        })
    }

    /// Reads up to `len` bytes at `off` (fewer at end of file).
    ///
    /// A file no layer changes is read from its backing file without the
    /// engine lock, so a cold read waits for the disk alone rather than
    /// holding up every other request (bench/NOTES.md item 42). What the
    /// path names can change meanwhile only under the lock and only with
    /// `tree_gen` bumped, and a commit that changes the file gives it a
    /// layer: if either happened, the read is done again under the lock.
    pub fn read(&self, tx: Option<TxId>, o: ObjId, off: u64, len: usize) -> Result<Vec<u8>> {
        let end = off.saturating_add(len as u64);
        let file = |st: &State, t: &Tx| match st.kind_in(Some(t), o)? {
            FileKind::File => Ok(()),
            FileKind::Dir => Err(Error::posix("read", o.to_string(), libc::EISDIR)),
            _ => Err(Error::posix("read", o.to_string(), libc::EINVAL)),
        };
        // Checks the kind and the pages' stamps (I2) each time: a retry may
        // come after a checkpoint removed the file (ESTALE, never an empty
        // read) or a commit changed the pages since the transaction began.
        let locked = |st: &mut State, t: &mut Tx| {
            file(st, t)?;
            st.read_pages(t, o, off, end)?;
            let out = st.read_content(Some(t), o, off, len)?;
            if out.len() < len {
                // A short read depends on the size.
                st.read_meta(t, o)?;
            }
            Ok(out)
        };
        enum First {
            Read(Vec<u8>),
            /// Read the backing file at this path without the lock.
            Unlocked(PathBuf, u64, Arc<dyn Storage>),
        }
        let first = self.run(tx, |st, t| {
            if st.bare(Some(t), o) {
                file(st, t)?;
                if let Some(path) = st.base_file(o)? {
                    st.read_pages(t, o, off, end)?;
                    return Ok(First::Unlocked(path, st.tree_gen, st.storage.clone()));
                }
            }
            locked(st, t).map(First::Read)
        })?;
        let (path, gen, storage) = match first {
            First::Read(out) => return Ok(out),
            First::Unlocked(path, gen, storage) => (path, gen, storage),
        };
        let mut buf = vec![0u8; len];
        // `read_at` is short only at the end of the file.
        let got = storage.read_at(&path, off, &mut buf);
        self.run(tx, |st, t| match got {
            Ok(n) if st.tree_gen == gen && st.bare(Some(t), o) => {
                buf.truncate(n);
                if n < len {
                    st.read_meta(t, o)?;
                }
                Ok(std::mem::take(&mut buf))
            }
            // Raced (a commit or a checkpoint changed the file or its
            // path), or failed: the locked read decides and reports — a
            // transaction that began before such a commit conflicts (I2).
            _ => locked(st, t),
        })
    }

    pub fn write(&self, tx: Option<TxId>, o: ObjId, off: u64, data: &[u8]) -> Result<usize> {
        let len = data.len() as u64;
        let reserved = self.run(tx, |st, t| match tx.is_some() {
            true => match st.reserve_spill(t, o, off, len)? {
                Some(r) => Ok(Some(r)),
                None => st.write(t, o, off, data).map(|_| None),
            },
            false => st.write(t, o, off, data).map(|_| None),
        })?;
        // Spilled bytes are copied without the engine lock: concurrent
        // transactions' big writes do not wait for one another's copies.
        let Some((id, at, file)) = reserved else { return Ok(data.len()) };
        let copied = file.write_at(at, data);
        if copied.is_ok() {
            // On their way to the disk before the commit's sync waits.
            file.start_writeback(at, len);
        }
        let mut st = self.lock();
        let Some(mut t) = tx.and_then(|id| st.txs.remove(&id)) else {
            return Err(Error::NoSuchTx(tx.unwrap_or(TxId(0))));
        };
        t.inflight -= 1;
        let doomed = t.doomed.clone();
        if let (Ok(()), None, None) = (&copied, &doomed, &st.poisoned) {
            st.spilled(&mut t, o, off, len, id, at);
        }
        let id_tx = t.id;
        st.txs.insert(id_tx, t);
        if let Some(p) = &st.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        match copied {
            Ok(()) => match doomed {
                Some(what) => {
                    st.stats.conflicts += 1;
                    Err(Error::Conflict { tx: id_tx, what })
                }
                None => Ok(data.len()),
            },
            Err(e) => {
                if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                    // Spare data files give their space back: a retry may fit.
                    st.drop_spares();
                }
                Err(Error::io("spill write", data_path(id).display().to_string(), e))
            }
        }
    }

    /// Appends at the end of the file as this transaction sees it; returns
    /// the offset written at.
    pub fn append(&self, tx: Option<TxId>, o: ObjId, data: &[u8]) -> Result<u64> {
        self.run(tx, |st, t| {
            let size = st.attr(t, o)?.size;
            st.write(t, o, size, data)?;
            Ok(size)
        })
    }

    pub fn truncate(&self, tx: Option<TxId>, o: ObjId, size: u64) -> Result<()> {
        self.run(tx, |st, t| st.truncate(t, o, size))
    }

    /// Creates a regular file; `EEXIST` if the name is taken.
    pub fn create(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr, mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.run(tx, |st, t| st.create(t, parent, name, FileKind::File, mode, (uid, gid), None))
    }

    pub fn mkdir(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr, mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.run(tx, |st, t| st.create(t, parent, name, FileKind::Dir, mode, (uid, gid), None))
    }

    pub fn symlink(
        &self,
        tx: Option<TxId>,
        parent: ObjId,
        name: &OsStr,
        target: &OsStr,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(Error::posix(
                "symlink",
                format!("target of {name:?}"),
                if target.is_empty() { libc::ENOENT } else { libc::ENAMETOOLONG },
            ));
        }
        self.run(tx, |st, t| st.create(t, parent, name, FileKind::Symlink, 0o777, (uid, gid), Some(target)))
    }

    pub fn readlink(&self, tx: Option<TxId>, o: ObjId) -> Result<OsString> {
        self.run(tx, |st, t| {
            if st.kind_in(Some(t), o)? != FileKind::Symlink {
                return Err(Error::posix("readlink", o.to_string(), libc::EINVAL));
            }
            st.read_meta(t, o)?;
            st.readlink_view(t, o)
        })
    }

    pub fn link(&self, tx: Option<TxId>, o: ObjId, parent: ObjId, name: &OsStr) -> Result<Attr> {
        self.run(tx, |st, t| {
            check_name(name)?;
            st.expect_dir(t, parent)?;
            if st.kind_in(Some(t), o)? == FileKind::Dir {
                return Err(Error::posix("link", format!("{o} is a directory"), libc::EPERM));
            }
            if reserved(parent, name) {
                return Err(Error::posix("link", format!("{META_DIR} is reserved for txfs"), libc::EPERM));
            }
            let a = st.attr(t, o)?;
            if a.nlink == 0 {
                return Err(Error::posix("link", format!("{o} was removed"), libc::ENOENT));
            }
            st.read_meta(t, parent)?;
            if st.lookup(t, parent, name)?.is_some() {
                return Err(Error::posix("link", format!("{name:?} exists"), libc::EEXIST));
            }
            t.delta.dirs.entry(parent).or_default().insert(name.to_owned(), Some(o));
            t.delta.obj(o).attr.nlink += 1;
            State::touch(t, o, false);
            State::touch(t, parent, true);
            st.attr_unrecorded(Some(t), o)
        })
    }

    pub fn unlink(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr) -> Result<()> {
        self.run(tx, |st, t| st.unlink_entry(t, parent, name, false))
    }

    pub fn rmdir(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr) -> Result<()> {
        self.run(tx, |st, t| st.unlink_entry(t, parent, name, true))
    }

    pub fn rename(
        &self,
        tx: Option<TxId>,
        from_dir: ObjId,
        from: &OsStr,
        to_dir: ObjId,
        to: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        self.run(tx, |st, t| st.rename(t, from_dir, from, to_dir, to, flags))
    }

    pub fn readdir(&self, tx: Option<TxId>, dir: ObjId) -> Result<Vec<DirEntry>> {
        self.run(tx, |st, t| {
            st.expect_dir(t, dir)?;
            st.readdir(t, dir)
        })
    }

    pub fn getxattr(&self, tx: Option<TxId>, o: ObjId, name: &OsStr) -> Result<Option<Vec<u8>>> {
        self.run(tx, |st, t| st.xattr(t, o, name))
    }

    pub fn listxattr(&self, tx: Option<TxId>, o: ObjId) -> Result<Vec<OsString>> {
        self.run(tx, |st, t| {
            st.kind_in(Some(t), o)?;
            st.read_meta(t, o)?;
            let mut names: BTreeMap<OsString, bool> = BTreeMap::new();
            if !st.is_created(t, o) {
                let p = st.base_path(o).ok_or(Error::Stale(o))?;
                for n in st.storage.list_xattrs(&p).ctx("listxattr", || p.display().to_string())? {
                    names.insert(n, true);
                }
            }
            for d in [st.frozen.as_ref(), Some(&st.committed), Some(&t.delta)].into_iter().flatten() {
                if let Some(od) = d.objs.get(&o) {
                    for (k, v) in &od.attr.xattrs {
                        names.insert(k.clone(), v.is_some());
                    }
                }
            }
            Ok(names.into_iter().filter(|(_, p)| *p).map(|(k, _)| k).collect())
        })
    }

    /// Sets (`Some`) or removes (`None`) an extended attribute. `create` and
    /// `replace` are XATTR_CREATE / XATTR_REPLACE.
    pub fn setxattr(
        &self,
        tx: Option<TxId>,
        o: ObjId,
        name: &OsStr,
        value: Option<&[u8]>,
        create: bool,
        replace: bool,
    ) -> Result<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(Error::posix("setxattr", format!("{name:?}"), libc::ERANGE));
        }
        if value.is_some_and(|v| v.len() > 65536) {
            return Err(Error::posix("setxattr", format!("{name:?}"), libc::E2BIG));
        }
        // Checks and change in one lock hold: XATTR_CREATE is atomic.
        self.run(tx, |st, t| {
            let kind = st.kind_in(Some(t), o)?;
            if kind == FileKind::Symlink && name.as_bytes().starts_with(b"user.") {
                // As Linux: user.* attributes only on files and directories.
                return Err(Error::posix("setxattr", format!("{name:?} on a symlink"), libc::EPERM));
            }
            let exists = st.xattr(t, o, name)?.is_some();
            if value.is_none() && !exists {
                return Err(Error::posix("removexattr", format!("{name:?}"), libc::ENODATA));
            }
            if create && exists {
                return Err(Error::posix("setxattr", format!("{name:?}"), libc::EEXIST));
            }
            if replace && !exists {
                return Err(Error::posix("setxattr", format!("{name:?}"), libc::ENODATA));
            }
            t.delta.obj(o).attr.xattrs.insert(name.to_owned(), value.map(|v| v.to_vec()));
            State::touch(t, o, false);
            Ok(())
        })
    }

    /// fsync: a no-op inside a transaction (the commit makes it durable);
    /// outside, every commit so far becomes durable.
    pub fn fsync(&self, tx: Option<TxId>) -> Result<()> {
        if tx.is_some() {
            return Ok(());
        }
        self.sync()
    }

    /// Makes every commit so far durable.
    pub fn sync(&self) -> Result<()> {
        let target = *self.shared.sync.written.lock();
        self.shared.sync.wait_durable(target)
    }

    /// Marks an object open (an open file handle); an open object that is
    /// unlinked stays readable until [`Engine::release`].
    pub fn open_obj(&self, o: ObjId) -> Result<()> {
        let mut st = self.lock();
        let n = st.nodes.get_mut(&o).ok_or(Error::Stale(o))?;
        n.open += 1;
        Ok(())
    }

    pub fn release(&self, o: ObjId) {
        let mut st = self.lock();
        let orphan = match st.nodes.get_mut(&o) {
            Some(n) => {
                n.open = n.open.saturating_sub(1);
                n.open == 0 && n.base.as_ref().is_some_and(|b| b.parent == ORPHANS_OBJ)
            }
            None => false,
        };
        if orphan {
            // The journal may still name .txfs/orphans/N (J1: only a plan
            // changes the backing tree): the file goes after the next
            // checkpoint, or at the next start.
            if let Some(n) = st.nodes.get_mut(&o) {
                n.gone = true;
            }
            st.released_orphans.push(o);
        }
    }

    pub fn stats(&self) -> Stats {
        let st = self.lock();
        let mut s = st.stats.clone();
        s.journal_bytes = st.journal.end;
        s.last_seq = st.seq.0;
        s.live_txs = st.txs.len() as u64;
        s.journal_syncs = self.shared.sync.syncs.load(Ordering::Relaxed);
        s
    }

    /// Writes everything committed into the backing tree and empties the
    /// journal (see `checkpoint.rs`).
    pub fn checkpoint(&self) -> Result<()> {
        let _one = self.shared.ckpt_lock.lock();
        self.sync()?;
        checkpoint::run(&self.shared.state, &self.shared.sync)
    }

    fn maybe_checkpoint(&self) {
        if self.bg.lock().is_none() {
            let big = self.lock().uncheckpointed() > self.shared.opts.checkpoint_bytes;
            if big {
                if let Err(e) = self.checkpoint() {
                    tracing::warn!("checkpoint failed: {e}");
                }
            }
        }
    }

    /// Checkpoints and stops the background thread: the backing directory
    /// then holds exactly the committed state as plain files.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// [`Engine::close`] for a shared engine: stops the background thread
    /// and checkpoints. Later operations still work (without a flusher).
    pub fn shutdown(&self) -> Result<()> {
        self.stop_bg();
        // An unmounted tree keeps no spare journal (disk space), and its
        // journal has nothing after its records: the last checkpoint starts
        // a fresh one, and the journal it retires is deleted.
        let storage = self.lock().storage.clone();
        crate::checkpoint::drop_spare(&*storage)?;
        self.checkpoint()?;
        let _one = self.shared.ckpt_lock.lock();
        crate::checkpoint::drop_spare(&*storage)?;
        self.lock().drop_spares();
        // A checkpoint with nothing to do leaves the journal as it is: if it
        // is a recycled one, its old bytes go now (nothing is committed, so
        // nothing follows the header). The same file goes on, keyed: a
        // failure here leaves the engine writing where recovery looks.
        let st = self.lock();
        if st.committed.is_empty() && st.frozen.is_none() {
            let j = &st.journal;
            if j.file.len().ctx("journal stat", || j.path.display().to_string())? > j.end {
                j.file.set_len(j.end).ctx("journal cut", || j.path.display().to_string())?;
                j.file.sync_data().ctx("journal cut", || j.path.display().to_string())?;
            }
        }
        Ok(())
    }

    fn stop_bg(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.bg.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_bg();
    }
}

fn background(sh: Arc<Shared>, iv: Duration) {
    let step = Duration::from_millis(10).min(iv);
    let mut waited = Duration::ZERO;
    let mut postponed = false;
    // The last commit seen and how long ago it was first seen.
    let (mut seen, mut idle) = (Seq(0), Duration::ZERO);
    while !sh.stop.load(Ordering::Relaxed) {
        std::thread::sleep(step);
        waited += step;
        if waited < iv {
            continue;
        }
        waited = Duration::ZERO;
        let target = *sh.sync.written.lock();
        if sh.sync.synced() < target {
            if let Err(e) = sh.sync.wait_durable(target) {
                tracing::error!("background journal flush failed: {e}");
            }
            sh.flushes.fetch_add(1, Ordering::Relaxed);
        }
        // What an idle checkpoint may take: not a poisoned engine's (it
        // commits nothing more and refuses checkpoints: idleness would only
        // log that every `idle_checkpoint`), not many names (counted up to
        // the bound, under the lock).
        let (big, pending, seq) = {
            let st = sh.state.lock();
            let few_names = st
                .committed
                .dirs
                .values()
                .try_fold(0usize, |n, d| Some(n + d.len()).filter(|&n| n <= IDLE_CHECKPOINT_MAX_NAMES))
                .is_some();
            let pending = !st.committed.is_empty() && st.poisoned.is_none() && few_names;
            (st.uncheckpointed() > sh.opts.checkpoint_bytes, pending, st.seq)
        };
        if seq != seen {
            (seen, idle) = (seq, Duration::ZERO);
        } else {
            idle += iv;
        }
        let quiet = pending && sh.opts.idle_checkpoint.is_some_and(|d| idle >= d);
        if big || quiet {
            idle = Duration::ZERO;
            let _one = sh.ckpt_lock.lock();
            let target = *sh.sync.written.lock();
            if let Err(e) = sh.sync.wait_durable(target) {
                tracing::error!("journal flush before checkpoint failed: {e}");
                continue;
            }
            match checkpoint::run(&sh.state, &sh.sync) {
                Ok(()) => postponed = false,
                // Not started (no room): retried every interval, said once.
                Err(e) if sh.state.lock().poisoned.is_none() => {
                    if !postponed {
                        tracing::error!("background checkpoint postponed: {e}");
                    }
                    postponed = true;
                }
                Err(e) => tracing::error!("background checkpoint failed: {e}"),
            }
        }
    }
}

/// Validates, journals and publishes one transaction (I3, J2). Called with
/// the lock held; returns the journal position to wait for if durable.
///
/// The record names the transaction's data files (synced first, ordered
/// commits too: their bytes are written once) instead of carrying them.
/// `sync_follows`: the caller waits for this record's durability at once.
fn commit_locked(st: &mut State, sync: &SyncState, mut tx: Tx, sync_follows: bool) -> Result<(JPos, Vec<ObjId>)> {
    if let Some(w) = tx.doomed.take() {
        st.discard_tx(&tx);
        return Err(Error::Conflict { tx: tx.id, what: w });
    }
    if let Some(what) = tx.reads.first_stale(&st.ver, tx.start) {
        st.discard_tx(&tx);
        return Err(Error::Conflict { tx: tx.id, what });
    }
    drop_unreachable_new(st, &mut tx.delta, &tx.explicit);
    if tx.delta.is_empty() {
        st.discard_tx(&tx);
        return Ok((*sync.written.lock(), Vec::new()));
    }
    // Bytes written to data files since the caller synced them (or every
    // byte, for a commit that did not go through commit_changes).
    let unsynced = take_unsynced(&st.data_files, &mut tx);
    if let Err(e) = sync_data_files(&unsynced) {
        st.discard_tx(&tx);
        st.stats.aborts += 1;
        return Err(e);
    }
    let changed: Vec<ObjId> = tx.delta.objs.iter().filter(|(_, od)| od.file.is_some()).map(|(o, _)| *o).collect();
    let seq = Seq(st.seq.0 + 1);
    // Sizes before this commit, for stamping truncated pages.
    // Sizes before this commit: truncated pages are stamped up to the old
    // size, and only a size that changes stamps the metadata (a write
    // inside the file does not conflict with a transaction that looked the
    // file up).
    let mut old_sizes = HashMap::new();
    for (o, od) in &tx.delta.objs {
        if od.file.is_some() {
            if let Ok(a) = st.attr_unrecorded(None, *o) {
                old_sizes.insert(*o, a.size);
            }
        }
    }
    let (rec, extents) = crate::recovery::encode(st, &tx.delta)?;
    let (meta, version) = rec.encode().map_err(|e| Error::Poisoned(format!("record encoding: {e}")))?;
    let data_len: u64 = extents.iter().map(|(_, _, l, _)| *l).sum();
    let durable_upto = {
        let s = sync.synced();
        if s.epoch == st.journal.epoch {
            s.off
        } else {
            0
        }
    };
    let appended = {
        let st_ref: &State = st;
        let mut fill = |sink: &mut journal::DataSink<'_>| -> Result<()> {
            let mut buf = Vec::new();
            for (_, _, len, loc) in &extents {
                // Bytes in memory go to the sink as they are (no zeroed
                // buffer, no copy: a plain 512 KiB WRITE spent 6% of the
                // daemon's time in those).
                if let DataLoc::Mem(b, s) = loc {
                    let bytes = b
                        .get(*s..*s + *len as usize)
                        .ok_or_else(|| std::io::Error::other("memory extent out of range"))
                        .ctx("commit", || "reading transaction data".into())?;
                    sink.put(bytes)?;
                    continue;
                }
                let mut done = 0u64;
                while done < *len {
                    let n = ((*len - done) as usize).min(1 << 20);
                    buf.resize(n, 0);
                    st_ref.fetch(&loc.advance(done), &mut buf).ctx("commit", || "reading transaction data".into())?;
                    sink.put(&buf)?;
                    done += n as u64;
                }
            }
            Ok(())
        };
        let mut j = placeholder_writer(st_ref);
        let r = j.append(seq, durable_upto, version, &meta, data_len, sync_follows, &mut fill);
        let end = j.end;
        st.journal.end = end;
        r
    };
    let appended = match appended {
        Ok(a) => a,
        Err(e) => {
            st.discard_tx(&tx);
            st.stats.aborts += 1;
            if matches!(e.errno(), libc::ENOSPC | libc::EDQUOT) {
                // The spare journal's and spare data files' space goes back
                // to the file system: this commit failed whole, a retry may fit.
                let _ = crate::checkpoint::drop_spare(&*st.storage);
                st.drop_spares();
            }
            return Err(e);
        }
    };
    // The data files the record names now belong to the committed state.
    for id in rec.files.iter().map(|f| f.file).collect::<std::collections::BTreeSet<_>>() {
        if let Some(df) = st.data_files.get_mut(&id) {
            if df.owner.take().is_some() {
                st.committed_data_bytes += df.len;
                df.file = None;
                df.epoch = st.journal.epoch;
            }
        }
    }
    // Point the delta's extents at the journal, then publish.
    let epoch = st.journal.epoch;
    let mut data_off = appended.data_start;
    for (o, foff, len, _) in &extents {
        if let Some(f) = tx.delta.objs.get_mut(o).and_then(|od| od.file.as_mut()) {
            f.ext.insert(*foff, *len, DataLoc::Journal(epoch, data_off));
        }
        data_off += len;
    }
    stamp(st, &tx.delta, seq, &old_sizes);
    st.committed.compose(&tx.delta);
    for (o, old) in &old_sizes {
        if st.attr_unrecorded(None, *o).map(|a| a.size).ok() != Some(*old) {
            st.ver.metas.insert(*o, seq);
        }
    }
    st.seq = seq;
    st.discard_tx(&tx);
    st.stats.commits += 1;
    let pos = JPos { epoch, off: appended.end };
    *sync.written.lock() = pos;
    Ok((pos, changed))
}

/// Objects created and removed again inside one transaction, and not
/// open, leave no trace: no journal bytes, no durable I/O (SPEC §5);
/// changes to objects that are gone cannot be observed by anyone.
fn drop_unreachable_new(st: &mut State, d: &mut Delta, explicit: &std::collections::HashSet<ObjId>) {
    let linked: std::collections::HashSet<ObjId> =
        d.dirs.values().flat_map(|e| e.values().flatten().copied()).collect();
    let dead: Vec<ObjId> = d
        .created
        .keys()
        .filter(|o| !linked.contains(o) && st.nodes.get(o).is_none_or(|n| n.open == 0))
        .copied()
        .collect();
    for o in dead {
        d.created.remove(&o);
        d.objs.remove(&o);
        d.dirs.remove(&o);
        d.parents.remove(&o);
    }
    // Objects removed and checkpointed since the transaction touched them.
    d.objs.retain(|o, _| st.nodes.get(o).is_some_and(|n| !n.gone));
    // Names removed that the committed state never had (a file created and
    // unlinked inside the transaction), then directories whose only change
    // left is the times those namespace changes bumped: the transaction
    // changed nothing there, and costs no journal write and no fdatasync
    // (SPEC §5). Times the transaction set itself stay.
    let dirs: Vec<ObjId> = d.dirs.keys().copied().collect();
    for dir in dirs {
        let gone: Vec<OsString> = d.dirs[&dir].iter().filter(|(_, e)| e.is_none()).map(|(n, _)| n.clone()).collect();
        for name in gone {
            let existed = match st.committed.entry(dir, &name) {
                Some(e) => e.is_some(),
                None if d.created.contains_key(&dir) || st.committed.created.contains_key(&dir) => false,
                // An unreadable backing tree: keep the removal.
                None => st.base_child(dir, &name).map_or(true, |c| c.is_some()),
            };
            if !existed {
                d.dirs.get_mut(&dir).expect("listed").remove(&name);
            }
        }
        if !d.dirs[&dir].is_empty() {
            continue;
        }
        d.dirs.remove(&dir);
        let times_only = d.objs.get(&dir).is_some_and(|od| {
            let a = &od.attr;
            od.file.is_none()
                && a.mode.is_none()
                && a.uid.is_none()
                && a.gid.is_none()
                && a.nlink == 0
                && a.xattrs.is_empty()
        });
        if times_only && !explicit.contains(&dir) && !d.created.contains_key(&dir) {
            d.objs.remove(&dir);
        }
    }
}

fn placeholder_writer(st: &State) -> JournalWriter {
    JournalWriter {
        epoch: st.journal.epoch,
        path: st.journal.path.clone(),
        file: st.journal.file.clone(),
        end: st.journal.end,
        nonce: st.journal.nonce,
    }
}

/// Stamps every item `delta` changes with `seq` (I2).
fn stamp(st: &mut State, delta: &Delta, seq: Seq, old_sizes: &HashMap<ObjId, u64>) {
    for (o, od) in &delta.objs {
        if let Some(f) = &od.file {
            let r = st.ver.pages.entry(*o).or_default();
            for (off, e) in f.ext.iter() {
                r.stamp(off / PAGE, (off + e.len).div_ceil(PAGE), seq);
            }
            if f.cut != NO_CUT {
                let old = old_sizes.get(o).copied().unwrap_or(u64::MAX / 2);
                r.stamp(f.cut / PAGE, old.max(f.cut).div_ceil(PAGE) + 1, seq);
            }
        }
        let a = &od.attr;
        // A directory's link count changes with every mkdir/rmdir in it; it
        // is not validated, or creating different names in one directory
        // would conflict (SPEC §3). A file's link count is.
        // A directory's own count drops by 2 only when it is removed: that is
        // stamped, so a transaction adding names to it cannot commit.
        let links = match st.nodes.get(o).map(|n| n.kind) {
            Some(FileKind::Dir) => a.nlink <= -2,
            _ => a.nlink != 0,
        };
        if a.mode.is_some() || a.uid.is_some() || a.gid.is_some() || links || !a.xattrs.is_empty() {
            st.ver.metas.insert(*o, seq);
        }
    }
    for (d, entries) in &delta.dirs {
        for n in entries.keys() {
            st.ver.names.insert((*d, n.clone()), seq);
        }
        st.ver.lists.insert(*d, seq);
    }
    for o in delta.parents.keys() {
        st.ver.metas.insert(*o, seq);
    }
}

/// Reads the committed state, for tests and tools: `None` if absent.
impl Engine {
    /// Resolves a slash-separated path in the committed state (no symlinks
    /// followed).
    pub fn resolve(&self, tx: Option<TxId>, path: &Path) -> Result<ObjId> {
        let mut cur = ObjId::ROOT;
        for c in path.components() {
            match c {
                std::path::Component::Normal(n) => cur = self.lookup(tx, cur, n)?.obj,
                std::path::Component::RootDir | std::path::Component::CurDir => {}
                _ => return Err(Error::posix("resolve", path.display().to_string(), libc::EINVAL)),
            }
        }
        Ok(cur)
    }
}
