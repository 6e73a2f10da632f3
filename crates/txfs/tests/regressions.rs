//! Regressions pinned on a real mount, each opening with its story: what
//! broke, how it was found, and the commit that fixed it (or why it is
//! still open).

mod common;

use common::*;

/// Story (found by the daemon crash campaign, reliability/crash_campaign.py):
/// the campaign's workers saw ENOENT, inside their transactions,
/// for files their snapshot held. The cause is not the engine (which
/// answers such lookups with the snapshot or a conflict: see
/// `a_directory_removed_after_begin_is_a_conflict_not_enoent` in
/// crates/engine/tests/regressions.rs) but the kernel's
/// caches: directories have one node id for everyone, so when a *live*
/// transaction removes a directory, the kernel marks that shared inode dead
/// (and `d_delete`s its dentry) the moment the daemon answers the rmdir.
/// Any process that still references the inode — here one holding the
/// directory open; in the campaign a concurrent path walk — then gets
/// ENOENT below it, while the removing transaction is still uncommitted,
/// and even after it aborted: an uncommitted change leaves a trace
/// (SPEC: abort leaves no trace; others see the committed state).
///
/// Fixed (issue 24): a transaction's rmdir or rename of a directory it did
/// not create is answered ESTALE once, after the directory got a private
/// node id; the kernel's retry walks with LOOKUP_REVAL, meets the private
/// id and removes or moves a private inode. Everything below a private
/// directory is private, and the daemon looks the old path up again just
/// after, so others' shared dentries come back (docs/design/mount.md,
/// "Removing and moving directories"; more cases in
/// uncommitted_dir_changes.rs). Private ids for every directory looked up
/// (tried first, reverted) unhash others' working directories on every
/// lookup instead.
#[test]
fn uncommitted_rmdir_does_not_hide_a_directory_from_others() {
    let m = Mount::with_backing(|b| {
        std::fs::create_dir_all(b.join("d/x")).unwrap();
        std::fs::write(b.join("d/x/f"), "hello").unwrap();
    });
    let mut other = Agent::spawn(m.mnt());
    other.ok("held = os.open(M + '/d/x', os.O_RDONLY)");
    assert_eq!(other.ok("out = open(M + '/d/x/f').read()"), "hello");
    m.begin().unwrap();
    std::fs::remove_file(m.path("d/x/f")).unwrap();
    std::fs::remove_dir(m.path("d/x")).unwrap();
    let during = other.run("out = open(M + '/d/x/f').read()");
    m.abort().unwrap();
    let after = other.run("out = open(M + '/d/x/f').read()");
    other.ok("os.close(held)");
    assert_eq!(during, Ok("hello".into()), "while the rmdir was uncommitted, another process lost d/x/f");
    assert_eq!(after, Ok("hello".into()), "after the rmdir was aborted, another process still cannot reach d/x/f");
}
