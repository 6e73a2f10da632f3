//! `txfs`: mount a transactional file system over a backing directory, and
//! run programs as transactions. See `txfs --help` and SPEC §1.
//!
//! The transactions themselves are the engine's (`txfs-engine`); this crate
//! is how programs reach them. By folder:
//!
//! * [`cli`]: one file per subcommand (`mount`, `umount`, `status`, `run`,
//!   `recover`, `check`). `txfs run`'s client side is `cli/run.rs` rather
//!   than a file of its own beside `cli/`: it is a subcommand like the
//!   others, and `cli/busy.rs` (who keeps a mount busy) sits there too,
//!   since only `txfs umount` asks.
//! * [`fuse`]: the FUSE adapter, kernel requests in and engine calls out:
//!   the operations, node ids, the kernel cache gate, transaction views and
//!   the ioctl control plane, a file each.
//! * [`wire`]: the ioctl protocol shared with the C and Python clients, the
//!   one definition their copies are tested against.
//! * [`attribution`]: whose request is this (thread and process-tree
//!   transactions), read from /proc and the mount table.
//! * [`config`]: the daemon's environment knobs, read once at startup.
//! * `failpoint`: the crash campaign's failpoints, only in debug builds and
//!   builds with the `testing` feature.
//!
//! Dependencies point one way: `cli` uses the rest; `fuse` uses
//! `attribution`, `wire` and `config`; those three use nothing else of the
//! crate, and know neither FUSE nor the command line. (`cli/mount.rs`
//! builds the FUSE session: its mount options are the subcommand's.)

mod attribution;
mod cli;
mod config;
#[cfg(any(feature = "testing", debug_assertions))]
mod failpoint;
mod fuse;
mod wire;

fn main() -> std::process::ExitCode {
    cli::main()
}
