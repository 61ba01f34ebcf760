//! nvfuser-ipc: CUDA IPC handle exchange for nvFuser, with a C ABI.
//!
//! The public surface is small:
//! - the crate root: the Rust API, the same operations as the C ABI (a [`Context`] for the job,
//!   a [`HandleCache`] that exchanges and caches the peers' buffers, host buffers, point-to-point
//!   transfers, [`Error`]/[`Status`]);
//! - [`store`]: the key-value store the ranks meet in (client, server and wire format);
//! - [`ffi`]: the C ABI (`nvfipc_*`, include/nvfuser_ipc.h is generated from it);
//! - `tools`, with the cargo feature `tools` only: the internals that the `nvfipc` CLI and the
//!   integration tests need. Not part of the supported API.
//!
//! Internal layers, bottom up, each using only those below it: error, os, names, logging, config;
//! store; node; transport, fdpass, cuda, host; barrier, context; exchange; default_transports;
//! ffi. docs/ARCHITECTURE.md is the map.

// Without `tools`, the internals that only the CLI and the tests use are unreachable. Dead code
// is still found: the workspace build, whose CLI enables `tools`, is the one linted.
#![cfg_attr(not(feature = "tools"), allow(dead_code, unused_imports))]

mod barrier;
mod config;
mod context;
mod cuda;
mod default_transports;
mod departures;
mod error;
mod exchange;
mod fdpass;
pub mod ffi;
mod hash;
mod host;
mod logging;
mod names;
mod node;
mod os;
pub mod store;
mod sync;
#[cfg(test)]
#[path = "tests/ports.rs"]
mod test_ports;
#[cfg(test)]
#[path = "../store/src/tests/rng.rs"]
mod test_rng;
mod transport;

#[cfg(feature = "tools")]
pub mod tools;

pub use context::{Context, ContextOptions, EnvOptions, DEFAULT_HOST_LINGER};
pub use cuda::p2p::{
    channel_recv_post as cuda_p2p_recv_post, channel_send_post as cuda_p2p_send_post,
    channel_send_wait as cuda_p2p_send_wait, Stream,
};
pub use default_transports::{cache as default_cache, cache_from_context};
pub use error::{Error, Result, Status};
pub use exchange::{
    CacheConfig, CacheStats, ChannelKey, Direction, HandleCache, MemKind, P2pHandles, PeerBuffer,
    Request, DEFAULT_MAX_LINGER, DEFAULT_RETAINED_PER_PEER,
};
pub use host::p2p::{
    recv_post as host_p2p_recv_post, send_post as host_p2p_send_post,
    send_wait as host_p2p_send_wait,
};
pub use host::{
    alloc as host_alloc, alloc_for_job as host_alloc_for_job, free as host_free, HostBuffer,
};
