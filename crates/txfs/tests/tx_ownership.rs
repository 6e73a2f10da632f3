//! Who a transaction belongs to (issue 23, items 2, 5 and 6): one live
//! thread or process tree with the credentials it began with, proven on
//! every request (`fuse/mod.rs`, `attribution/txmap.rs`).
//!
//! * A thread or process that gets a dead owner's id never joins, reads or
//!   commits its transaction; its own writes are plain and stay.
//! * A `txfs run` owner's pid reused by another process cannot end the tree.
//! * A setuid program executed inside a transaction runs outside it.
//! * `BEGIN_FILE` answers a file's bytes only on a readable descriptor, to
//!   a caller allowed to read the file.
//!
//! Pid reuse is steered as root with /proc/sys/kernel/ns_last_pid; other
//! processes of the machine may take the pid first, so each case is tried
//! until the pid lands (a round where it does not proves nothing and is
//! retried).
mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::time::Duration;

const NOBODY: u32 = 65534;

/// A mount for two users: `pub` is writable by everyone.
fn shared_mount() -> Mount {
    Mount::start_with(&["allow_other"], |b| {
        std::fs::create_dir(b.join("pub")).unwrap();
        std::fs::set_permissions(b.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    })
}

/// An agent running as nobody.
fn nobody_agent(m: &Mount) -> Agent {
    let mut cmd = std::process::Command::new(python());
    cmd.uid(NOBODY).gid(NOBODY);
    Agent::spawn_cmd(cmd, m.mnt())
}

/// Python, in an agent: `newcomer(code)` forks a child that gets pid
/// `want` if the test steered it there, runs `code` (which sets `r`, a
/// dict) and sends back `r`; answers the child's pid and `r`.
const NEWCOMER: &str = r#"
def newcomer(code):
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        env = dict(g)
        env['r'] = {}
        try:
            exec(code, env)
        except OSError as e:
            env['r']['oserror'] = e.errno
        os.write(wr, json.dumps(env['r']).encode())
        os._exit(0)
    os.close(wr)
    data = b''
    while True:
        chunk = os.read(rd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(rd)
    os.waitpid(pid, 0)
    return [pid, json.loads(data)]
def ioc(cmd, arg):
    fd = os.open(M, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, cmd, arg)
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
"#;

/// Makes the next pid the kernel hands out `pid` (if nobody else takes it).
fn steer_next_pid(pid: u32) {
    std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1)).expect("ns_last_pid (root only)");
}

/// A process whose thread transaction holds an uncommitted file dies; a
/// process of another user that gets its pid right after does not see the
/// file, cannot commit the transaction, and its own writes are plain and
/// stay. Fails without the check on every request (the reaper alone comes
/// up to 250 ms late).
#[test]
fn a_dead_threads_transaction_is_never_joined_by_a_process_with_its_id() {
    let m = shared_mount();
    let mut nobody = nobody_agent(&m);
    nobody.ok(&format!("g = globals()\n{NEWCOMER}"));
    let mut landed = 0;
    for round in 0..200 {
        if landed == 3 {
            break;
        }
        let mut owner = Agent::spawn(m.mnt());
        let dead = owner.pid();
        owner.ok("fd = os.open(M, os.O_RDONLY | os.O_DIRECTORY); fcntl.ioctl(fd, 0x4008e701, bytes(8))
open(M + '/pub/secret', 'w').write('uncommitted')
out = 0");
        assert!(!m.path("pub/secret").exists(), "uncommitted files are invisible to others");
        owner.kill();
        steer_next_pid(dead);
        let code = "r['seen'] = os.path.exists(M + '/pub/secret')
with open(M + '/pub/mine', 'w') as f:
    f.write('plain')
r['commit'] = ioc(0x4008e702, bytes(8))
r['abort'] = ioc(0x4008e703, bytes(8))";
        let v = nobody.ok(&format!("out = newcomer({code:?})"));
        let got = v[0].as_u64().unwrap() as u32;
        if got != dead {
            eprintln!("round {round}: the pid went elsewhere ({got}, not {dead}); again");
            let _ = std::fs::remove_file(m.path("pub/mine"));
            assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0));
            continue;
        }
        landed += 1;
        let r = &v[1];
        assert_eq!(r.get("oserror"), None, "the newcomer's own requests work: {r}");
        assert_eq!(r["seen"], false, "the newcomer saw the dead thread's uncommitted file: {r}");
        assert_eq!(r["commit"], libc::EINVAL, "COMMIT by the newcomer: not in a transaction ({r})");
        assert_eq!(r["abort"], libc::EINVAL, "ABORT by the newcomer: not in a transaction ({r})");
        assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0), "the dead owner's transaction is aborted");
        assert!(!m.path("pub/secret").exists(), "the dead owner's file was never committed");
        assert_eq!(std::fs::read_to_string(m.path("pub/mine")).unwrap(), "plain", "the newcomer's write stays");
        assert_eq!(std::fs::metadata(m.path("pub/mine")).unwrap().uid(), NOBODY);
        std::fs::remove_file(m.path("pub/mine")).unwrap();
    }
    assert_eq!(landed, 3, "the steered pid never landed");
}

/// A thread that began a transaction exits and a new thread of the same
/// process gets its id (thread ids of a process are reused as any pid):
/// the new thread is outside the transaction.
#[test]
fn a_new_thread_with_a_dead_threads_id_is_outside_its_transaction() {
    let m = shared_mount();
    let mut a = Agent::spawn(m.mnt());
    a.ok(r#"
import threading, ctypes
libc = ctypes.CDLL(None, use_errno=True)
def in_thread(f):
    box = {}
    def run():
        box['tid'] = threading.get_native_id()
        box['r'] = f()
    t = threading.Thread(target=run); t.start(); t.join()
    return box
def begin_and_write():
    fd = os.open(M, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.ioctl(fd, 0x4008e701, bytes(8))
    open(M + '/pub/secret2', 'w').write('uncommitted')
    os.close(fd)
def look():
    r = {'seen': os.path.exists(M + '/pub/secret2')}
    open(M + '/pub/mine2', 'w').write('plain')
    return r
out = 0
"#);
    let mut landed = false;
    for round in 0..200 {
        let dead = a.ok("out = in_thread(begin_and_write)['tid']").as_u64().unwrap() as u32;
        steer_next_pid(dead);
        let v = a.ok("out = in_thread(look)");
        if v["tid"].as_u64().unwrap() as u32 != dead {
            eprintln!("round {round}: the thread id went elsewhere; again");
            let _ = std::fs::remove_file(m.path("pub/mine2"));
            assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0));
            continue;
        }
        assert_eq!(v["r"]["seen"], false, "a new thread saw the dead thread's uncommitted file");
        assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0), "the dead thread's transaction is aborted");
        assert!(!m.path("pub/secret2").exists());
        assert_eq!(std::fs::read_to_string(m.path("pub/mine2")).unwrap(), "plain", "the new thread's write stays");
        landed = true;
        break;
    }
    assert!(landed, "the steered thread id never landed");
}

/// A `txfs run`-style owner registers a child's tree, the tree writes a
/// file, the owner dies; a process of another user that gets the owner's
/// pid cannot commit (or abort) the tree: refused, and the tree's file is
/// never committed.
#[test]
fn run_commit_and_run_abort_from_a_reused_owner_pid_are_refused() {
    let m = shared_mount();
    let mut nobody = nobody_agent(&m);
    nobody.ok(&format!("g = globals()\n{NEWCOMER}"));
    let mut landed = 0;
    for round in 0..200 {
        if landed == 2 {
            break;
        }
        let mut owner = Agent::spawn(m.mnt());
        let dead = owner.pid();
        // The owner forks a child that waits for the go-ahead, makes it a
        // tree transaction, and the child writes a file in it.
        let child = owner
            .ok(r#"
go_r, go_w = os.pipe(); done_r, done_w = os.pipe()
child = os.fork()
if child == 0:
    os.read(go_r, 1)
    open(M + '/pub/tree', 'w').write('uncommitted')
    os.write(done_w, b'x')
    os.read(go_r, 1)
    os._exit(0)
fd = os.open(M, os.O_RDONLY | os.O_DIRECTORY)
fcntl.ioctl(fd, 0x4010e705, struct.pack('IIII', child, 1, 0, 0))
os.write(go_w, b'x'); os.read(done_r, 1)
out = child
"#)
            .as_u64()
            .unwrap() as u32;
        assert!(!m.path("pub/tree").exists());
        owner.kill();
        steer_next_pid(dead);
        let op = if landed == 0 { 2 } else { 3 };
        let code = format!("r['end'] = ioc(0x4010e705, struct.pack('IIII', {child}, {op}, 0, 0))");
        let v = nobody.ok(&format!("out = newcomer({code:?})"));
        // SAFETY: a signal to the child of the dead owner (orphaned).
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
        if v[0].as_u64().unwrap() as u32 != dead {
            eprintln!("round {round}: the pid went elsewhere; again");
            assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0));
            continue;
        }
        landed += 1;
        let e = v[1]["end"].as_i64().unwrap() as i32;
        assert!(e == libc::EPERM || e == libc::ENOENT, "RUN op {op} from a reused owner pid: {}", errname(e));
        assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0), "the dead owner's tree is aborted");
        assert!(!m.path("pub/tree").exists(), "the tree's file was committed by another process");
    }
    assert_eq!(landed, 2, "the steered pid never landed");
}

/// A copy of tee, setuid root, in the scratch directory.
fn setuid_tee(m: &Mount) -> std::path::PathBuf {
    let dir = m.scratch();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tee = dir.join("suid-tee");
    let src = ["/usr/bin/tee", "/bin/tee"].into_iter().find(|p| std::path::Path::new(p).exists()).expect("tee");
    std::fs::copy(src, &tee).unwrap();
    std::fs::set_permissions(&tee, std::fs::Permissions::from_mode(0o4755)).unwrap();
    tee
}

/// An unprivileged user begins a transaction and executes a setuid-root
/// program (the thread transaction survives execve): the program's writes
/// are not in the caller's transaction, so the caller's abort (here: its
/// exit without a commit) does not roll them back.
#[test]
fn a_setuid_program_does_not_run_inside_its_callers_thread_transaction() {
    let m = shared_mount();
    let tee = setuid_tee(&m);
    let script = format!(
        "import os, fcntl
fd = os.open({mnt:?}, os.O_RDONLY | os.O_DIRECTORY)
fcntl.ioctl(fd, 0x4008e701, bytes(8))
open({mnt:?} + '/pub/before', 'w').write('mine')
os.execv({tee:?}, ['tee', {mnt:?} + '/pub/privileged'])",
        mnt = m.mnt().to_str().unwrap(),
        tee = tee.to_str().unwrap()
    );
    let mut c = std::process::Command::new(python());
    c.uid(NOBODY).gid(NOBODY).arg("-c").arg(&script).current_dir("/");
    c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"written by root\n").unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(30)).expect("the setuid tee exits");
    assert!(st.success(), "setuid tee: {st}");
    assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0), "the caller's transaction is aborted");
    assert!(!m.path("pub/before").exists(), "the caller's own write was in its (aborted) transaction");
    let md = std::fs::metadata(m.path("pub/privileged")).expect("the setuid program's file stays");
    assert_eq!(md.uid(), 0, "created by the setuid program");
    assert_eq!(std::fs::read_to_string(m.path("pub/privileged")).unwrap(), "written by root\n");
}

/// The same through `txfs run` as an unprivileged user: the command runs
/// the setuid program and fails, the run aborts, and what the setuid
/// program wrote stays.
#[test]
fn a_setuid_program_does_not_run_inside_its_callers_run() {
    let m = shared_mount();
    let tee = setuid_tee(&m);
    let script = format!(
        "echo mine > pub/before; echo written by root | {} pub/privileged >/dev/null; exit 3",
        tee.to_str().unwrap()
    );
    let mut c = m.run_cmd(&[], &["sh", "-c", &script]);
    c.uid(NOBODY).gid(NOBODY);
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(3), "txfs run: {}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0));
    assert!(!m.path("pub/before").exists(), "the run's own write was aborted");
    let md = std::fs::metadata(m.path("pub/privileged")).expect("the setuid program's file stays");
    assert_eq!(md.uid(), 0);
    assert_eq!(std::fs::read_to_string(m.path("pub/privileged")).unwrap(), "written by root\n");
}

/// `BEGIN_FILE` answers bytes of the file: refused on a write-only
/// descriptor (EBADF, as read(2)), and to a caller whose credentials may
/// not read the file (EACCES), and begins nothing then.
#[test]
fn begin_file_needs_read_access() {
    let m = Mount::start_with(&["allow_other"], |b| {
        let mut db = vec![b'.'; 100];
        db[24..40].copy_from_slice(b"secret-secret-16");
        std::fs::write(b.join("wo"), &db).unwrap();
        std::fs::set_permissions(b.join("wo"), std::fs::Permissions::from_mode(0o622)).unwrap();
        std::fs::write(b.join("ro"), &db).unwrap();
        std::fs::set_permissions(b.join("ro"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(b.join("open"), &db).unwrap();
        std::fs::set_permissions(b.join("open"), std::fs::Permissions::from_mode(0o644)).unwrap();
    });
    const BF: &str = "def bf(fd):
    b = bytearray(64)
    fcntl.ioctl(fd, 0xc040e70b, b)
    return b[40:56].decode()
def state():
    fd = os.open(M, os.O_RDONLY | os.O_DIRECTORY)
    b = bytearray(16)
    fcntl.ioctl(fd, 0x8010e707, b)
    os.close(fd)
    return struct.unpack('QII', bytes(b))[0]
out = 0";
    let mut nobody = nobody_agent(&m);
    nobody.ok(BF);
    // A file others may write but not read, opened write-only.
    nobody.fails("fd = os.open(M + '/wo', os.O_WRONLY); out = bf(fd)", libc::EBADF);
    assert_eq!(nobody.ok("out = state()"), 0, "nothing begun");
    // Root too: the descriptor, not the user, must be open for reading.
    let mut root = Agent::spawn(m.mnt());
    root.ok(BF);
    root.fails("fd = os.open(M + '/open', os.O_WRONLY); out = bf(fd)", libc::EBADF);
    // A readable descriptor of root's 0600 file, inherited by a child that
    // became nobody: its credentials may not read the file.
    let e = root.ok("fd = os.open(M + '/ro', os.O_RDONLY)
pid = os.fork()
if pid == 0:
    os.setgid(65534); os.setuid(65534)
    try:
        bf(fd); os._exit(0)
    except OSError as e:
        os._exit(e.errno)
out = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])");
    assert_eq!(e, libc::EACCES, "BEGIN_FILE by a caller that may not read the file");
    // What may be read, is: nobody on a readable descriptor of a 0644 file.
    assert_eq!(nobody.ok("fd = os.open(M + '/open', os.O_RDONLY); out = bf(fd)"), "secret-secret-16");
    nobody.ok("fd2 = os.open(M, os.O_RDONLY | os.O_DIRECTORY); fcntl.ioctl(fd2, 0x4008e703, bytes(8)); out = 0");
    assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0));
}

/// A setuid program that inherits a descriptor its caller opened inside
/// the transaction (a private node id of it) and changes the file through
/// it (fchmod, fsetxattr: requests on the node, without a handle): the
/// change is not the caller's to roll back. The program is a setuid-root
/// copy of python3, removed at the end.
#[test]
fn a_setuid_program_acting_on_an_inherited_descriptor_is_outside_the_transaction() {
    let m = shared_mount();
    let dir = m.scratch();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let py = dir.join("suid-python");
    std::fs::copy(std::fs::canonicalize(python()).unwrap(), &py).unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let mnt = m.mnt().to_str().unwrap();
    // nobody makes the file (plainly), begins, opens it in the
    // transaction, and executes the setuid program with the descriptor.
    let script = format!(
        "import os, fcntl
p = {mnt:?} + '/pub/f'
open(p, 'w').write('x')
os.chmod(p, 0o644)
fd = os.open({mnt:?}, os.O_RDONLY | os.O_DIRECTORY)
fcntl.ioctl(fd, 0x4008e701, bytes(8))
f = os.open(p, os.O_RDONLY)
os.set_inheritable(f, True)
os.execv({py:?}, ['suid-python', '-c', 'import os; assert os.geteuid() == 0; os.fchmod(%d, 0o600); os.setxattr(%d, \"user.by\", b\"root\")' % (f, f)])",
        py = py.to_str().unwrap()
    );
    let mut c = std::process::Command::new(python());
    c.uid(NOBODY).gid(NOBODY).arg("-c").arg(&script).current_dir("/");
    let st = c.status().unwrap();
    let _ = std::fs::remove_file(&py);
    assert!(st.success(), "the setuid program: {st}");
    assert!(wait_until(Duration::from_secs(5), || m.live_txs() == 0), "the caller's transaction is aborted");
    let md = std::fs::metadata(m.path("pub/f")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o600, "the setuid program's fchmod stays");
    assert_eq!(xattr(&m.path("pub/f"), "user.by").as_deref(), Some(&b"root"[..]), "and its fsetxattr");
}

/// The value of extended attribute `name` of `path`, if any.
fn xattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: NUL-terminated strings and a buffer of the given size.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}
