use std::io;

use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

/// Anonymous memory of its own (page-aligned), for the big buffers requests
/// are read into: it costs only the pages a request touched and goes back to
/// the system when dropped. From the heap, a freed 16 MiB buffer stays with
/// the allocator and the next one is zeroed over it, all resident: a daemon
/// that served many short sessions (one per `txfs run`) kept 100–170 MiB.
#[derive(Debug)]
pub(crate) struct MapBuf {
    pub(crate) ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value; access is through &self/&mut self.
unsafe impl Send for MapBuf {}
unsafe impl Sync for MapBuf {}

impl MapBuf {
    pub(crate) fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh private anonymous mapping; no memory is aliased.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { ptr: ptr.cast(), len })
    }
}

impl Drop for MapBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The buffer a request is read into from /dev/fuse: page-aligned, so
/// aligned for `fuse_in_header`.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    buffer: MapBuf,
}

impl FuseReadBuf {
    /// Creates a new `FuseReadBuf` of `BUFFER_SIZE` bytes.
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            buffer: MapBuf::new(BUFFER_SIZE)?,
        })
    }

    /// The whole buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is BUFFER_SIZE bytes, ours, and borrowed
        // mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.buffer.ptr, BUFFER_SIZE) }
    }
}
