//! `txfs run -- CMD` (SPEC §1, §2): CMD and all its descendants are one
//! transaction, committed if it exits 0 and aborted otherwise; its exit
//! status is passed through; conflicts are retried.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

const TREE: &str = "mkdir -p a/b/c && echo one > a/b/c/f1 && echo two > a/f2 && printf 'x%.0s' $(seq 1 5000) > big \
                    && ln -s a/f2 sl && mv a/f2 a/f2moved";

#[test]
fn run_commits_on_success_and_aborts_on_failure() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("keep"), "k").unwrap());
    let before = snapshot(m.mnt());

    let out = m.run_cmd(&[], &["sh", "-c", &format!("{TREE} && exit 1")]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "exit status 1 passed through: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(snapshot(m.mnt()), before, "a failed command left something behind");
    assert_eq!(names(m.mnt()), ["keep"]);

    let out = m.run_cmd(&[], &["sh", "-c", &format!("{TREE}; exit 42")]).output().unwrap();
    assert_eq!(out.status.code(), Some(42));
    assert_eq!(snapshot(m.mnt()), before);

    // Killed by a signal: aborted, and 128+signal.
    let out = m.run_cmd(&[], &["sh", "-c", &format!("{TREE} && kill -9 $$")]).output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 9));
    assert_eq!(snapshot(m.mnt()), before);

    let out = m.run_cmd(&[], &["sh", "-c", TREE]).output().unwrap();
    check_ok(&out, "txfs run (exit 0)");
    assert_eq!(names(m.mnt()), ["a", "big", "keep", "sl"]);
    assert_eq!(std::fs::read_to_string(m.path("a/b/c/f1")).unwrap(), "one\n");
    assert_eq!(std::fs::read_to_string(m.path("a/f2moved")).unwrap(), "two\n");
    assert_eq!(std::fs::read(m.path("big")).unwrap(), vec![b'x'; 5000]);
    assert_eq!(std::fs::read_link(m.path("sl")).unwrap().to_str(), Some("a/f2"));
    assert_errno(std::fs::metadata(m.path("a/f2")), libc::ENOENT, "moved away");
    assert_eq!(m.live_txs(), 0);

    // A command that does not exist: 127, nothing changes.
    let out = m.run_cmd(&[], &["/nonexistent/cmd"]).output().unwrap();
    assert_eq!(out.status.code(), Some(127));
}

#[test]
fn run_includes_grandchildren_and_hides_them_until_exit() {
    let m = Mount::new();
    let flag = m.scratch().join("ready");
    let go = m.scratch().join("go");
    // The grandchild writes; the tree waits (outside the mount) until the
    // test has looked.
    let script = format!(
        "sh -c 'sh -c \"echo deep > f\" && mkdir d && echo e > d/e' && touch {} && \
         while [ ! -e {} ]; do sleep 0.02; done",
        flag.display(),
        go.display()
    );
    let mut child = m.run_cmd(&[], &["sh", "-c", &script]).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(60), || flag.exists()), "the tree did not get going");
    assert_errno(std::fs::metadata(m.path("f")), libc::ENOENT, "a grandchild's file, before the tree exits");
    assert_errno(std::fs::metadata(m.path("d")), libc::ENOENT, "a grandchild's dir, before the tree exits");
    assert!(names(m.mnt()).is_empty());
    let out = Command::new("cat").arg("f").current_dir(m.mnt()).output().unwrap();
    assert!(!out.status.success());
    std::fs::write(&go, "").unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(60)).expect("txfs run hung");
    assert!(st.success(), "txfs run: {st}");
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "deep\n");
    assert_eq!(std::fs::read_to_string(m.path("d/e")).unwrap(), "e\n");

    // The same shape failing at the top: the grandchildren's work is undone.
    let out = m.run_cmd(&[], &["sh", "-c", "sh -c 'sh -c \"echo again > g; rm f\"'; exit 3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_errno(std::fs::metadata(m.path("g")), libc::ENOENT, "aborted grandchild");
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "deep\n");
}

#[test]
fn run_works_with_a_static_binary() {
    let m = Mount::new();
    let dir = m.scratch();
    let src = dir.join("st.c");
    std::fs::write(
        &src,
        r#"#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
int main(int argc, char **argv) {
    if (mkdir("sdir", 0755) != 0) return 10;
    int fd = open("sdir/sfile", O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) return 11;
    if (write(fd, "static\n", 7) != 7) return 12;
    if (fsync(fd) != 0) return 13;
    if (close(fd) != 0) return 14;
    return argc > 1 ? 5 : 0;
}
"#,
    )
    .unwrap();
    let bin = dir.join("st");
    let cc = Command::new("cc").arg("-static").arg("-O1").arg("-o").arg(&bin).arg(&src).output();
    match cc {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "NOTE: skipping the static-binary case: cc -static failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            return;
        }
        Err(e) => {
            eprintln!("NOTE: skipping the static-binary case: no cc ({e})");
            return;
        }
    }
    let bin = bin.to_str().unwrap();
    let out = m.run_cmd(&[], &[bin, "fail"]).output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(names(m.mnt()).is_empty(), "a failed static binary left {:?}", names(m.mnt()));
    let out = m.run_cmd(&[], &[bin]).output().unwrap();
    check_ok(&out, "static binary under txfs run");
    assert_eq!(std::fs::read_to_string(m.path("sdir/sfile")).unwrap(), "static\n");
}

#[test]
fn concurrent_runs_of_one_counter_lose_no_update() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("c"), "0\n").unwrap());
    let script = "v=$(cat c); sleep 0.2; echo $((v+1)) > c";
    let mut total_ok = 0u64;
    for round in 0..2 {
        let children: Vec<_> =
            (0..2).map(|_| m.run_cmd(&["--retries", "10"], &["sh", "-c", script]).spawn().unwrap()).collect();
        for mut c in children {
            let st = wait_timeout(&mut c, Duration::from_secs(60)).expect("txfs run hung");
            match st.code() {
                Some(0) => total_ok += 1,
                Some(75) => eprintln!("round {round}: one run ran out of retries (exit 75)"),
                other => panic!(
                    "round {round}: txfs run exited {other:?}: a conflict must make txfs run retry \
                     (or exit 75), even when it surfaced at an operation and made CMD fail"
                ),
            }
        }
        let v: u64 = std::fs::read_to_string(m.path("c")).unwrap().trim().parse().unwrap();
        assert_eq!(v, total_ok, "round {round}: counter {v} after {total_ok} successful increments: a lost update");
    }
    assert!(total_ok >= 3, "with 10 retries nearly all runs should commit ({total_ok} of 4)");
    assert!(m.status()["conflicts"].as_u64().unwrap() >= 1, "no conflict was ever seen: {}", m.status());
    assert_eq!(m.live_txs(), 0);
}

#[test]
fn run_includes_every_thread_of_a_process() {
    let m = Mount::new();
    let py = "import threading, sys\n\
              def w(i):\n    open('t%d' % i, 'w').write('thread %d' % i)\n\
              ts = [threading.Thread(target=w, args=(i,)) for i in range(8)]\n\
              [t.start() for t in ts]; [t.join() for t in ts]\n\
              sys.exit(int(sys.argv[1]))";
    let out = m.run_cmd(&[], &[python(), "-c", py, "4"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(names(m.mnt()).is_empty(), "threads' files survived an abort: {:?}", names(m.mnt()));
    let out = m.run_cmd(&[], &[python(), "-c", py, "0"]).output().unwrap();
    check_ok(&out, "threads under txfs run");
    assert_eq!(names(m.mnt()).len(), 8);
    assert_eq!(std::fs::read_to_string(m.path("t5")).unwrap(), "thread 5");
}

/// Deterministic form of the conflict above: CMD reads the counter, another
/// writer commits a new value, then CMD writes. The conflict surfaces at the
/// write (EDEADLK, so `sh` fails); `txfs run` must see that its transaction
/// was doomed and rerun CMD, not pass the shell's failure through.
#[test]
fn run_retries_when_the_conflict_hits_an_operation() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("c"), "0\n").unwrap());
    let ready = m.scratch().join("ready");
    let go = m.scratch().join("go");
    let script = format!(
        "v=$(cat c); touch {r}; while [ ! -e {g} ]; do sleep 0.01; done; echo $((v+1)) > c",
        r = ready.display(),
        g = go.display()
    );
    let mut child =
        m.run_cmd(&["--retries", "3"], &["sh", "-c", &script]).stderr(std::process::Stdio::piped()).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(60), || ready.exists()), "CMD did not start");
    std::fs::write(m.path("c"), "10\n").unwrap(); // another writer commits
    std::fs::write(&go, "").unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(60)).expect("txfs run hung");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(st.code(), Some(0), "txfs run did not retry after a conflict at an operation; stderr:\n{err}");
    assert_eq!(std::fs::read_to_string(m.path("c")).unwrap(), "11\n");
}

/// As root, `txfs run` mounts the transaction's own view over the mount
/// point in a private mount namespace (DESIGN §9): the command's working
/// directory and paths resolve through it, nobody else sees it, and
/// `TXFS_RUN_VIEW=0` falls back to attribution by process tree with the
/// same effect.
#[test]
fn run_serves_a_transaction_view_and_falls_back_without_it() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("old"), "o").unwrap());
    let outside_dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(m.mnt()).unwrap());
    let script = format!(
        "grep -c ' fuse.txfs-view ' /proc/self/mountinfo; stat -c %d . {mnt}; echo x > v; cat v old; rm old; \
         ls {mnt}",
        mnt = m.mnt().display()
    );
    for (view, name) in [(true, "v"), (false, "v")] {
        let mut c = m.run_cmd(&[], &["sh", "-c", &script]);
        if !view {
            c.env("TXFS_RUN_VIEW", "0");
        }
        let out = c.output().unwrap();
        check_ok(&out, "txfs run");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], if view { "1" } else { "0" }, "view={view}: mounts of the view: {text}");
        let (cwd_dev, mnt_dev): (u64, u64) = (lines[1].parse().unwrap(), lines[2].parse().unwrap());
        assert_eq!(cwd_dev, mnt_dev, "view={view}: the working directory resolves like the mount point");
        assert_eq!(mnt_dev != outside_dev, view, "view={view}: the command's mount point device");
        assert_eq!(&lines[3..], ["x", &format!("o{name}")], "view={view}: the command sees its own changes");
        assert_eq!(names(m.mnt()), [name], "view={view}: committed");
        assert_eq!(std::fs::read_to_string(m.path("v")).unwrap(), "x\n");
        // Put it back for the next round.
        std::fs::write(m.path("old"), "o").unwrap();
        std::fs::remove_file(m.path("v")).unwrap();
    }
    assert!(m.log_text().contains("serving a transaction view"), "the daemon log says so");
    // In the view even a shared writable mapping is the transaction's: the
    // kernel writes it back through the view before the command's last
    // process is gone (here: no msync, no munmap, _exit).
    std::fs::write(m.path("mm"), "aaaaaaaa").unwrap();
    let py = "import mmap, os, sys\nfd = os.open('mm', os.O_RDWR)\nm = mmap.mmap(fd, 8)\nm[0:4] = b'BBBB'\n\
              os._exit(int(sys.argv[1]))";
    for (code, want) in [(1, "aaaaaaaa"), (0, "BBBBaaaa")] {
        let out = m.run_cmd(&[], &[python(), "-c", py, &code.to_string()]).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read_to_string(m.path("mm")).unwrap(), want, "mapping written, exit {code}");
    }
    // The view is gone with the command: no mount left behind anywhere.
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mi.contains("fuse.txfs-view"), "a transaction view leaked into the test's namespace");
    assert_eq!(m.live_txs(), 0);
}

/// A daemon that serves no views (older than views, or TXFS_NO_VIEWS=1)
/// takes RUN_BEGIN with the view flag as a plain tree transaction. `txfs
/// run` must notice (the kernel's INIT is still unread), take the view
/// away and run the command on the shared mount — not leave it waiting for
/// an INIT nobody answers (seen once: a hung `chdir`).
#[test]
fn run_falls_back_when_the_daemon_does_not_serve_the_view() {
    let mut m = Mount::new();
    m.restart_with_env("TXFS_NO_VIEWS", "1");
    let mut child = m
        .run_cmd(&[], &["sh", "-c", "grep -c ' fuse.txfs-view ' /proc/self/mountinfo; echo made > f; cat f"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(60)).expect("txfs run hung on an unserved view");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(st.success(), "txfs run: {st}: {out}");
    assert_eq!(out, "0\nmade\n", "no view left mounted, the command ran as a transaction");
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "made\n");
    assert!(!m.log_text().contains("serving a transaction view"));
    assert_eq!(m.live_txs(), 0);
}

/// The run's own output goes through a descriptor opened outside it (the
/// shell's redirection: the shared mount, attributed by process tree),
/// while the run reads the same file through its view. The view must not
/// answer from what it cached before the write (size, pages, names).
#[test]
fn a_view_sees_what_its_run_wrote_through_the_shared_mount() {
    let m = Mount::new();
    let log = std::fs::File::create(m.path("log")).unwrap();
    let script = format!(
        "echo one; wc -c < {log} >&2; ls {mnt} >&2; echo two; wc -c < {log} >&2; cat {log} >&2",
        log = m.path("log").display(),
        mnt = m.mnt().display()
    );
    let out = m.run_cmd(&[], &["sh", "-c", &script]).stdout(log).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().map(str::trim).collect();
    assert_eq!(lines, ["4", "log", "8", "one", "two"], "what the view saw");
    assert_eq!(std::fs::read_to_string(m.path("log")).unwrap(), "one\ntwo\n");
}

/// A view's kernel opens files without asking the daemon (no OPEN or
/// RELEASE per open(2)/close(2): file handle 0). Everything a handle did
/// must still hold: a file the command removes stays readable through the
/// descriptor it holds, O_APPEND appends, a write is read back through
/// another descriptor and after reopening, `ls -l` of a directory listed
/// with attributes shows what the command just changed — and the removed
/// file is gone from the backing directory after the commit, not kept as an
/// orphan.
#[test]
fn a_view_opens_files_without_handles_and_loses_nothing() {
    let mut m = Mount::with_backing(|b| {
        std::fs::write(b.join("keep"), "kept bytes").unwrap();
        std::fs::create_dir(b.join("d")).unwrap();
        for i in 0..300 {
            std::fs::write(b.join(format!("d/f{i:03}")), format!("{i}")).unwrap();
        }
    });
    let py = r#"
import os, subprocess
fd = os.open('keep', os.O_RDONLY)
assert os.read(fd, 4) == b'kept'
os.unlink('keep')
assert not os.path.exists('keep')
assert os.read(fd, 100) == b' bytes', 'read after unlink'
os.close(fd)
for part in (b'one ', b'two'):
    a = os.open('log', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(a, part)
    os.close(a)
w = os.open('d/f007', os.O_RDWR)
r = os.open('d/f007', os.O_RDONLY)
os.pwrite(w, b'SEVEN', 0)
assert os.pread(r, 10, 0) == b'SEVEN', 'read through another descriptor'
os.close(w); os.close(r)
with open('d/f007', 'rb') as f: assert f.read() == b'SEVEN'
with open('d/f008', 'r+b') as f: f.truncate(0)
os.unlink('d/f009')
ls = subprocess.run(['ls', '-l', 'd'], capture_output=True, text=True, check=True).stdout
sizes = {l.split()[-1]: int(l.split()[4]) for l in ls.splitlines()[1:]}
assert len(sizes) == 299 and 'f009' not in sizes, len(sizes)
assert (sizes['f007'], sizes['f008'], sizes['f010']) == (5, 0, 2), sizes
print('ok')
"#;
    let out = m.run_cmd(&[], &[python(), "-c", py]).output().unwrap();
    let text = check_ok(&out, "python under txfs run");
    assert_eq!(text.trim(), "ok");
    assert!(m.log_text().contains("serving a transaction view"), "ran in a view");
    assert!(!m.path("keep").exists());
    assert_eq!(std::fs::read_to_string(m.path("log")).unwrap(), "one two");
    assert_eq!(std::fs::read_to_string(m.path("d/f007")).unwrap(), "SEVEN");
    assert_eq!(std::fs::read_to_string(m.path("d/f008")).unwrap(), "");
    assert!(!m.path("d/f009").exists());
    assert_eq!(names(&m.path("d")).len(), 299);
    assert_eq!(m.live_txs(), 0);
    // The removed file was closed when the transaction ended: no orphan
    // keeps it.
    m.umount_clean();
    let orphans = m.backing().join(".txfs/orphans");
    let left = std::fs::read_dir(&orphans).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "orphans left in {}", orphans.display());
    assert!(!m.backing().join("keep").exists());
}

/// A random walk of file operations in one `txfs run` (its view: files
/// opened without handles, listings with attributes, cached attributes),
/// each checked against a model inside the run, then the committed result
/// checked from outside. Seeds are fixed, so a failure replays.
#[test]
fn a_random_walk_in_a_view_matches_its_model() {
    let py = r#"
import os, random, sys, json, mmap
rng = random.Random(int(sys.argv[1]))
model = {}
for n in sorted(os.listdir('.')):
    with open(n, 'rb') as f: model[n] = f.read()
names = ['a', 'b', 'c', 'd', 'e']
fds = {}
for step in range(1500):
    op = rng.choice(['pwrite', 'append', 'trunc', 'read', 'mmap', 'stat', 'unlink', 'rename', 'ls', 'open', 'close'])
    n = rng.choice(names)
    where = f'step {step} {op} {n}'
    if op == 'open' and n in model and n not in fds:
        fds[n] = os.open(n, os.O_RDWR)
    elif op == 'close' and n in fds:
        os.close(fds.pop(n))
    elif op == 'pwrite':
        off, data = rng.randrange(0, 20000), bytes([rng.randrange(97, 123)]) * rng.randrange(1, 9000)
        fd = fds.get(n) or os.open(n, os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(fd, data, off)
        if n not in fds: os.close(fd)
        old = model.get(n, b'')
        old = old + b'\0' * max(0, off - len(old))
        model[n] = old[:off] + data + old[off + len(data):]
    elif op == 'append':
        data = bytes([rng.randrange(65, 91)]) * rng.randrange(1, 5000)
        fd = os.open(n, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, data); os.close(fd)
        model[n] = model.get(n, b'') + data
    elif op == 'trunc' and n in model:
        size = rng.randrange(0, 30000)
        os.truncate(n, size)
        model[n] = model[n][:size] + b'\0' * max(0, size - len(model[n]))
    elif op == 'read' and n in model:
        fd = fds.get(n) or os.open(n, os.O_RDONLY)
        off = rng.randrange(0, len(model[n]) + 10)
        got = os.pread(fd, 70000, off)
        if n not in fds: os.close(fd)
        assert got == model[n][off:], f'{where}: read {len(got)} bytes at {off}'
    elif op == 'mmap' and model.get(n):
        with open(n, 'rb') as f:
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                assert m[:] == model[n], f'{where}: mapping'
    elif op == 'stat':
        if n in model:
            assert os.stat(n).st_size == len(model[n]), f'{where}: size'
        else:
            assert not os.path.exists(n), f'{where}: exists'
    elif op == 'unlink' and n in model:
        os.unlink(n); del model[n]
        if n in fds:
            os.close(fds.pop(n))
    elif op == 'rename' and n in model:
        to = rng.choice(names)
        if to != n:
            os.rename(n, to); model[to] = model.pop(n)
            for k in (n, to):
                if k in fds: os.close(fds.pop(k))
    elif op == 'ls':
        sizes = {e.name: e.stat().st_size for e in os.scandir('.')}
        assert sizes == {k: len(v) for k, v in model.items()}, f'{where}: listing {sizes}'
for fd in fds.values(): os.close(fd)
print(json.dumps({k: v.hex() for k, v in model.items()}))
"#;
    for seed in 1..=4 {
        let m = Mount::new();
        std::fs::write(m.path("a"), "seeded").unwrap();
        let out = m.run_cmd(&[], &[python(), "-c", py, &seed.to_string()]).output().unwrap();
        let text = check_ok(&out, &format!("seed {seed}"));
        let want: std::collections::BTreeMap<String, String> = serde_json::from_str(text.trim()).unwrap();
        let mut got = std::collections::BTreeMap::new();
        for n in names(m.mnt()) {
            got.insert(n.clone(), hex(&std::fs::read(m.path(&n)).unwrap()));
        }
        assert_eq!(got, want, "seed {seed}: committed state");
        assert!(m.log_text().contains("serving a transaction view"), "seed {seed}: ran in a view");
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Story: a supervisor (systemd, `timeout`, a test harness) stops
/// `txfs run` with SIGTERM. Its command must stop too and the transaction
/// abort — not `txfs run` dying alone while the command runs on, orphaned,
/// in a view whose transaction is gone (found in the benchmark: every run
/// left five `sleep 3600`s behind).
#[test]
fn sigterm_to_txfs_run_stops_the_command_and_aborts() {
    let m = Mount::new();
    let pidfile = m.scratch().join("cmd.pid");
    let script = format!("echo $$ > {}; echo x > f; exec sleep 60", pidfile.display());
    let mut run = m.run_cmd(&[], &["sh", "-c", &script]).spawn().unwrap();
    let pid_of_cmd = || std::fs::read_to_string(&pidfile).ok()?.trim().parse::<i32>().ok();
    assert!(wait_until(Duration::from_secs(60), || pid_of_cmd().is_some() && m.live_txs() == 1), "the command runs");
    let cmd_pid = pid_of_cmd().unwrap();
    // SAFETY: plain kill of our child.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let st = wait_timeout(&mut run, Duration::from_secs(60)).expect("txfs run ended after SIGTERM");
    assert_eq!(st.code(), Some(128 + libc::SIGTERM), "exit status says the command was terminated: {st}");
    // SAFETY: probing a pid.
    let alive = unsafe { libc::kill(cmd_pid, 0) } == 0
        && std::fs::read_to_string(format!("/proc/{cmd_pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
    assert!(!alive, "the command outlived txfs run");
    assert!(wait_until(Duration::from_secs(60), || m.live_txs() == 0), "the transaction ended");
    assert_errno(std::fs::metadata(m.path("f")), libc::ENOENT, "aborted: nothing of the command survived");
}

/// A daemon serves one view per `txfs run` for as long as it lives: each
/// must give back what it took. Before: every view left its ring threads'
/// eventfds and /dev/fuse clones open (5 descriptors per run) and its
/// 16 MiB request buffers resident with the allocator (a daemon kept
/// 100–170 MiB after 10–30 runs). Views use FUSE over io_uring when the
/// kernel offers it, as the shared mount does. The memory is measured by
/// the timing tier (tests/timing.rs, `many_views_give_back_memory`).
#[test]
fn many_views_give_back_descriptors_and_threads() {
    let m = Mount::new();
    let pid = m.daemon_pid().expect("daemon");
    let count = |what: &str| std::fs::read_dir(format!("/proc/{pid}/{what}")).unwrap().count();
    // Each run writes 4 MiB in 1 MiB writes through its view (the request
    // buffers are touched) and reads it back.
    let script = "dd if=/dev/zero of=f bs=1M count=4 status=none && cat f > /dev/null";
    let run = || check_ok(&m.run_cmd(&[], &["sh", "-c", script]).output().unwrap(), "txfs run");
    run();
    let settle = |fds: usize, threads: usize| {
        wait_until(Duration::from_secs(60), || count("fd") <= fds && count("task") <= threads)
    };
    settle(usize::MAX, usize::MAX);
    std::thread::sleep(Duration::from_millis(300));
    let (fds, threads) = (count("fd"), count("task"));
    for _ in 0..20 {
        run();
    }
    let settled = settle(fds + 2, threads);
    let (fds2, threads2) = (count("fd"), count("task"));
    assert!(settled, "after 20 views: descriptors {fds} → {fds2}, threads {threads} → {threads2}");
    assert!(m.log_text().contains("serving a transaction view"), "ran in views");
    // Views use the ring exactly when the shared mount got it (io_uring can
    // be refused even where the module offers it: seccomp, io_uring_disabled).
    let uring = m.log_text().contains("requests arrive over io_uring");
    assert_eq!(
        m.log_text().contains("serving a transaction view over io_uring"),
        uring,
        "views use io_uring exactly when the kernel offers it"
    );
    assert_eq!(m.live_txs(), 0);
}

/// `txfs status`: whether the kernel may cache, and LOOKUP + GETATTR
/// requests the daemon served so far.
fn kernel_cache(m: &Mount) -> (bool, u64) {
    let s = m.status();
    let open = s["kernel_cache_open"].as_u64().expect("kernel_cache_open") == 1;
    (open, s["lookup_getattr_requests"].as_u64().expect("lookup_getattr_requests"))
}

/// The gate opens only on kernels with FUSE_NOTIFY_INC_EPOCH (6.16+).
fn gate_works(m: &Mount) -> bool {
    let open = kernel_cache(m).0;
    if !open {
        eprintln!("skipped: the kernel never caches on this mount (no FUSE_NOTIFY_INC_EPOCH)");
    }
    open
}

/// Starts `sh -c SCRIPT` under `txfs run` (a view: the tests run as
/// root) with no descriptor on the mount, and waits until the script has
/// touched `ready` in the scratch directory; it then waits for `go`.
fn start_waiting_run(m: &Mount, script: &str) -> (Reaped, std::path::PathBuf) {
    start_waiting_run_after(m, script, None)
}

/// As [`start_waiting_run`], but ready as soon as the script has begun
/// waiting for `first` (when given) instead of after the whole script.
fn start_waiting_run_after(m: &Mount, script: &str, first: Option<&std::path::Path>) -> (Reaped, std::path::PathBuf) {
    let (ready, go) = (m.scratch().join("ready"), m.scratch().join("go"));
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&go);
    let mut script = format!(
        "{script}; touch {ready}; while [ ! -e {go} ]; do sleep 0.02; done",
        ready = ready.display(),
        go = go.display()
    );
    if let Some(first) = first {
        // The script waits for `first` right after its first command.
        let wait = format!("while [ ! -e {} ]", first.display());
        script = script.replacen(&wait, &format!("touch {} && {wait}", ready.display()), 1);
    }
    let child = m
        .run_cmd(&[], &["sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = Reaped(child, first.into_iter().map(|f| f.to_path_buf()).chain([go.clone()]).collect());
    assert!(wait_until(Duration::from_secs(60), || ready.exists()), "the run never got ready");
    (child, go)
}

/// A waiting run that a failed assertion must not leave behind: the files
/// it may wait for are written when dropped.
struct Reaped(std::process::Child, Vec<std::path::PathBuf>);

impl Drop for Reaped {
    fn drop(&mut self) {
        for f in &self.1 {
            let _ = std::fs::write(f, "");
        }
        let _ = wait_timeout(&mut self.0, Duration::from_secs(60));
    }
}

/// A `txfs run` whose command can reach the shared mount only through its
/// view (no inherited descriptor, root or uncovered mount of it) leaves the
/// kernel caching there for everyone else (bench W8 "beside a live `txfs
/// run`": 0.37× before): plain stats beside it are answered by the kernel
/// and show the committed state. Its commit drops what was cached before
/// anyone can read on: right after `txfs run` returns, a plain reader whose
/// kernel cached the old answers a moment ago (well within their TTL) sees
/// the new size, the new directory and no removed file.
#[test]
fn a_run_with_only_its_view_leaves_the_shared_mount_cached() {
    let m = Mount::with_backing(|b| {
        std::fs::write(b.join("f"), "old\n").unwrap();
        std::fs::write(b.join("gone"), "x").unwrap();
    });
    if !gate_works(&m) {
        return;
    }
    let (mut child, go) = start_waiting_run(&m, "echo newer > f && mkdir d && rm gone");
    let (open, before) = kernel_cache(&m);
    assert!(open, "a run with its own view shut the shared mount's cache");
    for _ in 0..200 {
        assert_eq!(std::fs::metadata(m.path("f")).unwrap().len(), 4, "the run's uncommitted size leaked");
        assert!(std::fs::metadata(m.path("gone")).is_ok(), "the run's uncommitted removal leaked");
    }
    let asked = kernel_cache(&m).1 - before;
    assert!(asked < 40, "400 plain stats beside a run took {asked} LOOKUP/GETATTR requests: not cached");
    assert_errno(std::fs::metadata(m.path("d")), libc::ENOENT, "the run's uncommitted mkdir");
    // A fresh answer, cached for a whole TTL from here.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(std::fs::metadata(m.path("f")).unwrap().len(), 4);
    assert!(std::fs::metadata(m.path("gone")).is_ok());
    std::fs::write(&go, "").unwrap();
    let status = wait_timeout(&mut child.0, Duration::from_secs(60)).expect("the run ends");
    assert!(status.success(), "txfs run: {status}");
    assert_eq!(std::fs::metadata(m.path("f")).unwrap().len(), 6, "stale size after the run's commit");
    assert_errno(std::fs::metadata(m.path("gone")), libc::ENOENT, "stale entry after the run's commit");
    assert!(m.path("d").is_dir());
    assert!(kernel_cache(&m).0, "the cache stayed shut after the run");
    assert_eq!(m.live_txs(), 0);
}

/// A run that can reach the shared mount other than through its view keeps
/// the kernel from caching there, as any transaction does: its output
/// redirected to a file on the mount (an inherited descriptor), or a
/// request of its that arrives there anyway (here through another
/// process's working directory in /proc), which shuts the gate at once —
/// and is answered in the run's own view.
#[test]
fn a_run_that_can_reach_the_shared_mount_shuts_its_cache() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("f"), "old\n").unwrap());
    if !gate_works(&m) {
        return;
    }
    let log = std::fs::File::create(m.path("log")).unwrap();
    let go = m.scratch().join("go0");
    let script = format!("while [ ! -e {} ]; do sleep 0.02; done; echo one", go.display());
    let child = m.run_cmd(&[], &["sh", "-c", &script]).stdout(log).spawn().unwrap();
    let mut child = Reaped(child, vec![go.clone()]);
    assert!(wait_until(Duration::from_secs(60), || m.live_txs() == 1));
    // Before it wrote anything there: its descriptor alone shuts the cache.
    assert!(!kernel_cache(&m).0, "a run holding an inherited descriptor on the mount left the cache open");
    std::fs::write(&go, "").unwrap();
    assert!(wait_timeout(&mut child.0, Duration::from_secs(60)).expect("the run ends").success());
    assert_eq!(std::fs::read_to_string(m.path("log")).unwrap(), "one\n");
    assert!(kernel_cache(&m).0);

    // A process outside the run whose working directory is the mount.
    let outsider = Command::new("sleep").arg("600").current_dir(m.mnt()).spawn().unwrap();
    let outsider = Killed(outsider);
    let (step, seen) = (m.scratch().join("step"), m.scratch().join("seen"));
    let script = format!(
        "echo mine > f && while [ ! -e {step} ]; do sleep 0.02; done && cat /proc/{pid}/cwd/f > {seen}",
        step = step.display(),
        pid = outsider.0.id(),
        seen = seen.display()
    );
    let (mut child, go) = start_waiting_run_after(&m, &script, Some(&step));
    assert!(kernel_cache(&m).0, "open before the run's first request to the shared mount");
    std::fs::write(&step, "").unwrap();
    // Its output, not its creation: the shell creates `seen` before cat runs.
    assert!(wait_until(Duration::from_secs(60), || std::fs::read(&seen).is_ok_and(|b| !b.is_empty())));
    assert!(!kernel_cache(&m).0, "a request of the run reached the shared mount and left the cache open");
    std::fs::write(&go, "").unwrap();
    assert!(wait_timeout(&mut child.0, Duration::from_secs(60)).expect("the run ends").success());
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "mine\n", "the run read the shared mount outside its view");
    drop(outsider);
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "mine\n");
    assert!(kernel_cache(&m).0);
}

/// A helper process killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process inside a run that begins and aborts through its view ends the
/// run's transaction there (an abort dooms the whole tree), but the view's
/// gate is not the shared one, which still names the run as leaving it
/// open. Two thread transactions then overlap on the shared mount: when
/// the first ends, the second must keep the cache shut (a reopen by count
/// — one live, one named — reopened it, and the second's path walks went
/// to the kernel's cache, outside its read set).
#[test]
fn a_run_aborted_inside_its_view_does_not_reopen_the_cache_under_others() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("f"), "x").unwrap());
    if !gate_works(&m) {
        return;
    }
    let abort = format!(
        "{py} -c 'import fcntl, os; fd = os.open(\".\", os.O_RDONLY); fcntl.ioctl(fd, {IOC_BEGIN}, bytes(8)); \
         fcntl.ioctl(fd, {IOC_ABORT}, bytes(8))'",
        py = python()
    );
    let (mut child, go) = start_waiting_run(&m, &abort);
    assert_eq!(m.live_txs(), 0, "the abort inside the view ended the run's transaction");
    let mut agent = Agent::spawn(m.mnt());
    agent.ok(&format!("fd = os.open(M, os.O_RDONLY); fcntl.ioctl(fd, {IOC_BEGIN}, bytes(8)); out = 0"));
    m.begin().unwrap();
    assert!(!kernel_cache(&m).0);
    m.commit().unwrap();
    assert!(!kernel_cache(&m).0, "the cache reopened while another thread's transaction was live");
    agent.ok(&format!("fcntl.ioctl(fd, {IOC_COMMIT}, bytes(8)); os.close(fd); out = 0"));
    std::fs::write(&go, "").unwrap();
    let _ = wait_timeout(&mut child.0, Duration::from_secs(60)).expect("the run ends");
    assert!(kernel_cache(&m).0, "the cache stayed shut after everything ended");
    assert_eq!(m.live_txs(), 0);
}

/// A run started in a directory of the mount that was removed meanwhile
/// cannot enter it through its view: its working directory stays on the
/// shared mount, so the child tells the daemon (a request there) before it
/// runs the command, and the kernel stops caching while the run lives.
#[test]
fn a_run_left_on_the_shared_mount_by_its_working_directory_shuts_the_cache() {
    let m = Mount::new();
    if !gate_works(&m) {
        return;
    }
    std::fs::create_dir(m.path("dd")).unwrap();
    let (ready, go) = (m.scratch().join("ready"), m.scratch().join("go"));
    let inner = format!("touch {}; while [ ! -e {} ]; do sleep 0.02; done", ready.display(), go.display());
    let script = format!(
        "cd {dd} && rmdir {dd} && exec {txfs} run --mount {mnt} -- sh -c '{inner}'",
        dd = m.path("dd").display(),
        txfs = env!("CARGO_BIN_EXE_txfs"),
        mnt = m.mnt().display()
    );
    let child = Command::new("sh").arg("-c").arg(&script).stdin(std::process::Stdio::null()).spawn().unwrap();
    let mut child = Reaped(child, vec![go.clone()]);
    assert!(wait_until(Duration::from_secs(60), || ready.exists()), "the run never got ready");
    assert!(!kernel_cache(&m).0, "a run whose working directory stayed on the shared mount left the cache open");
    std::fs::write(&go, "").unwrap();
    assert!(wait_timeout(&mut child.0, Duration::from_secs(60)).expect("the run ends").success());
    assert!(kernel_cache(&m).0);
}
