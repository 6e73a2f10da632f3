//! Fifos, unix sockets and devices through the mount (issue 24, item 2):
//! made with mkfifo, bind and mknod, inside transactions and out, with
//! ext4's answers; working as what they are (bytes through a fifo, a
//! connection to a socket by its path, writes to a device); shown with
//! their type, mode and device number; and real special files in the
//! backing directory after the checkpoint. Special files already in the
//! backing directory show their type too.

mod common;

use common::*;
use serde_json::json;
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const NOBODY: u32 = 65534;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn mkfifo(p: &Path, mode: u32) -> std::io::Result<()> {
    // SAFETY: a valid C string.
    match unsafe { libc::mkfifo(cpath(p).as_ptr(), mode) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn mknod(p: &Path, mode: u32, dev: libc::dev_t) -> std::io::Result<()> {
    // SAFETY: a valid C string.
    match unsafe { libc::mknod(cpath(p).as_ptr(), mode, dev) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn umask() -> u32 {
    // SAFETY: umask has no preconditions; set back at once.
    unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    }
}

/// The type `readdir` gives each name (`d_type`, which std's `file_type`
/// takes from the listing without a stat when it is known).
fn listed_types(dir: &Path) -> Vec<(String, &'static str)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let k = if t.is_fifo() {
                "fifo"
            } else if t.is_socket() {
                "socket"
            } else if t.is_char_device() {
                "char"
            } else if t.is_block_device() {
                "block"
            } else if t.is_dir() {
                "dir"
            } else if t.is_symlink() {
                "symlink"
            } else {
                "file"
            };
            (e.file_name().to_string_lossy().into_owned(), k)
        })
        .collect();
    v.sort();
    v
}

/// Runs `cmd` to its end within 20 s (a fifo nobody opens would block it
/// forever); its stdout.
fn run_within(mut cmd: Command, what: &str) -> String {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect(what);
    let st = wait_timeout(&mut child, Duration::from_secs(20));
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    match st {
        Some(st) if st.success() => out,
        st => panic!("{what}: {st:?}\nstdout: {out}\nstderr: {err}"),
    }
}

/// A writer and a reader process pass bytes through `fifo`.
fn pass_through_fifo(fifo: &Path) -> String {
    let mut writer = Command::new("sh")
        .arg("-c")
        .arg(format!("printf 'through the fifo' > '{}'", fifo.display()))
        .spawn()
        .expect("writer");
    let mut reader = Command::new("cat");
    reader.arg(fifo);
    let got = run_within(reader, "cat of the fifo");
    assert!(wait_timeout(&mut writer, Duration::from_secs(20)).is_some_and(|s| s.success()), "writer");
    got
}

#[test]
fn mkfifo_on_the_mount_passes_bytes_between_two_processes() {
    let mut m = Mount::new();
    let fifo = m.path("fifo");
    mkfifo(&fifo, 0o640).unwrap();
    let md = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(md.file_type().is_fifo(), "{md:?}");
    assert_eq!((md.mode() & 0o7777, md.size(), md.rdev()), (0o640 & !umask(), 0, 0));
    assert_eq!(listed_types(m.mnt()), [("fifo".to_string(), "fifo")]);
    assert_eq!(pass_through_fifo(&fifo), "through the fifo");
    assert_errno(mkfifo(&fifo, 0o600), libc::EEXIST, "mkfifo over a fifo");
    // Renamed and linked, it is still the fifo.
    std::fs::rename(&fifo, m.path("renamed")).unwrap();
    std::fs::hard_link(m.path("renamed"), m.path("linked")).unwrap();
    assert_eq!(std::fs::symlink_metadata(m.path("renamed")).unwrap().nlink(), 2);
    assert_eq!(pass_through_fifo(&m.path("linked")), "through the fifo");
    m.umount_clean();
    let b = std::fs::symlink_metadata(m.backing().join("renamed")).unwrap();
    assert!(b.file_type().is_fifo(), "BACKING/renamed: {b:?}");
    assert_eq!((b.mode() & 0o7777, b.nlink()), (0o640 & !umask(), 2));
    assert_eq!(b.ino(), std::fs::symlink_metadata(m.backing().join("linked")).unwrap().ino());
}

#[test]
fn a_unix_socket_bound_on_the_mount_accepts_connections_by_path() {
    let mut m = Mount::new();
    std::fs::create_dir(m.path("run")).unwrap();
    let path = m.path("run/sock");
    let listener = UnixListener::bind(&path).unwrap();
    let md = std::fs::symlink_metadata(&path).unwrap();
    assert!(md.file_type().is_socket(), "{md:?}");
    assert_eq!(listed_types(&m.path("run")), [("sock".to_string(), "socket")]);
    // Another process connects by path.
    let mut client = Command::new(python());
    client.arg("-c").arg(
        "import socket, sys\n\
         c = socket.socket(socket.AF_UNIX); c.connect(sys.argv[1]); c.sendall(b'hello by path')\n\
         print(c.recv(100).decode())",
    );
    client.arg(&path);
    let t = std::thread::spawn(move || run_within(client, "socket client"));
    let (mut conn, _) = listener.accept().unwrap();
    let mut got = [0u8; 13];
    conn.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello by path");
    conn.write_all(b"and back").unwrap();
    drop(conn);
    assert_eq!(t.join().unwrap().trim(), "and back");
    assert_errno(UnixListener::bind(&path).map(drop), libc::EADDRINUSE, "bind over a socket");
    drop(listener);
    m.umount_clean();
    let b = std::fs::symlink_metadata(m.backing().join("run/sock")).unwrap();
    assert!(b.file_type().is_socket(), "BACKING/run/sock: {b:?}");
}

/// As root: a character device like /dev/null made on a mount with `-o dev`
/// works as the device (writes vanish, reads end at once), shows its
/// number, and is a real device node in the backing directory after the
/// checkpoint. What mknod cannot make answers as the kernel has it.
#[test]
fn root_makes_devices_that_work_and_reach_the_backing() {
    let mut m = Mount::start_with(&["dev"], |_| {});
    let null = m.path("null");
    mknod(&null, libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    let md = std::fs::symlink_metadata(&null).unwrap();
    assert!(md.file_type().is_char_device(), "{md:?}");
    assert_eq!((md.rdev(), md.mode() & 0o7777, md.uid()), (libc::makedev(1, 3), 0o666 & !umask(), 0));
    std::fs::write(&null, b"into the void").expect("write to the null device through the mount");
    assert_eq!(std::fs::read(&null).unwrap(), b"");
    mknod(&m.path("loop"), libc::S_IFBLK | 0o600, libc::makedev(7, 200)).unwrap();
    let md = std::fs::symlink_metadata(m.path("loop")).unwrap();
    assert!(md.file_type().is_block_device(), "{md:?}");
    assert_eq!(md.rdev(), libc::makedev(7, 200));
    assert_eq!(listed_types(m.mnt()), [("loop".to_string(), "block"), ("null".to_string(), "char")]);
    // S_IFREG (and a type of 0) is a regular file.
    mknod(&m.path("plain"), libc::S_IFREG | 0o644, 0).unwrap();
    mknod(&m.path("zero-type"), 0o644, 0).unwrap();
    assert!(std::fs::symlink_metadata(m.path("zero-type")).unwrap().is_file());
    std::fs::write(m.path("plain"), b"data").unwrap();
    // What the kernel refuses before asking: a directory, an unknown type.
    assert_errno(mknod(&m.path("d"), libc::S_IFDIR | 0o755, 0), libc::EPERM, "mknod S_IFDIR");
    assert_errno(mknod(&m.path("x"), 0o170000 | 0o644, 0), libc::EINVAL, "mknod of an unknown type");
    assert_errno(mknod(&null, libc::S_IFIFO | 0o644, 0), libc::EEXIST, "mknod over a name");
    m.umount_clean();
    let b = std::fs::symlink_metadata(m.backing().join("null")).unwrap();
    assert!(b.file_type().is_char_device(), "BACKING/null: {b:?}");
    assert_eq!((b.rdev(), b.mode() & 0o7777), (libc::makedev(1, 3), 0o666 & !umask()));
    let b = std::fs::symlink_metadata(m.backing().join("loop")).unwrap();
    assert!(b.file_type().is_block_device() && b.rdev() == libc::makedev(7, 200), "BACKING/loop: {b:?}");
    assert_eq!(std::fs::read(m.backing().join("plain")).unwrap(), b"data");
}

/// A caller without CAP_MKNOD gets EPERM for a device exactly as on the
/// disk under the test (the same calls, in a directory there): fifos,
/// sockets and the 0:0 whiteout are anyone's; owned by the caller.
#[test]
fn a_caller_without_cap_mknod_gets_what_ext4_gives() {
    let m = Mount::start_with(&["allow_other"], |b| {
        std::fs::create_dir(b.join("pub")).unwrap();
        std::fs::set_permissions(b.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    });
    let disk = m.scratch().join("pub");
    std::fs::create_dir(&disk).unwrap();
    std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut cmd = Command::new(python());
    cmd.uid(NOBODY).gid(NOBODY);
    let mut a = Agent::spawn_cmd(cmd, m.mnt());
    let case = |a: &mut Agent, dir: &Path| {
        let d = dir.display();
        let r = |a: &mut Agent, code: String| match a.run(&code) {
            Ok(_) => "ok".to_string(),
            Err(e) => errname(e),
        };
        vec![
            r(a, format!("os.mknod('{d}/null', stat.S_IFCHR | 0o666, os.makedev(1, 3))")),
            r(a, format!("os.mknod('{d}/blk', stat.S_IFBLK | 0o600, os.makedev(7, 0))")),
            r(a, format!("os.mknod('{d}/wh', stat.S_IFCHR | 0o600, 0)")),
            r(a, format!("os.mkfifo('{d}/fifo', 0o640)")),
            r(a, format!("os.mknod('{d}/fifo2', stat.S_IFIFO | 0o600)")),
            r(a, format!("import socket; s = socket.socket(socket.AF_UNIX); s.bind('{d}/sock')")),
            r(a, format!("os.mknod('{d}/dir', stat.S_IFDIR | 0o755)")),
        ]
    };
    let on_disk = case(&mut a, &disk);
    let on_mount = case(&mut a, &m.path("pub"));
    assert_eq!(on_mount, on_disk, "nobody's mknods on the mount and on the disk");
    assert_eq!(on_mount[0], errname(libc::EPERM), "{on_mount:?}");
    assert_eq!(on_mount[3], "ok", "{on_mount:?}");
    let st = a.ok(&format!(
        "s = os.lstat('{}/fifo'); out = [s.st_uid, s.st_gid, stat.S_ISFIFO(s.st_mode)]",
        m.path("pub").display()
    ));
    assert_eq!(st, json!([NOBODY, NOBODY, true]));
    assert_errno(std::fs::symlink_metadata(m.path("pub/null")), libc::ENOENT, "nobody's device");
}

/// In a thread transaction: a fifo, a socket and (root) a device work for
/// the transaction's thread and are invisible to every other process until
/// commit; then they are everyone's, the socket bound inside accepting
/// connections from outside. An aborted transaction's are gone.
#[test]
fn special_files_of_a_thread_transaction_are_private_until_commit_and_gone_after_abort() {
    let mut m = Mount::start_with(&["dev"], |b| std::fs::create_dir(b.join("d")).unwrap());
    let mut a = Agent::spawn(m.mnt());
    m.begin().unwrap();
    let fifo = m.path("d/fifo");
    mkfifo(&fifo, 0o600).unwrap();
    let listener = UnixListener::bind(m.path("d/sock")).unwrap();
    mknod(&m.path("d/null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    // Inside: they are what they are.
    assert_eq!(
        listed_types(&m.path("d")),
        [("fifo".to_string(), "fifo"), ("null".to_string(), "char"), ("sock".to_string(), "socket")]
    );
    assert_eq!(std::fs::symlink_metadata(m.path("d/null")).unwrap().rdev(), libc::makedev(1, 3));
    std::fs::write(m.path("d/null"), b"gone").unwrap();
    let mut r = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    w.write_all(b"in the transaction").unwrap();
    let mut got = [0u8; 18];
    r.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"in the transaction");
    drop((r, w));
    let mut c = UnixStream::connect(m.path("d/sock")).expect("connect by path inside the transaction");
    let (mut s, _) = listener.accept().unwrap();
    c.write_all(b"hi").unwrap();
    let mut two = [0u8; 2];
    s.read_exact(&mut two).unwrap();
    assert_eq!(&two, b"hi");
    drop((c, s));
    // Outside: nothing.
    for n in ["fifo", "sock", "null"] {
        a.fails(&format!("os.lstat(M + '/d/{n}')"), libc::ENOENT);
    }
    assert_eq!(a.ok("out = os.listdir(M + '/d')"), json!([]));
    a.fails("import socket; socket.socket(socket.AF_UNIX).connect(M + '/d/sock')", libc::ENOENT);
    m.commit().unwrap();
    // Committed: everyone's.
    let st = a.ok("out = [[stat.S_IFMT(s.st_mode), s.st_mode & 0o7777, s.st_rdev] for s in \
         (os.lstat(M + '/d/fifo'), os.lstat(M + '/d/sock'), os.lstat(M + '/d/null'))]");
    let sock_mode = std::fs::symlink_metadata(m.path("d/sock")).unwrap().mode() & 0o7777;
    assert_eq!(
        st,
        json!([
            [libc::S_IFIFO, 0o600 & !umask(), 0],
            [libc::S_IFSOCK, sock_mode, 0],
            [libc::S_IFCHR, 0o666 & !umask(), libc::makedev(1, 3)]
        ])
    );
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut b = [0u8; 7];
        s.read_exact(&mut b).unwrap();
        (b, listener)
    });
    a.ok("import socket; c = socket.socket(socket.AF_UNIX); c.connect(M + '/d/sock'); c.sendall(b'outside')");
    let (b, listener) = t.join().unwrap();
    assert_eq!(&b, b"outside", "the socket bound in the transaction, reached from outside after commit");
    drop(listener);
    // Aborted: gone, for the thread and everyone.
    m.begin().unwrap();
    mkfifo(&m.path("d/gone-fifo"), 0o600).unwrap();
    let l2 = UnixListener::bind(m.path("d/gone-sock")).unwrap();
    mknod(&m.path("d/gone-dev"), libc::S_IFBLK | 0o600, libc::makedev(7, 1)).unwrap();
    std::fs::rename(m.path("d/fifo"), m.path("d/fifo-renamed")).unwrap();
    m.abort().unwrap();
    drop(l2);
    for n in ["gone-fifo", "gone-sock", "gone-dev", "fifo-renamed"] {
        assert_errno(std::fs::symlink_metadata(m.path("d").join(n)), libc::ENOENT, n);
        a.fails(&format!("os.lstat(M + '/d/{n}')"), libc::ENOENT);
    }
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    drop(a);
    m.umount_clean();
    assert_eq!(names(&m.backing().join("d")), ["fifo", "null", "sock"]);
    let b = |n: &str| std::fs::symlink_metadata(m.backing().join("d").join(n)).unwrap();
    assert!(b("fifo").file_type().is_fifo() && b("sock").file_type().is_socket());
    assert!(b("null").file_type().is_char_device() && b("null").rdev() == libc::makedev(1, 3));
}

/// `txfs run`: processes of the run pass bytes through a fifo it made and
/// connect by path to a socket one of them bound, and a device it made
/// works in its view as on the shared mount (`-o dev`); committed, all are
/// in the backing directory after unmount. A failed run leaves none.
#[test]
fn special_files_of_a_txfs_run_work_between_its_processes() {
    let mut m = Mount::start_with(&["dev"], |_| {});
    let script = format!(
        "set -e\n\
         mknod null c 1 3\n\
         echo into the void > null\n\
         mkfifo -m 0620 p\n\
         ( printf 'through the fifo' > p ) &\n\
         cat p > got\n\
         wait\n\
         {py} -c '{sock}'\n",
        py = python(),
        sock = "import os, socket\n\
                s = socket.socket(socket.AF_UNIX); s.bind(\"s\"); s.listen(1)\n\
                pid = os.fork()\n\
                if pid == 0:\n\
                \x20   c = socket.socket(socket.AF_UNIX); c.connect(\"s\"); c.sendall(b\"by path\"); os._exit(0)\n\
                conn, _ = s.accept(); data = conn.recv(100); os.waitpid(pid, 0)\n\
                open(\"sockgot\", \"w\").write(data.decode())\n"
    );
    let out = m.run_cmd(&[], &["sh", "-c", &format!("{script}exit 3")]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(names(m.mnt()).is_empty(), "an aborted run left {:?}", names(m.mnt()));
    check_ok(&m.run_cmd(&[], &["sh", "-c", &script]).output().unwrap(), "txfs run");
    assert_eq!(std::fs::read_to_string(m.path("got")).unwrap(), "through the fifo");
    assert_eq!(std::fs::read_to_string(m.path("sockgot")).unwrap(), "by path");
    assert_eq!(
        listed_types(m.mnt()),
        [
            ("got".into(), "file"),
            ("null".into(), "char"),
            ("p".into(), "fifo"),
            ("s".into(), "socket"),
            ("sockgot".into(), "file")
        ]
    );
    assert_eq!(std::fs::symlink_metadata(m.path("p")).unwrap().mode() & 0o7777, 0o620);
    m.umount_clean();
    let b = |n: &str| std::fs::symlink_metadata(m.backing().join(n)).unwrap();
    assert!(b("p").file_type().is_fifo() && b("p").mode() & 0o7777 == 0o620);
    assert!(b("s").file_type().is_socket());
    assert!(b("null").file_type().is_char_device() && b("null").rdev() == libc::makedev(1, 3));
}

/// Special files already in the backing directory show their own type and
/// number through the mount (they were regular files of size 0 before),
/// work as themselves, and are renamed as themselves. Without `-o dev`
/// (FUSE's default, as every FUSE mount) a device does not open.
#[test]
fn special_files_already_in_the_backing_show_their_type() {
    let mut m = Mount::with_backing(|b| {
        mkfifo(&b.join("fifo"), 0o644).unwrap();
        drop(UnixListener::bind(b.join("sock")).unwrap());
        mknod(&b.join("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    });
    assert_eq!(
        listed_types(m.mnt()),
        [("fifo".to_string(), "fifo"), ("null".to_string(), "char"), ("sock".to_string(), "socket")]
    );
    let md = std::fs::symlink_metadata(m.path("null")).unwrap();
    assert!(md.file_type().is_char_device(), "{md:?}");
    assert_eq!(md.rdev(), libc::makedev(1, 3));
    assert_errno(std::fs::write(m.path("null"), b"x"), libc::EACCES, "a device on a nodev mount");
    assert!(std::fs::symlink_metadata(m.path("sock")).unwrap().file_type().is_socket());
    assert_eq!(pass_through_fifo(&m.path("fifo")), "through the fifo");
    let ino = std::fs::symlink_metadata(m.backing().join("fifo")).unwrap().ino();
    std::fs::rename(m.path("fifo"), m.path("moved")).unwrap();
    m.umount_clean();
    let b = std::fs::symlink_metadata(m.backing().join("moved")).unwrap();
    assert!(b.file_type().is_fifo());
    assert_eq!(b.ino(), ino, "the same fifo, renamed");
    // With `-o dev` it is the device it says it is.
    m.restart_with_opts(&["dev"]);
    std::fs::write(m.path("null"), b"x").expect("the backing's /dev/null, written through a dev mount");
}
