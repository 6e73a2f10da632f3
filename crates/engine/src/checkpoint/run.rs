//! Running a checkpoint inside a live engine: which parts hold the engine
//! lock, and how the engine's state follows the tree.
//!
//! [`run`]: under the lock, `start` plans, persists, runs phase 1, the
//! marker and phase 2, updates the node table, and switches commits to
//! the next journal, keeping the delta being written readable as
//! `State::frozen`; outside the lock, phases 3–4 and the final sync (the
//! long part); under the lock again, the frozen delta, the old journal and
//! the epoch's data files are dropped. A checkpoint that meets an I/O
//! error in its namespace phases runs them again at once, twice (20 and
//! 200 ms later, still under the lock: they are idempotent, as recovery
//! needs); one that still fails poisons the engine (recovery finishes the
//! plan): every request fails until the next open. One that fails writing contents (a
//! disk that filled after the estimate, an I/O error) is [`Unfinished`]:
//! its namespace is in the tree and commits already go to the next
//! journal, so the engine goes on as while any checkpoint writes contents
//! — reads lay the frozen delta over the tree, commits are acknowledged —
//! and the next run writes the contents again (they are idempotent, as for
//! recovery) before anything else. One that could not start (no room:
//! bytes or inodes) changes nothing and is retried later.
//!
//! Tests: `tests/checkpoint_concurrency.rs`
//! (`commits_and_reads_go_on_while_the_checkpoint_writes_contents`),
//! `tests/unlocked_reads.rs` (`reads_racing_checkpoints_see_their_own_whole_file`),
//! `tests/limits.rs` (`a_checkpoint_that_does_not_fit_is_postponed_not_poisoned`),
//! `tests/idle_checkpoint.rs`.

use super::execute::{contents, delete_and_sync, namespace, next_journal, retire, sync_stage_writes};
use super::plan::{build, persist, publish, Plan};
use crate::error::{Error, IoContext, Result};
use crate::ids::ObjId;
use crate::log::files::{data_path, drop_spare, is_missing};
use crate::log::journal::{self, SyncState};
use crate::storage::StoredFile;
use crate::txn::state::State;
use parking_lot::Mutex;
use std::sync::Arc;

/// A checkpoint whose contents phase failed, kept for the next [`run`]
/// (`State::unfinished`); its delta stays `State::frozen` meanwhile.
pub(crate) struct Unfinished {
    plan: Plan,
    journal: Arc<dyn StoredFile>,
    released: Vec<ObjId>,
    /// The last failure, for `txfs status` ([`Engine::fault`](crate::Engine::fault)).
    pub(crate) why: String,
    /// Failed attempts so far.
    pub(crate) tries: u32,
    /// Contents and phase 4 are done and synced; only the retirement of
    /// the old journal, marker and plan failed. Retried alone: once the
    /// journal's name is gone recovery no longer writes the contents
    /// again, so a retry must not start rewriting them either.
    retire_only: bool,
}

/// Runs a checkpoint; the caller holds the checkpoint lock (one at a time)
/// and not the engine lock. An [`Unfinished`] one is finished first; if
/// that fails again, nothing else runs. The plan, its namespace phases and the switch
/// to the next journal run under the engine lock; the contents (phase 3),
/// phase 4 and the final sync — the long part — run outside it, with the
/// delta they write kept as [`State::frozen`] so that reads and commits go
/// on meanwhile (DESIGN §4).
pub(crate) fn run(state: &Mutex<State>, sync: &SyncState) -> Result<()> {
    let unfinished = {
        let mut st = state.lock();
        if let Some(p) = st.poisoned() {
            return Err(Error::Poisoned(p));
        }
        st.unfinished.take().map(|u| (u, st.storage().clone()))
    };
    if let Some((u, storage)) = unfinished {
        let tries = u.tries;
        finish_contents(state, storage, u.plan, u.journal, u.released, tries, u.retire_only)?;
        tracing::info!(tries, "an unfinished checkpoint is done");
    }
    let (plan, journal, released, storage) = {
        let mut st = state.lock();
        if let Some(p) = st.poisoned() {
            return Err(Error::Poisoned(p));
        }
        if st.committed().is_empty() {
            // No record in the current journal: nothing can name an orphan.
            let released = st.take_released_orphans();
            st.remove_orphans(released);
            return Ok(());
        }
        let mut started = false;
        match start(&mut st, sync, &mut started) {
            Ok((plan, journal, released)) => (plan, journal, released, st.storage().clone()),
            Err(e) => {
                if started {
                    // The backing tree may be half-way through the plan;
                    // in-memory locations no longer match it. Recovery
                    // finishes the plan.
                    st.poison(format!("checkpoint failed: {e}"));
                }
                return Err(e);
            }
        }
    };
    finish_contents(state, storage, plan, journal, released, 0, false)
}

/// The part of a checkpoint outside the engine lock — contents, phase 4,
/// the final sync, the old journal's removal — and its end under the lock;
/// `tries` earlier attempts failed; with `retire_only` the contents were
/// done by one of them.
fn finish_contents(
    state: &Mutex<State>,
    storage: Arc<dyn crate::storage::Storage>,
    plan: Plan,
    journal: Arc<dyn StoredFile>,
    released: Vec<ObjId>,
    tries: u32,
    mut retire_only: bool,
) -> Result<()> {
    let res = (|| {
        if !retire_only {
            contents(&*storage, &plan, &*journal, Some(false))?;
            delete_and_sync(&*storage, &plan)?;
            retire_only = true;
        }
        retire(&*storage, &plan)
    })();
    let mut st = state.lock();
    if let Err(e) = res {
        // The namespace is in place and the node table follows it; only
        // contents, attributes and the old journal's removal may be half
        // done. Reads lay the frozen delta over the tree, and laying a
        // delta over its own partial application gives what applying it
        // whole gives (delta.rs): plain reads stay exact. Commits go on in
        // the next journal; the next run writes the contents again (a
        // crash meanwhile leaves the plan to recovery, as during any
        // checkpoint's contents).
        let why = format!("checkpoint failed writing contents ({} attempts): {e}", tries + 1);
        st.unfinished = Some(Unfinished { plan, journal, released, why, tries: tries + 1, retire_only });
        return Err(e);
    }
    // The retired journal was the last thing naming the epoch's data files
    // (those placed by rename are gone from data/ already). A crash before
    // this leaves them to recovery, which removes what nothing names.
    let retired = st.end_checkpoint(plan.epoch);
    for id in retired {
        match storage.unlink(&data_path(id)) {
            Ok(()) => {}
            Err(e) if is_missing(&e) => {}
            Err(e) => tracing::warn!("{}: {e} (removed at the next start)", data_path(id).display()),
        }
    }
    // Released orphans: the retired journal was the last thing naming them.
    st.remove_orphans(released);
    tracing::debug!(epoch = plan.epoch.0 + 1, "checkpoint done");
    Ok(())
}

/// What a plan may need on the backing file system at most: every data
/// byte it writes, a block per object it creates or moves, its own file and
/// the next journal's header — plus a margin for directory blocks.
fn space_needed(plan: &Plan) -> u64 {
    let journaled = plan.data.iter().flat_map(|d| d.extents.iter()).map(|(_, len, _)| *len);
    let filed = plan.data.iter().flat_map(|d| d.files.iter()).map(|(_, len, _, _)| *len);
    let data: u64 = journaled.chain(filed).map(|len| len.div_ceil(4096) * 4096).sum();
    let objects = (plan.out.len() + plan.place.len() + plan.data.len()) as u64;
    data + objects * 4096 + (1 << 20)
}

/// Inodes a plan may create at most: every new object it makes (a rename
/// or a link makes none), its own file and marker, the next journal, and
/// a margin for the spares it keeps.
fn inodes_needed(plan: &Plan) -> u64 {
    use super::plan::Place;
    let made = plan.place.iter().filter(|p| {
        matches!(p, Place::File { .. } | Place::Dir { .. } | Place::Symlink { .. } | Place::Special { .. })
    });
    made.count() as u64 + 16
}

/// How long the namespace phases wait before each run again after an I/O
/// error (under the engine lock: every request waits too).
const NAMESPACE_RETRIES: [std::time::Duration; 2] =
    [std::time::Duration::from_millis(20), std::time::Duration::from_millis(200)];

/// Phases 1–2 with their marker, the contents written through stage
/// links, and the next journal.
fn namespace_steps(
    storage: &dyn crate::storage::Storage,
    plan: &Plan,
    jf: &dyn StoredFile,
) -> Result<(Arc<dyn StoredFile>, crate::ids::Epoch, u32)> {
    namespace(storage, plan)?;
    // A node forgotten below (a file linked under a name never looked up)
    // would be read without `frozen`: its contents are written now.
    contents(storage, plan, jf, Some(true))?;
    sync_stage_writes(storage, plan)?;
    next_journal(storage, plan)
}

/// The part of a checkpoint under the engine lock: plan, phases 1–2, the
/// contents written through stage links, the next journal; then the
/// committed delta becomes `frozen` and commits go to the next journal.
#[allow(clippy::type_complexity)]
fn start(st: &mut State, sync: &SyncState, started: &mut bool) -> Result<(Plan, Arc<dyn StoredFile>, Vec<ObjId>)> {
    // Reads running without the lock must not trust what they read (J1's
    // phases 1 and 2 rename the tree's files under the lock, below).
    st.bump_tree_gen();
    let (plan, mut upd) = build(st)?;
    let storage = st.storage().clone();
    // Not enough room: fail before the backing tree changes, so nothing is
    // poisoned and the next attempt (once space is freed) simply runs.
    let mut free = storage.free_bytes().ctx("checkpoint", || "statvfs of the backing tree".into())?;
    if free.is_some_and(|f| f < space_needed(&plan)) {
        // The spare journal and spare data files are the first things to
        // give back.
        drop_spare(&*storage)?;
        st.drop_spares();
        free = storage.free_bytes().ctx("checkpoint", || "statvfs of the backing tree".into())?;
    }
    if let Some(free) = free {
        let need = space_needed(&plan);
        if free < need {
            return Err(Error::io(
                "checkpoint",
                format!("backing file system has {free} bytes free, the checkpoint needs up to {need}"),
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
    }
    // Inodes too: a user's many small files could use up an ext4's, and a
    // create failing half-way through phase 2 would stop the mount.
    if let Some(free) = storage.free_inodes().ctx("checkpoint", || "statvfs of the backing tree".into())? {
        let need = inodes_needed(&plan);
        if free < need {
            return Err(Error::io(
                "checkpoint",
                format!("backing file system has {free} inodes free, the checkpoint needs up to {need}"),
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
    }
    // The plan reads extents from the journal: every record it covers must
    // be durable before the plan is (an ordered commit may have slipped in
    // since the caller's sync).
    let j = st.journal();
    j.file.sync_data().ctx("journal sync", || j.path.display().to_string())?;
    // A plan that could not be written beside its place changes nothing
    // (not started: retried later).
    persist(&*storage, &plan)?;
    // From here on a failure may leave the plan half-done.
    *started = true;
    publish(&*storage, &plan)?;
    let jf = st.journal().file.clone();
    // Every step is idempotent (recovery runs them again from the plan),
    // so an I/O error here is retried at once, still under the lock: past
    // it the tree is half-way through the plan and the engine cannot serve
    // until the plan is finished. A fault that outlasts the retries stops
    // the mount (the caller poisons it; recovery finishes the plan).
    let mut waits = NAMESPACE_RETRIES.iter();
    let (file, next, nonce) = loop {
        match namespace_steps(&*storage, &plan, &*jf) {
            Ok(r) => break r,
            Err(e @ Error::Os { .. }) => match waits.next() {
                Some(wait) => {
                    tracing::warn!("checkpoint: {e}: the namespace phases are run again in {wait:?}");
                    std::thread::sleep(*wait);
                }
                None => return Err(e),
            },
            Err(e) => return Err(e),
        }
    };
    // The backing tree now holds the plan's names: update locations.
    let in_place = std::mem::take(&mut upd.in_place);
    st.follow_plan(upd, &*storage);
    let released = st.take_released_orphans();
    st.freeze_committed(&in_place);
    st.switch_journal(next, file.clone(), nonce);
    sync.rotate(next, file, journal::FILE_HEADER_LEN);
    Ok((plan, jf, released))
}
