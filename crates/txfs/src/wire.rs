//! The wire protocol of `clients/c/txfs.h`: ioctl numbers and argument
//! layouts. FUSE forwards only "restricted" ioctls, whose argument size is
//! encoded in the number, so every argument is a fixed-size struct.

pub const MAGIC: u32 = 0xE7;

const fn iow(nr: u32, size: u32) -> u32 {
    (1 << 30) | (size << 16) | (MAGIC << 8) | nr
}

const fn ior(nr: u32, size: u32) -> u32 {
    (2 << 30) | (size << 16) | (MAGIC << 8) | nr
}

const fn iowr(nr: u32, size: u32) -> u32 {
    (3 << 30) | (size << 16) | (MAGIC << 8) | nr
}

pub const BEGIN: u32 = iow(1, 8);
pub const COMMIT: u32 = iow(2, 8);
pub const ABORT: u32 = iow(3, 8);
pub const SYNC: u32 = iow(4, 8);
pub const RUN: u32 = iow(5, 16);
pub const STATUS: u32 = ior(6, 64);
pub const STATE: u32 = ior(7, 16);
/// BEGIN, answered with the state after it and how a transaction of the
/// caller's own ended: the one it names, or its last
/// (`struct txfs_ioc_begin_state`, 32 bytes).
pub const BEGIN_STATE: u32 = iowr(8, 32);
/// COMMIT of one level, only if the caller's transaction is the one named
/// (`struct txfs_ioc_commit_if`, 16 bytes); ESTALE otherwise.
pub const COMMIT_IF: u32 = iow(9, 16);
/// Issued on a file opened for writing: every WRITE through that descriptor
/// is a batch of writes to its file (`struct txfs_ioc_flags`, 8 bytes).
pub const BATCH: u32 = iow(10, 8);
/// BEGIN_STATE issued on a regular file, also answering what the caller's
/// transaction now sees of that file: its size and bytes 24..40 (SQLite's
/// file change counter), both entering the read set as if read
/// (`struct txfs_ioc_begin_file`, 64 bytes).
pub const BEGIN_FILE: u32 = iowr(11, 64);
/// The kernel cache gate (DESIGN §9): open (0/1), replies sent with a
/// nonzero TTL, closes that dropped something, LOOKUP and GETATTR requests
/// served (four u64, `txfs status`).
pub const CACHE: u32 = ior(12, 32);

pub const COMMIT_ORDERED: u32 = 0x1;

pub const RUN_BEGIN: u32 = 1;
pub const RUN_COMMIT: u32 = 2;
pub const RUN_ABORT: u32 = 3;
/// RUN_BEGIN flag: serve the tree a transaction view on the `/dev/fuse`
/// descriptor whose number (in the caller) is the fourth u32.
pub const RUN_VIEW: u32 = 0x2;

pub fn u32_at(b: &[u8], i: usize) -> u32 {
    b.get(i..i + 4).map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes"))).unwrap_or(0)
}

pub fn u64_at(b: &[u8], i: usize) -> u64 {
    b.get(i..i + 8).map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes"))).unwrap_or(0)
}

/// The layout of a batch WRITE (`TXFS_IOC_BATCH`, clients/c/txfs.h): the
/// magic, the whole batch's length (so a WRITE the kernel split is refused,
/// not half applied), then records of (offset u64, length u32, 0 u32, bytes).
pub const BATCH_MAGIC: &[u8; 8] = b"TXFSBAT1";

/// The writes of a batch WRITE, or `None` if `data` is not exactly one.
pub fn parse_batch(data: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    if data.len() < 16 || &data[..8] != BATCH_MAGIC || u64_at(data, 8) != data.len() as u64 {
        return None;
    }
    let mut out = Vec::new();
    let mut at = 16;
    while at < data.len() {
        let hdr = data.get(at..at + 16)?;
        let (off, len) = (u64_at(hdr, 0), u32_at(hdr, 8) as usize);
        if u32_at(hdr, 12) != 0 || len == 0 || off.checked_add(len as u64).is_none_or(|e| e > i64::MAX as u64) {
            return None;
        }
        out.push((off, data.get(at + 16..at + 16 + len)?));
        at += 16 + len;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers `_IOW`/`_IOR` give in C for the structs of txfs.h.
    #[test]
    fn numbers_match_the_c_header() {
        assert_eq!(BEGIN, 0x4008_e701);
        assert_eq!(RUN, 0x4010_e705);
        assert_eq!(STATUS, 0x8040_e706);
        assert_eq!(STATE, 0x8010_e707);
        assert_eq!(BEGIN_STATE, 0xc020_e708);
        assert_eq!(COMMIT_IF, 0x4010_e709);
        assert_eq!(BATCH, 0x4008_e70a);
        assert_eq!(CACHE, 0x8020_e70c);
    }
}
