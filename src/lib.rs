//! nvfuser-ipc: CUDA IPC handle exchange for nvFuser, with a C ABI.
//!
//! Layers, bottom up (see README.md and docs/ARCHITECTURE.md):
//! - [`store`]: PyTorch TCPStore protocol client and embedded server, host-callback store;
//! - [`barrier`]: reusable barriers over the world or any subset of ranks;
//! - [`node`]: which peers share this node (mappable memory, checkable pids);
//! - [`env`] and [`context`]: who we are (rank, world, local rank) and which store we use;
//! - [`cuda`] and [`host`]: exporting and importing device and host buffers;
//! - [`fdpass`]: passing file descriptors between processes without ptrace rights;
//! - [`exchange`]: epoch-keyed handle exchange and the handle cache;
//! - [`ffi`]: the thin C ABI over all of the above.

pub mod barrier;
pub mod context;
pub mod cuda;
pub mod env;
pub mod error;
pub mod exchange;
pub mod fdpass;
pub mod ffi;
pub mod host;
pub mod node;
pub mod store;
mod sync;

pub use error::{Error, Result, Status};
