//! Whether a TCP server of this machine still listens on a port, read from the kernel's socket
//! tables (`/proc/net/tcp`, `/proc/net/tcp6`) without connecting to it: a closing rank asks this
//! of a store's server that a host's client talks to, so that it makes no request to a server
//! that has gone (and the host's client prints nothing about it), and the server sees no
//! stray connection either.

use std::net::{IpAddr, ToSocketAddrs, UdpSocket};

/// `LISTEN` in the `st` column of the kernel's TCP tables.
const TCP_LISTEN: &str = "0A";

/// Whether some socket of this network namespace listens on TCP `port` (any address); `None`
/// when the tables cannot be read (no `/proc`).
pub fn listening_on(port: u16) -> Option<bool> {
    let mut readable = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        if table_listens_on(&text, port) {
            return Some(true);
        }
    }
    readable.then_some(false)
}

/// Whether a table in the format of `/proc/net/tcp` has a listening socket on `port`.
fn table_listens_on(text: &str, port: u16) -> bool {
    text.lines().skip(1).any(|line| {
        let mut cols = line.split_whitespace();
        let local = cols.nth(1).unwrap_or("");
        let state = cols.nth(1).unwrap_or("");
        let local_port = local
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        state == TCP_LISTEN && local_port == Some(port)
    })
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
        assert_eq!(listening_on(port), Some(true));
        // A connection to it is not a listener: only the LISTEN row counts.
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        drop(listener);
        assert_eq!(listening_on(port), Some(false));
        drop(client);
    }

    #[test]
    fn the_table_format_is_read_by_column() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
            0: 00000000:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n   \
            1: 0100007F:7532 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000     0        0 2\n";
        assert!(table_listens_on(table, 0x7531));
        assert!(
            !table_listens_on(table, 0x7532),
            "established, not listening"
        );
        assert!(!table_listens_on(table, 80));
        assert!(!table_listens_on("header only\n", 0x7531));
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
