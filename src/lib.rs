//! nvfuser-ipc: CUDA IPC handle exchange for nvFuser, with a C ABI.
//!
//! Layers, bottom up (see README.md and docs/ARCHITECTURE.md); each uses only layers below it:
//! - [`error`], `hash` (the stable FNV-1a and the store's map hasher), [`os`] (shm, waits,
//!   processes, launcher variables), [`names`] (every shm name, socket name and store key of a
//!   job), [`logging`] (the log `NVFIPC_DEBUG` turns on) and [`config`] (every environment
//!   variable the library reads, parsed into each layer's settings: docs/CONFIGURATION.md);
//! - [`store`]: PyTorch TCPStore protocol client and embedded server, host-callback store;
//! - [`node`]: which peers share this node (mappable memory, checkable pids);
//! - [`transport`]: the contract between the exchange and the memory transports;
//! - [`fdpass`]: passing file descriptors between processes without ptrace rights (for
//!   fd-based transports);
//! - [`cuda`] and [`host`]: the device and host transports, implementing that contract;
//! - [`barrier`] and [`context`]: barriers, who we are and which store we use;
//! - [`exchange`]: epoch-keyed handle exchange and the handle cache, over the contract only;
//! - [`default_transports`]: hands a cache the library's own transports;
//! - [`ffi`]: the thin C ABI over all of the above.

pub mod barrier;
pub mod config;
pub mod context;
pub mod cuda;
pub mod default_transports;
pub mod departures;
pub mod error;
pub mod exchange;
pub mod fdpass;
pub mod ffi;
mod hash;
pub mod host;
pub mod logging;
pub mod names;
pub mod node;
pub mod os;
pub mod store;
mod sync;
#[cfg(test)]
mod test_rng;
pub mod transport;

pub use error::{Error, Result, Status};
