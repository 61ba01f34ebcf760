//! Cost of a warm `HandleCache::exchange_handles` call: two ranks (this process is rank 0 and
//! hosts the store; it re-executes itself as rank 1) exchange a batch of two host shared-memory
//! requests, a SEND to rank+1 and a RECV from rank-1, as the ring benchmark does.
//!
//! Usage: cargo run --release --example warm_exchange -- [calls=100000] [--peer-first]
//!
//! Each rank prints the median, p90 and mean wall-clock time of its warm calls.
//!
//! `--peer-first` makes rank 0 wait, before each measured call and outside of it, until rank 1
//! has already reached that call's step on both channels. The measured call then never waits for
//! its peer, so it performs only the rank-local work of a hit: that is the mode for counting
//! instructions, e.g. with rank 0 under callgrind and rank 1 running natively:
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='*measured_call*' \
//!     target/release/examples/warm_exchange 2000 --peer-first
//! ```
//!
//! The instructions of one warm call are then the collected total divided by the calls.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::tools::exchange::{fingerprint, PeerBoard};
use nvfuser_ipc::tools::fdpass::TrustedUids;
use nvfuser_ipc::ChannelKey;
use nvfuser_ipc::{CacheConfig, HandleCache, MemKind, Request};
use nvfuser_ipc::{Error, Result};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TAG: &str = "ring";
const BYTES: u64 = 4096;
/// Unmeasured calls first: the cold one and a few to settle.
const WARMUP: u64 = 100;
const TIMEOUT: Duration = Duration::from_secs(60);
const PEER_ENV: &str = "NVFIPC_WARM_EXCHANGE_PEER";

struct Args {
    calls: u64,
    peer_first: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        calls: 100_000,
        peer_first: false,
    };
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--peer-first" => args.peer_first = true,
            n => {
                args.calls = n
                    .parse()
                    .map_err(|_| Error::invalid(format!("not a call count: {n:?}")))?
            }
        }
    }
    Ok(args)
}

/// The measured call, kept out of line so callgrind can collect exactly it.
#[inline(never)]
fn measured_call(cache: &HandleCache, requests: &[Request]) -> Result<()> {
    cache.exchange_handles(requests)
}

/// Waits until `peer` has reached `step` on both channels of the batch (see `--peer-first`).
fn wait_for_peer(board: &PeerBoard, entries: &mut [Option<u32>], fps: &[u128], step: u64) {
    let deadline = Instant::now() + TIMEOUT;
    for (entry, &fp) in entries.iter_mut().zip(fps) {
        loop {
            if entry.is_none() {
                *entry = board.find(fp);
            }
            if entry.is_some_and(|e| board.step(e) >= step) {
                break;
            }
            assert!(Instant::now() < deadline, "peer never reached step {step}");
            std::hint::spin_loop();
        }
    }
}

fn run_rank(rank: usize, port: u16, job: &str, args: &Args) -> Result<()> {
    let world = 2;
    let peer = 1 - rank;
    let opts = ConnectOptions {
        timeout: TIMEOUT,
        connect_timeout: TIMEOUT,
        wait_for_workers: None,
    };
    let store = Arc::new(TcpStore::connect("127.0.0.1", port, &opts)?);
    let cache = nvfuser_ipc::default_cache(CacheConfig {
        rank,
        world_size: world,
        store,
        job_id: job.to_string(),
        scope: String::new(),
        timeout: TIMEOUT,
    })?;
    let send = nvfuser_ipc::host_alloc_for_job(job, BYTES)?;
    let recv = nvfuser_ipc::host_alloc_for_job(job, BYTES)?;
    let requests = [
        Request::send((rank + 1) % world, TAG, send.addr(), BYTES, MemKind::Host),
        Request::recv(
            (rank + world - 1) % world,
            TAG,
            recv.addr(),
            BYTES,
            MemKind::Host,
        ),
    ];
    for _ in 0..WARMUP {
        cache.exchange_handles(&requests)?;
    }
    let peer_first = args.peer_first && rank == 0;
    let peer_board = if peer_first {
        let name = cache.names().board(peer);
        PeerBoard::try_open(&name, peer, &TrustedUids::from_env()?)?
            .ok_or_else(|| Error::state(format!("board {name} of rank {peer} is not there")))?
    } else {
        // Unused: only rank 0 with --peer-first waits for its peer outside the call.
        PeerBoard::try_open(&cache.names().board(rank), rank, &TrustedUids::from_env()?)?
            .ok_or_else(|| Error::state("own board is not there"))?
    };
    let fps: Vec<u128> = requests
        .iter()
        .map(|r| fingerprint(&ChannelKey::of(rank, r, 0).describe()))
        .collect();
    let mut entries = vec![None; fps.len()];
    let mut took = Vec::with_capacity(args.calls as usize);
    for call in 0..args.calls {
        if peer_first {
            wait_for_peer(&peer_board, &mut entries, &fps, WARMUP + call + 1);
        }
        let start = Instant::now();
        measured_call(&cache, &requests)?;
        took.push(start.elapsed().as_nanos() as u64);
    }
    let stats = cache.stats();
    took.sort_unstable();
    let n = took.len().max(1);
    let mean = took.iter().sum::<u64>() / n as u64;
    println!(
        "rank {rank}: {} warm calls{}: median {} ns, p90 {} ns, mean {mean} ns; \
         hits {} misses {} store round trips {}",
        args.calls,
        if peer_first { " (peer first)" } else { "" },
        took.get(n / 2).copied().unwrap_or(0),
        took.get(n * 9 / 10).copied().unwrap_or(0),
        stats.hits,
        stats.misses,
        stats.store_round_trips
    );
    // Only the two cold channel-steps of the first call may miss.
    if stats.misses != 2 {
        return Err(Error::internal(format!(
            "rank {rank}: expected 2 misses (the cold call), got {}",
            stats.misses
        )));
    }
    cache.try_close()?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let result = parse_args().and_then(|args| match std::env::var(PEER_ENV) {
        Ok(spec) => {
            let (port, job) = spec
                .split_once(':')
                .ok_or_else(|| Error::invalid(format!("bad {PEER_ENV}: {spec:?}")))?;
            let port = port
                .parse()
                .map_err(|_| Error::invalid(format!("bad port in {PEER_ENV}: {spec:?}")))?;
            run_rank(1, port, job, &args)
        }
        Err(_) => {
            let server = StoreServer::bind("127.0.0.1", 0)?;
            let job = format!("wx{}", std::process::id());
            let exe = std::env::current_exe()
                .map_err(|e| Error::from_io("locating this executable", &e))?;
            let mut peer = Command::new(exe)
                .args(std::env::args().skip(1))
                .env(PEER_ENV, format!("{}:{job}", server.port()))
                .spawn()
                .map_err(|e| Error::from_io("starting rank 1", &e))?;
            let mine = run_rank(0, server.port(), &job, &args);
            let status = peer
                .wait()
                .map_err(|e| Error::from_io("waiting for rank 1", &e))?;
            mine?;
            if !status.success() {
                return Err(Error::internal(format!("rank 1 failed: {status}")));
            }
            Ok(())
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warm_exchange: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
