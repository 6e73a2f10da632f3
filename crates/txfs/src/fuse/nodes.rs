//! Kernel node ids: which engine object, and whose view, a node id names.
//!
//! A node id below [`PRIVATE_BASE`] is the engine object of the same
//! number, seen by whoever asks. A transaction knows every existing regular
//! file it looks up by a *private* node id instead, so the kernel keeps a
//! separate inode — and page cache — for it that no other process can
//! reach: page faults there get the transaction's view (SPEC §6). Files it
//! created keep their shared id (nobody else reaches them), and so do
//! directories (see [`TxFs::node_id`]).
//!
//! Node ids are fuser's [`INodeNo`] everywhere in this adapter, never a
//! bare `u64` or an [`ObjId`]: the lists of what to invalidate name kernel
//! nodes ([`all_ids`] turns changed objects into every node id they have),
//! the cache gate remembers nodes, and only [`shared_id`] and [`TxFs::obj`]
//! cross between the two spaces.
//!
//! [`Private`] maps private ids to (transaction, object) and back; an id
//! lives while its transaction does or while the kernel still counts a
//! lookup of it. [`Paged`] names the shared node ids that may have pages in
//! the kernel, so that a change to any other node is answered at once.

use super::{fattr, TxFs};
use fuser::{FileAttr, INodeNo, Request};
use parking_lot::Mutex;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use txfs_engine::{Attr, FileKind, ObjId, TxId};

/// The node ids of the shared mount that may have pages in the kernel's
/// page cache. Handles there are `FOPEN_DIRECT_IO`, so a page is only ever
/// filled by a READ without a lock owner (a mapping's fault) or by a
/// mapping's write-back; a node is added before that READ touches the
/// engine, and never removed. A change to any other node has no pages to
/// drop, so its reply is sent at once instead of after a hand-off to the
/// invalidation thread (which costs a thread switch per plain write and per
/// commit). A node added after a commit's check read the committed data.
#[derive(Default)]
pub(super) struct Paged(pub(super) Mutex<std::collections::HashSet<INodeNo>>);

impl Paged {
    pub(super) fn add(&self, ino: INodeNo) {
        self.0.lock().insert(ino);
    }

    pub(super) fn keep(&self, mut nodes: Vec<INodeNo>) -> Vec<INodeNo> {
        let set = self.0.lock();
        nodes.retain(|n| set.contains(n));
        nodes
    }
}

/// Every node id of these objects: the private ones and the shared one.
pub(super) fn all_ids(private: &Mutex<Private>, objs: Vec<ObjId>) -> Vec<INodeNo> {
    let p = private.lock();
    let mut out = Vec::with_capacity(objs.len());
    for o in objs {
        out.extend(p.of_obj.get(&o).into_iter().flatten().copied());
        out.push(shared_id(o));
    }
    out
}

/// The node id everyone knows `o` by (and a view knows it by).
pub(super) fn shared_id(o: ObjId) -> INodeNo {
    INodeNo(o.0)
}

/// Whether `ino` is a transaction-private node id.
pub(super) fn is_private(ino: INodeNo) -> bool {
    ino.0 >= PRIVATE_BASE
}

/// How long a pass of [`TxFs::dir_change_may_proceed`] waits for its retry.
const PASS_LIFE: Duration = Duration::from_secs(2);

/// Node ids from here up are transaction-private (see [`Private`]).
pub(super) const PRIVATE_BASE: u64 = 1 << 62;

/// Transaction-private node ids: a transaction that changed an existing
/// file gets its own kernel inode for it, so the pages its mappings fault
/// in live in a page cache nobody else reaches (SPEC §6).
#[derive(Default)]
pub(super) struct Private {
    pub(super) owner: HashMap<INodeNo, (TxId, ObjId)>,
    pub(super) by_pair: HashMap<(TxId, ObjId), INodeNo>,
    pub(super) of_obj: HashMap<ObjId, Vec<INodeNo>>,
    pub(super) of_tx: HashMap<TxId, Vec<INodeNo>>,
    /// Lookups of a private id the kernel counts (entry replies) and has
    /// not forgotten: an id is dropped once its transaction has ended and
    /// this is zero, so the maps (and `all_ids`) do not grow with every
    /// transaction the daemon ever served.
    pub(super) nlookup: HashMap<INodeNo, u64>,
    pub(super) next: u64,
    /// Directories each transaction removed or moved through a shared
    /// parent: once it commits, others' dentries (and `getcwd`) must
    /// follow the change (`end_tx`).
    pub(super) moved: HashMap<TxId, Vec<Moved>>,
    /// Private ids of transactions that aborted: what their mappings still
    /// write back is dropped (`write`).
    pub(super) discard: std::collections::HashSet<INodeNo>,
}

/// A directory a transaction removed or moved, and the kernel's slot of
/// the shared dentry it had: its parent's shared node id and its name.
#[derive(Clone, Debug)]
pub(super) struct Moved {
    pub(super) obj: ObjId,
    pub(super) slot: (INodeNo, std::ffi::OsString),
}

impl Private {
    /// The private id `t` knows `o` by, made on first use. The check and
    /// the insert are one step under the caller's lock, so threads of one
    /// transaction looking the same file up at once get one id, never two
    /// (two would give the file two kernel inodes, and two page caches, in
    /// one view).
    pub(super) fn id_for(&mut self, t: TxId, o: ObjId) -> INodeNo {
        match self.by_pair.entry((t, o)) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                self.next += 1;
                let k = INodeNo(PRIVATE_BASE + self.next);
                e.insert(k);
                self.owner.insert(k, (t, o));
                self.of_obj.entry(o).or_default().push(k);
                self.of_tx.entry(t).or_default().push(k);
                k
            }
        }
    }

    pub(super) fn remove(&mut self, k: INodeNo) {
        if let Some((t, o)) = self.owner.remove(&k) {
            self.by_pair.remove(&(t, o));
            if let Some(v) = self.of_obj.get_mut(&o) {
                v.retain(|x| *x != k);
                if v.is_empty() {
                    self.of_obj.remove(&o);
                }
            }
            // Ids made for a transaction after its end (below its private
            // directories) are listed under it too.
            if let Some(v) = self.of_tx.get_mut(&t) {
                v.retain(|x| *x != k);
                if v.is_empty() {
                    self.of_tx.remove(&t);
                }
            }
        }
        self.nlookup.remove(&k);
        self.discard.remove(&k);
        tracing::trace!(node = k.0, "private node id dropped");
    }
}

impl TxFs {
    /// The engine object behind a kernel node id.
    pub(super) fn obj(&self, ino: INodeNo) -> ObjId {
        if let Some(s) = self.shared_mount().filter(|_| is_private(ino)) {
            if let Some((_, o)) = s.private.lock().owner.get(&ino) {
                return *o;
            }
        }
        ObjId(ino.0)
    }

    /// The transaction whose private node `ino` is, if it is one: `Some(None)`
    /// once that transaction has ended (then everyone's committed view).
    pub(super) fn private_owner(&self, ino: INodeNo) -> Option<Option<TxId>> {
        if !is_private(ino) {
            return None;
        }
        let t = self.shared_mount()?.private.lock().owner.get(&ino).map(|(t, _)| *t)?;
        Some(Some(t).filter(|t| self.engine.is_live(*t)))
    }

    /// The view for a request on node `ino`: a private node's owner, else
    /// the caller's transaction.
    pub(super) fn tx_at(&self, req: &Request, ino: INodeNo) -> Option<TxId> {
        if self.view().is_some() {
            return self.view();
        }
        match self.private_owner(ino) {
            // Not for a caller of other credentials than the owner's (a
            // setuid program acting on a descriptor its caller opened in
            // the transaction): the committed view, as after the end.
            Some(owner) => owner.filter(|t| req.pid() == 0 || self.txs.admits(*t, super::caller(req))),
            None => self.tx(req),
        }
    }

    /// The node id `tx` should know `o`, found or made in the directory
    /// whose node id is `parent`, by. A transaction knows every existing
    /// regular file it looks up by a private id, so the pages its mappings
    /// fault in (its view) stay in a page cache only it reaches; files it
    /// created are reachable by nobody else anyway. Directories are shared
    /// unless the transaction removes or moves them
    /// ([`TxFs::dir_change_may_proceed`]), and everything below a private
    /// directory is private.
    pub(super) fn node_id(&self, tx: Option<TxId>, o: ObjId, kind: FileKind, parent: INodeNo) -> INodeNo {
        // A view's node ids are all its transaction's: no private ones.
        let Some(s) = self.shared_mount() else { return shared_id(o) };
        if is_private(parent) {
            // A shared id below a private directory would make the kernel
            // move the shared dentry of a directory (it keeps one per
            // directory inode: d_splice_alias) under this transaction's
            // private tree, where others' working directories would follow
            // it. Whose: the caller's transaction, else the parent's.
            let mut p = s.private.lock();
            return match tx.or_else(|| p.owner.get(&parent).map(|(t, _)| *t)) {
                Some(t) => p.id_for(t, o),
                None => shared_id(o),
            };
        }
        let Some(t) = tx else { return shared_id(o) };
        if let Some(k) = s.private.lock().by_pair.get(&(t, o)) {
            return *k;
        }
        // Not other directories: a lookup answered with another node id
        // than the kernel's dentry has makes it d_invalidate that dentry,
        // which unhashes other processes' working directories (getcwd:
        // ENOENT) and detaches mounts below it.
        if kind != FileKind::File || self.engine.created_by(t, o) {
            return shared_id(o);
        }
        // Looked up again under the lock that inserts: another thread of
        // `t` may have made the id since the look above.
        s.private.lock().id_for(t, o)
    }

    /// Whether `tx`'s removal of, or move from or onto, the names `names`
    /// (parent node, name; the first names the request) may be applied now:
    /// the paths to look up again once it is answered (see [`TxFs::heal`]),
    /// or `None`: answer ESTALE.
    ///
    /// The kernel applies a successful rmdir or rename to the inode and
    /// dentry the caller's walk found, for everyone: a removed directory's
    /// inode is marked dead (listings of it fail, lookups in it answer
    /// ENOENT, through every descriptor and working directory), a moved
    /// one's dentry moves (others' `getcwd` shows the new name). A
    /// transaction must therefore remove and move only private inodes. A
    /// directory it did not create, met through a shared parent, has a
    /// shared dentry: the first such request makes the directory's private
    /// id and answers ESTALE, and the kernel repeats the walk once with
    /// LOOKUP_REVAL, which asks the daemon again, meets the private id,
    /// drops the shared dentry from the hash (not from those who hold it)
    /// and sends the request again, which passes. A pass lives 2 s: a retry
    /// cut short by a signal must not let a later request through on a
    /// shared dentry.
    pub(super) fn dir_change_may_proceed(&self, tx: Option<TxId>, names: &[(INodeNo, &OsStr)]) -> Option<Vec<PathBuf>> {
        let (Some(t), Some(s)) = (tx, self.shared_mount()) else { return Some(Vec::new()) };
        let mut victims = Vec::new();
        for (parent, name) in names {
            if is_private(*parent) {
                continue; // its children's dentries are private too
            }
            let Ok(a) = self.engine.lookup(Some(t), self.obj(*parent), name) else { continue };
            if a.kind == FileKind::Dir && !self.engine.created_by(t, a.obj) {
                victims.push((*parent, *name, a.obj));
            }
        }
        let Some((parent, name)) = names.first().filter(|_| !victims.is_empty()) else { return Some(Vec::new()) };
        let key = (t, self.obj(*parent), name.to_os_string());
        let now = Instant::now();
        let mut passes = s.passes.lock();
        if passes.remove(&key).is_some_and(|at| now.duration_since(at) < PASS_LIFE) {
            drop(passes);
            let moved = victims.iter().map(|(p, n, o)| Moved { obj: *o, slot: (*p, n.to_os_string()) });
            s.private.lock().moved.entry(t).or_default().extend(moved);
            let paths =
                victims.iter().filter_map(|(p, n, _)| Some(self.engine.committed_dir_path(self.obj(*p))?.join(n)));
            return Some(paths.collect());
        }
        passes.retain(|_, at| now.duration_since(*at) < PASS_LIFE);
        passes.insert(key, now);
        drop(passes);
        let mut p = s.private.lock();
        for (_, _, o) in &victims {
            p.id_for(t, *o);
        }
        tracing::debug!(%t, ?name, "directory change through a shared dentry: made private, ESTALE for the retry");
        None
    }

    /// Looks `paths` up again as nobody's transaction once the change that
    /// displaced their shared dentries is answered ([`healer`]). A
    /// directory the change replaced, or moved in an exchange, is looked up
    /// too: the transaction's moved dentry is there now, and others'
    /// working directories come first (the transaction's next walk there
    /// takes the name back).
    pub(super) fn heal(&self, paths: Vec<PathBuf>) {
        if let (false, Some(s)) = (paths.is_empty(), self.shared_mount()) {
            let _ = s.healer.lock().try_send(paths);
        }
    }

    /// The node id `tx` knows `a`'s object by, and the attributes for an
    /// entry reply naming it (the kernel counts a lookup of that node id).
    /// The attributes carry the object's own inode number whatever the node
    /// id: the kernel takes `st_ino` from them, so a file has one inode
    /// number inside a transaction and out (SQLite refuses to write a
    /// database whose `st_ino` changed under an open connection).
    pub(super) fn entry_attr(&self, tx: Option<TxId>, a: &Attr, parent: INodeNo) -> (INodeNo, FileAttr) {
        let node = self.node_id(tx, a.obj, a.kind, parent);
        if let Some(s) = self.shared_mount().filter(|_| is_private(node)) {
            *s.private.lock().nlookup.entry(node).or_default() += 1;
        }
        (node, fattr(a))
    }

    /// Every node id of these objects: the shared one and private ones.
    pub(super) fn all_ids(&self, objs: Vec<ObjId>) -> Vec<INodeNo> {
        match self.shared_mount() {
            Some(s) => all_ids(&s.private, objs),
            None => objs.into_iter().map(shared_id).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two lookups of one file by one transaction — as two threads racing
    /// through `node_id` both reach `id_for` — make one id, known once in
    /// every index; another transaction gets its own, and removing an id
    /// drops it everywhere.
    #[test]
    fn one_private_id_per_transaction_and_file() {
        let mut p = Private::default();
        let (t, u, o) = (TxId(1), TxId(2), ObjId(10));
        let k = p.id_for(t, o);
        assert!(is_private(k));
        assert_eq!(p.id_for(t, o), k);
        assert_eq!(p.of_obj[&o], vec![k]);
        assert_eq!(p.of_tx[&t], vec![k]);
        assert_eq!(p.owner.len(), 1);
        let k2 = p.id_for(u, o);
        assert_ne!(k2, k);
        assert_eq!(p.of_obj[&o], vec![k, k2]);
        p.remove(k);
        assert!(!p.by_pair.contains_key(&(t, o)) && !p.owner.contains_key(&k));
        assert_eq!(p.of_obj[&o], vec![k2]);
        assert_ne!(p.id_for(t, o), k, "a removed id is never handed out again");
    }
}
