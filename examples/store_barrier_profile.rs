//! Barrier rounds against the embedded TCPStore server, for profiling the server's work per
//! round (e.g. under `valgrind --tool=callgrind` or `strace -f -c`): N client threads speak the
//! wire protocol directly and run R barriers of one scheme.
//!
//! - `ours`: the library's protocol (`src/barrier.rs`): every client SETs `arrived/<g>/<rank>`
//!   and, in the same message, WAITs for `release/<g>`; client 0 instead DELETEs the arrival
//!   keys of `g-1` and WAITs for every other arrival key, then DELETEs `release/<g-1>` and SETs
//!   `release/<g>` in one message;
//! - `torch`: ADD `<g>` 1, ADD `<g>` 0, the rank that reads N SETs `<g>:last_worker`, everyone
//!   WAITs on it (PyTorch's store-based barrier).
//!
//! Usage: cargo run --release --example store_barrier_profile -- [ours|torch] [clients=64]
//! [rounds=200]

use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::store::wire;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

struct Client {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    out: Vec<u8>,
}

impl Client {
    fn connect(port: u16) -> std::io::Result<Client> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        let mut client = Client {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
            out: Vec::new(),
        };
        wire::encode_validate(&mut client.out);
        client.send()?;
        Ok(client)
    }

    fn send(&mut self) -> std::io::Result<()> {
        self.writer.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    fn add(&mut self, key: &str, delta: i64) -> std::io::Result<i64> {
        wire::encode_add(&mut self.out, key, delta).map_err(std::io::Error::other)?;
        self.send()?;
        wire::read_i64(&mut self.reader)
    }

    fn set(&mut self, key: &str) -> std::io::Result<()> {
        wire::encode_set(&mut self.out, key, b"1").map_err(std::io::Error::other)?;
        self.send()
    }

    fn wait(&mut self, key: &str) -> std::io::Result<()> {
        wire::encode_wait(&mut self.out, [key]).map_err(std::io::Error::other)?;
        self.send()?;
        self.expect_stop_waiting()
    }

    fn expect_stop_waiting(&mut self) -> std::io::Result<()> {
        let mut byte = [0u8];
        self.reader.read_exact(&mut byte)?;
        if byte[0] != wire::WAIT_STOP_WAITING {
            return Err(std::io::Error::other("unexpected WAIT reply"));
        }
        Ok(())
    }
}

fn ours(c: &mut Client, rank: usize, n: i64, gen: i64) -> std::io::Result<()> {
    let other = std::io::Error::other;
    let own = format!("/b/arrived/{gen}/{rank}");
    let release = format!("/b/release/{gen}");
    if rank != 0 {
        wire::encode_set(&mut c.out, &own, b"1").map_err(other)?;
        return c.wait(&release);
    }
    // The coordinator clears the previous generation's arrival keys while it waits.
    let previous: Vec<String> = if gen > 0 {
        (0..n)
            .map(|r| format!("/b/arrived/{}/{r}", gen - 1))
            .collect()
    } else {
        Vec::new()
    };
    for key in &previous {
        wire::encode_delete_key(&mut c.out, key).map_err(other)?;
    }
    wire::encode_set(&mut c.out, &own, b"1").map_err(other)?;
    let arrivals: Vec<String> = (1..n).map(|r| format!("/b/arrived/{gen}/{r}")).collect();
    wire::encode_wait(&mut c.out, arrivals.iter().map(String::as_str)).map_err(other)?;
    c.send()?;
    for _ in &previous {
        wire::read_i64(&mut c.reader)?;
    }
    c.expect_stop_waiting()?;
    if gen > 0 {
        let old = format!("/b/release/{}", gen - 1);
        wire::encode_delete_key(&mut c.out, &old).map_err(other)?;
    }
    c.set(&release)?;
    if gen > 0 {
        wire::read_i64(&mut c.reader)?;
    }
    Ok(())
}

fn torch(c: &mut Client, _rank: usize, n: i64, gen: i64) -> std::io::Result<()> {
    let key = format!("/t/{gen}");
    c.add(&key, 1)?;
    let count = c.add(&key, 0)?;
    let last = format!("{key}:last_worker");
    if count == n {
        c.set(&last)?;
    }
    c.wait(&last)
}

fn main() {
    let scheme = std::env::args().nth(1).unwrap_or_else(|| "ours".into());
    let round: fn(&mut Client, usize, i64, i64) -> std::io::Result<()> = match scheme.as_str() {
        "ours" => ours,
        "torch" => torch,
        other => {
            eprintln!("store_barrier_profile: unknown scheme {other:?} (ours or torch)");
            std::process::exit(2);
        }
    };
    let clients = arg(2, 64);
    let rounds = arg(3, 200);
    let server = match StoreServer::bind("127.0.0.1", 0) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("store_barrier_profile: {e}");
            std::process::exit(1);
        }
    };
    let port = server.port();
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|rank| {
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut c = Client::connect(port)?;
                for gen in 0..rounds as i64 {
                    round(&mut c, rank, clients as i64, gen)?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("store_barrier_profile: client failed: {e}");
                std::process::exit(1);
            }
            Err(_) => {
                eprintln!("store_barrier_profile: client thread panicked");
                std::process::exit(1);
            }
        }
    }
    let elapsed = start.elapsed();
    let stats = server.stats();
    println!(
        "{scheme}: {clients} clients, {rounds} rounds in {elapsed:?} ({:?} per round); server \
         handled {} requests ({:.1} per round)",
        elapsed / rounds as u32,
        stats.requests,
        stats.requests as f64 / rounds as f64
    );
}
