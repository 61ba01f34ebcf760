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
