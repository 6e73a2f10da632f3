//! The daemon's environment knobs, read once when `txfs mount` starts.
//!
//! Every knob is read here and nowhere else, before the session serves its
//! first request: a request never reads the environment, and what a
//! running daemon does cannot change with it.
//!
//! ```text
//! TXFS_THREADS=<n>           threads reading /dev/fuse (default 16; over
//!                            io_uring one is enough, for FORGETs)
//! TXFS_URING_THREADS=<n>     FUSE-over-io_uring threads per CPU for the
//!                            mount (default 8) and, at most 2, for each
//!                            `txfs run` view (default 2); 0: /dev/fuse only
//! TXFS_NO_VIEWS=1            serve no `txfs run` transaction views (runs
//!                            fall back to attribution by process tree)
//! TXFS_CHECKPOINT_BYTES=<n>  checkpoint once the journal exceeds n bytes
//! TXFS_STAGE_BYTES=<n>       stage a new file's content from n bytes
//! TXFS_SPILL_BYTES=<n>       spill a transaction's data past n bytes
//! ```
//!
//! The last three tune engine thresholds for tests and benchmarks. Test
//! hooks (`TXFS_FAILPOINT`, see `failpoint.rs`, and umount's
//! `TXFS_TEST_UMOUNT_PAUSE_MS`) exist only in debug builds and builds with
//! the `testing` feature; a release build refuses to mount with
//! `TXFS_FAILPOINT` set rather than run a crash test without its crashes.

use txfs_engine::Options;

/// The knobs of one daemon (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// `TXFS_THREADS`.
    pub threads: Option<usize>,
    /// `TXFS_URING_THREADS`.
    pub uring_threads: Option<usize>,
    /// Not `TXFS_NO_VIEWS=1`.
    pub views: bool,
    pub checkpoint_bytes: Option<u64>,
    pub stage_bytes: Option<u64>,
    pub spill_bytes: Option<u64>,
}

impl Config {
    /// The knobs as the environment sets them now. A value that is not a
    /// number counts as unset (the default), as before.
    pub fn from_env() -> Config {
        let count = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
        let bytes = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse().ok());
        Config {
            threads: count("TXFS_THREADS"),
            uring_threads: count("TXFS_URING_THREADS"),
            views: std::env::var_os("TXFS_NO_VIEWS").is_none_or(|v| v != "1"),
            checkpoint_bytes: bytes("TXFS_CHECKPOINT_BYTES"),
            stage_bytes: bytes("TXFS_STAGE_BYTES"),
            spill_bytes: bytes("TXFS_SPILL_BYTES"),
        }
    }

    /// Threads reading /dev/fuse for the shared mount.
    pub fn mount_threads(&self) -> usize {
        self.threads.unwrap_or(16)
    }

    /// io_uring threads per CPU for the shared mount.
    pub fn mount_uring_threads(&self) -> usize {
        self.uring_threads.unwrap_or(8)
    }

    /// io_uring threads per CPU for a `txfs run` view: two, or fewer if
    /// the mount's knob says so.
    pub fn view_uring_threads(&self) -> usize {
        self.uring_threads.unwrap_or(2).min(2)
    }

    /// `opts` with the engine thresholds set here applied.
    pub fn engine_options(&self, mut opts: Options) -> Options {
        if let Some(n) = self.checkpoint_bytes {
            opts.checkpoint_bytes = n;
        }
        if let Some(n) = self.stage_bytes {
            opts.stage_threshold = n;
        }
        if let Some(n) = self.spill_bytes {
            opts.spill_threshold = n;
        }
        opts
    }
}
