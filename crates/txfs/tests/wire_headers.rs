//! The clients' copies of the wire protocol agree with `src/wire.rs`.
//!
//! `clients/c/txfs.h` (C, and the SQLite VFS through it) and
//! `clients/python/txfs/_wire.py` spell the ioctl numbers and argument
//! structs out by hand. This test reads both as text — the C structs laid
//! out by C's rules (every field at a multiple of its alignment, the
//! struct's size a multiple of its largest), the Python ones by their
//! `struct` formats — and fails on any ioctl number, struct size, field
//! offset, field name or constant that differs from the daemon's.

#[allow(dead_code)]
#[path = "../src/wire.rs"]
mod wire;

use std::collections::HashMap;
use std::path::Path;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A struct as a client lays it out: size, and (name, offset, size) per field.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    size: usize,
    fields: Vec<(String, usize, usize)>,
}

fn rust_layout(c_name: &str) -> Layout {
    let (_, size, fields) = wire::STRUCTS.iter().find(|s| s.0 == c_name).unwrap_or_else(|| panic!("{c_name}"));
    Layout { size: *size, fields: fields.iter().map(|f| (f.name.to_string(), f.offset, f.size)).collect() }
}

/// Field names that differ on purpose: (C struct, Rust name, C name).
const RENAMED: &[(&str, &str, &str)] = &[
    // The view's descriptor went into the field txfs.h keeps reserved
    // (its C clients serve no views).
    ("txfs_ioc_run", "view_fd", "reserved"),
];

fn c_named(c_struct: &str, mut l: Layout) -> Layout {
    for (s, rust, c) in RENAMED {
        if *s == c_struct {
            for f in &mut l.fields {
                if f.0 == *rust {
                    f.0 = c.to_string();
                }
            }
        }
    }
    l
}

/// `_IOC(dir, TXFS_IOC_MAGIC, nr, size)`, asm-generic encoding.
fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (wire::MAGIC << 8) | nr
}

fn strip_c_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("an unterminated comment") + i + 2;
        rest = &rest[end..];
    }
    out.push_str(rest);
    out.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The C header's wire structs (`struct txfs_ioc_*`), laid out by C's
/// rules, with each one's alignment. Its other structs (the API's own, such
/// as `struct txfs_change`) are not on the wire and are passed over.
fn c_structs(h: &str) -> HashMap<String, (Layout, usize)> {
    let mut out: HashMap<String, (Layout, usize)> = HashMap::new();
    let mut rest = h;
    while let Some(i) = rest.find("struct ") {
        let after = &rest[i + 7..];
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let tail = after[name.len()..].trim_start();
        if !tail.starts_with('{') {
            rest = &after[name.len()..];
            continue;
        }
        let body_start = after.len() - tail.len() + 1;
        let body_end = after.find('}').expect("a struct without its end");
        if !name.starts_with("txfs_ioc_") {
            rest = &after[body_end..];
            continue;
        }
        let body = &after[body_start..body_end];
        let (mut at, mut align, mut fields) = (0usize, 1usize, Vec::new());
        for decl in body.split(';').map(str::trim).filter(|d| !d.is_empty()) {
            let (ty, names) = if let Some(r) = decl.strip_prefix("struct ") {
                let (t, n) = r.split_once(' ').expect("struct field");
                (format!("struct {t}"), n)
            } else if let Some(n) = decl.strip_prefix("unsigned char ") {
                ("unsigned char".to_string(), n)
            } else {
                let (t, n) = decl.split_once(' ').expect("field");
                (t.to_string(), n)
            };
            let (size, a) = match ty.as_str() {
                "uint32_t" => (4, 4),
                "uint64_t" => (8, 8),
                "unsigned char" | "uint8_t" => (1, 1),
                t => {
                    let inner = t.strip_prefix("struct ").unwrap_or_else(|| panic!("unknown C type {t}"));
                    let (l, a) = out.get(inner).unwrap_or_else(|| panic!("struct {inner} used before it is defined"));
                    (l.size, *a)
                }
            };
            for n in names.split(',').map(str::trim) {
                let (n, count) = match n.split_once('[') {
                    Some((n, c)) => (n.trim(), c.trim_end_matches(']').trim().parse::<usize>().expect("array length")),
                    None => (n, 1),
                };
                at = at.next_multiple_of(a);
                fields.push((n.to_string(), at, size * count));
                at += size * count;
                align = align.max(a);
            }
        }
        out.insert(name.clone(), (Layout { size: at.next_multiple_of(align), fields }, align));
        rest = &after[body_end..];
    }
    out
}

/// `#define NAME VALUE` lines.
fn c_defines(h: &str) -> HashMap<String, String> {
    h.lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|l| l.split_once(char::is_whitespace))
        .map(|(n, v)| (n.to_string(), v.trim().to_string()))
        .collect()
}

fn c_int(v: &str) -> u32 {
    let v = v.trim().trim_end_matches(['u', 'U']);
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16).expect("hex"),
        None => v.parse().unwrap_or_else(|_| panic!("not a number: {v}")),
    }
}

#[test]
fn the_c_header_agrees_with_the_daemon() {
    let h = strip_c_comments(&read("clients/c/txfs.h"));
    let structs = c_structs(&h);
    let defs = c_defines(&h);
    let mut seen = Vec::new();
    for (name, value) in &defs {
        let Some(op) = name.strip_prefix("TXFS_IOC_").filter(|n| *n != "MAGIC") else { continue };
        let (dir, args) = if let Some(a) = value.strip_prefix("_IOWR(") {
            (3, a)
        } else if let Some(a) = value.strip_prefix("_IOW(") {
            (1, a)
        } else if let Some(a) = value.strip_prefix("_IOR(") {
            (2, a)
        } else {
            panic!("{name}: not an _IOW/_IOR/_IOWR: {value}")
        };
        let args: Vec<&str> = args.trim_end_matches(')').split(',').map(str::trim).collect();
        assert_eq!(args[0], "TXFS_IOC_MAGIC", "{name}");
        let c_struct = args[2].strip_prefix("struct ").unwrap_or_else(|| panic!("{name}: argument {}", args[2]));
        let (layout, _) = structs.get(c_struct).unwrap_or_else(|| panic!("{name}: no struct {c_struct}"));
        let number = ioc(dir, args[1].parse().expect("ioctl nr"), layout.size);
        let (_, rust_number, rust_struct) =
            wire::IOCTLS.iter().find(|i| i.0 == op).unwrap_or_else(|| panic!("{name} is not in wire.rs"));
        assert_eq!(number, *rust_number, "{name}: txfs.h gives {number:#x}, wire.rs {rust_number:#x}");
        assert_eq!(c_struct, *rust_struct, "{name}: the argument's struct");
        seen.push(op.to_string());
    }
    for (op, _, _) in wire::IOCTLS {
        assert!(seen.iter().any(|s| s == op) || wire::INTERNAL.contains(op), "TXFS_IOC_{op} is missing from txfs.h");
    }
    for (c_name, _, _) in wire::STRUCTS {
        if wire::INTERNAL.contains(c_name) {
            continue;
        }
        let (layout, _) = structs.get(*c_name).unwrap_or_else(|| panic!("struct {c_name} is missing from txfs.h"));
        assert_eq!(*layout, c_named(c_name, rust_layout(c_name)), "struct {c_name}: txfs.h (left) vs wire.rs");
    }
    let int = |n: &str| c_int(defs.get(n).unwrap_or_else(|| panic!("{n} is missing from txfs.h")));
    assert_eq!(int("TXFS_IOC_MAGIC"), wire::MAGIC);
    assert_eq!(int("TXFS_COMMIT_ORDERED"), wire::COMMIT_ORDERED);
    assert_eq!(int("TXFS_RUN_BEGIN"), wire::RUN_BEGIN);
    assert_eq!(int("TXFS_RUN_COMMIT"), wire::RUN_COMMIT);
    assert_eq!(int("TXFS_RUN_ABORT"), wire::RUN_ABORT);
    for (name, value) in changes_constants() {
        assert_eq!(int(name), value, "{name}");
    }
    assert_eq!(defs["TXFS_BATCH_MAGIC"].trim_matches('"').as_bytes(), wire::BATCH_MAGIC);
    assert_eq!(defs["TXFS_BATCH_MAX"], "(1u << 20)");
    assert_eq!(wire::BATCH_MAX, 1 << 20);
}

/// The constants of CHANGES, as both clients name them.
fn changes_constants() -> Vec<(&'static str, u32)> {
    use wire::what;
    vec![
        ("TXFS_CHANGES_LIST", wire::CHANGES_LIST),
        ("TXFS_CHANGES_OLD", wire::CHANGES_OLD),
        ("TXFS_CHANGES_NEW", wire::CHANGES_NEW),
        ("TXFS_CHANGES_LOST", wire::CHANGES_LOST),
        ("TXFS_CHANGES_DATA", wire::CHANGES_DATA as u32),
        ("TXFS_CHANGE_HEAD", wire::CHANGE_HEAD as u32),
        ("TXFS_CHANGE_CREATED", what::CREATED),
        ("TXFS_CHANGE_DELETED", what::DELETED),
        ("TXFS_CHANGE_MODIFIED", what::MODIFIED),
        ("TXFS_CHANGE_RENAMED", what::RENAMED),
        ("TXFS_CHANGE_LINKED", what::LINKED),
        ("TXFS_CHANGE_MODE", what::MODE),
        ("TXFS_CHANGE_OWNER", what::OWNER),
        ("TXFS_CHANGE_XATTR", what::XATTR),
        ("TXFS_CHANGE_TIMES", what::TIMES),
        ("TXFS_CHANGE_REPLACED", what::REPLACED),
    ]
}

/// A Python `struct` format of `_wire.py` ("=II", "=8Q"): size, and the
/// offset and size of each value (Python names none).
fn py_layout(fmt: &str) -> (usize, Vec<(usize, usize)>) {
    let fmt = fmt.strip_prefix('=').expect("a standard-size format ('=')");
    let (mut at, mut fields, mut count) = (0, Vec::new(), String::new());
    for c in fmt.chars() {
        if c.is_ascii_digit() {
            count.push(c);
            continue;
        }
        let n: usize = if count.is_empty() { 1 } else { count.parse().expect("count") };
        count.clear();
        let size = match c {
            'B' | 'b' | 'x' => 1,
            'H' | 'h' => 2,
            'I' | 'i' => 4,
            'Q' | 'q' => 8,
            's' => {
                fields.push((at, n));
                at += n;
                continue;
            }
            other => panic!("format character {other:?}"),
        };
        for _ in 0..n {
            fields.push((at, size));
            at += size;
        }
    }
    (at, fields)
}

#[test]
fn the_python_module_agrees_with_the_daemon() {
    let py = read("clients/python/txfs/_wire.py");
    let mut formats: HashMap<String, String> = HashMap::new();
    let mut ints: HashMap<String, u32> = HashMap::new();
    let mut ioctls = Vec::new();
    for line in py.lines() {
        let Some((name, value)) = line.split_once(" = ") else { continue };
        let (name, value) = (name.trim(), value.trim());
        if let Some(f) = value.strip_prefix("struct.Struct(\"").and_then(|v| v.strip_suffix("\")")) {
            formats.insert(name.to_string(), f.to_string());
        } else if let Some(op) = name.strip_prefix("TXFS_IOC_").filter(|n| *n != "MAGIC") {
            let (dir, args) = if let Some(a) = value.strip_prefix("iowr(") {
                (3, a)
            } else if let Some(a) = value.strip_prefix("iow(") {
                (1, a)
            } else if let Some(a) = value.strip_prefix("ior(") {
                (2, a)
            } else {
                panic!("{name}: not an iow/ior/iowr: {value}")
            };
            let args: Vec<&str> = args.trim_end_matches(')').split(',').map(str::trim).collect();
            assert_eq!(args[0], "TXFS_IOC_MAGIC", "{name}");
            let arg = args[2].strip_suffix(".size").unwrap_or_else(|| panic!("{name}: size of {}", args[2]));
            ioctls.push((op.to_string(), dir, args[1].parse::<u32>().expect("nr"), arg.to_string()));
        } else if name.starts_with("TXFS_") {
            let v = value.strip_prefix("0x").map_or_else(|| value.parse(), |h| u32::from_str_radix(h, 16));
            ints.insert(name.to_string(), v.unwrap_or_else(|_| panic!("{name} = {value}")));
        }
    }
    assert!(!ioctls.is_empty(), "no ioctls found in _wire.py");
    for (op, dir, nr, arg) in &ioctls {
        let fmt = formats.get(arg).unwrap_or_else(|| panic!("TXFS_IOC_{op}: no struct {arg}"));
        let (size, fields) = py_layout(fmt);
        let (_, rust_number, c_struct) =
            wire::IOCTLS.iter().find(|i| i.0 == op).unwrap_or_else(|| panic!("TXFS_IOC_{op} is not in wire.rs"));
        let number = ioc(*dir, *nr, size);
        assert_eq!(number, *rust_number, "TXFS_IOC_{op}: _wire.py gives {number:#x}, wire.rs {rust_number:#x}");
        // IOC_RUN is struct txfs_ioc_run, and so on.
        assert_eq!(format!("txfs_{}", arg.to_lowercase()), *c_struct, "TXFS_IOC_{op}: the argument's struct");
        let rust = rust_layout(c_struct);
        let rust_fields: Vec<(usize, usize)> = rust.fields.iter().map(|f| (f.1, f.2)).collect();
        assert_eq!((size, fields), (rust.size, rust_fields), "{arg} ({fmt}): _wire.py (left) vs wire.rs");
    }
    assert_eq!(ints["TXFS_IOC_MAGIC"], wire::MAGIC);
    assert_eq!(ints["TXFS_COMMIT_ORDERED"], wire::COMMIT_ORDERED);
    assert_eq!(ints["TXFS_RUN_BEGIN"], wire::RUN_BEGIN);
    assert_eq!(ints["TXFS_RUN_COMMIT"], wire::RUN_COMMIT);
    assert_eq!(ints["TXFS_RUN_ABORT"], wire::RUN_ABORT);
    for (name, value) in changes_constants() {
        assert_eq!(ints.get(name), Some(&value), "{name} in _wire.py");
    }
    // STATUS_FIELDS names the values of struct txfs_ioc_status in order.
    let start = py.find("STATUS_FIELDS = (").expect("STATUS_FIELDS");
    let names: Vec<&str> = py[start..][..py[start..].find(')').expect(")")].split('"').skip(1).step_by(2).collect();
    let rust: Vec<&str> = wire::Status::FIELDS.iter().map(|f| f.name).collect();
    assert_eq!(names, rust, "STATUS_FIELDS");
}

/// The parsers above catch what they are meant to: a header with a wrong
/// size is told apart.
#[test]
fn a_changed_header_is_caught() {
    let h = "struct txfs_ioc_state { uint64_t tx; uint32_t depth; };";
    let s = c_structs(h);
    // 8 + 4, padded to 16 by the u64's alignment: the same size, but one
    // field fewer than wire.rs.
    assert_eq!(s["txfs_ioc_state"].0.size, 16);
    assert_ne!(s["txfs_ioc_state"].0, rust_layout("txfs_ioc_state"));
    let (size, _) = py_layout("=QI");
    assert_ne!(size, wire::State::SIZE);
}
