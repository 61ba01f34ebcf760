//! Load generator for the embedded TCPStore server: N client threads doing SET+GET round trips
//! (torch's pattern: one request in flight per connection) against one in-process server.
//!
//! Usage: cargo run --release --example store_server_load -- [clients=64] [seconds=3] [value_bytes=64]

use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::store::wire;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// Runs SET+GET pairs until `stop`; returns the round-trip latency of each pair.
fn client(
    port: u16,
    id: usize,
    value_bytes: usize,
    stop: &AtomicBool,
) -> std::io::Result<Vec<Duration>> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut out = Vec::new();
    wire::encode_validate(&mut out);
    writer.write_all(&out)?;
    let key = format!("/load/{id}");
    let value = vec![b'v'; value_bytes];
    let mut got = Vec::new();
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        out.clear();
        wire::encode_set(&mut out, &key, &value).map_err(std::io::Error::other)?;
        wire::encode_get(&mut out, &key).map_err(std::io::Error::other)?;
        writer.write_all(&out)?;
        wire::read_blob_into(&mut reader, &mut got)?;
        latencies.push(start.elapsed());
        if got != value {
            return Err(std::io::Error::other("GET returned a different value"));
        }
    }
    Ok(latencies)
}

fn main() {
    let clients = arg(1, 64);
    let seconds = arg(2, 3);
    let value_bytes = arg(3, 64);
    let server = match StoreServer::bind("127.0.0.1", 0) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("store_server_load: {e}");
            std::process::exit(1);
        }
    };
    let port = server.port();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..clients)
        .map(|id| {
            let stop = stop.clone();
            std::thread::spawn(move || client(port, id, value_bytes, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds as u64));
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(lat)) => all.extend(lat),
            Ok(Err(e)) => eprintln!("store_server_load: client failed: {e}"),
            Err(_) => eprintln!("store_server_load: client thread panicked"),
        }
    }
    all.sort();
    let pct = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)));
    println!(
        "{clients} clients, {value_bytes} B values: {:.0} SET+GET pairs/s, p50 {:?}, p99 {:?}",
        all.len() as f64 / seconds as f64,
        pct(0.50).copied().unwrap_or_default(),
        pct(0.99).copied().unwrap_or_default(),
    );
    let stats = server.stats();
    println!(
        "server: {} requests, {} accepted",
        stats.requests, stats.accepted
    );
}
