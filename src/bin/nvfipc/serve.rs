//! `nvfipc serve`: a TCPStore server until SIGINT or SIGTERM.

use crate::args::{split_flag, take_parsed, take_value, unknown_option, UsageError};
use crate::signals::Signals;
use nvfuser_ipc::env::DEFAULT_MASTER_PORT;
use nvfuser_ipc::store::server::{ServerOptions, StoreServer, DEFAULT_BUSY_POLL};
use std::io::Write;
use std::time::Duration;

/// How often the main thread checks that the server thread is still serving.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);

#[derive(Debug, PartialEq, Eq)]
pub struct ServeArgs {
    pub host: String,
    pub port: u16,
    pub busy_poll_us: u64,
    /// Event-loop threads; 0 picks one per four cores, at most four.
    pub threads: usize,
    /// Most clients at once.
    pub max_connections: usize,
}

impl ServeArgs {
    pub fn parse(args: Vec<String>) -> Result<ServeArgs, UsageError> {
        let mut parsed = ServeArgs {
            host: "::".to_string(),
            port: DEFAULT_MASTER_PORT,
            busy_poll_us: DEFAULT_BUSY_POLL.as_micros() as u64,
            threads: 0,
            max_connections: ServerOptions::default().max_connections,
        };
        let mut rest = args.into_iter();
        while let Some(arg) = rest.next() {
            match split_flag(&arg) {
                ("--host", inline) => parsed.host = take_value(&mut rest, "--host", inline)?,
                ("--port", inline) => {
                    parsed.port = take_parsed(&mut rest, "--port", inline, "a port (0..=65535)")?
                }
                ("--busy-poll-us", inline) => {
                    parsed.busy_poll_us =
                        take_parsed(&mut rest, "--busy-poll-us", inline, "microseconds")?
                }
                ("--threads", inline) => {
                    parsed.threads = take_parsed(&mut rest, "--threads", inline, "a thread count")?
                }
                ("--max-connections", inline) => {
                    parsed.max_connections =
                        take_parsed(&mut rest, "--max-connections", inline, "a client count")?
                }
                _ => return Err(unknown_option("serve", &arg)),
            }
        }
        Ok(parsed)
    }
}

/// Runs the server; returns the exit status.
pub fn run(args: &ServeArgs) -> i32 {
    // Install the handlers first so that a signal right after the "listening" line is not lost.
    let signals = match Signals::install(&[libc::SIGINT, libc::SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nvfipc serve: cannot install signal handlers: {e}");
            return 1;
        }
    };
    let opts = ServerOptions {
        busy_poll: Duration::from_micros(args.busy_poll_us),
        threads: args.threads,
        max_connections: args.max_connections,
        ..ServerOptions::default()
    };
    let server = match StoreServer::bind_with(&args.host, args.port, &opts) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("nvfipc serve: {e}");
            return 1;
        }
    };
    let addr = match server.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("nvfipc serve: {e}");
            return 1;
        }
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "listening on {addr}")
        .and_then(|()| out.flush())
        .is_err()
    {
        // Whoever started us cannot learn the address; serving would be useless.
        return 1;
    }
    drop(out);
    loop {
        match signals.wait(Some(LIVENESS_CHECK)) {
            Ok(Some(_)) => break,
            Ok(None) if server.is_running() => continue,
            Ok(None) => {
                let why = server.stats().last_error.unwrap_or_default();
                eprintln!("nvfipc serve: the server stopped unexpectedly: {why}");
                return 1;
            }
            Err(e) => {
                eprintln!("nvfipc serve: waiting for signals: {e}");
                server.shutdown();
                return 1;
            }
        }
    }
    server.shutdown();
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::strings;

    #[test]
    fn parses_host_and_port() {
        assert_eq!(
            ServeArgs::parse(strings(&[])).unwrap(),
            ServeArgs {
                host: "::".into(),
                port: 29542,
                busy_poll_us: 50,
                threads: 0,
                max_connections: 16384,
            }
        );
        assert_eq!(
            ServeArgs::parse(strings(&[
                "--host",
                "127.0.0.1",
                "--port=0",
                "--busy-poll-us=0",
                "--threads",
                "3",
                "--max-connections=100",
            ]))
            .unwrap(),
            ServeArgs {
                host: "127.0.0.1".into(),
                port: 0,
                busy_poll_us: 0,
                threads: 3,
                max_connections: 100,
            }
        );
        assert!(ServeArgs::parse(strings(&["--port", "99999"])).is_err());
        assert!(ServeArgs::parse(strings(&["--bogus"])).is_err());
        assert!(ServeArgs::parse(strings(&["--help"]))
            .unwrap_err()
            .is_help());
        assert!(ServeArgs::parse(strings(&["--busy-poll-us", "-1"])).is_err());
    }
}
