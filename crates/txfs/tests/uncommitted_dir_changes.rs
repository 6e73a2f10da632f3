//! A transaction's uncommitted removal or move of a directory reaches no
//! other process through the kernel's shared dentries and inodes (issue
//! 24, item 4): not one holding the directory open, not one whose working
//! directory is in it, not an unrelated path walk, and not another
//! transaction — before the change commits, after it aborts, and (once it
//! commits) the others follow the committed change.
//!
//! The kernel applies a successful rmdir or rename to the inode and dentry
//! the caller's walk found, for everyone: a removed directory's inode is
//! marked dead, a renamed one's dentry moves. Each case runs with the
//! change made by a thread transaction (an agent that sent BEGIN) and by a
//! `txfs run` without a view (`TXFS_RUN_VIEW=0`, as a non-root user gets);
//! a root run's view is a mount of its own and never had the problem.

mod common;

use common::*;
use std::time::Duration;

/// An agent in a transaction of `side`, its working directory the mount.
fn in_transaction(m: &Mount, side: Side) -> Agent {
    let mut a = agent_in_transaction(m, side);
    a.ok("os.chdir(M)");
    a
}

/// d/x/y/f ("hello") and d/g, in the backing before the mount.
fn tree(m_backing: &std::path::Path) {
    std::fs::create_dir_all(m_backing.join("d/x/y")).unwrap();
    std::fs::write(m_backing.join("d/x/y/f"), "hello").unwrap();
    std::fs::write(m_backing.join("d/g"), "g").unwrap();
}

/// Three outsiders: one holding d open, one with its working directory in
/// d/x, one that only walks paths.
fn outsiders(m: &Mount) -> (Agent, Agent, Agent) {
    let mut holder = Agent::spawn(m.mnt());
    holder.ok("held = os.open(M + '/d', os.O_RDONLY | os.O_DIRECTORY)");
    let mut dweller = Agent::spawn(m.mnt());
    dweller.ok("os.chdir(M + '/d/x')");
    let walker = Agent::spawn(m.mnt());
    (holder, dweller, walker)
}

/// `getcwd` of `a` is `want`. The one window left (docs/LIMITS.md §8):
/// while a transaction's rmdir or rename call runs, and until the daemon
/// has had the old path looked up again just after it, the kernel's shared
/// dentry is out of its hash, so `getcwd` of a process in it answers
/// ENOENT. Never a wrong name.
fn assert_cwd(a: &mut Agent, want: &str, when: &str) {
    let mut last = a.run("out = os.getcwd()");
    if last != Ok(serde_json::json!(want)) {
        assert_eq!(last, Err(libc::ENOENT), "{when}: getcwd");
        wait_until(Duration::from_secs(10), || {
            last = a.run("out = os.getcwd()");
            last != Err(libc::ENOENT)
        });
    }
    assert_eq!(last, Ok(serde_json::json!(want)), "{when}: getcwd");
}

/// What the three see of d: it must be the committed tree, whole.
fn assert_they_see_d(m: &Mount, o: &mut (Agent, Agent, Agent), when: &str) {
    let (holder, dweller, walker) = o;
    let listed = holder.ok("out = sorted(os.listdir(held))");
    assert_eq!(listed, serde_json::json!(["g", "x"]), "{when}: listing through a held descriptor");
    let x = m.path("d/x").display().to_string();
    assert_cwd(dweller, &x, when);
    assert_eq!(dweller.ok("out = sorted(os.listdir('.'))"), serde_json::json!(["y"]), "{when}: listing the cwd");
    assert_eq!(dweller.ok("out = open('y/f').read()"), "hello", "{when}: a path below the cwd");
    assert_eq!(walker.ok("out = open(M + '/d/x/y/f').read()"), "hello", "{when}: a path walk");
    assert_eq!(walker.ok("out = sorted(os.listdir(M + '/d'))"), serde_json::json!(["g", "x"]), "{when}");
}

#[test]
fn an_uncommitted_rm_r_reaches_no_holder_walker_or_working_directory() {
    for side in SIDES {
        for commit in [false, true] {
            let m = Mount::with_backing(tree);
            let mut o = outsiders(&m);
            let mut t = in_transaction(&m, side);
            t.ok("import shutil; shutil.rmtree(M + '/d')");
            assert!(t.run("os.stat(M + '/d')").is_err(), "{side:?}: the transaction sees its removal");
            assert_they_see_d(&m, &mut o, &format!("{side:?}, rm -r uncommitted"));
            // Again, after others walked there in between.
            assert_they_see_d(&m, &mut o, &format!("{side:?}, rm -r uncommitted, again"));
            end_transaction(t, side, commit);
            if !commit {
                assert_they_see_d(&m, &mut o, &format!("{side:?}, rm -r aborted"));
                let mut after = Agent::spawn(m.mnt());
                assert_eq!(
                    after.ok("out = open(M + '/d/x/y/f').read()"),
                    "hello",
                    "{side:?}: a newcomer after the abort"
                );
            } else {
                let walker = &mut o.2;
                assert!(
                    wait_until(Duration::from_secs(10), || walker.run("os.stat(M + '/d')") == Err(libc::ENOENT)),
                    "{side:?}: after the commit d is gone for others"
                );
                let held = o.0.run("out = [os.listdir(held), os.fstat(held).st_nlink]");
                let want = serde_json::json!([[], 0]);
                assert_eq!(held, Ok(want), "{side:?}: a held removed directory lists empty with no links, as on ext4");
                // Nothing is made in a removed directory (ext4: ENOENT): a
                // name there could never be checkpointed.
                assert_eq!(
                    o.0.run("os.mkdir('n', dir_fd=held)"),
                    Err(libc::ENOENT),
                    "{side:?}: mkdir in a held removed d"
                );
                let dweller = &mut o.1;
                assert_eq!(dweller.run("open('n', 'w')"), Err(libc::ENOENT), "{side:?}: create in a removed cwd");
                // Below the removed tree, getcwd fails as on ext4, not with
                // the old path.
                assert!(
                    wait_until(Duration::from_secs(10), || dweller.run("out = os.getcwd()") == Err(libc::ENOENT)),
                    "{side:?}: getcwd in a removed d/x: {:?}",
                    dweller.run("out = os.getcwd()")
                );
                drop(o);
                let mut m = m;
                m.umount_clean();
                m.start();
                assert!(!m.path("d").exists(), "{side:?}: after a remount");
            }
        }
    }
}

/// The G1a case of the issue: T1 holds d open (or lives in it) and lists it
/// inside its own transaction while T2's `rm -r d` is uncommitted; T1
/// commits what it saw; T2 aborts. T1 must have seen the whole of d.
#[test]
fn a_committed_transaction_never_reads_another_s_uncommitted_rm_r() {
    for side in SIDES {
        let m = Mount::with_backing(tree);
        let mut t1 = in_transaction(&m, Side::Thread);
        t1.ok("held = os.open(M + '/d', os.O_RDONLY | os.O_DIRECTORY); os.chdir(M + '/d/x')");
        let mut t2 = in_transaction(&m, side);
        t2.ok("import shutil; shutil.rmtree(M + '/d')");
        let seen = t1.ok("out = [sorted(os.listdir(held)), sorted(os.listdir('.')), open('y/f').read()]\n\
             open(M + '/seen', 'w').write(repr(out))");
        end_transaction(t1, Side::Thread, true);
        end_transaction(t2, side, false);
        assert_eq!(seen, serde_json::json!([["g", "x"], ["y"], "hello"]), "{side:?}: T1 read T2's uncommitted removal");
        assert_eq!(std::fs::read_to_string(m.path("seen")).unwrap(), "[['g', 'x'], ['y'], 'hello']");
    }
}

#[test]
fn an_uncommitted_rename_of_nested_directories_moves_nobody_else() {
    for side in SIDES {
        for commit in [false, true] {
            let m = Mount::with_backing(tree);
            let mut o = outsiders(&m);
            let mut t = in_transaction(&m, side);
            t.ok("os.rename(M + '/d/x/y', M + '/d/x/z'); os.rename(M + '/d/x', M + '/d/w'); os.rename(M + '/d', M + '/e')");
            assert_eq!(
                t.ok("out = open(M + '/e/w/z/f').read()"),
                "hello",
                "{side:?}: the transaction sees its renames"
            );
            // Outside readers of committed files while the renames are
            // uncommitted: never ESTALE, never the new names.
            let walker = &mut o.2;
            let reads =
                walker.ok("n = 0\nfor i in range(300):\n    n += open(M + '/d/x/y/f').read() == 'hello'\nout = n");
            assert_eq!(reads, 300, "{side:?}: committed reads during the renames");
            assert_eq!(walker.run("os.stat(M + '/e')"), Err(libc::ENOENT), "{side:?}: the new name leaked");
            assert_they_see_d(&m, &mut o, &format!("{side:?}, renames uncommitted"));
            // The transaction walks its new names again, others the old.
            assert_eq!(t.ok("out = sorted(os.listdir(M + '/e/w'))"), serde_json::json!(["z"]));
            assert_they_see_d(&m, &mut o, &format!("{side:?}, renames uncommitted, again"));
            end_transaction(t, side, commit);
            if !commit {
                assert_they_see_d(&m, &mut o, &format!("{side:?}, renames aborted"));
            } else {
                let want = m.path("e/w").display().to_string();
                let dweller = &mut o.1;
                assert!(
                    wait_until(Duration::from_secs(10), || dweller.run("out = os.getcwd()")
                        == Ok(serde_json::json!(want))),
                    "{side:?}: after the commit a process in d/x is in e/w: {:?}",
                    dweller.run("out = os.getcwd()")
                );
                assert_eq!(o.2.ok("out = open(M + '/e/w/z/f').read()"), "hello");
                assert_eq!(o.2.run("os.stat(M + '/d')"), Err(libc::ENOENT));
            }
        }
    }
}

/// A directory replaced by a rename (onto an empty one) and both sides of an
/// exchange are the transaction's alone until it commits.
#[test]
fn a_directory_replaced_or_exchanged_stays_whole_for_others() {
    for side in SIDES {
        let m = Mount::with_backing(|b| {
            tree(b);
            std::fs::create_dir_all(b.join("empty")).unwrap();
            std::fs::create_dir_all(b.join("other/in")).unwrap();
        });
        let mut o = outsiders(&m);
        let mut in_empty = Agent::spawn(m.mnt());
        in_empty.ok("os.chdir(M + '/empty')");
        let mut t = in_transaction(&m, side);
        t.ok("os.rename(M + '/d', M + '/empty')");
        t.ok("import ctypes; libc = ctypes.CDLL(None, use_errno=True)");
        let x = t.ok("out = libc.renameat2(-100, (M + '/empty').encode(), -100, (M + '/other').encode(), 2)");
        assert_eq!(x, 0, "{side:?}: RENAME_EXCHANGE");
        assert_eq!(t.ok("out = sorted(os.listdir(M + '/other'))"), serde_json::json!(["g", "x"]));
        assert_they_see_d(&m, &mut o, &format!("{side:?}, replace and exchange uncommitted"));
        let empty = m.path("empty").display().to_string();
        assert_cwd(&mut in_empty, &empty, &format!("{side:?}, in the replaced directory"));
        assert_eq!(in_empty.ok("out = os.listdir('.')"), serde_json::json!([]));
        assert_eq!(o.2.ok("out = sorted(os.listdir(M + '/other'))"), serde_json::json!(["in"]));
        end_transaction(t, side, false);
        assert_they_see_d(&m, &mut o, &format!("{side:?}, replace and exchange aborted"));
        assert_cwd(&mut in_empty, &empty, &format!("{side:?}, in the replaced directory, aborted"));
    }
}
