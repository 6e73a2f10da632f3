//! Crash-safety tests of the engine over the power-cut model
//! ([`CrashFs`]): SPEC §4 (atomicity, durability, prefix property,
//! idempotent recovery, torn tail versus damage) and §1 (the backing tree
//! holds exactly the committed state as plain files).
//!
//! A seeded workload runs transactions of several operations (create,
//! write/overwrite/append at random offsets including multi-page writes,
//! truncate, mkdir, rename of files and directories with content, unlink,
//! rmdir, link, symlink, chmod, files that live and die inside one
//! transaction), commits them durable or ordered, aborts some, sometimes
//! runs a second transaction alongside, mixes in non-transactional
//! operations, open/release of objects (orphans), `sync()` and
//! `checkpoint()`. After every successful commit the committed state
//! (`dump_engine(.., None)`) is recorded as the next snapshot of the commit
//! order, together with the index of the last snapshot acknowledged durable.
//!
//! Every crash state is then checked the same way ([`check_image`]):
//! recovery succeeds; the recovered tree equals SOME snapshot `j` with
//! `j >= last durable`; after `close()` the backing tree equals it byte for
//! byte (modes included) and `.txfs/` holds no leftovers.
//!
//! Tests: power cuts at random moments (1), recovery killed after every
//! storage op and power-cut (2), the process killed after every storage op
//! of a workload (commit, group sync, checkpoint plan, each plan phase,
//! journal rotation, close) and power-cut (3), journal and plan damage
//! versus torn tails (4), a pre-populated backing as the initial state (5),
//! and focused regressions of bugs the sweeps found.
//!
//! Every sweep runs twice: with the ext4-like ordered model, and (tests
//! named `*_conservative`, fewer seeds by default) with the conservative
//! one ([`Persistence::Conservative`]: namespace changes lost independently
//! unless their directories were fsynced, writes torn at 4 KiB), which the
//! protocol must survive too (issue 28).
//!
//! Reproducing a failure: every panic message names the test, the seed, the
//! step and the crash plan; `TXFS_CRASH_SEED=<seed>` runs only that seed,
//! `TXFS_CRASH_SEEDS=<n>` runs `n` seeds per test (default: a fixed set),
//! `TXFS_CRASH_STEPS=<n>` changes the workload length, and
//! `TXFS_CRASH_VERBOSE=1` prints per-seed counts (run with `--nocapture`).

mod common;

use common::{dump_engine, dump_storage, leftovers, Node, Tree};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cell::Cell;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use txfs_engine::journal::{FILE_HEADER_LEN, REC_HEADER_LEN};
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Persistence, Storage};
use txfs_engine::{Durability, Engine, Error, FileKind, ObjId, Options, RenameFlags, SetAttr, TxId, META_DIR};

// ----- configuration ---------------------------------------------------------

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The seeds a test runs: `TXFS_CRASH_SEED` alone, else `TXFS_CRASH_SEEDS`
/// (or `default_n`) seeds starting at `base`.
fn seeds(base: u64, default_n: u64) -> Vec<u64> {
    if let Some(s) = env_u64("TXFS_CRASH_SEED") {
        return vec![s];
    }
    let n = env_u64("TXFS_CRASH_SEEDS").unwrap_or(default_n);
    (0..n).map(|i| base + i).collect()
}

/// Workload length: `default` steps, or `TXFS_CRASH_STEPS` if set.
fn steps(default: usize) -> usize {
    env_u64("TXFS_CRASH_STEPS").map_or(default, |n| n as usize)
}

thread_local! {
    /// The persistence model of the test running on this thread.
    static MODEL: Cell<Persistence> = const { Cell::new(Persistence::Ordered) };
}

/// A power-cuttable storage starting from `m`, crashing with the model of
/// the running test.
fn crash_fs(m: MemFs) -> CrashFs {
    CrashFs::with_persistence(m, MODEL.with(Cell::get))
}

/// Runs `f` with the conservative persistence model ([`Persistence`]):
/// namespace changes lost independently unless their directories were
/// fsynced, attribute changes unless their inode was, writes torn at 4 KiB.
fn conservative<R>(f: impl FnOnce() -> R) -> R {
    MODEL.with(|m| m.set(Persistence::Conservative));
    f()
}

/// " (conservative model)" when the running test uses it.
fn model_tag() -> &'static str {
    match MODEL.with(Cell::get) {
        Persistence::Ordered => "",
        Persistence::Conservative => " (conservative model)",
    }
}

fn verbose() -> bool {
    std::env::var_os("TXFS_CRASH_VERBOSE").is_some()
}

/// Options for recovery checks: no background thread, so nothing happens
/// behind the test's back.
fn opts() -> Options {
    Options { flush_interval: None, ..Default::default() }
}

/// Options of a workload engine: some seeds spill early, some stage new
/// files' content in data files early, some checkpoint automatically after
/// small journals.
fn work_opts(seed: u64, auto_checkpoint: bool) -> Options {
    let mut o = opts();
    match seed % 3 {
        1 => o.spill_threshold = 8 << 10,
        2 => o.stage_threshold = 2 << 10,
        _ => {}
    }
    o.checkpoint_bytes = if auto_checkpoint && seed % 2 == 0 { 48 << 10 } else { u64::MAX };
    o
}

// ----- the model ---------------------------------------------------------------

/// Committed states in commit order, and what a crash may legally leave.
#[derive(Clone, Default)]
struct Model {
    /// `snaps[0]`: the state at open; `snaps[k]`: after the k-th commit.
    snaps: Vec<Tree>,
    /// Index of the last snapshot acknowledged durable.
    durable: usize,
    /// The state if a commit whose call failed (process death) went through.
    maybe: Option<Tree>,
}

impl Model {
    fn new(initial: Tree) -> Model {
        Model { snaps: vec![initial], durable: 0, maybe: None }
    }

    fn last(&self) -> &Tree {
        self.snaps.last().expect("at least the initial snapshot")
    }

    /// Which allowed state `t` is (newest first): `Some(snaps.len())` for
    /// the `maybe` state.
    fn find(&self, t: &Tree, min: usize) -> Option<usize> {
        if self.maybe.as_ref() == Some(t) {
            return Some(self.snaps.len());
        }
        (min..self.snaps.len()).rev().find(|&j| &self.snaps[j] == t)
    }
}

fn node_summary(n: &Node) -> String {
    match n {
        Node::File { data, mode } => {
            let crc = data.iter().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(*b as u32));
            format!("file mode {mode:o} len {} hash {crc:08x}", data.len())
        }
        Node::Dir { mode } => format!("dir mode {mode:o}"),
        Node::Symlink { target } => format!("symlink -> {target:?}"),
        Node::Special { kind, mode, rdev } => format!("{kind:?} mode {mode:o} rdev {rdev:#x}"),
    }
}

/// A compact difference between two trees, for failure messages.
fn diff(want: &Tree, got: &Tree) -> String {
    let mut s = String::new();
    for (p, n) in want {
        match got.get(p) {
            None => writeln!(s, "    missing  {}: {}", p.display(), node_summary(n)).unwrap(),
            Some(g) if g != n => {
                let mut extra = String::new();
                if let (Node::File { data: a, .. }, Node::File { data: b, .. }) = (n, g) {
                    if let Some(i) = a.iter().zip(b.iter()).position(|(x, y)| x != y) {
                        extra = format!(" (first differing byte at {i})");
                    }
                }
                writeln!(s, "    differs  {}: want {}, got {}{extra}", p.display(), node_summary(n), node_summary(g))
                    .unwrap()
            }
            _ => {}
        }
    }
    for (p, n) in got {
        if !want.contains_key(p) {
            writeln!(s, "    extra    {}: {}", p.display(), node_summary(n)).unwrap();
        }
    }
    s
}

fn describe_mismatch(model: &Model, min: usize, got: &Tree) -> String {
    let mut s = format!(
        "recovered state matches no allowed snapshot (have {} snapshots, last durable {}, min allowed {min}{})\n",
        model.snaps.len(),
        model.durable,
        if model.maybe.is_some() { ", plus a maybe-committed state" } else { "" }
    );
    // The closest snapshot by number of differing paths.
    let mut best = (usize::MAX, 0);
    for (j, t) in model.snaps.iter().enumerate() {
        let d = diff(t, got).lines().count();
        if d < best.0 {
            best = (d, j);
        }
    }
    let _ = writeln!(
        s,
        "  closest snapshot {} ({} differences{}):",
        best.1,
        best.0,
        if best.1 < min { ", but too old" } else { "" }
    );
    s.push_str(&diff(&model.snaps[best.1], got));
    let _ = writeln!(s, "  against the last snapshot {}:", model.snaps.len() - 1);
    s.push_str(&diff(model.last(), got));
    s
}

// ----- checks of one crash image -------------------------------------------------

/// Files in `.txfs/` that must not survive a clean close besides what
/// [`leftovers`] covers: plan files and temporaries, extra journals.
fn stray_meta(s: &dyn Storage) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(list) = s.read_dir(Path::new(META_DIR)) {
        for (n, _) in list {
            // The high-water mark stays; lost+found holds what a recovery
            // could not account for (a torn tail's data files), kept for the user.
            if !["journal", "stage", "orphans", "data", "mark", "lost+found"].iter().any(|k| n == OsStr::new(k)) {
                v.push(Path::new(META_DIR).join(n));
            }
        }
    }
    let jdir = Path::new(META_DIR).join("journal");
    if let Ok(list) = s.read_dir(&jdir) {
        if list.len() != 1 {
            v.extend(list.into_iter().map(|(n, _)| jdir.join(n)));
        }
    }
    v
}

/// After a clean close: the backing holds exactly `want`, nothing is left over.
fn assert_clean_backing(s: &dyn Storage, want: &Tree, ctx: &str) {
    let backing = dump_storage(s);
    if &backing != want {
        panic!(
            "{ctx}: after close the backing tree differs from the recovered committed state:\n{}",
            diff(want, &backing)
        );
    }
    let left = leftovers(s);
    assert!(left.is_empty(), "{ctx}: leftovers in {META_DIR} after close: {left:?}");
    let stray = stray_meta(s);
    assert!(stray.is_empty(), "{ctx}: stray files in {META_DIR} after close: {stray:?}");
}

fn open_or_panic(fs: Arc<dyn Storage>, ctx: &str) -> Engine {
    match Engine::open(fs, opts()) {
        Ok(e) => e,
        Err(e) => panic!("{ctx}: recovery failed: {e}"),
    }
}

/// Recovers `img` and checks that it holds exactly `want`, also after close.
fn verify_exact(img: MemFs, want: &Tree, ctx: &str) {
    let fs = Arc::new(img);
    let engine = open_or_panic(fs.clone(), ctx);
    let got = dump_engine(&engine, None);
    if &got != want {
        panic!("{ctx}: recovered state differs from the expected one:\n{}", diff(want, &got));
    }
    engine.close().unwrap_or_else(|e| panic!("{ctx}: close after recovery failed: {e}"));
    assert_clean_backing(&*fs, want, ctx);
}

/// The central check of a crash image: recovery succeeds, the recovered
/// state is an allowed snapshot (`>= min`), close leaves exactly it in the
/// backing. With `deep`, additionally: a power cut right after recovery
/// loses nothing, and a commit made after recovery (appended after a
/// possibly cut journal tail) survives a further power cut.
fn check_image(img: MemFs, model: &Model, min: usize, ctx: &str, deep: Option<u64>) -> usize {
    let cfs = Arc::new(crash_fs(img));
    let engine = open_or_panic(cfs.clone(), ctx);
    let got = dump_engine(&engine, None);
    let Some(j) = model.find(&got, min) else {
        panic!("{ctx}: {}", describe_mismatch(model, min, &got));
    };
    let mut want = got.clone();
    if let Some(s) = deep {
        let mut r = SmallRng::seed_from_u64(s);
        let p1: u64 = r.gen();
        verify_exact(
            cfs.crash(&mut CrashPlan::random(p1)),
            &got,
            &format!("{ctx}; power cut right after recovery with CrashPlan::random({p1})"),
        );
        let data: Vec<u8> = (0..r.gen_range(1..6000)).map(|i| (i % 251) as u8).collect();
        let tx = engine.begin();
        let post = (|| -> txfs_engine::Result<()> {
            let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("zz-post"), 0o640, 0, 0)?;
            engine.write(Some(tx), f.obj, 0, &data)?;
            engine.commit(tx, Durability::Durable)
        })();
        post.unwrap_or_else(|e| panic!("{ctx}: a durable commit after recovery failed: {e}"));
        want.insert(PathBuf::from("zz-post"), Node::File { data, mode: 0o640 });
        let now = dump_engine(&engine, None);
        if now != want {
            panic!("{ctx}: commit after recovery is not visible as expected:\n{}", diff(&want, &now));
        }
        let p2: u64 = r.gen();
        verify_exact(
            cfs.crash(&mut CrashPlan::random(p2)),
            &want,
            &format!("{ctx}; power cut after a durable commit following recovery, CrashPlan::random({p2})"),
        );
    }
    engine.close().unwrap_or_else(|e| panic!("{ctx}: close after recovery failed: {e}"));
    assert_clean_backing(&*cfs, &want, ctx);
    j
}

// ----- the workload ------------------------------------------------------------------

/// Names the workload creates: few, so that operations collide.
const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f1", "top", "hl", "x"];
const MODES: &[u32] = &[0o644, 0o600, 0o640, 0o755, 0o700, 0o751, 0o444];
/// Backing entries whose names start with this are never touched.
const KEEP: &str = "keep";
const BENIGN: &[i32] = &[
    libc::EEXIST,
    libc::ENOTEMPTY,
    libc::EINVAL,
    libc::ENOENT,
    libc::ENOTDIR,
    libc::EISDIR,
    libc::EPERM,
    libc::ENAMETOOLONG,
];

/// Why a workload step stopped early.
#[derive(Debug)]
enum Stop {
    /// The transaction lost a conflict (it is doomed; abort it).
    Conflict,
    /// The (simulated) process died: the failpoint was reached.
    Dead,
}

#[derive(Clone, Debug)]
struct Entry {
    path: PathBuf,
    parent: ObjId,
    name: OsString,
    obj: ObjId,
    kind: FileKind,
    depth: usize,
}

struct Power {
    /// Probability of a power-cut check after each engine call.
    rate: f64,
    rng: SmallRng,
    /// Crash states checked so far.
    checks: u64,
    /// Of those, how many recovered to an older snapshot than the last.
    older: u64,
}

struct Workload<'a> {
    engine: &'a Engine,
    name: &'static str,
    seed: u64,
    rng: SmallRng,
    model: Model,
    fs: Option<&'a CrashFs>,
    /// Absolute op count of the failpoint: errors are expected once reached.
    fail_at: Option<u64>,
    power: Option<Power>,
    checkpoints: u64,
    step: usize,
    calls: u64,
    commits: u64,
    /// Objects held open (`open_obj`): unlinked ones must stay readable,
    /// become orphans at a checkpoint and leave no trace after a crash.
    open: Vec<ObjId>,
}

fn random_data(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn errno_of(e: &Error) -> Option<i32> {
    match e {
        Error::Os { .. } => Some(e.errno()),
        _ => None,
    }
}

impl<'a> Workload<'a> {
    fn new(engine: &'a Engine, name: &'static str, seed: u64, initial: Tree) -> Workload<'a> {
        let checkpoints = engine.stats().checkpoints;
        Workload {
            engine,
            name,
            seed,
            rng: SmallRng::seed_from_u64(seed),
            model: Model::new(initial),
            fs: None,
            fail_at: None,
            power: None,
            checkpoints,
            step: 0,
            calls: 0,
            commits: 0,
            open: Vec::new(),
        }
    }

    fn ctx(&self) -> String {
        format!("[{}{} seed={} step={} call={}]", self.name, model_tag(), self.seed, self.step, self.calls)
    }

    fn reached(&self) -> bool {
        match (self.fs, self.fail_at) {
            (Some(fs), Some(at)) => fs.op_count() >= at,
            _ => false,
        }
    }

    /// Records the committed state as the next snapshot.
    fn record(&mut self, durable: bool) {
        self.model.snaps.push(dump_engine(self.engine, None));
        self.commits += 1;
        let c = self.engine.stats().checkpoints;
        if durable || c != self.checkpoints {
            self.checkpoints = c;
            self.model.durable = self.model.snaps.len() - 1;
        }
    }

    fn mark_durable(&mut self) {
        self.checkpoints = self.engine.stats().checkpoints;
        self.model.durable = self.model.snaps.len() - 1;
    }

    /// The committed state, if the engine still answers.
    fn try_dump(&self) -> Option<Tree> {
        match self.engine.readdir(None, ObjId::ROOT) {
            Ok(_) => Some(dump_engine(self.engine, None)),
            Err(_) => None,
        }
    }

    /// An engine call failed for a reason other than a benign POSIX error
    /// or a conflict: fine only if the process is "dead".
    fn failed(&mut self, what: &str, e: Error, may_have_committed: bool) -> Stop {
        let expected = matches!(e, Error::Os { .. } | Error::Poisoned(_));
        if self.reached() && expected {
            if may_have_committed {
                self.model.maybe = self.try_dump().filter(|t| t != self.model.last());
            }
            return Stop::Dead;
        }
        panic!("{}: {what} failed unexpectedly: {e} ({e:?})", self.ctx());
    }

    /// After an engine call: a power-cut check, or death at the failpoint.
    fn after_call(&mut self) -> Result<(), Stop> {
        if self.reached() {
            return Err(Stop::Dead);
        }
        let Some(p) = &mut self.power else { return Ok(()) };
        if !p.rng.gen_bool(p.rate) {
            return Ok(());
        }
        p.checks += 1;
        let roll = p.rng.gen_range(0..100);
        let deep = p.rng.gen_bool(0.1).then(|| p.rng.gen::<u64>());
        let plan_seed: u64 = p.rng.gen();
        let fs = self.fs.expect("power cuts need a CrashFs");
        let (mut plan, label, min) = match roll {
            0..=4 => (CrashPlan::keep_all(), "keep_all".to_string(), self.model.snaps.len() - 1),
            5..=14 => (CrashPlan::drop_all(), "drop_all".to_string(), self.model.durable),
            _ => (CrashPlan::random(plan_seed), format!("random({plan_seed})"), self.model.durable),
        };
        let ctx = format!("{} power cut with CrashPlan::{label} ({} pending ops)", self.ctx(), fs.pending_ops());
        let j = check_image(fs.crash(&mut plan), &self.model, min, &ctx, deep);
        if j + 1 < self.model.snaps.len() && &self.model.snaps[j] != self.model.last() {
            self.power.as_mut().expect("set").older += 1;
        }
        Ok(())
    }

    /// Runs one engine call. `Ok(None)`: a benign POSIX error. Outside a
    /// transaction a successful call is a commit and is recorded.
    fn call<T>(
        &mut self,
        tx: Option<TxId>,
        what: &str,
        f: impl FnOnce(&Engine) -> txfs_engine::Result<T>,
    ) -> Result<Option<T>, Stop> {
        self.calls += 1;
        let out = match f(self.engine) {
            Ok(v) => {
                if tx.is_none() {
                    self.record(false);
                }
                Some(v)
            }
            Err(e) if errno_of(&e).is_some_and(|n| BENIGN.contains(&n)) => None,
            Err(e) if e.is_conflict() => {
                if tx.is_none() {
                    panic!(
                        "{}: non-transactional {what} failed with a conflict (SPEC §3: it never does): {e}",
                        self.ctx()
                    );
                }
                return Err(Stop::Conflict);
            }
            Err(e) => return Err(self.failed(what, e, tx.is_none())),
        };
        self.after_call()?;
        Ok(out)
    }

    /// The namespace as `tx` sees it (untouchable `keep*` entries left out).
    fn list(&mut self, tx: Option<TxId>) -> Result<(Vec<Entry>, Vec<Entry>), Stop> {
        let root = Entry {
            path: PathBuf::new(),
            parent: ObjId::ROOT,
            name: OsString::new(),
            obj: ObjId::ROOT,
            kind: FileKind::Dir,
            depth: 0,
        };
        let mut all = Vec::new();
        let mut dirs = vec![root];
        let mut i = 0;
        while i < dirs.len() {
            let d = dirs[i].clone();
            i += 1;
            let list = match self.engine.readdir(tx, d.obj) {
                Ok(l) => l,
                Err(e) if e.is_conflict() && tx.is_some() => return Err(Stop::Conflict),
                Err(e) => return Err(self.failed("readdir", e, false)),
            };
            for e in list {
                if e.name.to_string_lossy().starts_with(KEEP) {
                    continue;
                }
                let en = Entry {
                    path: d.path.join(&e.name),
                    parent: d.obj,
                    name: e.name,
                    obj: e.obj,
                    kind: e.kind,
                    depth: d.depth + 1,
                };
                if e.kind == FileKind::Dir {
                    dirs.push(en.clone());
                }
                all.push(en);
            }
        }
        Ok((all, dirs))
    }

    fn pick<'e>(&mut self, v: &'e [Entry]) -> Option<&'e Entry> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.rng.gen_range(0..v.len())])
        }
    }

    fn name(&mut self) -> OsString {
        OsString::from(NAMES[self.rng.gen_range(0..NAMES.len())])
    }

    fn mode(&mut self) -> u32 {
        MODES[self.rng.gen_range(0..MODES.len())]
    }

    fn data_len(&mut self) -> usize {
        match self.rng.gen_range(0..10) {
            0..=3 => self.rng.gen_range(1..200),
            4..=7 => self.rng.gen_range(200..5000),
            _ => self.rng.gen_range(5000..20000),
        }
    }

    fn size_of(&mut self, tx: Option<TxId>, o: ObjId) -> Result<Option<u64>, Stop> {
        match self.engine.getattr(tx, o) {
            Ok(a) => Ok(Some(a.size)),
            Err(e) if e.is_conflict() && tx.is_some() => Err(Stop::Conflict),
            Err(e) if errno_of(&e).is_some_and(|n| BENIGN.contains(&n)) => Ok(None),
            Err(e) => Err(self.failed("getattr", e, false)),
        }
    }

    /// One random operation (one or a few engine calls) in `tx`.
    fn op(&mut self, tx: Option<TxId>) -> Result<(), Stop> {
        let (all, dirs) = self.list(tx)?;
        let files: Vec<Entry> = all.iter().filter(|e| e.kind == FileKind::File).cloned().collect();
        let mut kind = self.rng.gen_range(0..100);
        if files.is_empty() && ((14..42).contains(&kind) || kind >= 92) {
            kind = 0;
        }
        match kind {
            // create, maybe with content
            0..=13 => {
                let d = self.pick(&dirs).expect("root").obj;
                let (name, mode) = (self.name(), self.mode());
                let a = self.call(tx, "create", |e| e.create(tx, d, &name, mode, 0, 0))?;
                if let (Some(a), true) = (a, self.rng.gen_bool(0.7)) {
                    let len = self.data_len();
                    let data = random_data(&mut self.rng, len);
                    self.call(tx, "write", |e| e.write(tx, a.obj, 0, &data))?;
                }
            }
            // write at a random offset
            14..=29 => {
                let f = self.pick(&files).expect("checked").obj;
                let Some(size) = self.size_of(tx, f)? else { return Ok(()) };
                let off = match self.rng.gen_range(0..10) {
                    0 => 0,
                    1..=5 => self.rng.gen_range(0..=size),
                    6..=7 => self.rng.gen_range(0..=size / 4096 + 1) * 4096,
                    _ => size + self.rng.gen_range(0..9000),
                };
                let len = self.data_len();
                let data = random_data(&mut self.rng, len);
                self.call(tx, "write", |e| e.write(tx, f, off, &data))?;
            }
            // append
            30..=35 => {
                let f = self.pick(&files).expect("checked").obj;
                let len = self.data_len();
                let data = random_data(&mut self.rng, len);
                self.call(tx, "append", |e| e.append(tx, f, &data))?;
            }
            // truncate (shrink or extend)
            36..=41 => {
                let f = self.pick(&files).expect("checked").obj;
                let Some(size) = self.size_of(tx, f)? else { return Ok(()) };
                let to = if self.rng.gen_bool(0.7) {
                    self.rng.gen_range(0..=size)
                } else {
                    size + self.rng.gen_range(1..6000)
                };
                if self.rng.gen_bool(0.5) {
                    self.call(tx, "truncate", |e| e.truncate(tx, f, to))?;
                } else {
                    let set = SetAttr { size: Some(to), ..Default::default() };
                    self.call(tx, "setattr(size)", |e| e.setattr(tx, f, &set))?;
                }
            }
            // mkdir
            42..=49 => {
                let shallow: Vec<Entry> = dirs.iter().filter(|d| d.depth < 3).cloned().collect();
                let d = self.pick(&shallow).expect("root").obj;
                let (name, mode) = (self.name(), self.mode() | 0o700);
                self.call(tx, "mkdir", |e| e.mkdir(tx, d, &name, mode, 0, 0))?;
            }
            // rename a file, symlink or directory (possibly with content)
            50..=59 => {
                let src = if self.rng.gen_bool(0.35) { self.pick(&dirs[1..]) } else { self.pick(&all) };
                let Some(src) = src.cloned() else { return Ok(()) };
                let to_dir = if self.rng.gen_bool(0.3) { src.parent } else { self.pick(&dirs).expect("root").obj };
                let to = self.name();
                let flags = match self.rng.gen_range(0..20) {
                    0..=1 => RenameFlags { noreplace: true, exchange: false },
                    2 => RenameFlags { noreplace: false, exchange: true },
                    _ => RenameFlags::default(),
                };
                self.call(tx, "rename", |e| e.rename(tx, src.parent, &src.name, to_dir, &to, flags))?;
            }
            // unlink a file or symlink
            60..=65 => {
                let cand: Vec<Entry> = all.iter().filter(|e| e.kind != FileKind::Dir).cloned().collect();
                let Some(v) = self.pick(&cand).cloned() else { return Ok(()) };
                self.call(tx, "unlink", |e| e.unlink(tx, v.parent, &v.name))?;
            }
            // rmdir (mostly of empty directories)
            66..=69 => {
                let empty: Vec<Entry> =
                    dirs[1..].iter().filter(|d| !all.iter().any(|e| e.parent == d.obj)).cloned().collect();
                let pool = if empty.is_empty() || self.rng.gen_bool(0.2) { dirs[1..].to_vec() } else { empty };
                let Some(v) = self.pick(&pool).cloned() else { return Ok(()) };
                self.call(tx, "rmdir", |e| e.rmdir(tx, v.parent, &v.name))?;
            }
            // hard link
            70..=74 => {
                let Some(f) = self.pick(&files).cloned() else { return Ok(()) };
                let d = self.pick(&dirs).expect("root").obj;
                let name = self.name();
                self.call(tx, "link", |e| e.link(tx, f.obj, d, &name))?;
            }
            // symlink
            75..=79 => {
                let d = self.pick(&dirs).expect("root").obj;
                let name = self.name();
                let target =
                    OsString::from(format!("../{}/t{}", self.name().to_string_lossy(), self.rng.gen_range(0..100)));
                self.call(tx, "symlink", |e| e.symlink(tx, d, &name, &target, 0, 0))?;
            }
            // chmod
            80..=85 => {
                let Some(v) = self.pick(&all).cloned() else { return Ok(()) };
                let mut mode = self.mode();
                if v.kind == FileKind::Dir {
                    mode |= 0o700;
                }
                let set = SetAttr { mode: Some(mode), ..Default::default() };
                self.call(tx, "chmod", |e| e.setattr(tx, v.obj, &set))?;
            }
            // a file that lives and dies within the transaction
            86..=91 => {
                let d = self.pick(&dirs).expect("root").obj;
                let tmp = OsString::from(format!("tmp{}", self.rng.gen_range(0..4)));
                let Some(a) = self.call(tx, "create(tmp)", |e| e.create(tx, d, &tmp, 0o600, 0, 0))? else {
                    return Ok(());
                };
                let len = self.data_len();
                let data = random_data(&mut self.rng, len);
                self.call(tx, "write(tmp)", |e| e.write(tx, a.obj, 0, &data))?;
                let mut name = tmp.clone();
                if self.rng.gen_bool(0.5) {
                    let n2 = OsString::from(format!("{}-moved", tmp.to_string_lossy()));
                    if self
                        .call(tx, "rename(tmp)", |e| e.rename(tx, d, &tmp, d, &n2, RenameFlags::default()))?
                        .is_some()
                    {
                        name = n2;
                    }
                }
                self.call(tx, "unlink(tmp)", |e| e.unlink(tx, d, &name))?;
            }
            // overwrite a whole file
            _ => {
                let f = self.pick(&files).expect("checked").obj;
                self.call(tx, "truncate(0)", |e| e.truncate(tx, f, 0))?;
                let len = self.data_len();
                let data = random_data(&mut self.rng, len);
                self.call(tx, "write", |e| e.write(tx, f, 0, &data))?;
            }
        }
        Ok(())
    }

    /// One op in a live transaction; `Ok(false)` if it lost a conflict
    /// (then it is aborted and gone).
    fn tx_op(&mut self, tx: TxId) -> Result<bool, Stop> {
        match self.op(Some(tx)) {
            Ok(()) => Ok(true),
            Err(Stop::Conflict) => {
                self.engine.abort(tx).unwrap_or_else(|e| panic!("{}: abort of a doomed tx: {e}", self.ctx()));
                self.after_call()?;
                Ok(false)
            }
            Err(Stop::Dead) => Err(Stop::Dead),
        }
    }

    /// Commits (durable or ordered) or aborts a live transaction.
    fn end_tx(&mut self, tx: TxId) -> Result<(), Stop> {
        let roll = self.rng.gen_range(0..100);
        self.calls += 1;
        if roll < 15 {
            self.engine.abort(tx).unwrap_or_else(|e| panic!("{}: abort: {e}", self.ctx()));
            return self.after_call();
        }
        let durable = roll < 55;
        let d = if durable { Durability::Durable } else { Durability::Ordered };
        match self.engine.commit(tx, d) {
            Ok(()) => self.record(durable),
            Err(e) if e.is_conflict() => {
                assert!(!self.engine.is_live(tx), "{}: a conflicting commit left the tx live", self.ctx());
            }
            Err(e) => return Err(self.failed("commit", e, true)),
        }
        self.after_call()
    }

    /// A transaction of a few ops; sometimes a second one runs alongside
    /// (commit order then differs from begin order), sometimes plain
    /// operations run while it is live.
    fn transaction(&mut self) -> Result<(), Stop> {
        let mut tx = Some(self.engine.begin());
        let mut other = self.rng.gen_bool(0.12).then(|| self.engine.begin());
        let n = self.rng.gen_range(1..=6);
        for _ in 0..n {
            if self.rng.gen_bool(0.08) {
                // A non-transactional operation while transactions are live.
                match self.op(None) {
                    Ok(()) => {}
                    Err(Stop::Conflict) => unreachable!("non-transactional ops do not conflict"),
                    Err(Stop::Dead) => return Err(Stop::Dead),
                }
            }
            if let Some(o) = other {
                if self.rng.gen_bool(0.5) && !self.tx_op(o)? {
                    other = None;
                } else if self.rng.gen_bool(0.15) {
                    self.end_tx(o)?;
                    other = None;
                }
            }
            if let Some(t) = tx {
                if !self.tx_op(t)? {
                    tx = None;
                }
            }
        }
        if let Some(t) = tx {
            self.end_tx(t)?;
        }
        if let Some(o) = other {
            self.end_tx(o)?;
        }
        Ok(())
    }

    /// Releases every object the workload holds open (before a close).
    fn release_all(&mut self) {
        for o in std::mem::take(&mut self.open) {
            self.engine.release(o);
        }
    }

    /// Opens a file (like an open file descriptor) or releases one.
    fn open_or_release(&mut self) -> Result<(), Stop> {
        if !self.open.is_empty() && self.rng.gen_bool(0.5) {
            let o = self.open.swap_remove(self.rng.gen_range(0..self.open.len()));
            self.calls += 1;
            self.engine.release(o);
            return self.after_call();
        }
        let (all, _) = self.list(None)?;
        let files: Vec<Entry> = all.into_iter().filter(|e| e.kind == FileKind::File).collect();
        let Some(f) = self.pick(&files).cloned() else { return Ok(()) };
        self.calls += 1;
        match self.engine.open_obj(f.obj) {
            Ok(()) => self.open.push(f.obj),
            Err(e) => return Err(self.failed("open_obj", e, false)),
        }
        self.after_call()
    }

    fn step(&mut self) -> Result<(), Stop> {
        match self.rng.gen_range(0..100) {
            0..=4 => self.open_or_release(),
            5..=69 => self.transaction(),
            70..=84 => match self.op(None) {
                Err(Stop::Conflict) => unreachable!("non-transactional ops do not conflict"),
                r => r,
            },
            85..=91 => {
                self.calls += 1;
                match self.engine.sync() {
                    Ok(()) => self.mark_durable(),
                    Err(e) => return Err(self.failed("sync", e, false)),
                }
                self.after_call()
            }
            _ => {
                self.calls += 1;
                match self.engine.checkpoint() {
                    Ok(()) => self.mark_durable(),
                    Err(e) => return Err(self.failed("checkpoint", e, false)),
                }
                self.after_call()
            }
        }
    }

    /// Runs `steps` steps; `Err(Dead)` if the failpoint killed it.
    fn run(&mut self, steps: usize) -> Result<(), Stop> {
        for s in 0..steps {
            self.step = s;
            self.step()?;
        }
        Ok(())
    }
}

// ----- initial backing contents -------------------------------------------------------

/// Fills a backing store with plain files, directories, a symlink and a hard
/// link, as a user's directory before the first mount.
fn populate(s: &dyn Storage, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
    let p = Path::new;
    let file = |path: &str, mode: u32, len: usize, rng: &mut SmallRng| {
        s.create_file(p(path), mode).unwrap();
        if len > 0 {
            s.write_at(p(path), 0, &random_data(rng, len)).unwrap();
        }
        s.set_mode(p(path), mode).unwrap();
    };
    s.mkdir(p("a"), 0o755).unwrap();
    s.mkdir(p("a/b"), 0o700).unwrap();
    s.mkdir(p("c"), 0o751).unwrap();
    s.mkdir(p(KEEP), 0o755).unwrap();
    file("a/f1", 0o644, 5000, &mut rng);
    file("top", 0o600, 12000, &mut rng);
    file("a/b/d", 0o640, 300, &mut rng);
    file("e", 0o644, 0, &mut rng);
    file("keep/untouched", 0o444, 7000, &mut rng);
    file("keepfile", 0o644, 100, &mut rng);
    s.symlink(OsStr::new("a/f1"), p("x")).unwrap();
    s.link(p("top"), p("a/hl")).unwrap();
    s.sync_all().unwrap();
}

fn initial_fs(seed: u64, populated: bool) -> MemFs {
    let m = MemFs::new();
    if populated {
        populate(&m, seed);
    }
    m
}

// ----- 1. power cuts --------------------------------------------------------------------------

/// Returns (crash states checked, commits made).
fn power_cut_run(seed: u64, steps: usize, rate: f64) -> (u64, u64) {
    let populated = seed % 2 == 1;
    let cfs = crash_fs(initial_fs(seed, populated));
    let initial = dump_storage(&cfs);
    let fs: Arc<CrashFs> = Arc::new(cfs);
    let engine = Engine::open(fs.clone(), work_opts(seed, true)).expect("open");
    let at_open = dump_engine(&engine, None);
    assert_eq!(at_open, initial, "[power_cuts seed={seed}] the engine does not show the initial backing tree");
    let mut w = Workload::new(&engine, "power_cuts", seed, initial);
    w.fs = Some(&*fs);
    w.power = Some(Power {
        rate,
        rng: SmallRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xc0ffee),
        checks: 0,
        older: 0,
    });
    w.run(steps).unwrap_or_else(|s| panic!("{}: workload stopped: {s:?}", w.ctx()));
    // The end: a power cut after close loses nothing.
    let model = w.model.clone();
    let commits = w.commits;
    let mut checks = w.power.as_ref().map_or(0, |p| p.checks);
    let older = w.power.as_ref().map_or(0, |p| p.older);
    if verbose() {
        eprintln!("power cuts seed {seed}: {checks} crash states, {older} recovered to an older snapshot, {} of {} snapshots durable-acknowledged, {} paths at the end", model.durable, model.snaps.len() - 1, model.last().len());
    }
    let ctx = w.ctx();
    w.release_all();
    drop(w);
    engine.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
    assert_clean_backing(&*fs, model.last(), &format!("{ctx} close"));
    for p in [1u64, 2, 3] {
        let ps = seed ^ (p << 32);
        verify_exact(
            fs.crash(&mut CrashPlan::random(ps)),
            model.last(),
            &format!("{ctx} power cut after close, CrashPlan::random({ps})"),
        );
        checks += 1;
    }
    (checks, commits)
}

#[test]
fn power_cuts_leave_a_durable_prefix() {
    power_cuts(1, 60, "power cuts");
}

/// The same under [`Persistence::Conservative`] (fewer seeds by default:
/// `TXFS_CRASH_SEEDS` sets both).
#[test]
fn power_cuts_leave_a_durable_prefix_conservative() {
    conservative(|| power_cuts(1001, 16, "power cuts under the conservative model"));
}

fn power_cuts(base: u64, n: u64, label: &str) {
    let t0 = Instant::now();
    let (mut states, mut commits) = (0, 0);
    for seed in seeds(base, n) {
        let (c, n) = power_cut_run(seed, steps(150), 0.3);
        states += c;
        commits += n;
    }
    eprintln!("{label}: {states} crash states, {commits} commits, {:?}", t0.elapsed());
}

// ----- 2. crash during recovery ----------------------------------------------------------------

/// A crash image with a model of what it may recover to: a workload killed
/// at a random step (possibly inside a checkpoint), then a power cut.
fn dying_image(seed: u64) -> (MemFs, Model, String) {
    let mut r = SmallRng::seed_from_u64(seed ^ 0xdead);
    let populated = seed % 2 == 0;
    let initial_mem = initial_fs(seed, populated);
    let initial = dump_storage(&initial_mem);
    let fs = Arc::new(crash_fs(initial_mem));
    let engine = Engine::open(fs.clone(), work_opts(seed, false)).expect("open");
    // Let it run a while, then arm the failpoint somewhere ahead.
    let mut w = Workload::new(&engine, "recovery_crash", seed, initial);
    w.fs = Some(&*fs);
    let warm = r.gen_range(5..30);
    w.run(warm).unwrap_or_else(|s| panic!("{}: {s:?}", w.ctx()));
    let n = r.gen_range(0..600);
    w.fail_at = Some(fs.op_count() + n);
    fs.set_fail_after(Some(n));
    let _ = w.run(200);
    let plan_seed: u64 = r.gen();
    let ctx = format!("{} died after {n} more storage ops, then CrashPlan::random({plan_seed})", w.ctx());
    let model = w.model.clone();
    drop(w);
    let img = fs.crash(&mut CrashPlan::random(plan_seed));
    drop(engine);
    (img, model, ctx)
}

#[test]
fn crash_during_recovery_is_recovered_again() {
    crash_during_recovery(100, 60, "crash during recovery");
}

#[test]
fn crash_during_recovery_is_recovered_again_conservative() {
    conservative(|| crash_during_recovery(1100, 20, "crash during recovery under the conservative model"));
}

fn crash_during_recovery(base: u64, n: u64, label: &str) {
    let t0 = Instant::now();
    let mut states = 0u64;
    let mut attempts = 0u64;
    for seed in seeds(base, n) {
        let (img, model, ctx0) = dying_image(seed);
        // A pristine copy of the image to start every attempt from.
        let base = crash_fs(img);
        let mut r = SmallRng::seed_from_u64(seed ^ 0xabcd);
        let mut k = 0u64;
        loop {
            let fs = Arc::new(crash_fs(base.crash(&mut CrashPlan::keep_all())));
            fs.set_fail_after(Some(k));
            attempts += 1;
            let ctx = format!("{ctx0}; recovery killed after {k} storage ops");
            match Engine::open(fs.clone(), opts()) {
                Ok(engine) => {
                    // Recovery finished before the failpoint: check it as is.
                    fs.set_fail_after(None);
                    let got = dump_engine(&engine, None);
                    if model.find(&got, model.durable).is_none() {
                        panic!("{ctx}: {}", describe_mismatch(&model, model.durable, &got));
                    }
                    engine.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
                    assert_clean_backing(&*fs, &got, &ctx);
                    states += 1;
                    break;
                }
                Err(e) => {
                    assert!(
                        fs.op_count() >= k,
                        "{ctx}: recovery failed before reaching the failpoint ({} ops): {e}",
                        fs.op_count()
                    );
                    assert!(!matches!(e, Error::Corrupt { .. }), "{ctx}: an interrupted recovery reported damage: {e}");
                    for _ in 0..2 {
                        let ps: u64 = r.gen();
                        let c = format!("{ctx}, then CrashPlan::random({ps}) and a clean recovery");
                        check_image(fs.crash(&mut CrashPlan::random(ps)), &model, model.durable, &c, None);
                        states += 1;
                    }
                }
            }
            k += 1;
            assert!(k < 100_000, "{ctx0}: recovery never finishes");
        }
    }
    {
        eprintln!("{label}: {states} crash states, {attempts} killed recoveries, {:?}", t0.elapsed());
    }
}

// ----- 3. failpoints at every step ---------------------------------------------------------------

/// Runs the fixed workload with the process dying after `n` storage ops
/// (`None`: never). Returns the live fs, the model, whether it died.
fn run_with_failpoint(seed: u64, steps: usize, populated: bool, n: Option<u64>) -> (Arc<CrashFs>, Model, bool, String) {
    let initial_mem = initial_fs(seed, populated);
    let initial = dump_storage(&initial_mem);
    let fs = Arc::new(crash_fs(initial_mem));
    fs.set_fail_after(n);
    let name = "failpoints";
    let engine = match Engine::open(fs.clone(), work_opts(seed, false)) {
        Ok(e) => e,
        Err(e) => {
            assert!(n.is_some_and(|n| fs.op_count() >= n), "[{name} seed={seed} fail_after={n:?}] open failed: {e}");
            return (
                fs,
                Model::new(initial),
                true,
                format!("[{name} seed={seed} fail_after={n:?}] died in the first open"),
            );
        }
    };
    let mut w = Workload::new(&engine, name, seed, initial);
    w.fs = Some(&*fs);
    w.fail_at = n;
    let mut dead = w.reached() || w.run(steps).is_err();
    if !dead {
        w.release_all();
        dead = w.reached();
    }
    let mut ctx = format!("{} fail_after={n:?}", w.ctx());
    let model = w.model.clone();
    drop(w);
    if !dead {
        ctx.push_str(" in close");
        match engine.close() {
            Ok(()) => dead = n.is_some_and(|n| fs.op_count() >= n),
            Err(e) => {
                assert!(n.is_some_and(|n| fs.op_count() >= n), "{ctx}: close failed: {e}");
                dead = true;
            }
        }
    }
    (fs, model, dead, ctx)
}

#[test]
fn failpoint_at_every_storage_op() {
    failpoints(200, 6, "failpoints");
}

#[test]
fn failpoint_at_every_storage_op_conservative() {
    conservative(|| failpoints(1200, 2, "failpoints under the conservative model"));
}

fn failpoints(base: u64, n: u64, label: &str) {
    let t0 = Instant::now();
    let mut states = 0u64;
    let mut points = 0u64;
    for seed in seeds(base, n) {
        let populated = seed % 2 == 1;
        let steps = steps(30);
        let (clean, _, _, _) = run_with_failpoint(seed, steps, populated, None);
        let total = clean.op_count();
        let mut r = SmallRng::seed_from_u64(seed ^ 0xf00d);
        let mut n = 0u64;
        loop {
            let (fs, model, dead, ctx) = run_with_failpoint(seed, steps, populated, Some(n));
            points += 1;
            let mut plans =
                vec![("keep_all".to_string(), CrashPlan::keep_all()), ("drop_all".to_string(), CrashPlan::drop_all())];
            for _ in 0..2 {
                let s: u64 = r.gen();
                plans.push((format!("random({s})"), CrashPlan::random(s)));
            }
            for (label, mut plan) in plans {
                let c = format!("{ctx}, then a power cut with CrashPlan::{label}");
                let deep = r.gen_bool(0.05).then(|| r.gen::<u64>());
                check_image(fs.crash(&mut plan), &model, model.durable, &c, deep);
                states += 1;
            }
            if !dead {
                break;
            }
            n += 1;
            assert!(n <= total * 2 + 100, "{ctx}: the workload keeps dying long past its clean op count {total}");
        }
        if verbose() {
            eprintln!("failpoints seed {seed}: {n} failpoints over {total} ops");
        }
    }
    {
        eprintln!("{label}: {points} death points, {states} crash states, {:?}", t0.elapsed());
    }
}

// ----- 4. journal damage ------------------------------------------------------------------------

/// The journal file and its records' `(start, end)` offsets; after them
/// only the zeroed runway, or nothing.
fn journal_records(s: &dyn Storage) -> (PathBuf, Vec<(u64, u64)>) {
    let (path, v, at) = common::journal_records(s);
    let rest = &read_all(s, &path)[at as usize..];
    assert!(rest.iter().all(|b| *b == 0), "journal does not end on a record boundary or the runway");
    (path, v)
}

fn read_all(s: &dyn Storage, path: &Path) -> Vec<u8> {
    let len = s.lstat(path).unwrap().size as usize;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = s.read_at(path, got as u64, &mut buf[got..]).unwrap();
        assert!(n > 0);
        got += n;
    }
    buf
}

/// Five commits, the journal never checkpointed: durable, durable,
/// ordered, durable, ordered.
fn journal_fixture(populated: bool) -> (CrashFs, Model) {
    let initial_mem = initial_fs(7, populated);
    let initial = dump_storage(&initial_mem);
    let fs = Arc::new(crash_fs(initial_mem));
    let engine = Engine::open(fs.clone(), Options { checkpoint_bytes: u64::MAX, ..opts() }).expect("open");
    let mut model = Model::new(initial);
    let r = ObjId::ROOT;
    let n = OsStr::new;
    let commit = |model: &mut Model, d: Durability, f: &dyn Fn(TxId) -> txfs_engine::Result<()>| {
        let tx = engine.begin();
        f(tx).expect("op");
        engine.commit(tx, d).expect("commit");
        model.snaps.push(dump_engine(&engine, None));
        if d == Durability::Durable {
            model.durable = model.snaps.len() - 1;
        }
    };
    let pattern =
        |len: usize, k: u8| -> Vec<u8> { (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(k)).collect() };
    commit(&mut model, Durability::Durable, &|tx| {
        let f = engine.create(Some(tx), r, n("j1"), 0o644, 0, 0)?;
        engine.write(Some(tx), f.obj, 0, &pattern(9000, 1))?;
        engine.mkdir(Some(tx), r, n("jd"), 0o755, 0, 0).map(drop)
    });
    commit(&mut model, Durability::Durable, &|tx| {
        let f = engine.lookup(Some(tx), r, n("j1"))?;
        engine.write(Some(tx), f.obj, 4000, &pattern(5000, 2))?;
        let d = engine.lookup(Some(tx), r, n("jd"))?;
        engine.rename(Some(tx), r, n("j1"), d.obj, n("moved"), RenameFlags::default())
    });
    commit(&mut model, Durability::Ordered, &|tx| {
        let f = engine.create(Some(tx), r, n("j3"), 0o600, 0, 0)?;
        engine.write(Some(tx), f.obj, 0, &pattern(3000, 3))?;
        engine.symlink(Some(tx), r, n("jl"), n("jd/moved"), 0, 0).map(drop)
    });
    commit(&mut model, Durability::Durable, &|tx| {
        let f = engine.lookup(Some(tx), r, n("j3"))?;
        engine.truncate(Some(tx), f.obj, 100)?;
        let d = engine.lookup(Some(tx), r, n("jd"))?;
        engine.link(Some(tx), f.obj, d.obj, n("j3link")).map(drop)
    });
    commit(&mut model, Durability::Ordered, &|tx| {
        let f = engine.create(Some(tx), r, n("j5"), 0o640, 0, 0)?;
        engine.write(Some(tx), f.obj, 0, &pattern(6000, 5))?;
        engine.unlink(Some(tx), r, n("jl"))
    });
    // No close: the journal keeps all five records.
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
    (fs, model)
}

#[test]
fn journal_damage_is_reported_and_torn_tail_is_cut() {
    let mut checked = 0u64;
    for populated in [false, true] {
        let (base, model) = journal_fixture(populated);
        let ctx0 = format!("[journal_damage populated={populated}]");
        let img = base.crash(&mut CrashPlan::keep_all());
        let (jpath, recs) = journal_records(&img);
        assert_eq!(recs.len(), 5, "{ctx0}: five commit records expected");
        let full = model.last().clone();
        drop(img);

        // Flip one byte of an early record (followed by later durable
        // records): damage, never silently skipped.
        for (i, &(start, end)) in recs[..4].iter().enumerate() {
            let len = end - start;
            let mut offsets: Vec<u64> = (0..REC_HEADER_LEN).collect();
            for k in 0..24u64 {
                offsets.push(REC_HEADER_LEN + (len - REC_HEADER_LEN) * k / 24);
            }
            offsets.push(len - 1);
            for off in offsets {
                let ctx = format!("{ctx0} byte {off} of record {} (offsets {start}..{end}) flipped", i + 1);
                let img = base.crash(&mut CrashPlan::keep_all());
                let mut b = [0u8; 1];
                img.read_at(&jpath, start + off, &mut b).unwrap();
                b[0] ^= 0x5a;
                img.write_at(&jpath, start + off, &b).unwrap();
                let before = read_all(&img, &jpath);
                let fs = Arc::new(img);
                match Engine::open(fs.clone(), opts()) {
                    // Every byte counts, the header check (44..48) too.
                    Err(Error::Corrupt { .. }) => {}
                    Ok(e) => {
                        let got = dump_engine(&e, None);
                        let j = model.find(&got, 0);
                        panic!("{ctx}: recovery succeeded (recovered snapshot {j:?} of {}) instead of reporting Error::Corrupt", model.snaps.len() - 1);
                    }
                    Err(e) => panic!("{ctx}: expected Error::Corrupt, got {e}"),
                }
                // A refused recovery leaves the journal alone: it is refused again.
                assert_eq!(read_all(&*fs, &jpath), before, "{ctx}: the failed recovery changed the journal");
                assert!(matches!(Engine::open(fs.clone(), opts()), Err(Error::Corrupt { .. })), "{ctx}: second open");
                checked += 1;
            }
        }
        // Damage to the journal file header.
        for off in 0..FILE_HEADER_LEN {
            let ctx = format!("{ctx0} byte {off} of the journal file header flipped");
            let img = base.crash(&mut CrashPlan::keep_all());
            let mut b = [0u8; 1];
            img.read_at(&jpath, off, &mut b).unwrap();
            b[0] ^= 0x01;
            img.write_at(&jpath, off, &b).unwrap();
            match Engine::open(Arc::new(img), opts()) {
                // The nonce (28..32) is covered by the header checksum too.
                Err(Error::Corrupt { .. }) => {}
                Ok(_) => panic!("{ctx}: recovery succeeded instead of reporting Error::Corrupt"),
                Err(e) => panic!("{ctx}: expected Error::Corrupt, got {e}"),
            }
            checked += 1;
        }

        // The last record torn (cut anywhere inside, or a byte flipped):
        // recovery cuts it and lands on the state before it.
        let (start, end) = recs[4];
        let before_last = &model.snaps[model.snaps.len() - 2];
        let mut cuts: Vec<u64> =
            vec![start, start + 1, start + 8, start + 40, start + REC_HEADER_LEN - 1, start + REC_HEADER_LEN, end - 1];
        for k in 1..12 {
            cuts.push(start + REC_HEADER_LEN + (end - start - REC_HEADER_LEN) * k / 12);
        }
        for cut in cuts {
            let ctx = format!("{ctx0} journal truncated at {cut} inside the last record ({start}..{end})");
            let img = base.crash(&mut CrashPlan::keep_all());
            img.set_len(&jpath, cut).unwrap();
            verify_exact(img, before_last, &ctx);
            checked += 1;
        }
        for off in [0, 9, 20, 41, REC_HEADER_LEN + 3, (end - start) / 2, end - start - 1] {
            let ctx = format!("{ctx0} byte {off} of the last record flipped");
            let img = base.crash(&mut CrashPlan::keep_all());
            let mut b = [0u8; 1];
            img.read_at(&jpath, start + off, &mut b).unwrap();
            b[0] ^= 0x80;
            img.write_at(&jpath, start + off, &b).unwrap();
            verify_exact(img, before_last, &ctx);
            checked += 1;
        }
        // Zeros after the last record (a preallocated or half-written tail)
        // are a torn tail too: everything stays.
        let img = base.crash(&mut CrashPlan::keep_all());
        img.write_at(&jpath, end, &[0u8; 4096]).unwrap();
        verify_exact(img, &full, &format!("{ctx0} zeros after the last record"));
        // A persisted checkpoint plan is checksummed too: kill a checkpoint
        // once its plan is on disk, then damage the plan.
        let plan_img = {
            let mut n = 0;
            loop {
                // Opening checkpoints the journal: kill that checkpoint.
                let fresh = Arc::new(crash_fs(base.crash(&mut CrashPlan::keep_all())));
                fresh.set_fail_after(Some(n));
                let died = Engine::open(fresh.clone(), opts()).is_err();
                assert!(died, "{ctx0}: recovery never persisted a plan before finishing");
                let plans: Vec<PathBuf> = fresh
                    .read_dir(Path::new(META_DIR))
                    .unwrap()
                    .into_iter()
                    .map(|(n, _)| Path::new(META_DIR).join(n))
                    .filter(|p| p.extension() == Some(OsStr::new("plan")))
                    .collect();
                if let [plan] = plans.as_slice() {
                    break (fresh.crash(&mut CrashPlan::keep_all()), plan.clone());
                }
                n += 1;
            }
        };
        let (img, plan_path) = plan_img;
        let plan_base = crash_fs(img);
        let plan_len = plan_base.lstat(&plan_path).unwrap().size;
        for off in (0..plan_len).step_by((plan_len as usize / 40).max(1)) {
            let ctx = format!("{ctx0} byte {off} of the persisted plan {} flipped", plan_path.display());
            let img = plan_base.crash(&mut CrashPlan::keep_all());
            let mut b = [0u8; 1];
            img.read_at(&plan_path, off, &mut b).unwrap();
            b[0] ^= 0x21;
            img.write_at(&plan_path, off, &b).unwrap();
            match Engine::open(Arc::new(img), opts()) {
                Err(Error::Corrupt { .. }) => {}
                Ok(_) => panic!("{ctx}: recovery succeeded with a damaged plan"),
                Err(e) => panic!("{ctx}: expected Error::Corrupt, got {e}"),
            }
            checked += 1;
        }
        verify_exact(plan_base.crash(&mut CrashPlan::keep_all()), &full, &format!("{ctx0} intact plan"));
        // And the untouched journal recovers everything.
        verify_exact(base.crash(&mut CrashPlan::keep_all()), &full, &format!("{ctx0} intact journal"));
        checked += 2;
    }
    {
        eprintln!("journal damage: {checked} damaged journals checked");
    }
}

// ----- 5. the backing tree as the initial state ---------------------------------------------------

#[test]
fn untouched_backing_is_the_initial_state_and_close_leaves_the_model() {
    for seed in seeds(300, 8) {
        let ctx = format!("[untouched_backing seed={seed}]");
        let fs = Arc::new(initial_fs(seed, true));
        let initial = dump_storage(&*fs);
        let keep = Path::new("keep/untouched");
        let keep_meta = fs.lstat(keep).unwrap();
        let engine = Engine::open(fs.clone(), work_opts(seed, true)).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
        let seen = dump_engine(&engine, None);
        if seen != initial {
            panic!("{ctx}: the engine does not show the backing tree as it was:\n{}", diff(&initial, &seen));
        }
        if dump_storage(&*fs) != initial {
            panic!("{ctx}: opening changed the backing tree:\n{}", diff(&initial, &dump_storage(&*fs)));
        }
        engine.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
        assert_clean_backing(&*fs, &initial, &format!("{ctx} open+close"));

        let engine = Engine::open(fs.clone(), work_opts(seed, true)).unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
        let mut w = Workload::new(&engine, "untouched_backing", seed, initial);
        w.run(120).unwrap_or_else(|s| panic!("{}: {s:?}", w.ctx()));
        w.release_all();
        let want = w.model.last().clone();
        drop(w);
        engine.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
        assert_clean_backing(&*fs, &want, &format!("{ctx} after the workload"));
        let m = fs.lstat(keep).unwrap();
        assert_eq!(
            (m.ino, m.mtime, m.ctime, m.size),
            (keep_meta.ino, keep_meta.mtime, keep_meta.ctime, keep_meta.size),
            "{ctx}: a file no transaction touched was rewritten"
        );
        // Reopening shows the same state again.
        let engine = Engine::open(fs.clone(), opts()).unwrap_or_else(|e| panic!("{ctx}: third open: {e}"));
        let again = dump_engine(&engine, None);
        if again != want {
            panic!("{ctx}: reopened state differs:\n{}", diff(&want, &again));
        }
        engine.close().unwrap();
    }
}

// ----- focused regressions (minimal reproductions of bugs the sweeps found) ----

/// Kills the very first `Engine::open` of an empty backing after every
/// storage op, then power-cuts: the next open must succeed on an empty tree.
#[test]
fn first_open_killed_at_every_step() {
    first_open_killed_at_every_step_body();
}

#[test]
fn first_open_killed_at_every_step_conservative() {
    conservative(first_open_killed_at_every_step_body);
}

fn first_open_killed_at_every_step_body() {
    let empty = Tree::new();
    for n in 0.. {
        let fs = Arc::new(crash_fs(MemFs::new()));
        fs.set_fail_after(Some(n));
        let done = Engine::open(fs.clone(), opts()).is_ok();
        for (label, mut plan) in [
            ("keep_all", CrashPlan::keep_all()),
            ("drop_all", CrashPlan::drop_all()),
            ("random(7)", CrashPlan::random(7)),
        ] {
            let ctx =
                format!("[first_open{}] first open killed after {n} storage ops, then CrashPlan::{label}", model_tag());
            verify_exact(fs.crash(&mut plan), &empty, &ctx);
        }
        if done {
            break;
        }
    }
}

/// A committed write to a file whose only other link the engine never
/// looked up, then the looked-up name unlinked: the checkpoint writes the
/// content through the file's stage link and phase 4 removes that link.
/// Killing the checkpoint after every storage op and recovering must land
/// on the committed state every time.
#[test]
fn checkpoint_of_a_file_linked_elsewhere_killed_at_every_step() {
    checkpoint_of_a_file_linked_elsewhere_killed_at_every_step_body();
}

#[test]
fn checkpoint_of_a_file_linked_elsewhere_killed_at_every_step_conservative() {
    conservative(checkpoint_of_a_file_linked_elsewhere_killed_at_every_step_body);
}

fn checkpoint_of_a_file_linked_elsewhere_killed_at_every_step_body() {
    let mut n = 0;
    loop {
        let mem = MemFs::new();
        let p = Path::new;
        mem.mkdir(p("a"), 0o755).unwrap();
        mem.create_file(p("top"), 0o644).unwrap();
        mem.write_at(p("top"), 0, &[7u8; 10000]).unwrap();
        mem.link(p("top"), p("a/hl")).unwrap();
        let fs = Arc::new(crash_fs(mem));
        let engine = Engine::open(fs.clone(), opts()).expect("open");
        let top = engine.lookup(None, ObjId::ROOT, OsStr::new("top")).unwrap().obj;
        engine.write(None, top, 5000, b"new data").unwrap();
        engine.unlink(None, ObjId::ROOT, OsStr::new("top")).unwrap();
        engine.sync().unwrap();
        let want = dump_engine(&engine, None);
        fs.set_fail_after(Some(n));
        let done = engine.checkpoint().is_ok();
        drop(engine);
        let mut plans =
            vec![("keep_all".to_string(), CrashPlan::keep_all()), ("drop_all".to_string(), CrashPlan::drop_all())];
        plans.extend((0..24u64).map(|s| (format!("random({s})"), CrashPlan::random(s))));
        for (label, mut plan) in plans {
            let ctx = format!(
                "[linked_elsewhere{}] checkpoint killed after {n} storage ops, then CrashPlan::{label}",
                model_tag()
            );
            verify_exact(fs.crash(&mut plan), &want, &ctx);
        }
        if done {
            break;
        }
        n += 1;
    }
}

/// A file with two names, held open, loses the name the engine looked up;
/// a checkpoint runs; the file is then changed through its other name.
/// The file is still linked, so it must not become an orphan: after a
/// power cut recovery must find it, and after close nothing may be left in
/// `.txfs/orphans`.
#[test]
fn open_file_with_another_link_is_not_an_orphan() {
    let mem = MemFs::new();
    let p = Path::new;
    mem.create_file(p("f"), 0o644).unwrap();
    mem.write_at(p("f"), 0, b"hello world").unwrap();
    mem.link(p("f"), p("g")).unwrap();
    let fs = Arc::new(crash_fs(mem));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new("f")).unwrap().obj;
    let g = engine.lookup(None, ObjId::ROOT, OsStr::new("g")).unwrap().obj;
    assert_eq!(f, g, "two names of one file are one object");
    engine.open_obj(f).unwrap();
    engine.unlink(None, ObjId::ROOT, OsStr::new("f")).unwrap();
    engine.checkpoint().unwrap();
    engine.write(None, g, 0, b"HELLO").unwrap();
    engine.sync().unwrap();
    let want = dump_engine(&engine, None);
    assert_eq!(want.get(Path::new("g")), Some(&Node::File { data: b"HELLO world".to_vec(), mode: 0o644 }));
    verify_exact(
        fs.crash(&mut CrashPlan::keep_all()),
        &want,
        "[open_other_link] power cut after a durable write through the other name",
    );
    engine.release(f);
    engine.close().unwrap();
    assert_clean_backing(&*fs, &want, "[open_other_link] after release and close");
}

/// `txfs check` after the daemon is killed at every storage op of a
/// checkpoint (the page cache survives a kill: `CrashPlan::keep_all`)
/// reports an interrupted checkpoint, never damage — found by the mount's
/// crash campaign: a next journal created but not yet given its header.
#[test]
fn check_after_a_checkpoint_killed_at_every_step_reports_no_damage() {
    let mut n = 0u64;
    loop {
        let fs = Arc::new(crash_fs(MemFs::new()));
        let engine = Engine::open(fs.clone(), opts()).expect("open");
        let f = engine.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
        engine.write(None, f, 0, b"checkpointed").unwrap();
        engine.mkdir(None, ObjId::ROOT, OsStr::new("d"), 0o755, 0, 0).unwrap();
        engine.sync().unwrap();
        fs.set_fail_after(Some(n));
        let done = engine.checkpoint().is_ok();
        drop(engine);
        let img = fs.crash(&mut CrashPlan::keep_all());
        let rep = txfs_engine::check(&img).expect("check runs");
        assert!(rep.problems.is_empty(), "checkpoint killed after {n} storage ops: {:?}", rep.problems);
        let e = Engine::open(Arc::new(img), opts()).unwrap_or_else(|e| panic!("after {n} ops: recovery: {e}"));
        assert_eq!(e.read(None, e.resolve(None, Path::new("f")).unwrap(), 0, 64).unwrap(), b"checkpointed");
        if done {
            break;
        }
        n += 1;
    }
    assert!(n > 10, "the checkpoint took only {n} storage ops");
}

/// Special files through every kind of crash: a backing store with a fifo
/// and a device; commits that make a fifo, a socket, a character and a
/// block device, rename the old fifo, link the new one twice, chmod the
/// device and remove the old device. Killing the checkpoint after every
/// storage op, then any power cut, recovery must land on the committed
/// state — kinds, modes and device numbers (`dump_engine` and, after
/// close, `assert_clean_backing` compare them), made by `mknod` in phase 2
/// or replayed from the journal.
#[test]
fn checkpoint_of_special_files_killed_at_every_step() {
    checkpoint_of_special_files_killed_at_every_step_body();
}

#[test]
fn checkpoint_of_special_files_killed_at_every_step_conservative() {
    conservative(checkpoint_of_special_files_killed_at_every_step_body);
}

fn checkpoint_of_special_files_killed_at_every_step_body() {
    let dev = |major: u32, minor: u32| libc::makedev(major, minor) as u64;
    let mut n = 0;
    loop {
        let mem = MemFs::new();
        let p = Path::new;
        mem.mkdir(p("d"), 0o755).unwrap();
        mem.mknod(p("d/old-fifo"), FileKind::Fifo, 0o600, 0).unwrap();
        mem.mknod(p("old-dev"), FileKind::CharDev, 0o600, dev(4, 64)).unwrap();
        let fs = Arc::new(crash_fs(mem));
        let engine = Engine::open(fs.clone(), opts()).expect("open");
        let d = engine.lookup(None, ObjId::ROOT, OsStr::new("d")).unwrap().obj;
        let tx = engine.begin();
        let fifo = engine.mknod(Some(tx), d, OsStr::new("fifo"), FileKind::Fifo, 0o640, 0, 0, 0).unwrap().obj;
        engine.mknod(Some(tx), ObjId::ROOT, OsStr::new("sock"), FileKind::Socket, 0o755, 0, 0, 0).unwrap();
        let null = engine.mknod(Some(tx), d, OsStr::new("null"), FileKind::CharDev, 0o600, dev(1, 3), 0, 0).unwrap();
        engine
            .mknod(Some(tx), ObjId::ROOT, OsStr::new("disk"), FileKind::BlockDev, 0o660, dev(259, 70000), 0, 0)
            .unwrap();
        engine.commit(tx, Durability::Durable).unwrap();
        engine
            .rename(None, d, OsStr::new("old-fifo"), ObjId::ROOT, OsStr::new("moved"), RenameFlags::default())
            .unwrap();
        engine.link(None, fifo, ObjId::ROOT, OsStr::new("fifo-link")).unwrap();
        engine.link(None, fifo, d, OsStr::new("fifo-link2")).unwrap();
        engine.setattr(None, null.obj, &SetAttr { mode: Some(0o666), ..Default::default() }).unwrap();
        engine.unlink(None, ObjId::ROOT, OsStr::new("old-dev")).unwrap();
        engine.sync().unwrap();
        let want = dump_engine(&engine, None);
        assert_eq!(
            want.get(Path::new("d/null")),
            Some(&Node::Special { kind: FileKind::CharDev, mode: 0o666, rdev: dev(1, 3) })
        );
        assert_eq!(want.get(Path::new("moved")), Some(&Node::Special { kind: FileKind::Fifo, mode: 0o600, rdev: 0 }));
        assert_eq!(want.len(), 8, "{want:?}");
        fs.set_fail_after(Some(n));
        let done = engine.checkpoint().is_ok();
        drop(engine);
        let mut plans =
            vec![("keep_all".to_string(), CrashPlan::keep_all()), ("drop_all".to_string(), CrashPlan::drop_all())];
        plans.extend((0..8u64).map(|s| (format!("random({s})"), CrashPlan::random(s))));
        for (label, mut plan) in plans {
            let ctx = format!(
                "[special files{}] checkpoint killed after {n} storage ops, then CrashPlan::{label}",
                model_tag()
            );
            verify_exact(fs.crash(&mut plan), &want, &ctx);
        }
        if done {
            break;
        }
        n += 1;
    }
    assert!(n > 10, "the checkpoint took {n} storage ops");
}

/// `txfs mount` makes `.txfs/` itself (to lock it) before the engine opens:
/// the open must still make that name durable before it acknowledges a
/// commit. Under the conservative model a power cut otherwise loses
/// `.txfs` and every commit in it (issue 28).
#[test]
fn a_meta_folder_made_before_the_first_open_is_made_durable() {
    conservative(|| {
        for made_by_an_open_killed_before_its_syncs in [false, true] {
            let fs = Arc::new(crash_fs(MemFs::new()));
            fs.mkdir(Path::new(META_DIR), 0o700).unwrap();
            if made_by_an_open_killed_before_its_syncs {
                for sub in ["journal", "stage", "orphans", "data"] {
                    fs.mkdir(&Path::new(META_DIR).join(sub), 0o700).unwrap();
                }
            }
            let engine = Engine::open(fs.clone(), opts()).expect("open");
            let tx = engine.begin();
            let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
            engine.write(Some(tx), f, 0, b"acknowledged").unwrap();
            engine.commit(tx, Durability::Durable).unwrap();
            let want = dump_engine(&engine, None);
            let ctx =
                format!("[meta folder made before open, subfolders too: {made_by_an_open_killed_before_its_syncs}]");
            verify_exact(fs.crash(&mut CrashPlan::drop_all()), &want, &format!("{ctx} CrashPlan::drop_all"));
            for s in 0..8 {
                verify_exact(fs.crash(&mut CrashPlan::random(s)), &want, &format!("{ctx} CrashPlan::random({s})"));
            }
        }
    });
}
