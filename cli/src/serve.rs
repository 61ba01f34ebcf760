//! `nvfipc serve`: a TCPStore server until SIGINT or SIGTERM.

use crate::signals::Signals;
use nvfipc_store::server::{
    ServerOptions, StoreServer, DEFAULT_BUSY_POLL, DEFAULT_PENDING_BUDGET,
    DEFAULT_PENDING_PER_CLIENT, DEFAULT_REPLY_BUDGET,
};
use nvfuser_ipc::tools::config::DEFAULT_MASTER_PORT;
use std::io::Write;
use std::time::Duration;

/// How often the main thread checks that the server thread is still serving.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);

/// Run a TCPStore server (PyTorch's wire protocol)
///
/// Prints one line "listening on HOST:PORT" when ready and serves until SIGINT or SIGTERM. The
/// server raises its soft open-file limit only as far as --max-connections needs, and refuses
/// clients beyond the limit with a line on stderr. What replies hold beyond the stored data
/// (LIST snapshots, streamed MULTI_GET references, unsent output) is bounded by
/// --reply-budget-mib across all clients: a reply that does not fit waits until others are sent.
/// What requests not yet answered hold (WAIT registrations, partly read requests) is bounded per
/// client by --pending-per-client-mib and across all clients by --pending-budget-mib: a request
/// beyond either closes its client's connection, with a line on stderr.
#[derive(clap::Args, Debug, PartialEq, Eq)]
#[command(
    override_usage = "nvfipc serve [--host H] [--port P] [--threads N] [--busy-poll-us US]\n               [--max-connections C] [--reply-budget-mib M]\n               [--pending-budget-mib M] [--pending-per-client-mib M]"
)]
pub struct ServeArgs {
    /// Address to listen on (:: is every IPv6 and IPv4 address)
    #[arg(long, value_name = "H", default_value = "::")]
    pub host: String,
    /// Port (0 picks a free one)
    #[arg(long, value_name = "P", default_value_t = DEFAULT_MASTER_PORT)]
    pub port: u16,
    /// After a request each event loop polls without sleeping for US microseconds (0: never)
    #[arg(long, value_name = "US", default_value_t = DEFAULT_BUSY_POLL.as_micros() as u64)]
    pub busy_poll_us: u64,
    /// Event-loop threads; 0 picks one per four cores, at most four.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
    /// Most clients at once (fewer when the open-file limit is lower)
    #[arg(long, value_name = "C", default_value_t = ServerOptions::default().max_connections)]
    pub max_connections: usize,
    /// MiB that replies may hold beyond the stored data, across all clients (at least 1)
    #[arg(long, value_name = "M", default_value_t = (DEFAULT_REPLY_BUDGET >> 20) as u64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub reply_budget_mib: u64,
    /// MiB that requests not yet answered may hold, across all clients (at least 1)
    #[arg(long, value_name = "M", default_value_t = (DEFAULT_PENDING_BUDGET >> 20) as u64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub pending_budget_mib: u64,
    /// MiB that one client's requests not yet answered may hold (at least 1)
    #[arg(long, value_name = "M", default_value_t = (DEFAULT_PENDING_PER_CLIENT >> 20) as u64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub pending_per_client_mib: u64,
}

/// `mib` MiB in bytes.
fn mib(mib: u64) -> usize {
    usize::try_from(mib << 20).unwrap_or(usize::MAX)
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
        reply_budget: mib(args.reply_budget_mib),
        pending_budget: mib(args.pending_budget_mib),
        pending_per_client: mib(args.pending_per_client_mib),
        ..ServerOptions::default()
    };
    // The server's lines (a refused client, a closed connection) go through the library's log.
    nvfuser_ipc::tools::logging::init();
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
mod tests;
