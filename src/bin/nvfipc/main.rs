//! `nvfipc`: the command-line companion of nvfuser-ipc (store server and local launcher).

mod args;
mod barrier_test;
mod launch;
mod serve;
mod signals;

use args::UsageError;

const USAGE: &str = "\
nvfipc: store server and local launcher of nvfuser-ipc

Usage:
  nvfipc serve [--host H] [--port P]
      Run a TCPStore server (PyTorch's wire protocol). Prints one line
      \"listening on HOST:PORT\" when ready and serves until SIGINT or SIGTERM.
      Defaults: --host :: (every IPv6 and IPv4 address), --port 29542;
      --port 0 picks a free port.

  nvfipc launch -n N [--port P] [--kill-grace-ms MS] [--] CMD [ARGS...]
      Host a store on 127.0.0.1 (--port 0, the default, picks a free port) and
      run N ranks of CMD with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
      MASTER_ADDR, MASTER_PORT, NVFIPC_STORE_ADDR, WORLD_RANK, WORLD_LOCAL_RANK
      and WORLD_LOCAL_SIZE set. Every output line is prefixed with \"[rank R] \".
      When a rank fails, the others get SIGTERM, then SIGKILL after the grace
      period (default 5000 ms), and nvfipc exits with the failed rank's status
      (128 + signal number for a signal).

  nvfipc help | --help | -h
      Show this text.

  nvfipc --version
      Show the version.

Example:
  nvfipc launch -n 4 -- nvfipc barrier-test --rounds 10
";

fn usage_error(err: UsageError) -> i32 {
    eprintln!("nvfipc: {err}\nRun 'nvfipc --help' for usage.");
    2
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        std::process::exit(usage_error(UsageError(
            "missing command (serve, launch or help)".into(),
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
        "barrier-test" => match barrier_test::BarrierTestArgs::parse(rest) {
            Ok(a) => barrier_test::run(&a),
            Err(e) => usage_error(e),
        },
        other => usage_error(UsageError(format!("unknown command {other:?}"))),
    };
    std::process::exit(code);
}
