//! [`State`]: everything the engine knows, behind its one lock.
//!
//! * the object table (`nodes`, `by_ino`): every object met so far, and
//!   where it lives in the backing tree ([`BaseLoc`], stable between
//!   checkpoints: J1);
//! * the committed delta, and the `frozen` one a running checkpoint is
//!   writing (DESIGN §4);
//! * live transactions ([`Tx`]: each one's delta (I1), read set, data files);
//! * the commit stamps ([`Versions`], I2) and the commit counter;
//! * the journal writer and the journal files committed extents point into;
//! * the data files of live transactions and of committed records;
//! * counters, and the engine's one poison latch (`poisoned`, shared with
//!   the group commit: a checkpoint that failed half way or a failed
//!   journal sync refuses all further work until the engine is reopened
//!   and recovery finishes it).
//!
//! Invariants kept here: an object is reachable by a transaction only if
//! it is in the tree, the committed delta, or that transaction's own delta
//! (I1, [`State::kind_in`]); `tree_gen` moves before anything renames or
//! removes a backing file, so a read that ran without the lock can tell it
//! raced (`tests/unlocked_reads.rs`).

use super::api::{Options, Stats};
use super::budget::{Caps, Doom, ObjCount};
use super::isolation::{ReadSet, Versions};

use crate::delta::{DataLoc, Delta};
use crate::error::{Error, Result};
use crate::ids::{DataFileId, Epoch, ObjId, Seq, TxId};
use crate::log::files::{data_path, journal_path, read_exact_at, DataFile, META_DIR};
use crate::log::group_commit::Poison;
use crate::log::journal::{self, JournalWriter};
use crate::storage::{FileKind, Meta, Storage, StoredFile};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;

/// Reserved object ids: the root is [`ObjId::ROOT`], then `.txfs` and
/// `.txfs/orphans`; ids from `FIRST_FREE_OBJ` on are handed out.
pub(crate) const META_OBJ: ObjId = ObjId(2);
pub(crate) const ORPHANS_OBJ: ObjId = ObjId(3);
pub(crate) const FIRST_FREE_OBJ: u64 = 16;

/// More levels than any walk up a directory tree goes before it takes the
/// tree for broken (a cycle): far more than any real tree, since trees may
/// be deeper than PATH_MAX.
pub(crate) const MAX_DEPTH: usize = 1 << 24;

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
    pub(super) id: TxId,
    pub(super) start: Seq,
    pub(super) delta: Delta,
    pub(super) reads: ReadSet,
    pub(super) doomed: Option<Doom>,
    pub(super) mem_bytes: u64,
    /// Bookkeeping bytes charged beside the maps' entries (budget.rs).
    pub(super) book: u64,
    /// What `book` holds for each object's extents and xattrs.
    pub(super) counted: HashMap<ObjId, ObjCount>,
    /// Page ranges in the read set.
    pub(super) page_ranges: u64,
    /// What the mount's count (`State::live_mem`) holds for it.
    pub(super) charged: u64,
    /// The user it belongs to (`Engine::begin_as`): its data files are
    /// theirs, so that the backing's quotas count them.
    pub(super) owner: Option<(u32, u32)>,
    /// The transaction's spill data file and where its next bytes go.
    pub(super) spill: Option<(DataFileId, u64)>,
    /// Files it created whose content is staged in a data file.
    pub(super) staged: HashMap<ObjId, DataFileId>,
    /// Existing files it rewrites from the start, past `stage_threshold` or
    /// its memory: their shadow data files, which hold its bytes at the
    /// files' own offsets (DESIGN §2a).
    pub(super) shadows: HashMap<ObjId, DataFileId>,
    /// A data file of this transaction was written since it was last synced.
    pub(super) data_dirty: bool,
    /// Objects whose attributes the transaction set itself (setattr), as
    /// opposed to times that its namespace changes bumped.
    pub(super) explicit: std::collections::HashSet<ObjId>,
    /// Of those, the ones whose times it set (utimensat, touch), as opposed
    /// to the mtime a truncate's setattr carries: what a change set lists
    /// as `times` (changes.rs).
    pub(super) timed: std::collections::HashSet<ObjId>,
    /// Writes reserved in its data files whose bytes are still being copied
    /// outside the engine lock. Its commit waits for them: a shadow's bytes
    /// sit where the committed delta points, so a copy landing after the
    /// commit would change committed content.
    pub(super) inflight: u32,
    /// Its commit is waiting for `inflight`: new writes take the locked
    /// path, so a stream of writes from other threads cannot starve it.
    pub(super) committing: bool,
    /// Operations it ran: with the commit counter, tells whether its
    /// change set can have changed since it was last listed (changes.rs).
    pub(super) ops: u64,
}

impl Tx {
    /// Its data files: the spill file and the staged files.
    pub(super) fn data_file_ids(&self) -> impl Iterator<Item = DataFileId> + '_ {
        let files = self.staged.values().chain(self.shadows.values()).copied();
        self.spill.iter().map(|(id, _)| *id).chain(files)
    }

    pub(super) fn new(id: TxId, start: Seq) -> Tx {
        Tx {
            id,
            start,
            delta: Delta::default(),
            reads: ReadSet::default(),
            doomed: None,
            mem_bytes: 0,
            book: 0,
            counted: HashMap::new(),
            page_ranges: 0,
            charged: 0,
            owner: None,
            spill: None,
            staged: HashMap::new(),
            shadows: HashMap::new(),
            data_dirty: false,
            explicit: Default::default(),
            timed: Default::default(),
            inflight: 0,
            committing: false,
            ops: 0,
        }
    }
}

/// What the in-memory node table must look like after the plan ran.
pub(crate) struct NodeUpdates {
    pub(crate) moved: Vec<(ObjId, BaseLoc)>,
    /// Base names the plan changed: no node may keep them as a location.
    pub(crate) changed_locs: HashSet<(ObjId, OsString)>,
    pub(crate) gone: Vec<ObjId>,
    pub(crate) new_inos: Vec<ObjId>,
    /// New files placed by renaming their data file: the tree holds their
    /// content once phase 2 ran.
    pub(crate) in_place: Vec<ObjId>,
    /// Existing files replaced by their shadow: a new backing inode.
    pub(crate) replaced: Vec<ObjId>,
    /// Ids of the data files that old inodes are kept as (spares).
    pub(crate) spares: Vec<DataFileId>,
}

pub(crate) struct State {
    pub(super) storage: Arc<dyn Storage>,
    pub(super) nodes: HashMap<ObjId, Node>,
    pub(super) by_ino: HashMap<(u64, u64), ObjId>,
    pub(super) committed: Delta,
    /// The committed delta a running checkpoint is writing into the backing
    /// tree, below `committed`. Its namespace is already in the tree (the
    /// checkpoint's phases 1–2 ran under the lock); its file contents and
    /// attributes are being written (phase 3, outside the lock), so reads
    /// lay them over the tree until the checkpoint ends (DESIGN §4).
    pub(super) frozen: Option<Delta>,
    /// A checkpoint whose contents phase failed, written again by the next
    /// checkpoint run; its delta is `frozen` meanwhile.
    pub(crate) unfinished: Option<crate::checkpoint::Unfinished>,
    /// Bumped, under the lock, before anything renames or removes a file of
    /// the backing tree (a checkpoint's start, an orphan's removal) and when
    /// a checkpoint ends: a read that ran without the lock counts only if
    /// this did not move meanwhile ([`Engine::read`](crate::Engine::read)).
    pub(super) tree_gen: u64,
    pub(super) txs: HashMap<TxId, Tx>,
    pub(super) ver: Versions,
    pub(super) next_obj: u64,
    pub(super) next_tx: u64,
    pub(super) seq: Seq,
    pub(super) journal: JournalWriter,
    pub(super) journal_files: HashMap<Epoch, Arc<dyn StoredFile>>,
    /// Data files (`.txfs/data/`): of live transactions, and those that
    /// committed records name until the checkpoint retires them.
    pub(super) data_files: HashMap<DataFileId, DataFile>,
    pub(super) next_data: u64,
    /// Bytes in data files that committed records name (checkpoint trigger).
    pub(super) committed_data_bytes: u64,
    pub(super) poisoned: Arc<Poison>,
    /// Orphans whose last handle closed: removed once a checkpoint has
    /// retired the journal that may name them.
    pub(super) released_orphans: Vec<ObjId>,
    pub(super) stats: Stats,
    pub(super) spill_threshold: u64,
    pub(super) stage_threshold: u64,
    /// The backing's largest file size and most names per file, if known:
    /// a write, truncate or link past them is refused at the call (EFBIG,
    /// EMLINK) rather than accepted and met by the checkpoint.
    pub(super) max_file_size: Option<u64>,
    pub(super) max_links: Option<u64>,
    /// Spare data files: the old inodes of files a checkpoint replaced by
    /// their shadows, `(id, length)`. A new shadow takes one and overwrites
    /// blocks that are already allocated (DESIGN §2a).
    pub(super) spares: Vec<(DataFileId, u64)>,
    /// Memory caps of live transactions, and what they hold together
    /// (budget.rs).
    pub(super) caps: Caps,
    pub(super) live_mem: u64,
    /// A big transaction ended: give freed heap back once the lock is let go.
    pub(super) trim: bool,
    /// What big transactions held, dropped once the lock is let go (a
    /// million extents take tens of milliseconds to free: budget.rs).
    pub(super) graveyard: Vec<Box<dyn std::any::Any + Send>>,
    /// The durable high-water mark's writer (`log/mark.rs`).
    pub(crate) mark: Arc<crate::log::mark::Mark>,
    /// Recovery went past a refusal (`Options::accept_loss`): the mark is
    /// rewritten whole at the end of the open.
    pub(crate) loss_accepted: bool,
    /// What recovery accepted to lose, said for the log (`txfs recover`).
    pub(crate) losses: Vec<String>,
}

impl State {
    /// Committed bytes the next checkpoint works through: the journal and
    /// the data files its records name.
    pub(super) fn uncheckpointed(&self) -> u64 {
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
            // Only a cycle gets here: trees may be deeper than PATH_MAX
            // (a bound of 4096 levels left deeper objects unreachable,
            // and their checkpoint failed: issue 23).
            if guard > MAX_DEPTH {
                return None;
            }
        }
        let mut p = PathBuf::new();
        for s in parts.iter().rev() {
            p.push(s);
        }
        Some(p)
    }

    pub(super) fn is_created(&self, tx: &Tx, o: ObjId) -> bool {
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
    pub(super) fn base_file(&self, o: ObjId) -> Result<Option<PathBuf>> {
        let n = self.nodes.get(&o).ok_or(Error::Stale(o))?;
        Ok(n.base.as_ref().and_then(|_| self.base_path(o)))
    }

    pub(super) fn base_meta(&self, o: ObjId) -> Result<Option<Meta>> {
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

    /// Removes the data files `tx` still owns (none of its bytes
    /// survive; a commit has already taken the ones its record names).
    /// Idempotent: a second call finds nothing more to give back.
    pub(super) fn discard_tx(&mut self, tx: &mut Tx) {
        self.live_mem = self.live_mem.saturating_sub(std::mem::take(&mut tx.charged));
        if tx.held() >= super::budget::TRIM_AFTER {
            self.trim = true;
        }
        for id in tx.data_file_ids() {
            if self.data_files.get(&id).is_some_and(|d| d.owner == Some(tx.id)) {
                self.data_files.remove(&id);
                let _ = self.storage.unlink(&data_path(id));
            }
        }
    }
}

// ----- what checkpoint/ and recovery.rs ask of the state -----------------
//
// The fields above are private to the transaction layer: a checkpoint and
// recovery change the state only through these, each one step they name.

impl State {
    /// A fresh state for recovery: the reserved directories, nothing
    /// committed yet, appending to `journal` after the commit `prev_seq`.
    pub(crate) fn new(storage: Arc<dyn Storage>, journal: JournalWriter, prev_seq: Seq, opts: &Options) -> State {
        let (epoch, jf) = (journal.epoch, journal.file.clone());
        let storage_limits = (storage.max_file_size(), storage.max_links());
        let mut st = State {
            storage,
            nodes: HashMap::new(),
            by_ino: HashMap::new(),
            committed: Delta::default(),
            frozen: None,
            unfinished: None,
            tree_gen: 0,
            txs: HashMap::new(),
            ver: Default::default(),
            next_obj: FIRST_FREE_OBJ,
            next_tx: 0,
            seq: prev_seq,
            journal,
            journal_files: HashMap::from([(epoch, jf)]),
            data_files: HashMap::new(),
            next_data: 0,
            committed_data_bytes: 0,
            poisoned: Arc::default(),
            released_orphans: Vec::new(),
            spares: Vec::new(),
            mark: Arc::new(crate::log::mark::Mark::new(&crate::log::mark::OnDisk::Absent)),
            loss_accepted: false,
            losses: Vec::new(),
            stats: Default::default(),
            spill_threshold: opts.spill_threshold,
            stage_threshold: opts.stage_threshold,
            max_file_size: storage_limits.0,
            max_links: storage_limits.1,
            caps: Caps::of(opts),
            live_mem: 0,
            trim: false,
            graveyard: Vec::new(),
        };
        let dir = |parent: ObjId, name: &str| Node {
            kind: FileKind::Dir,
            base: Some(BaseLoc { parent, name: OsString::from(name) }),
            alts: Vec::new(),
            open: 0,
            gone: false,
            ino: None,
        };
        st.nodes.insert(ObjId::ROOT, dir(ObjId::ROOT, ""));
        st.nodes.insert(META_OBJ, dir(ObjId::ROOT, META_DIR));
        st.nodes.insert(ORPHANS_OBJ, dir(META_OBJ, "orphans"));
        st
    }

    pub(crate) fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    pub(crate) fn node(&self, o: ObjId) -> Option<&Node> {
        self.nodes.get(&o)
    }

    pub(crate) fn committed(&self) -> &Delta {
        &self.committed
    }

    /// The last commit's seq.
    pub(crate) fn seq(&self) -> Seq {
        self.seq
    }

    pub(crate) fn journal(&self) -> &JournalWriter {
        &self.journal
    }

    pub(crate) fn data_file(&self, id: DataFileId) -> Option<&DataFile> {
        self.data_files.get(&id)
    }

    /// Why the engine refuses work, if it does.
    pub(crate) fn poisoned(&self) -> Option<String> {
        self.poisoned.get()
    }

    /// The latch itself, for the group commit to share.
    pub(crate) fn poison_latch(&self) -> Arc<Poison> {
        self.poisoned.clone()
    }

    /// From now on every operation fails with `why`: the backing tree may
    /// no longer match what the state says of it (recovery mends it).
    pub(crate) fn poison(&mut self, why: String) {
        self.poisoned.set(why, false);
    }

    /// From now on nothing is acknowledged (the journal's contents are
    /// unknown) but plain reads of the in-memory state go on.
    pub(crate) fn poison_journal(&mut self, why: String) {
        self.poisoned.set(why, true);
    }

    /// Reads that ran without the lock must not trust what they read: a
    /// file of the backing tree is about to be renamed or removed.
    pub(crate) fn bump_tree_gen(&mut self) {
        self.tree_gen += 1;
    }

    /// Bytes of the spare data files kept.
    pub(crate) fn spare_bytes(&self) -> u64 {
        self.spares.iter().map(|(_, l)| l).sum()
    }

    /// A data-file id never used before.
    pub(crate) fn new_data_id(&mut self) -> DataFileId {
        let k = DataFileId(self.next_data);
        self.next_data += 1;
        k
    }

    /// Recovery met the data file `id` on disk: new ids go past it.
    pub(crate) fn data_id_seen(&mut self, id: DataFileId) {
        self.next_data = self.next_data.max(id.0 + 1);
    }

    /// Recovery: a committed record names the data file `id` of `len`
    /// bytes; the checkpoint of the current epoch retires it.
    pub(crate) fn add_committed_data_file(&mut self, id: DataFileId, len: u64) {
        let epoch = self.journal.epoch;
        self.data_files.insert(id, DataFile { file: None, owner: None, len, epoch });
        self.committed_data_bytes += len;
    }

    /// Recovery: one record's delta joins the committed state as commit `seq`.
    pub(crate) fn replay(&mut self, d: &Delta, seq: Seq) {
        self.committed.compose(d);
        self.seq = seq;
    }

    /// Orphans whose last handle closed since the last checkpoint.
    pub(crate) fn take_released_orphans(&mut self) -> Vec<ObjId> {
        std::mem::take(&mut self.released_orphans)
    }

    /// A checkpoint's phases 1–2 ran: the node table follows the backing
    /// tree's new names and inodes.
    pub(crate) fn follow_plan(&mut self, upd: NodeUpdates, storage: &dyn Storage) {
        for o in upd.gone {
            if let Some(n) = self.nodes.get_mut(&o) {
                if let Some(k) = n.ino.take() {
                    self.by_ino.remove(&k);
                }
                n.base = None;
                n.gone = true;
            }
        }
        for (o, loc) in upd.moved {
            if let Some(n) = self.nodes.get_mut(&o) {
                // Names the node had that still exist stay known as links.
                if let Some(old) = n.base.take() {
                    n.alts.push(old);
                }
                n.alts.retain(|l| *l != loc);
                n.base = Some(loc);
                n.gone = false;
            }
        }
        for n in self.nodes.values_mut() {
            n.alts.retain(|l| !upd.changed_locs.contains(&(l.parent, l.name.clone())));
        }
        for o in upd.new_inos {
            if let Some(pth) = self.base_path(o) {
                if let Ok(m) = storage.lstat(&pth) {
                    self.by_ino.insert((m.dev, m.ino), o);
                    if let Some(n) = self.nodes.get_mut(&o) {
                        n.ino = Some((m.dev, m.ino));
                    }
                }
            }
        }
        for k in upd.spares {
            // The link may not have been allowed (replace_file).
            if let Ok(m) = storage.lstat(&data_path(k)) {
                self.spares.push((k, m.size));
            }
        }
        for o in upd.replaced {
            let Some(m) = self.base_path(o).and_then(|pth| storage.lstat(&pth).ok()) else { continue };
            if let Some(old) = self.nodes.get_mut(&o).and_then(|n| n.ino.replace((m.dev, m.ino))) {
                self.by_ino.remove(&old);
            }
            self.by_ino.insert((m.dev, m.ino), o);
        }
    }

    /// The committed delta becomes the frozen one a running checkpoint
    /// writes (reads lay it over the tree until the checkpoint ends);
    /// commits start a new committed delta. `in_place`: new files whose data
    /// file phase 2 renamed into place (their content is the tree's now).
    pub(crate) fn freeze_committed(&mut self, in_place: &[ObjId]) {
        let mut frozen = std::mem::take(&mut self.committed);
        for o in in_place {
            // Their data file is the tree's file now (renamed in phase 2).
            if let Some(od) = frozen.objs.get_mut(o) {
                od.file = None;
            }
        }
        self.frozen = Some(frozen);
        self.committed_data_bytes = 0;
    }

    /// Commits go to the journal of epoch `next` from now on.
    pub(crate) fn switch_journal(&mut self, next: Epoch, file: Arc<dyn StoredFile>, nonce: u32) {
        self.journal_files.insert(next, file.clone());
        self.journal =
            JournalWriter { epoch: next, path: journal_path(next), file, end: journal::FILE_HEADER_LEN, nonce };
    }

    /// The checkpoint of `epoch` is over: its frozen delta and journal go,
    /// and so do the data files its records named; returns their ids (the
    /// caller unlinks them).
    pub(crate) fn end_checkpoint(&mut self, epoch: Epoch) -> Vec<DataFileId> {
        self.frozen = None;
        self.tree_gen += 1;
        self.journal_files.remove(&epoch);
        let retired: Vec<DataFileId> = self
            .data_files
            .iter()
            .filter(|(_, df)| df.owner.is_none() && df.epoch == epoch)
            .map(|(id, _)| *id)
            .collect();
        for id in &retired {
            self.data_files.remove(id);
        }
        self.stats.checkpoints += 1;
        retired
    }

    /// Unlinks orphans whose last handle closed. Only when no journal record
    /// can name them any more (J1); a crash first leaves them to recovery.
    pub(crate) fn remove_orphans(&mut self, released: Vec<ObjId>) {
        if !released.is_empty() {
            self.tree_gen += 1;
        }
        for o in released {
            if let Some(pth) = self.base_path(o) {
                let _ = self.storage.unlink(&pth);
            }
            if let Some(n) = self.nodes.get_mut(&o) {
                n.base = None;
            }
        }
    }
}
