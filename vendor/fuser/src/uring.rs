//! FUSE over io_uring (Linux 6.14+, added to this vendored fuser for txfs).
//!
//! With `/dev/fuse`, a request wakes whichever daemon thread sleeps in
//! `read`, usually on another CPU, and the reply wakes the requester back
//! across CPUs. Over io_uring the kernel keeps one queue per CPU and hands a
//! request to an entry registered on the requester's own CPU; with the
//! entry's thread pinned there, request and reply are same-CPU wake-ups.
//!
//! Each ring thread owns one io_uring and one entry (a header buffer and a
//! payload buffer registered with `FUSE_IO_URING_CMD_REGISTER`), so a
//! handler that blocks (a commit waiting for its `fdatasync`) holds only its
//! own entry; the kernel gives the queue's next request to another thread's.
//! FORGET and INTERRUPT still arrive on `/dev/fuse`, as does everything
//! before every queue has an entry, so the `/dev/fuse` threads keep running.
//!
//! The kernel splits a request into the `fuse_in_header`, the operation's
//! first argument and the rest (the payload). fuser parses the `/dev/fuse`
//! layout, so the pieces are put back together: small requests are copied
//! into a separate buffer (and the reply is written straight into the ring
//! buffers), big ones (WRITE data) are rebuilt in place in front of the
//! payload (and the reply is staged and copied once the request is done
//! with, so no reply ever overwrites bytes a handler may still read).

use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;

use crate::Filesystem;
use crate::dev_fuse::DevFuse;
use crate::passthrough::BackingId;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: in/out header (128), op header (128),
/// `struct fuse_uring_ent_in_out` (32).
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const HEADER_SIZE: usize = 288;
const IN_HEADER: usize = 40; // sizeof(struct fuse_in_header)
const OUT_HEADER: usize = 16; // sizeof(struct fuse_out_header)
/// Room in front of the payload for the in header and the op header.
const HEADROOM: usize = 256;
/// Requests with at most this much payload are copied out of the ring.
const COPY_LIMIT: usize = 64 * 1024;
/// The kernel's smallest request buffer (`FUSE_MIN_READ_BUFFER`).
const MIN_PAYLOAD: usize = 8192;

/// Payload size the kernel requires of each entry for these settings.
pub(crate) fn payload_size(max_write: u32, max_pages: u16) -> usize {
    let pages = usize::from(max_pages) * page_size::get();
    MIN_PAYLOAD.max(max_write as usize).max(pages)
}

/// Number of queues the kernel creates: one per possible CPU.
fn possible_cpus() -> usize {
    // "0-1", "0-3,5", "0"
    let parse = |s: &str| -> Option<usize> {
        let mut max = 0;
        for part in s.trim().split(',') {
            let last = part.rsplit('-').next()?;
            max = max.max(last.parse::<usize>().ok()?);
        }
        Some(max + 1)
    };
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse(&s))
        .unwrap_or_else(|| {
            // SAFETY: sysconf has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
            usize::try_from(n).unwrap_or(1).max(1)
        })
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET bounds-checks.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "io_uring queue {cpu}: cannot pin thread: {}",
                io::Error::last_os_error()
            );
        }
    }
}

fn words(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

struct ReplyState {
    /// The reply has been written (or staged).
    done: bool,
    /// The ring buffers are not borrowed by the request: write in place.
    direct: bool,
    /// The reply, when it cannot be written in place yet.
    staged: Vec<u8>,
}

/// One ring entry's buffers and the reply slot handed to fuser's replies.
pub(crate) struct RingReply {
    header: std::cell::UnsafeCell<Vec<u64>>,
    data: std::cell::UnsafeCell<Vec<u64>>,
    payload_cap: usize,
    state: Mutex<ReplyState>,
    cond: Condvar,
    dev: Arc<DevFuse>,
}

// SAFETY: the buffers are written either by the ring thread while no reply
// can be sent (between CQE and dispatch, after the reply is done) or by the
// one reply under `state`'s lock while the ring thread waits on it.
unsafe impl Send for RingReply {}
unsafe impl Sync for RingReply {}

impl std::fmt::Debug for RingReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingReply").finish_non_exhaustive()
    }
}

impl RingReply {
    fn new(payload_cap: usize, dev: Arc<DevFuse>) -> Self {
        Self {
            header: std::cell::UnsafeCell::new(words(HEADER_SIZE)),
            data: std::cell::UnsafeCell::new(words(HEADROOM + payload_cap)),
            payload_cap,
            state: Mutex::new(ReplyState {
                done: false,
                direct: false,
                staged: Vec::new(),
            }),
            cond: Condvar::new(),
            dev,
        }
    }

    fn header_ptr(&self) -> *mut u8 {
        // SAFETY: only the pointer is taken; see the Sync impl for access.
        unsafe { (*self.header.get()).as_mut_ptr().cast() }
    }

    fn payload_ptr(&self) -> *mut u8 {
        // SAFETY: as above; HEADROOM is within the allocation.
        unsafe { (*self.data.get()).as_mut_ptr().cast::<u8>().add(HEADROOM) }
    }

    /// Writes a complete reply (out header first) into the ring buffers.
    ///
    /// # Safety
    /// No one may hold a reference into the ring buffers.
    unsafe fn write_reply(&self, reply: &[&[u8]]) {
        let mut out = [0u8; OUT_HEADER];
        let mut at = 0; // position in the concatenated reply
        let payload = self.payload_ptr();
        for piece in reply {
            let mut rest = *piece;
            if at < OUT_HEADER {
                let n = (OUT_HEADER - at).min(rest.len());
                out[at..at + n].copy_from_slice(&rest[..n]);
                at += n;
                rest = &rest[n..];
            }
            if !rest.is_empty() {
                // SAFETY: send checked that the payload part fits payload_cap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        rest.as_ptr(),
                        payload.add(at - OUT_HEADER),
                        rest.len(),
                    );
                }
                at += rest.len();
            }
        }
        let header = self.header_ptr();
        let payload_sz = at.saturating_sub(OUT_HEADER) as u32;
        // SAFETY: the header buffer is HEADER_SIZE bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), header, OUT_HEADER);
            std::ptr::copy_nonoverlapping(
                payload_sz.to_ne_bytes().as_ptr(),
                header.add(ENT_IN_OUT + 16),
                4,
            );
        }
    }

    pub(crate) fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total < OUT_HEADER || total - OUT_HEADER > self.payload_cap {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "reply of {total} bytes does not fit a ring entry of {}",
                    self.payload_cap
                ),
            ));
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.done {
            return Err(io::Error::other("second reply to one ring request"));
        }
        if st.direct {
            let pieces: Vec<&[u8]> = bufs.iter().map(|b| &**b).collect();
            // SAFETY: direct means the request was copied out of the ring.
            unsafe { self.write_reply(&pieces) };
        } else {
            st.staged.clear();
            for b in bufs {
                st.staged.extend_from_slice(b);
            }
        }
        st.done = true;
        self.cond.notify_all();
        Ok(())
    }

    pub(crate) fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<BackingId> {
        BackingId::create(&self.dev, fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        unsafe { BackingId::wrap_raw(&self.dev, id) }
    }
}

fn uring_cmd(fd: i32, cmd_op: u32, qid: u16, commit_id: u64, iov: Option<u64>) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut entry = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
        .cmd(cmd)
        .addr(iov)
        .build()
        .user_data(u64::from(cmd_op));
    if iov.is_some() {
        // REGISTER takes two iovecs in sqe->len, which the builder has no
        // field for. `Entry128` is `#[repr(C)]` over `struct io_uring_sqe`
        // and 64 more bytes; `len` is the u32 at offset 24.
        const _: () = assert!(size_of::<squeue::Entry128>() == 128);
        // SAFETY: the struct is 128 plain bytes (asserted); offset 24..28 is
        // `len` in every version of `struct io_uring_sqe`.
        unsafe {
            let raw = (&raw mut entry).cast::<u8>();
            std::ptr::copy_nonoverlapping(2u32.to_ne_bytes().as_ptr(), raw.add(24), 4);
        }
    }
    entry
}

/// Starts `per_queue` ring threads on every queue. Returns their handles;
/// each ends when the connection does.
pub(crate) fn start<FS: Filesystem + 'static>(
    make_loop: impl Fn(String) -> SessionEventLoop<FS>,
    dev: &Arc<DevFuse>,
    per_queue: usize,
    payload_cap: usize,
) -> io::Result<Vec<std::thread::JoinHandle<io::Result<()>>>> {
    let queues = possible_cpus();
    let mut threads = Vec::with_capacity(queues * per_queue);
    for qid in 0..queues {
        for k in 0..per_queue {
            let name = format!("fuser-ring-{qid}.{k}");
            let se = make_loop(name.clone());
            let reply = Arc::new(RingReply::new(payload_cap, dev.clone()));
            let dev = dev.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || ring_thread(se, qid, reply, dev))?,
            );
        }
    }
    Ok(threads)
}

fn ring_thread<FS: Filesystem>(
    se: SessionEventLoop<FS>,
    qid: usize,
    reply: Arc<RingReply>,
    dev: Arc<DevFuse>,
) -> io::Result<()> {
    pin_to_cpu(qid);
    let qid16 = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
    let fd = dev.as_raw_fd();
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(2)?;
    let iov = [
        libc::iovec {
            iov_base: reply.header_ptr().cast(),
            iov_len: HEADER_SIZE,
        },
        libc::iovec {
            iov_base: reply.payload_ptr().cast(),
            iov_len: reply.payload_cap,
        },
    ];
    let register = uring_cmd(fd, CMD_REGISTER, qid16, 0, Some(iov.as_ptr() as u64));
    let mut next = register;
    // Small requests are rebuilt here, 8-byte aligned like fuser's buffers.
    let mut copy = words(IN_HEADER + OP_IN + COPY_LIMIT);
    let mut big: Vec<u64> = Vec::new();
    loop {
        // SAFETY: the iovecs and buffers outlive the ring (owned by this
        // frame and by `reply`, which this thread keeps alive).
        unsafe {
            ring.submission()
                .push(&next)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        let cqe = loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
            if let Some(cqe) = ring.completion().next() {
                break cqe;
            }
        };
        let res = cqe.result();
        if res == -libc::EINTR || res == -libc::EAGAIN {
            continue; // resubmit the same command
        }
        if res < 0 {
            let err = io::Error::from_raw_os_error(-res);
            if cqe.user_data() == u64::from(CMD_REGISTER) && res != -libc::ENOTCONN {
                warn!("FUSE io_uring queue {qid}: register: {err}; requests stay on /dev/fuse");
            } else {
                debug!("FUSE io_uring queue {qid}: {err}; thread ends");
            }
            return Ok(());
        }
        // SAFETY: the kernel filled the header; nothing else references it.
        let header: [u8; HEADER_SIZE] =
            unsafe { std::ptr::read(reply.header_ptr().cast::<[u8; HEADER_SIZE]>()) };
        let u32_at = |at: usize| u32::from_ne_bytes(header[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_ne_bytes(header[at..at + 8].try_into().unwrap());
        let in_len = u32_at(0) as usize;
        let unique = u64_at(8);
        let commit_id = u64_at(ENT_IN_OUT + 8);
        let payload_sz = u32_at(ENT_IN_OUT + 16) as usize;
        let op_len = in_len
            .checked_sub(IN_HEADER + payload_sz)
            .filter(|&n| n <= OP_IN && payload_sz <= reply.payload_cap);
        // Copy small requests out; rebuild big ones in front of the payload
        // (8-aligned when the op header's length is, as it is for WRITE).
        let direct = payload_sz <= COPY_LIMIT || op_len.is_none_or(|n| n % 8 != 0);
        {
            let mut st = reply.state.lock().unwrap_or_else(|e| e.into_inner());
            st.done = false;
            st.direct = direct;
        }
        match op_len {
            None => {
                error!(
                    "FUSE io_uring queue {qid}: request of {in_len} bytes with {payload_sz} of payload; answering EIO"
                );
                answer_error(&reply, unique, libc::EIO);
            }
            Some(op_len) => {
                let data: &[u8] = if direct {
                    let buf: &mut Vec<u64> = if payload_sz <= COPY_LIMIT {
                        &mut copy
                    } else {
                        big.resize(in_len.div_ceil(8), 0);
                        &mut big
                    };
                    let out = buf.as_mut_ptr().cast::<u8>();
                    // SAFETY: `buf` holds in_len bytes; the sources are this
                    // entry's buffers, which only this request's reply touches.
                    unsafe {
                        std::ptr::copy_nonoverlapping(header.as_ptr(), out, IN_HEADER);
                        std::ptr::copy_nonoverlapping(
                            header[OP_IN..].as_ptr(),
                            out.add(IN_HEADER),
                            op_len,
                        );
                        std::ptr::copy_nonoverlapping(
                            reply.payload_ptr(),
                            out.add(IN_HEADER + op_len),
                            payload_sz,
                        );
                        std::slice::from_raw_parts(out, in_len)
                    }
                } else {
                    let start = HEADROOM - op_len - IN_HEADER;
                    // SAFETY: the headroom is ours; replies are staged (not
                    // written into the ring buffers) while this slice lives.
                    unsafe {
                        let base = (*reply.data.get()).as_mut_ptr().cast::<u8>();
                        std::ptr::copy_nonoverlapping(header.as_ptr(), base.add(start), IN_HEADER);
                        std::ptr::copy_nonoverlapping(
                            header[OP_IN..].as_ptr(),
                            base.add(start + IN_HEADER),
                            op_len,
                        );
                        std::slice::from_raw_parts(base.add(start), in_len)
                    }
                };
                let sender = crate::channel::ChannelSender::Ring(reply.clone());
                match RequestWithSender::new(sender, data) {
                    Some(req) => {
                        if let Ok(crate::ll::Operation::Destroy(_)) = req.request.operation() {
                            req.reply::<crate::ReplyEmpty>().ok();
                        } else {
                            req.dispatch(&se);
                        }
                    }
                    None => answer_error(&reply, unique, libc::EIO),
                }
            }
        }
        // Every borrow of the ring buffers is gone; wait for a reply sent
        // from another thread, then put a staged one in place.
        let mut st = reply.state.lock().unwrap_or_else(|e| e.into_inner());
        while !st.done {
            st = reply.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if !st.direct {
            let staged = std::mem::take(&mut st.staged);
            // SAFETY: no request borrows the ring buffers any more.
            unsafe { reply.write_reply(&[&staged]) };
            st.staged = staged;
        }
        drop(st);
        next = uring_cmd(fd, CMD_COMMIT_AND_FETCH, qid16, commit_id, None);
    }
}

fn answer_error(reply: &RingReply, unique: u64, errno: i32) {
    let mut out = [0u8; OUT_HEADER];
    out[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    if let Err(e) = reply.send(&[IoSlice::new(&out)]) {
        error!("FUSE io_uring: answering {unique}: {e}");
    }
}
