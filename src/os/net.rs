//! What the library asks of TCP beyond the store's own sockets (`nvfipc_store::net`, re-exported
//! here): errno checks of a bind, and what `/proc/net/tcp{,6}` tell about a server of this
//! machine without connecting.

pub use nvfipc_store::net::fd_limits;
use std::io;
use std::net::{IpAddr, ToSocketAddrs, UdpSocket};

/// The text of an "address in use" `io::Error` (to match errors turned into text).
pub fn addr_in_use_message() -> String {
    io::Error::from_raw_os_error(libc::EADDRINUSE).to_string()
}

/// `LISTEN` in the `st` column of the kernel's TCP tables.
const TCP_LISTEN: &str = "0A";
/// `ESTABLISHED` in the `st` column.
const TCP_ESTABLISHED: &str = "01";
const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];

/// A TCP server on this machine, as this process sees it in the kernel's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerView {
    /// Some socket (of any process) listens on the port.
    pub listening: bool,
    /// A socket of this process listens on the port.
    pub served_here: bool,
    /// Connections accepted on the port whose client end is not a socket of this process:
    /// other processes (here or elsewhere) still connected to the server.
    pub other_clients: usize,
}

/// How this process sees the TCP server on `port`; `None` when `/proc` cannot tell.
pub fn server_view(port: u16) -> Option<ServerView> {
    let own = own_socket_inodes()?;
    let mut rows = Vec::new();
    let mut readable = false;
    for table in TABLES {
        if let Ok(text) = std::fs::read_to_string(table) {
            readable = true;
            rows.extend(text.lines().skip(1).filter_map(Row::parse));
        }
    }
    readable.then(|| view_of(&rows, port, &own))
}

/// One socket of a kernel TCP table.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    local_port: u16,
    remote_port: u16,
    state: String,
    inode: u64,
}

impl Row {
    /// Parses `sl local_address rem_address st ... uid timeout inode`.
    fn parse(line: &str) -> Option<Row> {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
        Some(Row {
            local_port: port(cols.get(1)?)?,
            remote_port: port(cols.get(2)?)?,
            state: cols.get(3)?.to_string(),
            inode: cols.get(9)?.parse().ok()?,
        })
    }
}

/// The server on `port` as seen from the process owning the socket inodes `own`. A client of this
/// process is told apart by its port (a table may show it over IPv4, the server's end over IPv6).
fn view_of(rows: &[Row], port: u16, own: &std::collections::HashSet<u64>) -> ServerView {
    let ours = |r: &&Row| own.contains(&r.inode);
    let listening = rows
        .iter()
        .any(|r| r.state == TCP_LISTEN && r.local_port == port);
    let served_here = rows
        .iter()
        .filter(ours)
        .any(|r| r.state == TCP_LISTEN && r.local_port == port);
    let own_client_ports: std::collections::HashSet<u16> = rows
        .iter()
        .filter(ours)
        .filter(|r| r.state == TCP_ESTABLISHED && r.remote_port == port)
        .map(|r| r.local_port)
        .collect();
    let other_clients = rows
        .iter()
        .filter(ours)
        .filter(|r| r.state == TCP_ESTABLISHED && r.local_port == port)
        .filter(|r| !own_client_ports.contains(&r.remote_port))
        .count();
    ServerView {
        listening,
        served_here,
        other_clients,
    }
}

/// The inodes of this process's sockets (`/proc/self/fd/N -> socket:[inode]`).
fn own_socket_inodes() -> Option<std::collections::HashSet<u64>> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(
        dir.flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|target| {
                let t = target.to_str()?;
                t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
            })
            .collect(),
    )
}

/// Whether `host` names this machine: loopback, or an address (or name of one) a socket can bind.
pub fn is_this_machine(host: &str) -> bool {
    let bindable = |ip: IpAddr| ip.is_loopback() || UdpSocket::bind((ip, 0)).is_ok();
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
        return bindable(ip);
    }
    match (host, 0u16).to_socket_addrs() {
        Ok(mut addrs) => addrs.any(|a| bindable(a.ip())),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests;
