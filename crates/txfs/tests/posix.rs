//! Non-transactional POSIX behaviour through the mount, as on ext4.

mod common;

use common::*;
use serde_json::json;
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn io_result(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

const NOBODY: u32 = 65534;

#[test]
fn permissions_are_checked_for_the_calling_user() {
    let mut m = Mount::start_with(&["allow_other"], |b| {
        std::fs::write(b.join("secret"), "s").unwrap();
        std::fs::set_permissions(b.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(b.join("public"), "p").unwrap();
        std::fs::set_permissions(b.join("public"), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::create_dir(b.join("pub")).unwrap();
        std::fs::set_permissions(b.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::create_dir(b.join("priv")).unwrap();
        std::fs::write(b.join("priv/x"), "x").unwrap();
        std::fs::set_permissions(b.join("priv"), std::fs::Permissions::from_mode(0o700)).unwrap();
    });
    let mut cmd = Command::new(python());
    cmd.uid(NOBODY).gid(NOBODY);
    let mut a = Agent::spawn_cmd(cmd, m.mnt());
    assert_eq!(a.ok("out = [os.getuid(), os.getgid(), os.getgroups()]"), json!([NOBODY, NOBODY, []]));

    a.fails("os.open(M + '/secret', os.O_RDONLY)", libc::EACCES);
    a.fails("os.open(M + '/public', os.O_WRONLY)", libc::EACCES);
    assert_eq!(a.ok("out = open(M + '/public').read()"), "p");
    a.fails("os.open(M + '/new', os.O_CREAT | os.O_WRONLY, 0o644)", libc::EACCES);
    a.fails("os.mkdir(M + '/newdir')", libc::EACCES);
    a.fails("os.unlink(M + '/public')", libc::EACCES);
    a.fails("os.rename(M + '/public', M + '/pub/stolen')", libc::EACCES);
    a.fails("os.listdir(M + '/priv')", libc::EACCES);
    a.fails("os.stat(M + '/priv/x')", libc::EACCES);
    a.fails("os.chmod(M + '/public', 0o666)", libc::EPERM);
    a.fails("os.truncate(M + '/public', 0)", libc::EACCES);

    // New files and directories belong to the caller.
    a.ok("fd = os.open(M + '/pub/mine', os.O_CREAT | os.O_WRONLY, 0o640); os.write(fd, b'mine'); os.close(fd)");
    a.ok("os.mkdir(M + '/pub/mydir', 0o750)");
    let st = a.ok("out = [[s.st_uid, s.st_gid, s.st_mode & 0o7777] for s in \
                   (os.stat(M + '/pub/mine'), os.stat(M + '/pub/mydir'))]");
    assert_eq!(st, json!([[NOBODY, NOBODY, 0o640], [NOBODY, NOBODY, 0o750]]));
    a.fails("os.chown(M + '/pub/mine', 0, 0)", libc::EPERM);
    a.ok("os.chmod(M + '/pub/mine', 0o600)");
    let md = std::fs::metadata(m.path("pub/mine")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (NOBODY, NOBODY, 0o600), "as root sees it");

    // The same user, in a transaction of its own.
    a.ok("t = os.open(M + '/pub', os.O_RDONLY); fcntl.ioctl(t, 0x4008e701, struct.pack('II', 0, 0))");
    a.ok("open(M + '/pub/txfile', 'w').write('t')");
    a.fails("os.open(M + '/secret', os.O_RDONLY)", libc::EACCES);
    assert_errno(std::fs::metadata(m.path("pub/txfile")), libc::ENOENT, "uncommitted");
    a.ok("fcntl.ioctl(t, 0x4008e702, struct.pack('II', 0, 0)); os.close(t)");
    let md = std::fs::metadata(m.path("pub/txfile")).unwrap();
    assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY));
    drop(a);

    // The owners reach the backing files.
    m.umount_clean();
    for n in ["pub/mine", "pub/mydir", "pub/txfile"] {
        let md = std::fs::metadata(m.backing().join(n)).unwrap();
        assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY), "BACKING/{n}");
    }
    assert_eq!(std::fs::metadata(m.backing().join("pub/mine")).unwrap().mode() & 0o7777, 0o600);
}

/// Root's own mount (no allow_other) leaves permission checks out of the
/// kernel (no GETATTR per path component) and answers access(2) itself:
/// root may do anything but execute a file without an execute bit. With
/// allow_other the kernel checks (the test above).
#[test]
fn root_only_mount_skips_kernel_permission_checks_and_answers_access() {
    fn access(p: &Path, mode: i32) -> std::io::Result<()> {
        // SAFETY: a valid C string; access has no other preconditions.
        io_result(unsafe { libc::access(cpath(p).as_ptr(), mode) })
    }
    let m = Mount::start_with(&[], |b| {
        std::fs::write(b.join("plain"), "p").unwrap();
        std::fs::set_permissions(b.join("plain"), std::fs::Permissions::from_mode(0o000)).unwrap();
        std::fs::write(b.join("tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(b.join("tool"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir(b.join("d")).unwrap();
        std::fs::set_permissions(b.join("d"), std::fs::Permissions::from_mode(0o000)).unwrap();
    });
    let line = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(m.mnt().to_str().unwrap()))
        .expect("the mount in /proc/self/mounts")
        .to_string();
    assert!(!line.contains("default_permissions"), "root-only mount: {line}");
    access(&m.path("plain"), libc::R_OK | libc::W_OK).expect("root reads and writes a mode 000 file");
    assert_errno(access(&m.path("plain"), libc::X_OK), libc::EACCES, "X_OK without an execute bit");
    access(&m.path("tool"), libc::X_OK).expect("X_OK with an execute bit");
    assert_errno(access(&m.path("missing"), libc::F_OK), libc::ENOENT, "F_OK of a missing name");
    access(&m.path("d"), libc::X_OK).expect("X_OK of a directory");
    assert_eq!(std::fs::read(m.path("plain")).unwrap(), b"p", "root opens a mode 000 file");
}

#[test]
fn setgid_directories_pass_their_group_on() {
    let m = Mount::new();
    let d = m.path("sg");
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, None, Some(1234)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o2775)).unwrap();
    assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o7777, 0o2775);
    std::fs::write(d.join("f"), "f").unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    let f = std::fs::metadata(d.join("f")).unwrap();
    assert_eq!((f.uid(), f.gid()), (0, 1234), "a file in a setgid dir takes its group");
    assert_eq!(f.mode() & libc::S_ISGID, 0, "files do not get the setgid bit");
    let sub = std::fs::metadata(d.join("sub")).unwrap();
    assert_eq!((sub.uid(), sub.gid()), (0, 1234), "a subdir takes the group");
    assert_ne!(sub.mode() & libc::S_ISGID, 0, "and the setgid bit");
    std::fs::write(d.join("sub/deeper"), "").unwrap();
    assert_eq!(std::fs::metadata(d.join("sub/deeper")).unwrap().gid(), 1234);
    // Outside the setgid dir: the creator's group.
    std::fs::write(m.path("plain"), "").unwrap();
    assert_eq!(std::fs::metadata(m.path("plain")).unwrap().gid(), 0);
}

#[test]
fn rename_over_an_existing_file() {
    let m = Mount::new();
    std::fs::write(m.path("a"), "AAA").unwrap();
    std::fs::write(m.path("b"), "B").unwrap();
    let ino_a = std::fs::metadata(m.path("a")).unwrap().ino();
    let old_b = File::open(m.path("b")).unwrap();
    std::fs::rename(m.path("a"), m.path("b")).unwrap();
    assert_errno(std::fs::metadata(m.path("a")), libc::ENOENT, "the old name");
    assert_eq!(std::fs::read_to_string(m.path("b")).unwrap(), "AAA");
    assert_eq!(std::fs::metadata(m.path("b")).unwrap().ino(), ino_a, "the renamed inode");
    assert_eq!(names(m.mnt()), ["b"]);
    // The replaced file lives on through its open descriptor.
    let mut buf = [0u8; 8];
    let n = old_b.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"B", "the replaced file's open fd");
    assert_eq!(old_b.metadata().unwrap().nlink(), 0, "the replaced file has no names left");
    // rename to itself: a no-op
    std::fs::rename(m.path("b"), m.path("b")).unwrap();
    assert_eq!(std::fs::read_to_string(m.path("b")).unwrap(), "AAA");
    // RENAME_NOREPLACE and RENAME_EXCHANGE
    std::fs::write(m.path("c"), "C").unwrap();
    let (b, c) = (cpath(&m.path("b")), cpath(&m.path("c")));
    // SAFETY: valid C strings.
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, b.as_ptr(), libc::AT_FDCWD, c.as_ptr(), libc::RENAME_NOREPLACE) };
    assert_errno(io_result(r), libc::EEXIST, "RENAME_NOREPLACE onto an existing name");
    // SAFETY: valid C strings.
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, b.as_ptr(), libc::AT_FDCWD, c.as_ptr(), libc::RENAME_EXCHANGE) };
    io_result(r).expect("RENAME_EXCHANGE");
    assert_eq!(std::fs::read_to_string(m.path("b")).unwrap(), "C");
    assert_eq!(std::fs::read_to_string(m.path("c")).unwrap(), "AAA");
    assert_errno(std::fs::rename(m.path("nope"), m.path("x")), libc::ENOENT, "rename of a missing name");
}

#[test]
fn rename_directories() {
    let m = Mount::new();
    std::fs::create_dir(m.path("full")).unwrap();
    std::fs::write(m.path("full/x"), "x").unwrap();
    std::fs::create_dir(m.path("empty")).unwrap();
    std::fs::create_dir(m.path("e2")).unwrap();
    std::fs::write(m.path("file"), "f").unwrap();

    // A non-empty directory over an empty one.
    std::fs::rename(m.path("full"), m.path("empty")).unwrap();
    assert_errno(std::fs::metadata(m.path("full")), libc::ENOENT, "the old name");
    assert_eq!(std::fs::read_to_string(m.path("empty/x")).unwrap(), "x");
    // An empty directory over a non-empty one: ENOTEMPTY.
    assert_errno(std::fs::rename(m.path("e2"), m.path("empty")), libc::ENOTEMPTY, "rename over a non-empty dir");
    assert!(m.path("e2").is_dir());
    assert_eq!(std::fs::read_to_string(m.path("empty/x")).unwrap(), "x");
    // Kinds must match.
    assert_errno(std::fs::rename(m.path("e2"), m.path("file")), libc::ENOTDIR, "dir over a file");
    assert_errno(std::fs::rename(m.path("file"), m.path("e2")), libc::EISDIR, "file over a dir");
    // Not into itself.
    assert_errno(std::fs::rename(m.path("empty"), m.path("empty/sub")), libc::EINVAL, "a dir into itself");
    // Moving a directory between parents keeps its contents.
    std::fs::rename(m.path("empty"), m.path("e2/moved")).unwrap();
    assert_eq!(std::fs::read_to_string(m.path("e2/moved/x")).unwrap(), "x");
    assert_eq!(names(m.mnt()), ["e2", "file"]);
    assert_eq!(std::fs::metadata(m.path("e2")).unwrap().nlink(), 3, "e2: ., its entry, moved/..");
}

#[test]
fn hard_links() {
    let m = Mount::new();
    std::fs::write(m.path("a"), "one").unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::hard_link(m.path("a"), m.path("d/b")).unwrap();
    let (a, b) = (std::fs::metadata(m.path("a")).unwrap(), std::fs::metadata(m.path("d/b")).unwrap());
    assert_eq!(a.ino(), b.ino(), "one inode");
    assert_eq!((a.nlink(), b.nlink()), (2, 2));
    OpenOptions::new().write(true).open(m.path("d/b")).unwrap().write_all_at(b"TWO", 0).unwrap();
    assert_eq!(std::fs::read_to_string(m.path("a")).unwrap(), "TWO", "written through the other name");
    assert_errno(std::fs::hard_link(m.path("a"), m.path("d/b")), libc::EEXIST, "link onto an existing name");
    assert_errno(std::fs::hard_link(m.path("d"), m.path("dl")), libc::EPERM, "link of a directory");
    std::fs::remove_file(m.path("a")).unwrap();
    let b = std::fs::metadata(m.path("d/b")).unwrap();
    assert_eq!(b.nlink(), 1);
    assert_eq!(std::fs::read_to_string(m.path("d/b")).unwrap(), "TWO");
}

#[test]
fn symlinks() {
    let m = Mount::new();
    std::os::unix::fs::symlink("t/file", m.path("l")).unwrap();
    assert_eq!(std::fs::read_link(m.path("l")).unwrap(), Path::new("t/file"));
    let l = std::fs::symlink_metadata(m.path("l")).unwrap();
    assert!(l.file_type().is_symlink());
    assert_eq!(l.len(), 6, "a symlink's size is its target's length");
    assert_errno(std::fs::metadata(m.path("l")), libc::ENOENT, "stat of a dangling symlink");
    std::fs::create_dir(m.path("t")).unwrap();
    std::fs::write(m.path("t/file"), "via link").unwrap();
    assert_eq!(std::fs::read_to_string(m.path("l")).unwrap(), "via link");
    assert!(std::fs::metadata(m.path("l")).unwrap().is_file());
    std::os::unix::fs::symlink("t", m.path("dl")).unwrap();
    assert_eq!(names(&m.path("dl")), ["file"]);
    std::fs::write(m.path("dl/new"), "n").unwrap();
    assert_eq!(std::fs::read_to_string(m.path("t/new")).unwrap(), "n");
    assert_errno(std::os::unix::fs::symlink("x", m.path("l")), libc::EEXIST, "symlink onto an existing name");
    assert_errno(std::fs::read_link(m.path("t/file")), libc::EINVAL, "readlink of a file");
    std::fs::remove_file(m.path("l")).unwrap();
    assert!(m.path("t/file").exists(), "unlinking the link keeps the target");
    // Absolute targets are not resolved by txfs.
    std::os::unix::fs::symlink("/etc/hostname", m.path("abs")).unwrap();
    assert_eq!(std::fs::read_link(m.path("abs")).unwrap(), Path::new("/etc/hostname"));
}

#[test]
fn sparse_file_at_one_gib() {
    let mut m = Mount::new();
    const OFF: u64 = 1 << 30;
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(m.path("sparse")).unwrap();
    f.write_all_at(b"x", OFF).unwrap();
    assert_eq!(f.metadata().unwrap().len(), OFF + 1);
    assert_eq!(std::fs::metadata(m.path("sparse")).unwrap().len(), OFF + 1);
    let mut buf = vec![1u8; 4096];
    for at in [0, 4096 * 3 + 17, OFF / 2, OFF - 4096] {
        f.read_exact_at(&mut buf, at).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "the hole at {at} reads zeros");
    }
    let mut tail = [0u8; 10];
    let n = f.read_at(&mut tail, OFF - 5).unwrap();
    assert_eq!(&tail[..n], b"\0\0\0\0\0x", "the end of the hole and the byte");
    drop(f);
    m.umount_clean();
    let md = std::fs::metadata(m.backing().join("sparse")).unwrap();
    assert_eq!(md.len(), OFF + 1);
    assert!(md.blocks() * 512 < 16 << 20, "the backing file stayed sparse ({} bytes allocated)", md.blocks() * 512);
    let b = File::open(m.backing().join("sparse")).unwrap();
    let mut one = [9u8; 2];
    assert_eq!(b.read_at(&mut one, OFF - 1).unwrap(), 2);
    assert_eq!(&one, b"\0x");
}

#[test]
fn o_append_from_two_descriptors() {
    let m = Mount::new();
    std::fs::write(m.path("log"), "start:").unwrap();
    let mut a = OpenOptions::new().append(true).open(m.path("log")).unwrap();
    let mut b = OpenOptions::new().append(true).open(m.path("log")).unwrap();
    a.write_all(b"a1,").unwrap();
    b.write_all(b"b1,").unwrap();
    a.write_all(b"a2,").unwrap();
    b.write_all(b"b2").unwrap();
    assert_eq!(std::fs::read_to_string(m.path("log")).unwrap(), "start:a1,b1,a2,b2");
    // A plain writer in between: appends still go to the end.
    OpenOptions::new().write(true).open(m.path("log")).unwrap().write_all_at(b"0123456789ABCDEFGHIJ", 10).unwrap();
    a.write_all(b"!").unwrap();
    assert_eq!(std::fs::read_to_string(m.path("log")).unwrap(), "start:a1,b0123456789ABCDEFGHIJ!");
    // Inside a transaction: at the end of the file as the transaction sees it.
    m.begin().unwrap();
    b.write_all(b"<tx").unwrap();
    a.write_all(b">").unwrap();
    assert_eq!(std::fs::read_to_string(m.path("log")).unwrap(), "start:a1,b0123456789ABCDEFGHIJ!<tx>");
    m.commit().unwrap();
    assert_eq!(std::fs::read_to_string(m.path("log")).unwrap(), "start:a1,b0123456789ABCDEFGHIJ!<tx>");
}

#[test]
fn o_excl_on_an_existing_name_is_eexist() {
    let m = Mount::new();
    std::fs::write(m.path("there"), "t").unwrap();
    let excl = |p: &Path| OpenOptions::new().write(true).create_new(true).open(p);
    assert_errno(excl(&m.path("there")), libc::EEXIST, "O_EXCL on a file");
    std::os::unix::fs::symlink("nowhere", m.path("dangling")).unwrap();
    assert_errno(excl(&m.path("dangling")), libc::EEXIST, "O_EXCL on a dangling symlink");
    std::fs::create_dir(m.path("d")).unwrap();
    assert_errno(excl(&m.path("d")), libc::EEXIST, "O_EXCL on a directory");
    assert_errno(excl(&m.path("missing/x")), libc::ENOENT, "O_EXCL in a missing directory");
    excl(&m.path("fresh")).unwrap().write_all(b"f").unwrap();
    assert_errno(excl(&m.path("fresh")), libc::EEXIST, "O_EXCL the second time");
    assert_eq!(std::fs::read_to_string(m.path("there")).unwrap(), "t");
    assert_errno(std::fs::metadata(m.path("nowhere")), libc::ENOENT, "O_EXCL did not follow the symlink");
}

#[test]
fn file_larger_than_4_gib() {
    let mut m = Mount::new();
    const G4: u64 = 1 << 32;
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(m.path("big")).unwrap();
    f.write_all_at(b"edge", G4 - 2).unwrap();
    f.write_all_at(b"tail", G4 + 10).unwrap();
    assert_eq!(f.metadata().unwrap().len(), G4 + 14);
    let mut buf = [7u8; 18];
    f.read_exact_at(&mut buf, G4 - 4).unwrap();
    assert_eq!(&buf, b"\0\0edge\0\0\0\0\0\0\0\0tail");
    let mut past = [0u8; 8];
    assert_eq!(f.read_at(&mut past, G4 + 14).unwrap(), 0, "EOF");
    drop(f);
    m.umount_clean();
    let b = File::open(m.backing().join("big")).unwrap();
    assert_eq!(b.metadata().unwrap().len(), G4 + 14);
    let mut t = [0u8; 4];
    b.read_exact_at(&mut t, G4 + 10).unwrap();
    assert_eq!(&t, b"tail");
    m.start();
    let f = File::open(m.path("big")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), G4 + 14);
    let mut t = [0u8; 8];
    f.read_exact_at(&mut t, G4 - 2).unwrap();
    assert_eq!(&t, b"edge\0\0\0\0");
    let mut end = Vec::new();
    let mut f = f;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(G4 + 8)).unwrap();
    f.read_to_end(&mut end).unwrap();
    assert_eq!(end, b"\0\0tail");
}

#[test]
fn name_length_limit_is_255_bytes() {
    let m = Mount::new();
    let n255 = "a".repeat(255);
    let n256 = "b".repeat(256);
    std::fs::write(m.path(&n255), "ok").unwrap();
    assert_eq!(std::fs::read_to_string(m.path(&n255)).unwrap(), "ok");
    assert_eq!(names(m.mnt()), std::slice::from_ref(&n255));
    let d255 = "d".repeat(255);
    std::fs::create_dir(m.path(&d255)).unwrap();
    std::fs::rename(m.path(&n255), m.path(&d255).join(&n255)).unwrap();
    assert_errno(std::fs::write(m.path(&n256), "x"), libc::ENAMETOOLONG, "create");
    assert_errno(std::fs::create_dir(m.path(&n256)), libc::ENAMETOOLONG, "mkdir");
    assert_errno(std::fs::metadata(m.path(&n256)), libc::ENAMETOOLONG, "stat");
    assert_errno(std::fs::rename(m.path(&d255), m.path(&n256)), libc::ENAMETOOLONG, "rename");
    assert_errno(std::os::unix::fs::symlink("x", m.path(&n256)), libc::ENAMETOOLONG, "symlink");
    assert_errno(std::fs::hard_link(m.path(&d255).join(&n255), m.path(&n256)), libc::ENAMETOOLONG, "link");
    assert_eq!(names(m.mnt()), std::slice::from_ref(&d255));
    assert_eq!(names(&m.path(&d255)), [n255]);
    // Multi-byte: 85 three-byte characters are 255 bytes.
    let u = "€".repeat(85);
    std::fs::write(m.path(&u), "u").unwrap();
    assert_errno(std::fs::write(m.path(format!("{u}x")), "u"), libc::ENAMETOOLONG, "256 bytes of UTF-8");
}

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> std::io::Result<()> {
    let (p, n) = (cpath(p), cstr(name));
    // SAFETY: valid C strings and buffer.
    io_result(unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) })
}

fn getxattr(p: &Path, name: &str, size: usize) -> std::io::Result<Vec<u8>> {
    let (p, n) = (cpath(p), cstr(name));
    let mut buf = vec![0u8; size];
    // SAFETY: valid C strings and buffer of `size` bytes.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(if size == 0 { 0 } else { r as usize });
    if size == 0 {
        return Ok(vec![0; r as usize]);
    }
    Ok(buf)
}

fn listxattr(p: &Path) -> std::io::Result<Vec<String>> {
    let p = cpath(p);
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C string and buffer.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut v: Vec<String> = buf[..r as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    v.sort();
    Ok(v)
}

fn removexattr(p: &Path, name: &str) -> std::io::Result<()> {
    let (p, n) = (cpath(p), cstr(name));
    // SAFETY: valid C strings.
    io_result(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })
}

#[test]
fn user_xattrs() {
    let mut m = Mount::new();
    let f = m.path("f");
    std::fs::write(&f, "f").unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    assert_eq!(listxattr(&f).unwrap(), Vec::<String>::new());
    setxattr(&f, "user.a", b"1", 0).unwrap();
    setxattr(&f, "user.bee", b"two bytes and more", 0).unwrap();
    setxattr(&m.path("d"), "user.onadir", b"", 0).unwrap();
    assert_eq!(getxattr(&f, "user.a", 64).unwrap(), b"1");
    assert_eq!(getxattr(&f, "user.bee", 0).unwrap().len(), 18, "size query");
    assert_errno(getxattr(&f, "user.bee", 4), libc::ERANGE, "too small a buffer");
    assert_eq!(listxattr(&f).unwrap(), ["user.a", "user.bee"]);
    assert_eq!(getxattr(&m.path("d"), "user.onadir", 64).unwrap(), b"");
    assert_errno(setxattr(&f, "user.a", b"x", libc::XATTR_CREATE), libc::EEXIST, "XATTR_CREATE on an existing name");
    assert_errno(setxattr(&f, "user.zz", b"x", libc::XATTR_REPLACE), libc::ENODATA, "XATTR_REPLACE on a missing one");
    setxattr(&f, "user.a", b"replaced", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&f, "user.a", 64).unwrap(), b"replaced");
    removexattr(&f, "user.a").unwrap();
    assert_errno(getxattr(&f, "user.a", 64), libc::ENODATA, "get after remove");
    assert_errno(removexattr(&f, "user.a"), libc::ENODATA, "remove twice");
    assert_eq!(listxattr(&f).unwrap(), ["user.bee"]);
    let bin: Vec<u8> = (0..=255u8).collect();
    setxattr(&f, "user.bin", &bin, 0).unwrap();
    assert_eq!(getxattr(&f, "user.bin", 1024).unwrap(), bin);

    // In a transaction: private until commit.
    let mut agent = Agent::spawn(m.mnt());
    m.begin().unwrap();
    setxattr(&f, "user.tx", b"t", 0).unwrap();
    removexattr(&f, "user.bee").unwrap();
    assert_eq!(listxattr(&f).unwrap(), ["user.bin", "user.tx"]);
    assert_eq!(agent.ok("out = sorted(os.listxattr(M + '/f'))"), json!(["user.bee", "user.bin"]));
    agent.fails("os.getxattr(M + '/f', 'user.tx')", libc::ENODATA);
    m.commit().unwrap();
    assert_eq!(agent.ok("out = sorted(os.listxattr(M + '/f'))"), json!(["user.bin", "user.tx"]));
    drop(agent);

    m.umount_clean();
    m.start();
    assert_eq!(listxattr(&m.path("f")).unwrap(), ["user.bin", "user.tx"]);
    assert_eq!(getxattr(&m.path("f"), "user.bin", 1024).unwrap(), bin);
    assert_eq!(getxattr(&m.path("d"), "user.onadir", 64).unwrap(), b"");
}

#[test]
fn dot_txfs_is_hidden() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("visible"), "v").unwrap());
    assert!(m.backing().join(".txfs").is_dir(), "the daemon keeps its state in BACKING/.txfs");
    assert_eq!(names(m.mnt()), ["visible"]);
    let ls = m.sh("ls -a");
    assert_eq!(check_ok(&ls, "ls -a").split_whitespace().collect::<Vec<_>>(), [".", "..", "visible"]);
    assert_errno(std::fs::metadata(m.path(".txfs")), libc::ENOENT, "stat .txfs");
    assert_errno(File::open(m.path(".txfs")), libc::ENOENT, "open .txfs");
    assert_errno(File::open(m.path(".txfs/lock")), libc::ENOENT, "open .txfs/lock");
    assert_errno(std::fs::read_dir(m.path(".txfs/journal")).map(|_| ()), libc::ENOENT, "opendir .txfs/journal");
    assert_errno(std::fs::create_dir(m.path(".txfs")), libc::EPERM, "mkdir .txfs");
    assert_errno(File::create(m.path(".txfs")), libc::EPERM, "create .txfs");
    assert_errno(std::fs::rename(m.path("visible"), m.path(".txfs")), libc::EPERM, "rename onto .txfs");
    assert_errno(std::os::unix::fs::symlink("x", m.path(".txfs")), libc::EPERM, "symlink .txfs");
    assert_errno(std::fs::hard_link(m.path("visible"), m.path(".txfs")), libc::EPERM, "link .txfs");
    assert!(m.backing().join(".txfs/lock").exists(), "untouched");
    // Elsewhere, .txfs is an ordinary name.
    std::fs::create_dir(m.path("sub")).unwrap();
    std::fs::create_dir(m.path("sub/.txfs")).unwrap();
    std::fs::write(m.path("sub/.txfs/x"), "x").unwrap();
    assert_eq!(names(&m.path("sub")), [".txfs"]);
    // Its bytes never show through the mount.
    let mut s = String::new();
    File::open(m.path("visible")).unwrap().read_to_string(&mut s).unwrap();
    assert_eq!(s, "v");
}

#[test]
fn mode_times_and_statfs() {
    let m = Mount::new();
    let f = m.path("f");
    std::fs::write(&f, "f").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o4751);
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(1_000_000_000, 123_456_789);
    File::options().write(true).open(&f).unwrap().set_modified(t).unwrap();
    let md = std::fs::metadata(&f).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 123_456_789));
    OpenOptions::new().write(true).open(&f).unwrap().write_all(b"again").unwrap();
    let md = std::fs::metadata(&f).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((md.mtime() - now).abs() < 60, "a write sets mtime to now ({} vs {now})", md.mtime());
    assert!((md.ctime() - now).abs() < 60, "and ctime ({} vs {now})", md.ctime());
    let c = cpath(m.mnt());
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    io_result(unsafe { libc::statvfs(c.as_ptr(), &mut s) }).unwrap();
    assert_eq!(s.f_namemax, 255);
    assert!(s.f_blocks > 0 && s.f_bsize > 0);
    let _ = File::create(m.path("w")).unwrap().write(b"w").unwrap();
    let mode = OpenOptions::new().write(true).create_new(true).mode(0o600).open(m.path("m600")).unwrap();
    assert_eq!(mode.metadata().unwrap().mode() & 0o777, 0o600);
}

#[test]
fn big_directory_listing_and_rm_rf() {
    let m = Mount::new();
    let d = m.path("big");
    std::fs::create_dir(&d).unwrap();
    let n = 1500;
    for i in 0..n {
        File::create(d.join(format!("entry-with-a-longish-name-{i:05}"))).unwrap();
    }
    let ls = m.sh("ls -f big | wc -l");
    assert_eq!(check_ok(&ls, "ls").trim(), format!("{}", n + 2), "ls -f counts . and ..");
    assert_eq!(names(&d).len(), n);
    // Deleting while listing (rm -rf reads and unlinks in batches).
    check_ok(&m.sh("rm -rf big"), "rm -rf");
    assert_errno(std::fs::metadata(&d), libc::ENOENT, "after rm -rf");
    assert!(names(m.mnt()).is_empty());
}

#[test]
fn unlinked_open_file_lives_until_closed() {
    let mut m = Mount::new();
    let mut f = OpenOptions::new().read(true).write(true).create_new(true).open(m.path("tmp")).unwrap();
    f.write_all(b"before").unwrap();
    std::fs::remove_file(m.path("tmp")).unwrap();
    assert_errno(std::fs::metadata(m.path("tmp")), libc::ENOENT, "stat after unlink");
    f.write_all(b" and after").unwrap();
    let mut s = String::new();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "before and after");
    let md = f.metadata().unwrap();
    assert_eq!((md.len(), md.nlink()), (16, 0));
    // A new file of the same name is a different file.
    std::fs::write(m.path("tmp"), "new").unwrap();
    assert_eq!(f.metadata().unwrap().len(), 16);
    drop(f);
    assert_eq!(std::fs::read_to_string(m.path("tmp")).unwrap(), "new");
    m.umount_clean();
    let orphans = m.backing().join(".txfs/orphans");
    if orphans.exists() {
        assert!(names(&orphans).is_empty(), "orphans left: {:?}", names(&orphans));
    }
    assert_eq!(names(m.backing()), [".txfs", "tmp"]);
}

#[test]
fn flock_and_posix_locks_work_between_processes() {
    let m = Mount::new();
    std::fs::write(m.path("lockfile"), "l").unwrap();
    let mut a = Agent::spawn(m.mnt());
    let mut b = Agent::spawn(m.mnt());
    for ag in [&mut a, &mut b] {
        ag.ok("fd = os.open(M + '/lockfile', os.O_RDWR)");
    }
    a.ok("fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)");
    b.fails("fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", libc::EWOULDBLOCK);
    a.ok("fcntl.flock(fd, fcntl.LOCK_UN)");
    b.ok("fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)");
    b.ok("fcntl.flock(fd, fcntl.LOCK_UN)");
    a.ok("fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)");
    b.fails("fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 5)", libc::EAGAIN);
    b.ok("fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 20)");
}

/// Outside transactions the mount is a POSIX file system: shared writable
/// mappings work (SQLite's WAL index, LMDB, ...). SPEC §3 only allows
/// refusing them *inside* a transaction.
#[test]
fn shared_writable_mmap_outside_transactions() {
    let m = Mount::new();
    let mut a = Agent::spawn(m.mnt());
    a.ok("import mmap; fd = os.open(M + '/shm', os.O_RDWR | os.O_CREAT, 0o644); os.ftruncate(fd, 8192)");
    match a.run("mm = mmap.mmap(fd, 8192, flags=mmap.MAP_SHARED); mm[100:104] = b'shrd'; mm.flush()") {
        Ok(_) => {}
        Err(e) => panic!("MAP_SHARED|PROT_WRITE outside a transaction failed: {}", errname(e)),
    }
    let data = std::fs::read(m.path("shm")).unwrap();
    assert_eq!(&data[100..104], b"shrd", "written through a shared mapping, read with read(2)");
    let o = Command::new("sqlite3")
        .arg(m.path("w.db"))
        .arg("PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES(1); SELECT count(*) FROM t;")
        .output()
        .unwrap();
    assert_eq!(check_ok(&o, "sqlite3 in WAL mode").split_whitespace().collect::<Vec<_>>(), ["wal", "1"]);
}

/// `mount -t fuse.txfs` and an fstab line go through `/sbin/mount.fuse.txfs`
/// (a symlink to `txfs`, made here when the machine has none), which mounts
/// as a daemon; `txfs umount` then leaves plain files.
#[test]
fn mount_t_fuse_txfs_and_an_fstab_line() {
    let helper = Path::new("/sbin/mount.fuse.txfs");
    let made = match std::fs::symlink_metadata(helper) {
        Ok(_) => false,
        Err(_) => {
            std::os::unix::fs::symlink(TXFS, helper).expect("symlink /sbin/mount.fuse.txfs");
            true
        }
    };
    struct Unlink(bool);
    impl Drop for Unlink {
        fn drop(&mut self) {
            if self.0 {
                let _ = std::fs::remove_file("/sbin/mount.fuse.txfs");
            }
        }
    }
    let _unlink = Unlink(made);
    let tmp = tempfile::Builder::new().prefix(PREFIX).tempdir().unwrap();
    let (backing, mnt) = (tmp.path().join("backing"), tmp.path().join("mnt"));
    std::fs::create_dir(&backing).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(backing.join("hello"), "from backing").unwrap();

    let fstab = tmp.path().join("fstab");
    std::fs::write(&fstab, format!("{} {} fuse.txfs defaults,noatime 0 0\n", backing.display(), mnt.display()))
        .unwrap();
    let ways: [Vec<&OsStr>; 2] = [
        vec!["-t".as_ref(), "fuse.txfs".as_ref(), "-o".as_ref(), "noatime".as_ref(), backing.as_ref(), mnt.as_ref()],
        vec!["-T".as_ref(), fstab.as_ref(), mnt.as_ref()],
    ];
    for (i, args) in ways.iter().enumerate() {
        let out = Command::new("mount").args(args).output().expect("running mount(8)");
        assert!(out.status.success(), "mount {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let guard = scopeguard(&mnt);
        assert!(is_mounted(&mnt), "mount {args:?} returned but {} is not a txfs mount", mnt.display());
        let seen = std::fs::read_to_string(mnt.join("hello")).unwrap();
        assert!(seen.starts_with("from backing"), "read through the mount: {seen:?}");
        std::fs::write(mnt.join("hello"), format!("from backing, way {i}")).unwrap();
        let um = Command::new(TXFS).arg("umount").arg(&mnt).output().unwrap();
        assert!(um.status.success(), "txfs umount: {}", String::from_utf8_lossy(&um.stderr));
        std::mem::forget(guard);
        assert!(!is_mounted(&mnt));
        assert_eq!(std::fs::read_to_string(backing.join("hello")).unwrap(), format!("from backing, way {i}"));
    }
}

/// Lazily unmounts `mnt` if the test fails while it is mounted.
fn scopeguard(mnt: &Path) -> impl Drop + '_ {
    struct G<'a>(&'a Path);
    impl Drop for G<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    G(mnt)
}

/// A listing read in many small pieces: entries removed and added meanwhile
/// (among them the ones just read, as `rm -r` does) must not make it skip or
/// repeat anything that was there throughout.
#[test]
fn a_listing_read_in_pieces_survives_removals_and_additions() {
    const N: usize = 3000;
    let m = Mount::start_with(&[], |b| {
        std::fs::create_dir(b.join("d")).unwrap();
        for i in 0..N {
            std::fs::write(b.join(format!("d/f{i:05}")), "").unwrap();
        }
    });
    let d = m.path("d");
    let fd = open_dir(&d);
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut removed_unread = std::collections::HashSet::new();
    let mut added = 0usize;
    let mut reads = 0usize;
    loop {
        let names = getdents(fd, 512);
        if names.is_empty() {
            break;
        }
        reads += 1;
        for n in &names {
            *seen.entry(n.clone()).or_default() += 1;
            // (A name removed after the listing began may still come.)
            if n.starts_with('f') && seen[n] == 1 && !removed_unread.contains(n) {
                std::fs::remove_file(d.join(n)).unwrap();
            }
        }
        // Some entries not read yet go, and new ones come.
        for k in 0..3 {
            let victim = format!("f{:05}", (reads * 37 + k * 1009) % N);
            if !seen.contains_key(&victim) && removed_unread.insert(victim.clone()) {
                std::fs::remove_file(d.join(&victim)).unwrap();
            }
        }
        std::fs::write(d.join(format!("n{added}")), "").unwrap();
        added += 1;
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    assert!(reads > 20, "the listing came in {reads} pieces: the buffer was meant to split it");
    let twice: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).map(|(n, _)| n.clone()).collect();
    assert!(twice.is_empty(), "names read twice: {twice:?}");
    let missed: Vec<_> =
        (0..N).map(|i| format!("f{i:05}")).filter(|n| !removed_unread.contains(n) && !seen.contains_key(n)).collect();
    assert!(
        missed.is_empty(),
        "{} names present throughout were skipped: {:?}",
        missed.len(),
        &missed[..missed.len().min(10)]
    );
    let bogus: Vec<_> = seen.keys().filter(|n| !n.starts_with('f') && !n.starts_with('n')).collect();
    assert!(bogus.is_empty(), "names that never existed: {bogus:?}");
    // What is left: exactly the additions (every original was removed).
    let mut left = names(&d);
    left.sort();
    let mut want: Vec<String> = (0..added).map(|i| format!("n{i}")).collect();
    want.sort();
    assert_eq!(left, want);
}

/// telldir/seekdir and rewinddir: a position taken mid-listing reads the
/// same names again; a rewind reads all of them.
#[test]
fn seekdir_and_rewinddir_return_to_the_same_names() {
    let m = Mount::start_with(&[], |b| {
        for i in 0..500 {
            std::fs::write(b.join(format!("e{i}")), "").unwrap();
        }
    });
    let c = cpath(m.mnt());
    let read = |dir: *mut libc::DIR, k: usize| -> Vec<String> {
        let mut out = Vec::new();
        while out.len() < k {
            // SAFETY: `dir` is an open stream.
            let e = unsafe { libc::readdir(dir) };
            if e.is_null() {
                break;
            }
            // SAFETY: readdir returned a valid entry.
            let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_string_lossy().into_owned();
            if name != "." && name != ".." {
                out.push(name);
            }
        }
        out
    };
    // SAFETY: a valid C string; the stream is closed below.
    let dir = unsafe { libc::opendir(c.as_ptr()) };
    assert!(!dir.is_null());
    let first = read(dir, 200);
    // SAFETY: open stream.
    let pos = unsafe { libc::telldir(dir) };
    let next = read(dir, 150);
    // SAFETY: a position telldir gave for this stream.
    unsafe { libc::seekdir(dir, pos) };
    assert_eq!(read(dir, 150), next, "seekdir to a telldir position");
    let rest = read(dir, usize::MAX);
    let mut all: Vec<String> = first.iter().chain(&next).chain(&rest).cloned().collect();
    assert_eq!(all.len(), 500);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 500, "a name came twice");
    // SAFETY: open stream.
    unsafe { libc::rewinddir(dir) };
    assert_eq!(read(dir, usize::MAX).len(), 500, "after rewinddir");
    // SAFETY: open stream, closed once.
    unsafe { libc::closedir(dir) };
}

/// A directory descriptor read part-way by one process and inherited by
/// another: the second continues where the first stopped.
#[test]
fn an_inherited_directory_stream_continues_in_the_child() {
    let m = Mount::start_with(&[], |b| {
        for i in 0..800 {
            std::fs::write(b.join(format!("g{i}")), "").unwrap();
        }
    });
    let fd = open_dir(m.mnt());
    let mut names_read = getdents(fd, 1024);
    names_read.extend(getdents(fd, 1024));
    assert!(!names_read.is_empty() && names_read.len() < 800);
    // The child reads on through the same open file (its position included)
    // and prints what it got.
    // SAFETY: clearing FD_CLOEXEC on our descriptor.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    let script = r#"
import ctypes, sys
fd, nr = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(4096)
names = []
while True:
    n = libc.syscall(nr, fd, buf, 4096)
    assert n >= 0, ctypes.get_errno()
    if n == 0:
        break
    raw, at = buf.raw, 0
    while at < n:
        rl = int.from_bytes(raw[at + 16:at + 18], 'little')
        nm = raw[at + 19:at + rl].split(b'\0')[0].decode()
        if nm not in ('.', '..'):
            names.append(nm)
        at += rl
print('\n'.join(names))
"#;
    let out = Command::new(python())
        .args(["-c", script, &fd.to_string(), &libc::SYS_getdents64.to_string()])
        .output()
        .unwrap();
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    assert!(out.status.success(), "child: {}", String::from_utf8_lossy(&out.stderr));
    let child: Vec<String> =
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(String::from).collect();
    let mut all: Vec<String> = names_read.iter().chain(&child).cloned().collect();
    assert_eq!(all.len(), 800, "parent read {}, child {}", names_read.len(), child.len());
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 800, "a name came twice");
}

/// Times before the epoch in whole seconds (`touch -d 1901-12-13`, tar
/// archives of old files) are what was set, and the checkpoint applies
/// them: the conversion once made them one second early with 1e9
/// nanoseconds, which the backing's utimensat refuses, so the checkpoint
/// failed and the mount answered EIO for good (found by
/// reliability/hostile.py, class entry).
#[test]
fn times_before_the_epoch_survive_the_checkpoint() {
    let mut m = Mount::new();
    let times = [(-(1i64 << 31), 0i64), (-1, 0), (-1, 500_000_000), (-86_400, 999_999_999)];
    for (i, (secs, nanos)) in times.iter().enumerate() {
        let p = m.path(format!("old{i}"));
        File::create(&p).unwrap();
        let ts = libc::timespec { tv_sec: *secs, tv_nsec: *nanos };
        // SAFETY: valid C string and two timespecs.
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, cpath(&p).as_ptr(), [ts, ts].as_ptr(), 0) };
        io_result(r).unwrap();
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!((md.mtime(), md.mtime_nsec()), (*secs, *nanos), "old{i} on the mount");
    }
    m.umount_clean(); // checkpoints: would fail (EINVAL) with the old conversion
    for (i, (secs, nanos)) in times.iter().enumerate() {
        let md = std::fs::metadata(m.backing().join(format!("old{i}"))).unwrap();
        assert_eq!((md.mtime(), md.mtime_nsec()), (*secs, *nanos), "old{i} in the backing directory");
    }
}
