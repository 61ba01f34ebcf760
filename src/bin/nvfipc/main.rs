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

const HEADER: &str = "\
nvfipc: store server, local launcher, demo and benchmarks of nvfuser-ipc
(nvfipc COMMAND --help shows one command)

Usage:
";

const SERVE_HELP: &str = "  nvfipc serve [--host H] [--port P] [--threads N] [--busy-poll-us US]
               [--max-connections C]
      Run a TCPStore server (PyTorch's wire protocol). Prints one line
      \"listening on HOST:PORT\" when ready and serves until SIGINT or SIGTERM.
      Defaults: --host :: (every IPv6 and IPv4 address), --port 29542;
      --port 0 picks a free port. N event-loop threads (default 0: one per
      four cores, 1 to 4). After a request each loop polls without sleeping
      for US microseconds (default 50; 0: never). At most C clients at once
      (default 16384; fewer when the open-file limit is lower: the server
      raises its soft limit only that far, and refuses clients beyond it
      with a line on stderr).
";

const LAUNCH_HELP: &str = "  nvfipc launch -n N [--port P] [--kill-grace-ms MS] [--] CMD [ARGS...]
      Host a store on 127.0.0.1 (--port 0, the default, picks a free port) and
      run N ranks of CMD with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
      MASTER_ADDR, MASTER_PORT, NVFIPC_STORE_ADDR, WORLD_RANK, WORLD_LOCAL_RANK
      and WORLD_LOCAL_SIZE set. CMD `nvfipc` runs this nvfipc program. Every
      output line is prefixed with \"[rank R] \". When a rank fails, the others
      get SIGTERM, then SIGKILL after the grace period (default 5000 ms), and
      nvfipc exits with the failed rank's status (128 + signal number for a
      signal). -n is also spelled --nproc.
";

const DEMO_HELP: &str =
    "  nvfipc demo [--ranks N] [--iters K] [--bytes B] [--transport auto|device|host]
              [--timeout-ms MS]
      Start N ranks of this program on this machine (rank 0 hosts the store).
      Each exports a send and a receive buffer and exchanges handles in a ring
      (send to rank+1, receive from rank-1); each rank pulls its predecessor's
      data over the handles and verifies it, K times: the first exchange is
      cold, the others are cache hits except one step in the middle where every
      rank swaps its send buffer. Rank 0 prints the timings and counters, one
      row per rank (the table's legend says what each column is). auto (the
      default) uses the GPU when a CUDA driver and a device are there, shared
      memory otherwise. Defaults: 2 ranks, 10 iterations, 1048576 bytes,
      30000 ms timeout. Exits non-zero on any failure.
";

const BENCH_HELP: &str = "  nvfipc bench [--scenario exchange|store|barrier[,...]] [--json FILE]
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
";

const BARRIER_TEST_HELP: &str =
    "  nvfipc barrier-test --rounds R [--subset-seed S] [--timeout-ms MS]
                      [--absent-rank A]
      Run by every rank of a launched job (see launch): R barriers over the
      world, or over pseudo-random subsets of the ranks derived from seed S,
      each checked through the store (no rank leaves before every member
      arrived). Rank A creates its context but never joins (the others must
      time out naming it). Exits non-zero on any failure.
";

const INTERNAL_HELP: &str = "  nvfipc demo-rank ... | bench-rank ...
      One rank of `demo` or `bench`, started by them; not for direct use.
";

const TAIL: &str = "
  nvfipc help | --help | -h
      Show this text.

  nvfipc --version
      Show the version.

Examples:
  nvfipc serve --port 0
  nvfipc launch -n 4 -- nvfipc barrier-test --rounds 10
  nvfipc demo --ranks 4
  nvfipc bench --quick
";

/// The whole usage text.
fn usage() -> String {
    [
        HEADER,
        SERVE_HELP,
        "\n",
        LAUNCH_HELP,
        "\n",
        DEMO_HELP,
        "\n",
        BENCH_HELP,
        "\n",
        BARRIER_TEST_HELP,
        TAIL,
    ]
    .concat()
}

/// The help of one command (what `nvfipc COMMAND --help` prints).
fn command_help(command: &str) -> String {
    let text = match command {
        "serve" => SERVE_HELP,
        "launch" => LAUNCH_HELP,
        "demo" => DEMO_HELP,
        "bench" => BENCH_HELP,
        "barrier-test" => BARRIER_TEST_HELP,
        _ => INTERNAL_HELP,
    };
    format!("Usage:\n{text}")
}

fn usage_error(err: UsageError) -> i32 {
    eprintln!("nvfipc: {err}\nRun 'nvfipc --help' for usage.");
    2
}

/// A parse result: run the command, print its help, or report the mistake.
fn dispatch<A>(command: &str, parsed: Result<A, UsageError>, run: impl FnOnce(&A) -> i32) -> i32 {
    match parsed {
        Ok(a) => run(&a),
        Err(e) if e.is_help() => {
            print!("{}", command_help(command));
            0
        }
        Err(e) => usage_error(e),
    }
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
            print!("{}", usage());
            0
        }
        "--version" | "-V" => {
            println!("nvfipc {}", env!("CARGO_PKG_VERSION"));
            0
        }
        "serve" => dispatch(&command, serve::ServeArgs::parse(rest), serve::run),
        "launch" => dispatch(&command, launch::LaunchArgs::parse(rest), launch::run),
        "demo" => dispatch(&command, demo::DemoArgs::parse(rest), demo::run),
        "demo-rank" => dispatch(&command, demo::DemoArgs::parse(rest), demo::run_rank),
        "bench" => dispatch(&command, bench::BenchArgs::parse(rest), bench::run),
        "bench-rank" => dispatch(&command, bench::RankArgs::parse(rest), bench::run_rank),
        "barrier-test" => dispatch(
            &command,
            barrier_test::BarrierTestArgs::parse(rest),
            barrier_test::run,
        ),
        other => usage_error(UsageError(format!("unknown command {other:?}"))),
    };
    std::process::exit(code);
}
