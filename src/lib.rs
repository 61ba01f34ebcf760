//! nvfuser-ipc: CUDA IPC handle exchange for nvFuser, with a C ABI.
//!
//! Layers, bottom up, each using only those below it: [`error`], [`os`], [`names`], [`logging`],
//! [`config`]; [`store`]; [`node`]; [`transport`], [`fdpass`], [`cuda`], [`host`]; [`barrier`],
//! [`context`]; [`exchange`]; [`default_transports`]; [`ffi`]. docs/ARCHITECTURE.md is the map.

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

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
#[path = "tests/ports.rs"]
mod test_ports;
#[cfg(test)]
#[path = "tests/rng.rs"]
mod test_rng;
pub mod transport;

pub use error::{Error, Result, Status};
