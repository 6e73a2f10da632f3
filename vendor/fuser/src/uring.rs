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
//! FORGET and INTERRUPT still arrive on `/dev/fuse`, so one `/dev/fuse`
//! thread keeps running (`SessionEventLoop::forget_loop`); the kernel holds
//! every other request until each queue has an entry.
//!
//! The kernel splits a request into the `fuse_in_header`, the operation's
//! first argument and the rest (the payload). fuser parses the `/dev/fuse`
//! layout, so the pieces are put back together: small requests are copied
//! into a separate buffer (and the reply is written straight into the ring
//! buffers), big ones (WRITE data) are rebuilt in place in front of the
//! payload (and the reply is staged and copied once the request is done
//! with, so no reply ever overwrites bytes a handler may still read).

use crate::read_buf::MapBuf;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::path::PathBuf;
use std::sync::Condvar;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;

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
    /// The ring thread moved on without the reply: tell it through `wake`.
    parked: bool,
}

/// One ring entry's buffers and the reply slot handed to fuser's replies.
pub(crate) struct RingReply {
    header: std::cell::UnsafeCell<Vec<u64>>,
    data: MapBuf,
    payload_cap: usize,
    state: Mutex<ReplyState>,
    /// The ring thread's eventfd, for replies sent after it moved on.
    wake: Arc<OwnedFd>,
    dev: Arc<DevFuse>,
}

// SAFETY: the buffers are written either by the ring thread while no reply
// can be sent (between CQE and dispatch, after the reply is done) or by the
// one reply under `state`'s lock, before the ring thread commits it.
unsafe impl Send for RingReply {}
unsafe impl Sync for RingReply {}

impl std::fmt::Debug for RingReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingReply").finish_non_exhaustive()
    }
}

impl RingReply {
    fn new(payload_cap: usize, dev: Arc<DevFuse>, wake: Arc<OwnedFd>) -> io::Result<Self> {
        Ok(Self {
            header: std::cell::UnsafeCell::new(words(HEADER_SIZE)),
            data: MapBuf::new(HEADROOM + payload_cap)?,
            payload_cap,
            state: Mutex::new(ReplyState {
                done: false,
                direct: false,
                staged: Vec::new(),
                parked: false,
            }),
            wake,
            dev,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ReplyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn header_ptr(&self) -> *mut u8 {
        // SAFETY: only the pointer is taken; see the Sync impl for access.
        unsafe { (*self.header.get()).as_mut_ptr().cast() }
    }

    fn payload_ptr(&self) -> *mut u8 {
        // SAFETY: as above; HEADROOM is within the allocation.
        unsafe { self.data.ptr.add(HEADROOM) }
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
        let mut st = self.state();
        if st.done {
            return Err(io::Error::other("second reply to one ring request"));
        }
        let mut result = Ok(());
        let mut too_big = [0u8; OUT_HEADER];
        let pieces: Vec<&[u8]> = if total < OUT_HEADER || total - OUT_HEADER > self.payload_cap {
            // The kernel must still hear something, or the entry (and the
            // requester) would wait forever: EIO for the same request.
            result = Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("reply of {total} bytes does not fit a ring entry of {}; answered EIO", self.payload_cap),
            ));
            let mut head = Vec::with_capacity(OUT_HEADER);
            for b in bufs {
                head.extend_from_slice(&b[..b.len().min(OUT_HEADER - head.len())]);
            }
            head.resize(OUT_HEADER, 0);
            too_big[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
            too_big[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            too_big[8..16].copy_from_slice(&head[8..16]);
            vec![&too_big[..]]
        } else {
            bufs.iter().map(|b| &**b).collect()
        };
        if st.direct {
            // SAFETY: direct means no request borrows the ring buffers.
            unsafe { self.write_reply(&pieces) };
        } else {
            st.staged.clear();
            for b in pieces {
                st.staged.extend_from_slice(b);
            }
        }
        st.done = true;
        if st.parked {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writing 8 bytes to our own eventfd.
            let n = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
            if n != 8 {
                error!("FUSE io_uring: waking the ring thread: {}", io::Error::last_os_error());
            }
        }
        result
    }

    pub(crate) fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<BackingId> {
        BackingId::create(&self.dev, fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        unsafe { BackingId::wrap_raw(&self.dev, id) }
    }
}

fn uring_cmd(fd: i32, cmd_op: u32, qid: u16, commit_id: u64, iov: Option<u64>, slot: usize) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut entry = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
        .cmd(cmd)
        .addr(iov)
        .build()
        .user_data(slot as u64);
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

/// Sets up `per_queue` rings for every queue (an io_uring, an eventfd and
/// the first entry's buffers each), before INIT grants io_uring.
/// `mountpoint` lets each queue's pump reach the mount (see [`Queue`]).
pub(crate) fn prepare(
    dev: &Arc<DevFuse>,
    per_queue: usize,
    payload_cap: usize,
    mountpoint: Option<PathBuf>,
) -> io::Result<Vec<RingThread>> {
    let queues = possible_cpus();
    if u16::try_from(queues).is_err() {
        return Err(io::Error::other(format!("{queues} CPUs: too many for FUSE io_uring queues")));
    }
    let mut rings = Vec::with_capacity(queues * per_queue);
    for qid in 0..queues {
        let queue = Arc::new(Queue {
            qid,
            parked: Mutex::new(0),
            cond: Condvar::new(),
            stop: AtomicBool::new(false),
            mountpoint: mountpoint.clone(),
            pumps: AtomicUsize::new(0),
            pumped: Mutex::new(std::time::Instant::now()),
        });
        for k in 0..per_queue {
            rings.push(
                RingThread::new(qid, k, dev.clone(), payload_cap, queue.clone())
                    .map_err(|e| io::Error::new(e.kind(), format!("setting up ring {qid}.{k}: {e}")))?,
            );
        }
    }
    Ok(rings)
}

/// Starts a thread for every prepared ring, and each queue's pump. Each
/// ends when the connection does.
pub(crate) fn start<FS: Filesystem + 'static>(
    make_loop: impl Fn(String) -> SessionEventLoop<FS>,
    rings: Vec<RingThread>,
) -> io::Result<Vec<std::thread::JoinHandle<io::Result<()>>>> {
    let mut threads = Vec::with_capacity(rings.len());
    for mut ring in rings {
        if ring.k == 0 && ring.queue.mountpoint.is_some() {
            let queue = ring.queue.clone();
            let name = format!("fuser-pumps-{}", ring.qid);
            threads.push(std::thread::Builder::new().name(name).spawn(move || {
                queue.pump();
                Ok(())
            })?);
        }
        let name = format!("fuser-ring-{}.{}", ring.qid, ring.k);
        let se = make_loop(name.clone());
        threads.push(std::thread::Builder::new().name(name).spawn(move || {
            let res = ring.run(&se);
            ring.queue.stop();
            // The buffers may be freed only once the kernel holds none of
            // them: every command completed. Closing the io_uring would
            // cancel them too, but may finish that after close returns, so
            // if the drain times out they are leaked rather than freed under
            // it. A session that serves one `txfs run` ends many times in a
            // daemon's life: leaking there costs descriptors and memory.
            let drained = ring.drain();
            let RingThread { ring: uring, slots, wake_buf, conn_gone, .. } = ring;
            drop(uring);
            if drained {
                drop(slots);
                drop(wake_buf);
            } else {
                if conn_gone {
                    warn!("FUSE io_uring queue: commands still held by the kernel at exit; their buffers are leaked");
                } else {
                    debug!("FUSE io_uring queue: ring thread ends on a live connection; its buffers are left");
                }
                std::mem::forget(slots);
                std::mem::forget(wake_buf);
            }
            res
        })?);
    }
    Ok(threads)
}

/// What the ring threads of one CPU queue share.
///
/// The kernel hands a queued request to an entry only when an entry of that
/// queue commits (COMMIT_AND_FETCH); a newly registered entry only takes
/// requests that arrive after it. So when every entry that was busy is
/// parked (waiting for a late reply), a request queued meanwhile waits for
/// one of them — and a late reply can wait for exactly such a request: txfs
/// answers a commit after the kernel dropped the changed files' pages, and
/// a page fault holding one of those pages waits for its READ. The pump
/// breaks the cycle: while entries are parked it asks the mount for
/// `statfs` from this queue's CPU, which lands on an armed entry; that
/// entry's commit fetches the queued request.
pub(crate) struct Queue {
    qid: usize,
    parked: Mutex<usize>,
    cond: Condvar,
    stop: AtomicBool,
    mountpoint: Option<PathBuf>,
    /// Pump requests in flight.
    pumps: AtomicUsize,
    /// When a pump request last started with none in flight, or was last
    /// answered.
    pumped: Mutex<std::time::Instant>,
}

/// Pump requests in flight per queue, as long as they are being answered.
const PUMPS: usize = 4;
/// Pump requests in flight per queue, at most: past [`PUMPS`], one more is
/// sent only while none has been answered for [`PUMP_STUCK`]. Pumps that
/// all arrived while no entry was armed are queued like the rest, and only
/// a request that arrives after an entry is armed drains them: without
/// another pump, the queue (and a page fault's READ in it) would wait for
/// good.
const PUMPS_MAX: usize = 64;
const PUMP_STUCK: std::time::Duration = std::time::Duration::from_millis(20);

impl Queue {
    fn park(&self, delta: isize) {
        let mut n = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_add_signed(delta);
        self.cond.notify_all();
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.park(0);
    }

    /// While entries are parked, asks the mount for `statfs` from this
    /// queue's CPU, once a millisecond, each time from a new short-lived
    /// thread: a pump request that arrives while no entry is armed is
    /// queued like the rest, and the next one (on the entry registered
    /// meanwhile) drains it. At most [`PUMPS`] are in flight.
    fn pump(self: &Arc<Self>) {
        let Some(mnt) = &self.mountpoint else { return };
        let Ok(path) = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()) else { return };
        let path = Arc::new(path);
        loop {
            {
                let mut n = self.parked.lock().unwrap_or_else(|e| e.into_inner());
                while *n == 0 && !self.stop.load(Ordering::SeqCst) {
                    n = self.cond.wait(n).unwrap_or_else(|e| e.into_inner());
                }
            }
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            // Late replies usually come within microseconds: only a queue
            // still parked after a millisecond is pumped.
            std::thread::sleep(std::time::Duration::from_millis(1));
            let parked = *self.parked.lock().unwrap_or_else(|e| e.into_inner()) > 0;
            let inflight = self.pumps.load(Ordering::SeqCst);
            let stuck = || self.pumped.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= PUMP_STUCK;
            if !parked
                || self.stop.load(Ordering::SeqCst)
                || inflight >= PUMPS_MAX
                || (inflight >= PUMPS && !stuck())
            {
                continue;
            }
            if self.pumps.fetch_add(1, Ordering::SeqCst) == 0 {
                *self.pumped.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
            }
            let (queue, path) = (self.clone(), path.clone());
            let spawned = std::thread::Builder::new().name(format!("fuser-pump-{}", self.qid)).spawn(move || {
                pin_to_cpu(queue.qid);
                // SAFETY: a valid path and a buffer of the right type.
                let mut st: libc::statfs = unsafe { std::mem::zeroed() };
                unsafe { libc::statfs(path.as_ptr(), &mut st) };
                *queue.pumped.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
                queue.pumps.fetch_sub(1, Ordering::SeqCst);
            });
            if spawned.is_err() {
                self.pumps.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// One registered entry of a ring thread.
struct Slot {
    reply: Arc<RingReply>,
    /// Header and payload buffers, as REGISTER reads them.
    iov: Box<[libc::iovec; 2]>,
    /// The request it holds (or last held): what COMMIT_AND_FETCH names.
    commit_id: u64,
    /// Registered and answered at least once (a retry is a commit).
    fetched: bool,
}

// SAFETY: the iovecs point into `reply`'s buffers, owned by the same slot.
unsafe impl Send for Slot {}

impl std::fmt::Debug for RingThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingThread").field("qid", &self.qid).field("k", &self.k).finish_non_exhaustive()
    }
}

/// user_data of the eventfd read.
const WAKE: u64 = u64::MAX;

/// A ring thread: its own io_uring, its entries, its eventfd.
///
/// Usually one entry. A reply that a handler sends later from another
/// thread (txfs answers a commit only after the kernel dropped the changed
/// files' pages) must not pin the thread's only entry: a page fault that
/// holds such a page needs an entry of this CPU's queue for its READ. So
/// when a request is left without a reply, the thread registers one more
/// entry and goes on; the late reply wakes it through the eventfd, and that
/// entry is committed (and serves requests again) then.
pub(crate) struct RingThread {
    qid: usize,
    k: usize,
    queue: Arc<Queue>,
    dev: Arc<DevFuse>,
    payload_cap: usize,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    wake: Arc<OwnedFd>,
    wake_buf: Box<u64>,
    slots: Vec<Slot>,
    /// Entries the kernel holds (registered or committed, not yet filled).
    armed: usize,
    /// The eventfd read is queued (its buffer is `wake_buf`).
    wake_armed: bool,
    /// The thread ends because the connection did (ENOTCONN/ECONNABORTED).
    conn_gone: bool,
    /// Small requests are rebuilt here, 8-byte aligned like fuser's buffers.
    copy: Vec<u64>,
    big: Vec<u64>,
}

impl RingThread {
    fn new(qid: usize, k: usize, dev: Arc<DevFuse>, payload_cap: usize, queue: Arc<Queue>) -> io::Result<Self> {
        // SAFETY: eventfd has no memory preconditions. Blocking on purpose:
        // io_uring polls a blocking file instead of failing with EAGAIN.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor we own.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
        Ok(Self {
            qid,
            k,
            queue,
            dev,
            payload_cap,
            ring: IoUring::builder().build(64)?,
            wake,
            wake_buf: Box::new(0),
            slots: Vec::new(),
            armed: 0,
            wake_armed: false,
            conn_gone: false,
            copy: words(IN_HEADER + OP_IN + COPY_LIMIT),
            big: Vec::new(),
        })
    }

    fn qid16(&self) -> u16 {
        self.qid as u16 // possible CPUs fit: checked in prepare
    }

    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an SQE names (iovecs, entry buffers, the
            // eventfd word) lives in `self` until the ring is dropped.
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn push_wake_read(&mut self) -> io::Result<()> {
        let sqe = opcode::Read::new(types::Fd(self.wake.as_raw_fd()), (&raw mut *self.wake_buf).cast(), 8)
            .build()
            .user_data(WAKE);
        self.push(&sqe.into())?;
        self.wake_armed = true;
        Ok(())
    }

    /// After `run`: if the connection is gone, reaps the completion of every
    /// command still queued (the kernel ends each entry's command; the
    /// eventfd read ends on a write of our own). Returns whether all came
    /// back within a second, after which no buffer is the kernel's.
    fn drain(&mut self) -> bool {
        // However the thread ended (a commit that raced the abort fails with
        // ENOENT, not ENOTCONN): /dev/fuse polls POLLERR once the connection
        // is aborted, which comes before its entries are torn down.
        if !self.conn_gone {
            let mut pfd = libc::pollfd { fd: self.dev.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd on a descriptor we hold; no waiting.
            let n = unsafe { libc::poll(&mut pfd, 1, 0) };
            self.conn_gone = n == 1 && pfd.revents & libc::POLLERR != 0;
        }
        if !self.conn_gone {
            // On a live connection the commands still queued would take
            // requests nobody answers; closing the ring cancels them.
            return false;
        }
        if self.wake_armed {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writing 8 bytes to our own eventfd.
            unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while self.armed > 0 || self.wake_armed {
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
                return false;
            };
            let ts = types::Timespec::from(left.min(std::time::Duration::from_millis(100)));
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::ETIME | libc::EBUSY)) => {}
                Err(_) => return false,
            }
            for c in self.ring.completion() {
                if c.user_data() == WAKE {
                    self.wake_armed = false;
                } else {
                    self.armed = self.armed.saturating_sub(1);
                }
            }
        }
        true
    }

    fn register_slot(&mut self) -> io::Result<()> {
        let reply = Arc::new(RingReply::new(self.payload_cap, self.dev.clone(), self.wake.clone())?);
        let iov = Box::new([
            libc::iovec {
                iov_base: reply.header_ptr().cast(),
                iov_len: HEADER_SIZE,
            },
            libc::iovec {
                iov_base: reply.payload_ptr().cast(),
                iov_len: reply.payload_cap,
            },
        ]);
        let idx = self.slots.len();
        let sqe = uring_cmd(self.dev.as_raw_fd(), CMD_REGISTER, self.qid16(), 0, Some(iov.as_ptr() as u64), idx);
        self.slots.push(Slot {
            reply,
            iov,
            commit_id: 0,
            fetched: false,
        });
        self.push(&sqe)?;
        self.armed += 1;
        Ok(())
    }

    /// Sends slot `i`'s reply (done) and fetches its next request.
    fn commit(&mut self, i: usize) -> io::Result<()> {
        let slot = &self.slots[i];
        {
            let mut st = slot.reply.state();
            if !st.direct {
                let staged = std::mem::take(&mut st.staged);
                // SAFETY: the request is gone; nothing borrows the buffers.
                unsafe { slot.reply.write_reply(&[&staged]) };
                st.staged = staged;
            }
            st.parked = false;
        }
        let sqe = uring_cmd(self.dev.as_raw_fd(), CMD_COMMIT_AND_FETCH, self.qid16(), slot.commit_id, None, i);
        self.push(&sqe)?;
        self.armed += 1;
        Ok(())
    }

    fn run<FS: Filesystem>(&mut self, se: &SessionEventLoop<FS>) -> io::Result<()> {
        pin_to_cpu(self.qid);
        self.push_wake_read()?;
        self.register_slot()?;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            let mut done: std::collections::VecDeque<(u64, i32)> =
                self.ring.completion().map(|c| (c.user_data(), c.result())).collect();
            let go_on = self.handle(se, &mut done);
            // Completions taken off the ring but not handled (the thread
            // ends): their commands are no longer the kernel's either.
            for (user_data, _) in done {
                if user_data == WAKE {
                    self.wake_armed = false;
                } else {
                    self.armed = self.armed.saturating_sub(1);
                }
            }
            if !go_on? {
                return Ok(());
            }
            if self.armed == 0 {
                // Every entry waits for a late reply: one more for the queue.
                self.register_slot()?;
            }
        }
    }

    /// Handles completions in order until they are all handled (`true`) or
    /// the thread must end (`false`, or an error); what it leaves in
    /// `done` was not handled.
    fn handle<FS: Filesystem>(
        &mut self,
        se: &SessionEventLoop<FS>,
        done: &mut std::collections::VecDeque<(u64, i32)>,
    ) -> io::Result<bool> {
        while let Some((user_data, res)) = done.pop_front() {
            if user_data == WAKE {
                self.wake_armed = false;
                if res < 0 && res != -libc::EINTR && res != -libc::EAGAIN {
                    return Err(io::Error::from_raw_os_error(-res));
                }
                self.push_wake_read()?;
                // Late replies: commit each parked slot that has one.
                for i in 0..self.slots.len() {
                    let ready = {
                        let st = self.slots[i].reply.state();
                        st.parked && st.done
                    };
                    if ready {
                        self.queue.park(-1);
                        self.commit(i)?;
                    }
                }
                continue;
            }
            let i = user_data as usize;
            if res == -libc::EINTR || res == -libc::EAGAIN {
                // Not taken: the same command again.
                let slot = &self.slots[i];
                let sqe = if slot.fetched {
                    uring_cmd(self.dev.as_raw_fd(), CMD_COMMIT_AND_FETCH, self.qid16(), slot.commit_id, None, i)
                } else {
                    uring_cmd(self.dev.as_raw_fd(), CMD_REGISTER, self.qid16(), 0, Some(slot.iov.as_ptr() as u64), i)
                };
                self.push(&sqe)?;
                continue;
            }
            self.armed -= 1;
            if res < 0 {
                let err = io::Error::from_raw_os_error(-res);
                if i == 0 && !self.slots[0].fetched && res != -libc::ENOTCONN && res != -libc::ECONNABORTED {
                    // Until every queue has an entry the kernel holds
                    // every request: the mount would hang for good.
                    error!(
                        "FUSE io_uring queue {}: registering the first entry failed: {err}; \
                         this mount cannot serve requests, ending it (TXFS_URING_THREADS=0 uses /dev/fuse)",
                        self.qid
                    );
                    if self.queue.mountpoint.is_some() {
                        std::process::exit(1);
                    }
                    // A session on a descriptor it was given (a `txfs
                    // run` view) is not worth the process: this thread
                    // ends. A refused registration can also make the
                    // kernel give up the rings and send requests to
                    // /dev/fuse (`forget_loop` then serves them there);
                    // otherwise they wait (killably) until the command is
                    // interrupted or killed.
                    return Err(err);
                } else if !self.slots[i].fetched && res != -libc::ENOTCONN && res != -libc::ECONNABORTED {
                    warn!("FUSE io_uring queue {}: registering another entry: {err}", self.qid);
                } else {
                    debug!("FUSE io_uring queue {}: {err}; thread ends", self.qid);
                }
                self.conn_gone = res == -libc::ENOTCONN || res == -libc::ECONNABORTED;
                return Ok(false);
            }
            self.slots[i].fetched = true;
            if self.serve(se, i) {
                self.commit(i)?;
            }
        }
        Ok(true)
    }

    /// Hands slot `i`'s request to the file system. Returns whether the
    /// reply is there; if not, the slot is parked until it is.
    fn serve<FS: Filesystem>(&mut self, se: &SessionEventLoop<FS>, i: usize) -> bool {
        let qid = self.qid;
        let reply = self.slots[i].reply.clone();
        // SAFETY: the kernel filled the header; nothing else references it.
        let header: [u8; HEADER_SIZE] = unsafe { std::ptr::read(reply.header_ptr().cast::<[u8; HEADER_SIZE]>()) };
        let u32_at = |at: usize| u32::from_ne_bytes(header[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_ne_bytes(header[at..at + 8].try_into().unwrap());
        let in_len = u32_at(0) as usize;
        let unique = u64_at(8);
        self.slots[i].commit_id = u64_at(ENT_IN_OUT + 8);
        let payload_sz = u32_at(ENT_IN_OUT + 16) as usize;
        let op_len = in_len
            .checked_sub(IN_HEADER + payload_sz)
            .filter(|&n| n <= OP_IN && payload_sz <= reply.payload_cap);
        // Copy small requests out; rebuild big ones in front of the payload
        // (8-aligned when the op header's length is, as it is for WRITE).
        let direct = payload_sz <= COPY_LIMIT || op_len.is_none_or(|n| n % 8 != 0);
        {
            let mut st = reply.state();
            st.done = false;
            st.direct = direct;
            st.parked = false;
        }
        match op_len {
            None => {
                error!("FUSE io_uring queue {qid}: request of {in_len} bytes with {payload_sz} of payload; answering EIO");
                answer_error(&reply, unique, libc::EIO);
            }
            Some(op_len) => {
                let data: &[u8] = if direct {
                    let buf: &mut Vec<u64> = if payload_sz <= COPY_LIMIT {
                        &mut self.copy
                    } else {
                        self.big.resize(in_len.div_ceil(8), 0);
                        &mut self.big
                    };
                    let out = buf.as_mut_ptr().cast::<u8>();
                    // SAFETY: `buf` holds in_len bytes; the sources are this
                    // entry's buffers, which only this request's reply touches.
                    unsafe {
                        std::ptr::copy_nonoverlapping(header.as_ptr(), out, IN_HEADER);
                        std::ptr::copy_nonoverlapping(header[OP_IN..].as_ptr(), out.add(IN_HEADER), op_len);
                        std::ptr::copy_nonoverlapping(reply.payload_ptr(), out.add(IN_HEADER + op_len), payload_sz);
                        std::slice::from_raw_parts(out, in_len)
                    }
                } else {
                    let start = HEADROOM - op_len - IN_HEADER;
                    // SAFETY: the headroom is ours; replies are staged (not
                    // written into the ring buffers) while this slice lives.
                    unsafe {
                        let base = reply.data.ptr;
                        std::ptr::copy_nonoverlapping(header.as_ptr(), base.add(start), IN_HEADER);
                        std::ptr::copy_nonoverlapping(header[OP_IN..].as_ptr(), base.add(start + IN_HEADER), op_len);
                        std::slice::from_raw_parts(base.add(start), in_len)
                    }
                };
                let sender = crate::channel::ChannelSender::Ring(reply.clone());
                match RequestWithSender::new(sender, data) {
                    Some(req) => {
                        if let Ok(crate::ll::Operation::Destroy(_)) = req.request.operation() {
                            req.reply::<crate::ReplyEmpty>().ok();
                        } else {
                            // A handler that panics has its reply dropped,
                            // which answers EIO; the entry must still be
                            // committed, so the thread goes on.
                            let run = std::panic::AssertUnwindSafe(|| req.dispatch(se));
                            if std::panic::catch_unwind(run).is_err() {
                                error!("FUSE io_uring queue {qid}: a handler panicked; its request was answered EIO");
                            }
                        }
                    }
                    None => answer_error(&reply, unique, libc::EIO),
                }
            }
        }
        // The request and every borrow of the ring buffers are gone.
        let mut st = reply.state();
        if st.done {
            true
        } else {
            st.parked = true;
            self.queue.park(1);
            false
        }
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
