//! Attribution: whose request is this, and who can reach the mount.
//!
//! The kernel tells the daemon only the calling thread's id. Everything
//! else is read from the kernel's own tables:
//! * [`txmap`]: which transaction a thread is in — its own (`fs_tx_begin`)
//!   or its process tree's (`txfs run`), proven on every request to be the
//!   live thread that began it, with the credentials it began with — and
//!   the reaper of transactions whose owner died;
//! * [`procfs`]: /proc, read without ever sending a request to a FUSE
//!   daemon: start times, parents, descriptors, devices, and whether a
//!   `txfs run` tree can reach the shared mount other than by its view;
//! * [`mountinfo`]: the one parser of the mount table, for the daemon and
//!   the CLI alike.
//!
//! Nothing here knows FUSE: [`crate::fuse`] asks, `txfs umount` and `txfs
//! run` (in [`crate::cli`]) ask too.

pub mod mountinfo;
pub mod procfs;
pub mod txmap;
