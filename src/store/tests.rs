//! The store server's limits against the library's largest request.

use super::client::ConnectOptions;
use super::server::{StoreServer, DEFAULT_PENDING_PER_CLIENT};
use super::*;
use crate::config::MAX_WORLD_SIZE;
use crate::names::BarrierKeys;
use crate::Status;

/// The coordinator of a world barrier of the most ranks, in a job with a 64-byte id, WAITs on
/// 131072 keys in one request: the frame and its registrations fit the default per-client limit
/// (the server keeps the connection and the WAIT times out cleanly).
#[test]
fn a_world_barrier_fits_the_default_pending_limits() {
    let keys = BarrierKeys::new(Some(&"j".repeat(64)), "w131072");
    let waited: Vec<String> = (1..MAX_WORLD_SIZE)
        .map(|r| keys.arrival(u64::from(u32::MAX), r))
        .collect();
    let refs: Vec<&str> = waited.iter().map(String::as_str).collect();
    let mut frame = Vec::new();
    let wire_keys: Vec<String> = waited.iter().map(|k| format!("/{k}")).collect();
    wire::encode_wait(&mut frame, wire_keys.iter().map(String::as_str)).unwrap();
    assert!(
        frame.len() < DEFAULT_PENDING_PER_CLIENT / 4,
        "{}",
        frame.len()
    );
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let opts = ConnectOptions::with_timeout(Duration::from_secs(30));
    let client = connect("127.0.0.1", server.port(), &opts).unwrap();
    // The most held at once (the frame while it is read, then its registrations), and what the
    // registrations hold while the WAIT waits (the last amount seen before it is cancelled).
    let (mut peak, mut registered) = (0, 0);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| Store::wait(&client, &refs, Duration::from_secs(3)));
        while !waiter.is_finished() {
            let held = server.stats().pending_bytes_held;
            peak = peak.max(held);
            if held > 0 {
                registered = held;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let err = waiter.join().unwrap().unwrap_err();
        assert_eq!(err.status, Status::Timeout, "{err}");
    });
    eprintln!(
        "frame {} bytes, registrations {registered} bytes, at most {peak} bytes held",
        frame.len()
    );
    assert!(peak < DEFAULT_PENDING_PER_CLIENT, "{peak}");
    assert!(
        registered > 0 && registered < DEFAULT_PENDING_PER_CLIENT / 2,
        "{registered}"
    );
    assert_eq!(server.stats().closed_malformed, 0);
}
