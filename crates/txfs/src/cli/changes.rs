//! A transaction's change set for people and tools: `txfs diff`, and what
//! `txfs run --dry-run / --confirm` prints. Fetched from the daemon a page
//! at a time (CHANGES, `fuse/changes.rs`); printed like `git status` (one
//! line a path, what is below a created or deleted directory folded into
//! it), as JSON (docs/CHANGES.md), or with unified diffs of text files like
//! `git diff`, paged on a terminal.

use crate::wire::{self, what, ChangeRec};
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;

/// Who asks about which transaction: on `mount` (its root directory),
/// the caller's own (`pid` 0) or the `txfs run` tree of `pid`.
#[derive(Clone, Copy)]
pub(super) struct Source<'a> {
    pub mount: &'a std::fs::File,
    pub pid: u32,
}

/// How to print a change set.
#[derive(Clone, Copy, Default)]
pub(super) struct Show {
    pub json: bool,
    /// Unified diffs of text files.
    pub diff: bool,
    /// Every path, also those below a created or deleted directory.
    pub all: bool,
}

/// Files past this size are not read for a diff.
const DIFF_MAX: u64 = 16 << 20;

impl Source<'_> {
    fn ask(&self, op: u32, snap: u32, index: u64, offset: u64) -> io::Result<wire::Changes> {
        let req = wire::Changes { pid: self.pid, op, offset, index, snap, ..Default::default() };
        let mut buf = req.encode();
        // SAFETY: CHANGES reads and writes `Changes::SIZE` bytes, which `buf` holds.
        if unsafe { libc::ioctl(self.mount.as_raw_fd(), wire::CHANGES as _, buf.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(wire::Changes::decode(&buf))
    }

    /// The change set. A newer listing taken meanwhile (ESTALE) starts it
    /// again.
    pub fn list(&self) -> io::Result<Listing> {
        'again: for _ in 0..8 {
            let first = self.ask(wire::CHANGES_LIST, 0, 0, 0)?;
            let mut bytes = Vec::with_capacity(first.total as usize);
            let mut page = first;
            loop {
                bytes.extend_from_slice(&page.data.0[..page.len as usize]);
                if bytes.len() as u64 >= first.total || page.len == 0 {
                    break;
                }
                page = match self.ask(wire::CHANGES_LIST, first.snap, 0, bytes.len() as u64) {
                    Err(e) if e.raw_os_error() == Some(libc::ESTALE) => continue 'again,
                    r => r?,
                };
            }
            let recs = wire::decode_changes(&bytes)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "the daemon's change listing is cut"))?;
            let lost = first.flags & wire::CHANGES_LOST != 0;
            return Ok(Listing { snap: first.snap, recs, lost });
        }
        Err(io::Error::other("the change set kept being listed anew by others"))
    }

    /// One side of change `index` of listing `snap`: its bytes, or `None`
    /// past [`DIFF_MAX`].
    fn content(&self, snap: u32, index: usize, new: bool) -> io::Result<Option<Vec<u8>>> {
        let op = if new { wire::CHANGES_NEW } else { wire::CHANGES_OLD };
        let mut page = self.ask(op, snap, index as u64, 0)?;
        if page.total > DIFF_MAX {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(page.total as usize);
        loop {
            out.extend_from_slice(&page.data.0[..page.len as usize]);
            if page.len == 0 || out.len() as u64 >= page.total {
                return Ok(Some(out));
            }
            page = self.ask(op, snap, index as u64, out.len() as u64)?;
        }
    }
}

/// A change set as listed.
pub(super) struct Listing {
    /// The daemon's snapshot of it, which names its files' two sides.
    snap: u32,
    recs: Vec<ChangeRec>,
    /// The transaction already lost a conflict: its commit will fail.
    pub lost: bool,
}

/// How many paths of each kind, for the closing line.
#[derive(Default)]
struct Tally {
    created: u64,
    deleted: u64,
    modified: u64,
    renamed: u64,
    other: u64,
    bytes: u64,
}

impl Tally {
    fn add(&mut self, c: &ChangeRec) {
        match status(c) {
            "created" => self.created += 1,
            "deleted" => self.deleted += 1,
            "modified" => self.modified += 1,
            "renamed" => self.renamed += 1,
            "replaced" => self.modified += 1,
            _ => self.other += 1,
        }
        self.bytes += c.bytes;
    }

    fn line(&self, paths: usize) -> String {
        if paths == 0 {
            return "no changes".into();
        }
        let mut parts = Vec::new();
        for (n, word) in [
            (self.created, "created"),
            (self.deleted, "deleted"),
            (self.modified, "modified"),
            (self.renamed, "renamed"),
            (self.other, "other"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {word}"));
            }
        }
        let s = if paths == 1 { "" } else { "s" };
        format!("{paths} path{s}: {}; {} written", parts.join(", "), super::human(self.bytes))
    }
}

/// The word for what happened to a path, as the first column says it.
fn status(c: &ChangeRec) -> &'static str {
    let w = c.what;
    if w & what::CREATED != 0 {
        "created"
    } else if w & what::DELETED != 0 {
        "deleted"
    } else if w & what::RENAMED != 0 {
        "renamed"
    } else if w & what::LINKED != 0 {
        "linked"
    } else if w & what::MODIFIED != 0 {
        "modified"
    } else if w & what::REPLACED != 0 {
        "replaced"
    } else {
        "changed"
    }
}

fn kind_name(kind: u32) -> &'static str {
    match kind {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "char device",
        libc::S_IFBLK => "block device",
        _ => "other",
    }
}

/// A path for a terminal, quoted as git quotes one when it holds control
/// characters, quotes, backslashes or bytes that are not UTF-8.
fn shown(p: &[u8]) -> String {
    match std::str::from_utf8(p) {
        Ok(s) if !s.chars().any(|c| c.is_control() || c == '"' || c == '\\') => s.to_owned(),
        _ => {
            let mut out = String::from("\"");
            for &b in p {
                match b {
                    b'"' => out.push_str("\\\""),
                    b'\\' => out.push_str("\\\\"),
                    b'\n' => out.push_str("\\n"),
                    b'\t' => out.push_str("\\t"),
                    0x20..=0x7e => out.push(b as char),
                    _ => out.push_str(&format!("\\{b:03o}")),
                }
            }
            out.push('"');
            out
        }
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One line of the human listing.
fn line(c: &ChangeRec) -> String {
    let mut s = format!("{:<9} {}", status(c), shown(&c.path));
    if c.kind == libc::S_IFDIR && !c.path.is_empty() {
        s.push('/');
    }
    let w = c.what;
    let mut details: Vec<String> = Vec::new();
    if w & what::RENAMED != 0 {
        s = format!("{:<9} {} → {}", status(c), shown(&c.from), shown(&c.path));
    }
    if w & (what::CREATED | what::DELETED) != 0 && c.kind == libc::S_IFDIR {
        let mut parts = Vec::new();
        if c.files > 0 {
            parts.push(plural(c.files, "file", "files"));
        }
        if c.dirs > 0 {
            parts.push(plural(c.dirs, "directory", "directories"));
        }
        details.push(if parts.is_empty() { "empty".into() } else { parts.join(", ") });
    } else if w & what::CREATED != 0 && c.kind == libc::S_IFREG {
        details.push(super::human(c.new_size));
    } else if w & what::DELETED != 0 && c.kind == libc::S_IFREG {
        details.push(super::human(c.old_size));
    } else if w & (what::CREATED | what::DELETED) != 0 && c.kind != libc::S_IFLNK {
        details.push(kind_name(c.kind).into());
    }
    if c.kind == libc::S_IFLNK {
        let (old, new) = (&c.old_target, &c.target);
        match (old.is_empty(), new.is_empty()) {
            (false, false) if old != new => details.push(format!("-> {} (was {})", shown(new), shown(old))),
            (_, false) => details.push(format!("-> {}", shown(new))),
            (false, true) => details.push(format!("was -> {}", shown(old))),
            _ => {}
        }
    }
    if w & what::RENAMED == 0 && !c.from.is_empty() {
        details.push(format!("was {}", shown(&c.from)));
    }
    if w & what::MODIFIED != 0 {
        let (old, new) = (super::human(c.old_size), super::human(c.new_size));
        let sizes = if c.old_size == c.new_size {
            new
        } else if old == new {
            // Sizes that round alike: the bytes.
            format!("{} B → {} B", c.old_size, c.new_size)
        } else {
            format!("{old} → {new}")
        };
        details.push(format!("{sizes}, {} written", super::human(c.bytes)));
    }
    if w & what::REPLACED != 0 && status(c) != "replaced" {
        details.push("replaced".into());
    }
    if w & what::MODE != 0 {
        details.push(format!("mode {:04o} → {:04o}", c.old_mode & 0o7777, c.new_mode & 0o7777));
    }
    if w & what::OWNER != 0 {
        details.push(format!("owner {}:{} → {}:{}", c.old_uid, c.old_gid, c.new_uid, c.new_gid));
    }
    if w & what::XATTR != 0 {
        let names: Vec<String> = c.xattrs.iter().map(|x| shown(x)).collect();
        details.push(format!("xattr {}", names.join(" ")));
    }
    if w & what::TIMES != 0 {
        details.push("times".into());
    }
    if !details.is_empty() {
        s.push_str(&format!("  ({})", details.join("; ")));
    }
    s
}

/// Which records a human listing shows: not those below a directory
/// created (deleted) with them, unless `all`.
fn visible(recs: &[ChangeRec], all: bool) -> Vec<usize> {
    let mut out = Vec::new();
    let mut fold: Option<(&[u8], bool)> = None;
    for (i, c) in recs.iter().enumerate() {
        let created = c.what & what::CREATED != 0;
        if let Some((dir, was_created)) = fold {
            let below = c.path.len() > dir.len() && c.path.starts_with(dir) && c.path[dir.len()] == b'/';
            if below && (was_created == created) && (created || c.what == what::DELETED) && !all {
                continue;
            }
            if !below {
                fold = None;
            }
        }
        if fold.is_none() && c.kind == libc::S_IFDIR && (created || c.what == what::DELETED) {
            fold = Some((&c.path, created));
        }
        out.push(i);
    }
    out
}

fn text(b: &[u8]) -> serde_json::Value {
    serde_json::Value::String(String::from_utf8_lossy(b).into_owned())
}

/// A record as JSON (the schema: docs/CHANGES.md).
fn json(c: &ChangeRec) -> serde_json::Value {
    let w = c.what;
    let words: Vec<&str> = [
        (what::CREATED, "created"),
        (what::DELETED, "deleted"),
        (what::MODIFIED, "modified"),
        (what::RENAMED, "renamed"),
        (what::LINKED, "linked"),
        (what::REPLACED, "replaced"),
        (what::MODE, "mode"),
        (what::OWNER, "owner"),
        (what::XATTR, "xattr"),
        (what::TIMES, "times"),
    ]
    .into_iter()
    .filter(|(b, _)| w & b != 0)
    .map(|(_, s)| s)
    .collect();
    let side = |mode: u32, uid: u32, gid: u32, size: u64| {
        (mode != 0).then(
            || serde_json::json!({ "mode": format!("{:04o}", mode & 0o7777), "uid": uid, "gid": gid, "size": size }),
        )
    };
    let mut v = serde_json::json!({
        "path": text(&c.path),
        "status": status(c),
        "what": words,
        "kind": kind_name(c.kind),
        "old": side(c.old_mode, c.old_uid, c.old_gid, c.old_size),
        "new": side(c.new_mode, c.new_uid, c.new_gid, c.new_size),
        "bytes_written": c.bytes,
    });
    let m = v.as_object_mut().expect("an object");
    if std::str::from_utf8(&c.path).is_err() {
        m.insert("path_hex".into(), c.path.iter().map(|b| format!("{b:02x}")).collect::<String>().into());
    }
    if !c.from.is_empty() {
        m.insert("from".into(), text(&c.from));
        if std::str::from_utf8(&c.from).is_err() {
            m.insert("from_hex".into(), c.from.iter().map(|b| format!("{b:02x}")).collect::<String>().into());
        }
    }
    if !c.target.is_empty() {
        m.insert("target".into(), text(&c.target));
    }
    if !c.old_target.is_empty() {
        m.insert("old_target".into(), text(&c.old_target));
    }
    if !c.xattrs.is_empty() {
        m.insert("xattrs".into(), c.xattrs.iter().map(|x| text(x)).collect());
    }
    if c.kind == libc::S_IFDIR && w & (what::CREATED | what::DELETED) != 0 {
        m.insert("below".into(), serde_json::json!({ "files": c.files, "dirs": c.dirs }));
    }
    v
}

/// Git's test for a binary file: a NUL in its first 8000 bytes.
fn binary(b: &[u8]) -> bool {
    b[..b.len().min(8000)].contains(&0)
}

/// The unified diff of change `i`, if it has file contents on a side.
fn diff(src: &Source, snap: u32, i: usize, c: &ChangeRec, out: &mut dyn Write) -> io::Result<()> {
    let file = |mode: u32| mode & libc::S_IFMT == libc::S_IFREG;
    let (old_file, new_file) = (file(c.old_mode) && c.what & what::CREATED == 0, file(c.new_mode));
    let content_changed = c.what & (what::CREATED | what::DELETED | what::MODIFIED) != 0;
    if !(old_file || new_file) || !content_changed {
        return Ok(());
    }
    let read = |new: bool, present: bool| -> io::Result<Option<Vec<u8>>> {
        if !present {
            return Ok(Some(Vec::new()));
        }
        match src.content(snap, i, new) {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(None),
            r => r,
        }
    };
    // As git: `a/PATH`, the whole name quoted when the path needs it.
    let side = |prefix: &[u8], p: &[u8]| shown(&[prefix, p].concat());
    let old_name =
        if old_file { side(b"a/", if c.from.is_empty() { &c.path } else { &c.from }) } else { "/dev/null".into() };
    let new_name = if new_file && c.what & what::DELETED == 0 { side(b"b/", &c.path) } else { "/dev/null".into() };
    let (old, new) = (read(false, old_file)?, read(true, new_file && c.what & what::DELETED == 0)?);
    let (Some(old), Some(new)) = (old, new) else {
        return writeln!(out, "(not shown: {} is too large to diff, or not readable by you)\n", shown(&c.path));
    };
    if binary(&old) || binary(&new) {
        return writeln!(out, "Binary files {old_name} and {new_name} differ\n");
    }
    let d = similar::TextDiff::configure()
        .algorithm(similar::Algorithm::Myers)
        .timeout(std::time::Duration::from_secs(2))
        .diff_lines(&old[..], &new[..]);
    // Written by hand, not by `UnifiedDiff`'s writer: that one makes bytes
    // that are not UTF-8 U+FFFD, and the patch would not apply.
    let mut u = d.unified_diff();
    u.context_radius(3);
    let mut first = true;
    for hunk in u.iter_hunks() {
        if std::mem::take(&mut first) {
            writeln!(out, "--- {old_name}\n+++ {new_name}")?;
        }
        writeln!(out, "{}", hunk.header())?;
        for change in hunk.iter_changes() {
            let sign = match change.tag() {
                similar::ChangeTag::Delete => b'-',
                similar::ChangeTag::Insert => b'+',
                similar::ChangeTag::Equal => b' ',
            };
            out.write_all(&[sign])?;
            out.write_all(change.value())?;
            if change.missing_newline() {
                out.write_all(b"\n\\ No newline at end of file\n")?;
            }
        }
    }
    Ok(())
}

/// Prints the change set `l` of `src` to stdout (paged on a terminal, as
/// git does).
pub(super) fn print(src: &Source, l: &Listing, show: Show) -> io::Result<()> {
    let (snap, recs) = (l.snap, &l.recs);
    let mut pager = Pager::start(!show.json);
    // Buffered: stdout is line-buffered, a pager's pipe not at all; one
    // write a line made a listing of 100 000 paths take seconds.
    let mut buffered = io::BufWriter::with_capacity(1 << 16, pager.writer());
    let out: &mut dyn Write = &mut buffered;
    let r = (|| -> io::Result<()> {
        if show.json {
            // One change a line, written as it is made: a document of
            // 100 000 changes built whole took 390 MB.
            let mut t = Tally::default();
            writeln!(out, "{{\"changes\": [")?;
            for (i, c) in recs.iter().enumerate() {
                t.add(c);
                serde_json::to_writer(&mut *out, &json(c))?;
                writeln!(out, "{}", if i + 1 < recs.len() { "," } else { "" })?;
            }
            let summary = serde_json::json!({
                "paths": recs.len(),
                "created": t.created, "deleted": t.deleted, "modified": t.modified,
                "renamed": t.renamed, "other": t.other, "bytes_written": t.bytes,
            });
            return writeln!(out, "],\n\"summary\": {summary}}}");
        }
        let mut t = Tally::default();
        recs.iter().for_each(|c| t.add(c));
        let shown_recs = visible(recs, show.all);
        for &i in &shown_recs {
            writeln!(out, "{}", line(&recs[i]))?;
        }
        if show.diff {
            writeln!(out)?;
            for &i in &shown_recs {
                diff(src, snap, i, &recs[i], out)?;
            }
        }
        writeln!(out, "{}", t.line(recs.len()))
    })()
    .and_then(|()| buffered.flush());
    drop(buffered);
    pager.finish();
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// stdout, or a pager's stdin when stdout is a terminal (`$PAGER`, else
/// `less` with `LESS=FRX` unless set: it exits at once if all fits).
struct Pager {
    child: Option<std::process::Child>,
    stdout: io::Stdout,
}

impl Pager {
    fn start(wanted: bool) -> Pager {
        use std::io::IsTerminal;
        let stdout = io::stdout();
        if !wanted || !stdout.is_terminal() {
            return Pager { child: None, stdout };
        }
        let cmd = std::env::var("PAGER").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "less".into());
        let mut c = std::process::Command::new("sh");
        c.arg("-c").arg(&cmd).stdin(std::process::Stdio::piped());
        if std::env::var_os("LESS").is_none() {
            c.env("LESS", "FRX");
        }
        Pager { child: c.spawn().ok(), stdout }
    }

    fn writer(&mut self) -> &mut dyn Write {
        match self.child.as_mut().and_then(|c| c.stdin.as_mut()) {
            Some(w) => w,
            None => &mut self.stdout,
        }
    }

    fn finish(&mut self) {
        if let Some(mut c) = self.child.take() {
            drop(c.stdin.take());
            let _ = c.wait();
        } else {
            let _ = self.stdout.flush();
        }
    }
}

/// `txfs diff`: the change set of the caller's own transaction (a shell
/// under `txfs run`), or of the thread transaction of the program that
/// started it, on the mount at `point`.
pub fn diff_cmd(mount: Option<&std::path::Path>, show: Show) -> Result<(), String> {
    let point = crate::attribution::mountinfo::resolve(mount, &[]).map_err(|e| e.to_string())?;
    let dir = std::fs::File::open(&point).map_err(|e| format!("{}: {e}", point.display()))?;
    let src = Source { mount: &dir, pid: 0 };
    match src.list().and_then(|l| print(&src, &l, show)) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Err(format!("not in a transaction on {} (run it in a shell under `txfs run`)", point.display()))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => {
            Err(format!("{}: the daemon predates `txfs diff` (remount with this txfs)", point.display()))
        }
        Err(e) => Err(format!("{}: {e}", point.display())),
    }
}
