//! `txfs`: mount a transactional file system over a backing directory, and
//! run programs as transactions. See `txfs --help` and SPEC §1.

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
