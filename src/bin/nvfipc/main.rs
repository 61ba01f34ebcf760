//! `nvfipc`: the command-line companion of nvfuser-ipc (store server, local launcher, demo and
//! benchmarks).

mod args;
mod barrier_test;
mod bench;
mod demo;
mod launch;
mod memory;
mod serve;
mod signals;
mod stats;

use args::UsageError;

const USAGE: &str = "\
nvfipc: store server, local launcher, demo and benchmarks of nvfuser-ipc

Usage:
  nvfipc serve [--host H] [--port P] [--threads N] [--busy-poll-us US]
      Run a TCPStore server (PyTorch's wire protocol). Prints one line
      \"listening on HOST:PORT\" when ready and serves until SIGINT or SIGTERM.
      Defaults: --host :: (every IPv6 and IPv4 address), --port 29542;
      --port 0 picks a free port. N event-loop threads (default 0: one per
      four cores, 1 to 4). After a request each loop polls without sleeping
      for US microseconds (default 50; 0: never).

  nvfipc launch -n N [--port P] [--kill-grace-ms MS] [--] CMD [ARGS...]
      Host a store on 127.0.0.1 (--port 0, the default, picks a free port) and
      run N ranks of CMD with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
      MASTER_ADDR, MASTER_PORT, NVFIPC_STORE_ADDR, WORLD_RANK, WORLD_LOCAL_RANK
      and WORLD_LOCAL_SIZE set. Every output line is prefixed with \"[rank R] \".
      When a rank fails, the others get SIGTERM, then SIGKILL after the grace
      period (default 5000 ms), and nvfipc exits with the failed rank's status
      (128 + signal number for a signal).

  nvfipc demo [--ranks N] [--iters K] [--bytes B] [--transport auto|device|host]
              [--timeout-ms MS]
      Start N ranks of this program on this machine (rank 0 hosts the store).
      Each exports a send and a receive buffer and exchanges handles in a ring
      (send to rank+1, receive from rank-1); each rank pulls its predecessor's
      data over the handles and verifies it, K times: the first exchange is
      cold, the others are cache hits except one step in the middle where every
      rank swaps its send buffer. Rank 0 prints the timings and counters.
      auto (the default) uses the GPU when a CUDA driver and a device are
      there, shared memory otherwise. Defaults: 2 ranks, 10 iterations,
      1048576 bytes, 30000 ms timeout. Exits non-zero on any failure.

  nvfipc bench [--scenario exchange|store|barrier[,...]] [--json FILE]
               [--svg-dir DIR] [--quick] [--transport auto|device|host]
               [--no-torch] [--server-threads N] [--busy-poll-us US]
      Measure, in one run: the ring exchange (cold, warm, asymmetric) against
      the upstream seed protocol and the floor (opens + two store round trips)
      for 2, 4 and 8 ranks (--transport as for demo); our store server against
      PyTorch's TCPStore (libuv and classic, hosted by the Python in
      $NVFIPC_PYTHON; skipped with a note without it or with --no-torch) for 1
      to 256 clients; barrier latency for up to 64 processes against a
      torch-style store barrier. Prints tables and the ratios to the targets;
      writes JSON to FILE and one SVG plot per scenario to DIR. --quick runs a
      small version in a few seconds. Default: every scenario. --server-threads
      and --busy-poll-us set our server of the store scenario as for serve
      (its label then names them). Exits non-zero when a scenario could not
      run (a missed target is reported, not an error).

  nvfipc help | --help | -h
      Show this text.

  nvfipc --version
      Show the version.

Examples:
  nvfipc launch -n 4 -- nvfipc barrier-test --rounds 10
  nvfipc demo --ranks 4
  nvfipc bench --json docs/bench/bench.json --svg-dir docs/bench
";

fn usage_error(err: UsageError) -> i32 {
    eprintln!("nvfipc: {err}\nRun 'nvfipc --help' for usage.");
    2
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        std::process::exit(usage_error(UsageError(
            "missing command (serve, launch, demo, bench or help)".into(),
        )));
    };
    let rest: Vec<String> = args.collect();
    let code = match command.as_str() {
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            0
        }
        "--version" | "-V" => {
            println!("nvfipc {}", env!("CARGO_PKG_VERSION"));
            0
        }
        "serve" => match serve::ServeArgs::parse(rest) {
            Ok(a) => serve::run(&a),
            Err(e) => usage_error(e),
        },
        "launch" => match launch::LaunchArgs::parse(rest) {
            Ok(a) => launch::run(&a),
            Err(e) => usage_error(e),
        },
        "demo" => match demo::DemoArgs::parse(rest) {
            Ok(a) => demo::run(&a),
            Err(e) => usage_error(e),
        },
        "demo-rank" => match demo::DemoArgs::parse(rest) {
            Ok(a) => demo::run_rank(&a),
            Err(e) => usage_error(e),
        },
        "bench" => match bench::BenchArgs::parse(rest) {
            Ok(a) => bench::run(&a),
            Err(e) => usage_error(e),
        },
        "bench-rank" => match bench::RankArgs::parse(rest) {
            Ok(a) => bench::run_rank(&a),
            Err(e) => usage_error(e),
        },
        "barrier-test" => match barrier_test::BarrierTestArgs::parse(rest) {
            Ok(a) => barrier_test::run(&a),
            Err(e) => usage_error(e),
        },
        other => usage_error(UsageError(format!("unknown command {other:?}"))),
    };
    std::process::exit(code);
}
