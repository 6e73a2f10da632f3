//! Checkpoint: write the committed delta into the backing tree, then start a
//! new journal epoch.
//!
//! The backing tree changes *only* by executing a persisted plan (J1). A
//! plan is computed from the committed delta and the backing tree, written
//! to `.txfs/ckpt-<epoch>.plan` (checksummed, fsynced), and then executed in
//! four phases. Every step is idempotent, so recovery simply executes the
//! plan again from its last durable phase marker (J5):
//!
//! ```text
//!  phase 1  move out   every backing entry the delta changes is renamed to
//!                      .txfs/stage/o<id> (or unlinked, for a second link),
//!                      deepest path first      — skip if already gone
//!           marker     fsync the directories phase 1 changed (syncfs past
//!                      64 or if one moved); create .txfs/ckpt-<epoch>.p1;
//!                      fsync .txfs
//!  phase 2  place      staged and new objects go to their final names,
//!                      shallowest first; extra hard links after; a new
//!                      file whose content is exactly a data file is that
//!                      data file, renamed into place (its bytes are
//!                      written once: selective data journaling); an
//!                      existing file whose content is all of its shadow
//!                      gets its attributes and is replaced by it
//!                      — skip if the stage name is gone / target exists
//!  phase 3  contents   per file: truncate to the cut, write extents from
//!                      the journal and from data files, set the final
//!                      size; then attributes
//!                      — final-state writes: replaying them is harmless
//!  phase 4  delete     staged objects that died are removed
//!           finish     syncfs; create journal <epoch+1>; unlink journal
//!                      <epoch>; unlink the plan; then the epoch's data
//!                      files (nothing names them any more)
//! ```
//!
//! Why phase 1 needs the marker: phase 2 may re-create a name phase 1
//! moved away; replaying phase 1 after that would move the new object.
//! Why deepest first, and a sync of the folders the inner moves changed
//! before a folder above them moves: if a directory's move survived a
//! crash, the moves of everything inside it that phase 1 touched survived
//! too (no order between namespace operations is assumed: each sync and
//! what depends on it is in docs/design/checkpoint.md).
//!
//! Locking: plan, phase 1, marker and phase 2 run under the engine lock;
//! phase 3 onwards runs outside it while the delta being written stays
//! readable as `State::frozen` and new commits go to the next journal
//! ([`run()`], DESIGN §4).
//!
//! ## Rooms
//! * `plan.rs`: the [`Plan`](plan::Plan), built from the committed delta, persisted
//!   before phase 1 and loaded by recovery (J1, J5).
//! * `paths.rs`: the table of the paths a plan names, each as its parent's
//!   entry and its last name (a tree's depth costs no more than its names).
//! * `execute.rs`: the phases and the switch to the next journal, on the
//!   storage and the plan alone: recovery runs the same code.
//! * `run.rs`: a checkpoint inside a live engine: what holds the lock, and
//!   how the engine's state follows the tree.
//!
//! Checkpoint works on a `txn::state::State` and the `log`; it never calls
//! the engine facade. The facade (`txn/mod.rs`) and recovery call it.

mod execute;
pub(crate) mod paths;
pub(crate) mod plan;
mod run;

pub(crate) use execute::{execute, finish};
pub(crate) use plan::{load, plan_path};
pub(crate) use run::{run, Unfinished};
