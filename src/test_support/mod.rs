//! Helpers for the `nvfipc` CLI and the tests, not part of the library's API (hidden from the
//! docs): the library itself never allocates device memory, it only exports and maps what its
//! caller allocated.
//!
//! - [`device_buffer`]: owned device buffers and streams, for programs that drive the exchange.

pub mod device_buffer;
