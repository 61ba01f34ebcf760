//! What the kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`) tell about a TCP server
//! of this machine, without connecting to it: whether it still listens on a port (a closing rank
//! asks this of a store's server that a host's client talks to, so that it makes no request to a
//! server that has gone, and the host's client prints nothing about it), and whether it runs in
//! this process and how many connections other processes hold to it (a rank whose process hosts
//! a host's store keeps it up until the others are done with it).

use std::net::{IpAddr, ToSocketAddrs, UdpSocket};

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

/// How this process sees the TCP server on `port` (see [`ServerView`]); `None` when the tables
/// or this process's descriptors cannot be read.
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

/// The server on `port` as seen from the process owning the socket inodes `own`. A client of
/// this process is told apart by its ephemeral port, which the accepted end names as its remote
/// port (one table may show the client over IPv4 and the server's end over IPv6).
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

/// Whether `host` names this machine: a loopback name or address, or an address (or a name that
/// resolves to one) that a socket here can bind to.
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
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_listener_is_seen_until_it_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(server_view(port).unwrap().listening);
        // A connection to it is not a listener: only the LISTEN row counts.
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        drop(listener);
        assert!(!server_view(port).unwrap().listening);
        drop(client);
    }

    #[test]
    fn the_table_format_is_read_by_column() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
            0: 00000000:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n   \
            1: 0100007F:7532 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000     0        0 2\n";
        let rows: Vec<Row> = table.lines().skip(1).filter_map(Row::parse).collect();
        let nobody = std::collections::HashSet::new();
        assert!(view_of(&rows, 0x7531, &nobody).listening);
        assert!(
            !view_of(&rows, 0x7532, &nobody).listening,
            "established, not listening"
        );
        assert!(!view_of(&rows, 80, &nobody).listening);
        assert!("header only\n"
            .lines()
            .skip(1)
            .filter_map(Row::parse)
            .next()
            .is_none());
    }

    #[test]
    fn a_server_of_this_process_counts_the_clients_of_others_only() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let view = server_view(port).unwrap();
        assert_eq!(
            view,
            ServerView {
                listening: true,
                served_here: true,
                other_clients: 0
            }
        );
        // This process's own client (and the end the server accepted for it) is not another's.
        let own = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(server_view(port).unwrap().other_clients, 0);
        // A listener of another process: not served here (a port nobody listens on, too).
        let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
        let other_port = elsewhere.local_addr().unwrap().port();
        drop(elsewhere);
        let gone = server_view(other_port).unwrap();
        assert!(!gone.listening && !gone.served_here);
        drop((own, accepted));
    }

    #[test]
    fn clients_of_other_processes_are_counted_from_the_tables() {
        let row = |local, remote, state: &str, inode| Row {
            local_port: local,
            remote_port: remote,
            state: state.to_string(),
            inode,
        };
        let own: std::collections::HashSet<u64> = [1, 2, 3, 4].into_iter().collect();
        let rows = [
            row(7000, 0, "0A", 1),     // our listener
            row(40001, 7000, "01", 2), // our client
            row(7000, 40001, "01", 3), // its accepted end
            row(7000, 40002, "01", 4), // another process's client, accepted
            row(40002, 7000, "01", 9), // that client's own end (not ours)
            row(7000, 40003, "08", 4), // a client that hung up (CLOSE_WAIT)
            row(7001, 40004, "01", 4), // another port
        ];
        assert_eq!(
            view_of(&rows, 7000, &own),
            ServerView {
                listening: true,
                served_here: true,
                other_clients: 1
            }
        );
        let elsewhere = view_of(&rows, 7000, &[9].into_iter().collect());
        assert!(elsewhere.listening && !elsewhere.served_here);
        let parsed = Row::parse(
            "   3: 0100007F:1B58 0100007F:9C41 01 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 20 4 30 10 -1",
        );
        assert_eq!(parsed, Some(row(0x1B58, 0x9C41, "01", 12345)));
        assert_eq!(Row::parse("  sl  local_address rem_address   st"), None);
    }

    #[test]
    fn this_machine_is_told_apart_from_others() {
        assert!(is_this_machine("localhost"));
        assert!(is_this_machine("127.0.0.1"));
        assert!(is_this_machine("::1") || UdpSocket::bind("[::1]:0").is_err());
        // TEST-NET-1 (RFC 5737) is never assigned to a machine.
        assert!(!is_this_machine("192.0.2.1"));
        assert!(!is_this_machine("no-such-host.invalid"));
    }
}
