//! nvfipc-store: a client and a server of PyTorch's TCPStore wire protocol (the `c10d::TCPStore`
//! that `torch.distributed` rendezvous and process groups use), with no CUDA and no Python.
//!
//! - [`client::TcpStore`] talks to any TCPStore server (torch's libuv and classic servers, or
//!   this crate's) like torch 2.11's C++ client: `set`, `get`, `add`, `check`, `wait`,
//!   `delete_key`, `num_keys`, `compare_set`, `append`, `multi_set`, `multi_get`, queues and
//!   `list`, each bounded in time, with torch's key prefix so that torch sees the same keys.
//! - [`server::StoreServer`] is a server byte-compatible with torch's default (libuv) one, on
//!   one or more epoll threads, with bounds on what replies and unanswered requests may hold.
//! - [`wire`] is the codec both use: limit-checked request encoders, the incremental parser the
//!   server runs, the client's reply readers.
//!
//! Errors are an [`Error`]: a [`Status`] and a message naming the store, the operation and the
//! keys. Lines are logged through the `log` facade under the targets [`CLIENT_LOG_TARGET`] and
//! [`SERVER_LOG_TARGET`]; install any logger to see them.
//!
//! ```
//! use nvfipc_store::client::{ConnectOptions, TcpStore};
//! use nvfipc_store::server::StoreServer;
//! use std::time::Duration;
//!
//! // A server on an ephemeral port of this machine, and a client of it.
//! let server = StoreServer::bind("127.0.0.1", 0)?;
//! let opts = ConnectOptions::with_timeout(Duration::from_secs(10));
//! let store = TcpStore::connect("127.0.0.1", server.port(), &opts)?;
//!
//! store.set("greeting", b"hello")?;
//! store.wait(&["greeting"], Duration::from_secs(1))?;
//! assert_eq!(store.get("greeting", Duration::from_secs(1))?, b"hello");
//! assert_eq!(store.add("counter", 2)?, 2);
//!
//! // A wait for a key nobody sets ends with a timeout, and the connection stays usable.
//! let err = store.wait(&["missing"], Duration::from_millis(50)).unwrap_err();
//! assert_eq!(err.status, nvfipc_store::Status::Timeout);
//! assert_eq!(store.num_keys()?, 2);
//! # Ok::<(), nvfipc_store::Error>(())
//! ```

pub mod client;
pub mod error;
pub mod net;
pub mod server;
#[cfg(test)]
#[path = "tests/rng.rs"]
mod test_rng;
pub mod wire;

pub use error::{Error, Result, Status};
use std::time::Duration;

/// PyTorch's default store timeout (`Store::kDefaultTimeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The `log` target of the client's lines.
pub const CLIENT_LOG_TARGET: &str = "nvfipc::store";
/// The `log` target of the server's lines.
pub const SERVER_LOG_TARGET: &str = "nvfipc::server";
