//! Attribution: whose request is this, and who can reach the mount.
//!
//! The kernel tells the daemon only the calling thread's id. Everything
//! else — which transaction a thread is in, whether a `txfs run` tree can
//! reach the shared mount other than through its view — is read from
//! /proc and the mount table.

pub mod mountinfo;
pub mod txmap;
