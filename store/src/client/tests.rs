//! Tests of the TCP client against our server, scripted fake servers and captured bytes.

use super::*;
use crate::net::resolve;
use crate::server::StoreServer;
use std::net::TcpListener;
use std::thread::JoinHandle;

impl TcpStore {
    /// The address the connection actually reached (after name resolution).
    fn peer_addr(&self) -> Result<SocketAddr> {
        let conn = self.connection();
        conn.stream().peer_addr().map_err(|e| {
            Error::from_io(
                format!("store {}:{}: peer address", self.host, self.port),
                &e,
            )
        })
    }
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn handshake_bytes() -> Vec<u8> {
    let mut v = hex("00 CEF7853C 0D");
    v.extend_from_slice(&std::process::id().to_le_bytes());
    v
}

/// A fake server for one connection: for each step, reads exactly the expected request
/// bytes, checks them, and writes the canned reply. Returns the unread remainder on EOF.
fn scripted(steps: Vec<(Vec<u8>, Vec<u8>)>) -> (u16, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        for (i, (expect, reply)) in steps.into_iter().enumerate() {
            let mut got = vec![0u8; expect.len()];
            sock.read_exact(&mut got).unwrap();
            assert_eq!(got, expect, "request {i} differs");
            sock.write_all(&reply).unwrap();
        }
    });
    (port, handle)
}

fn opts(timeout_ms: u64) -> ConnectOptions {
    ConnectOptions::with_timeout(Duration::from_millis(timeout_ms))
}

fn echo() -> Vec<u8> {
    std::process::id().to_le_bytes().to_vec()
}

#[test]
fn requests_are_byte_identical_to_torch_client_capture() {
    // Bytes as captured from a torch 2.11 client (protocol reference, section 3).
    let steps = vec![
        (handshake_bytes(), echo()),
        (hex("01 0200000000000000 2f6b 0200000000000000 7631"), vec![]),
        (hex("06 0100000000000000 0200000000000000 2f6b"), hex("00")),
        (hex("03 0200000000000000 2f6b"), hex("0200000000000000 7631")),
        (hex("04 0200000000000000 2f6e 0300000000000000"), hex("0300000000000000")),
        (
            hex("05 0200000000000000 0200000000000000 2f6b 0300000000000000 2f7a7a"),
            hex("01"),
        ),
        (
            hex("02 0200000000000000 2f6b 0200000000000000 7631 0200000000000000 7632"),
            hex("0200000000000000 7632"),
        ),
        (hex("09 0200000000000000 2f6b 0100000000000000 2b"), vec![]),
        (
            hex("0b 0200000000000000 0200000000000000 2f61 0100000000000000 31 0200000000000000 2f62 0100000000000000 32"),
            vec![],
        ),
        (
            hex("06 0200000000000000 0200000000000000 2f61 0200000000000000 2f62"),
            hex("00"),
        ),
        (
            hex("0a 0200000000000000 0200000000000000 2f61 0200000000000000 2f62"),
            hex("0100000000000000 31 0100000000000000 32"),
        ),
        (hex("08 0200000000000000 2f61"), hex("0100000000000000")),
        (hex("07"), hex("0400000000000000")),
        (hex("0e 0200000000000000 2f71 0100000000000000 65"), vec![]),
        (hex("10 0200000000000000 2f71"), hex("0100000000000000")),
        (
            hex("0f 0200000000000000 2f71"),
            hex("0100000000000000 0100000000000000 65"),
        ),
        (hex("0f 0200000000000000 2f71"), hex("0000000000000000")),
        (
            hex("11"),
            hex("0300000000000000 0200000000000000 2f61 0500000000000000 696e69742f 0300000000000000 2f7a7a"),
        ),
    ];
    let (port, server) = scripted(steps);
    let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
    let t = Duration::from_secs(5);
    s.set("k", b"v1").unwrap();
    assert_eq!(s.get("k", t).unwrap(), b"v1");
    assert_eq!(s.add("n", 3).unwrap(), 3);
    assert!(!s.check(&["k", "zz"]).unwrap());
    assert_eq!(s.compare_set("k", b"v1", b"v2").unwrap(), b"v2");
    s.append("k", b"+").unwrap();
    s.multi_set(&[("a", b"1".as_slice()), ("b", b"2".as_slice())])
        .unwrap();
    assert_eq!(
        s.multi_get(&["a", "b"], t).unwrap(),
        vec![b"1".to_vec(), b"2".to_vec()]
    );
    assert!(s.delete_key("a").unwrap());
    assert_eq!(s.num_keys().unwrap(), 4);
    s.queue_push("q", b"e").unwrap();
    assert_eq!(s.queue_len("q").unwrap(), 1);
    assert_eq!(s.queue_pop("q", None).unwrap(), Some(b"e".to_vec()));
    assert_eq!(s.queue_pop("q", None).unwrap(), None);
    assert_eq!(s.list().unwrap(), vec!["a".to_owned(), "zz".to_owned()]);
    drop(s);
    server.join().unwrap();
}

#[test]
fn wait_timeout_cancels_and_accepts_late_stop_waiting() {
    for (cancel_reply, late) in [(hex("01"), false), (hex("00 01"), true)] {
        let steps = vec![
            (handshake_bytes(), echo()),
            (hex("06 0100000000000000 0300000000000000 2f7a7a"), vec![]),
            (hex("0c"), cancel_reply),
            (hex("0d").into_iter().chain(echo()).collect(), echo()),
        ];
        let (port, server) = scripted(steps);
        let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
        let start = Instant::now();
        let result = s.wait(&["zz"], Duration::from_millis(100));
        assert!(start.elapsed() >= Duration::from_millis(100));
        if late {
            // The key arrived just before the cancel: the wait succeeded.
            result.unwrap();
            s.ping().unwrap();
            server.join().unwrap();
            continue;
        }
        let err = result.unwrap_err();
        assert_eq!(err.status, Status::Timeout);
        assert!(
            err.message
                .starts_with("wait timeout after 100ms, keys: /zz"),
            "{}",
            err.message
        );
        assert!(
            err.message.contains(&format!("127.0.0.1:{port}")),
            "{}",
            err.message
        );
        // The stream is still in step: the next request works.
        s.ping().unwrap();
        server.join().unwrap();
    }
}

/// A call's own timeout bounds all of it, not the store timeout: the coordinator's barrier step
/// (DELETE_KEY, SET and WAIT in one message) whose DELETE_KEY is answered at once and whose WAIT
/// is answered after more than the store timeout, within the call's, succeeds and leaves the
/// connection in step.
#[test]
fn a_wait_within_the_calls_timeout_outlasts_the_store_timeout() {
    let mut request = Vec::new();
    wire::encode_delete_key(&mut request, &user_key("old")).unwrap();
    wire::encode_set(&mut request, &user_key("mine"), b"1").unwrap();
    wire::encode_wait(&mut request, user_keys(&["theirs"])).unwrap();
    let ping: Vec<u8> = hex("0d").into_iter().chain(echo()).collect();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        for (expect, reply) in [
            (handshake_bytes(), echo()),
            (request, hex("0100000000000000")),
        ] {
            let mut got = vec![0u8; expect.len()];
            sock.read_exact(&mut got).unwrap();
            assert_eq!(got, expect);
            sock.write_all(&reply).unwrap();
        }
        // The other ranks arrive after more than the store timeout.
        std::thread::sleep(MIN_REPLY_TIMEOUT * 5 / 2);
        sock.write_all(&[WAIT_STOP_WAITING]).unwrap();
        let mut got = vec![0u8; ping.len()];
        sock.read_exact(&mut got).unwrap();
        sock.write_all(&echo()).unwrap();
    });
    let s = TcpStore::connect(
        "127.0.0.1",
        port,
        &opts(MIN_REPLY_TIMEOUT.as_millis() as u64),
    )
    .unwrap();
    let call_timeout = Duration::from_secs(30);
    s.update_then_wait(&["old"], Some(("mine", b"1")), &["theirs"], call_timeout)
        .unwrap();
    s.ping().unwrap();
    server.join().unwrap();
}

#[test]
fn wait_for_workers_sends_add_init_without_prefix() {
    let steps = vec![
        (handshake_bytes(), echo()),
        (
            hex("04 0500000000000000 696e69742f 0100000000000000"),
            hex("0100000000000000"),
        ),
    ];
    let (port, server) = scripted(steps);
    let o = ConnectOptions {
        wait_for_workers: Some(2),
        ..opts(5000)
    };
    let _s = TcpStore::connect("127.0.0.1", port, &o).unwrap();
    server.join().unwrap();
    let err = TcpStore::connect(
        "127.0.0.1",
        port,
        &ConnectOptions {
            wait_for_workers: Some(0),
            ..opts(100)
        },
    )
    .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
}

#[test]
fn server_closing_breaks_the_connection_and_later_calls_fail_fast() {
    let (port, server) = scripted(vec![(handshake_bytes(), echo())]);
    let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
    server.join().unwrap(); // the fake server has closed the socket
    let err = s.add("n", 1).unwrap_err();
    assert_eq!(err.status, Status::Io, "{err}");
    assert!(
        err.message.contains(&format!("127.0.0.1:{port}")),
        "{}",
        err.message
    );
    assert!(err.message.contains("ADD"), "{}", err.message);
    let start = Instant::now();
    let err = s.num_keys().unwrap_err();
    assert_eq!(err.status, Status::InvalidState, "{err}");
    assert!(err.message.contains("reconnect"), "{}", err.message);
    // Far below the 5 s timeout (a loaded machine can stall a thread for tens of milliseconds).
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_server_that_stops_answering_does_not_hang_the_client() {
    // The fake server handshakes, then reads the ADD and never replies.
    let add = hex("04 0200000000000000 2f6e 0100000000000000");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; handshake_bytes().len()];
        sock.read_exact(&mut buf).unwrap();
        sock.write_all(&echo()).unwrap();
        let mut buf = vec![0u8; add.len()];
        sock.read_exact(&mut buf).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
    });
    let s = TcpStore::connect("127.0.0.1", port, &opts(200)).unwrap();
    let start = Instant::now();
    let err = s.add("n", 1).unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.status, Status::Io, "{err}");
    assert!(err.message.contains("no reply"), "{}", err.message);
    assert!(
        took >= MIN_REPLY_TIMEOUT && took < MIN_REPLY_TIMEOUT * 3,
        "{took:?}"
    );
    server.join().unwrap();
}

#[test]
fn limits_are_refused_before_sending_and_keep_the_connection() {
    let (port, server) = scripted(vec![
        (handshake_bytes(), echo()),
        (hex("07"), hex("0000000000000000")),
    ]);
    let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
    let long_key = "k".repeat(wire::MAX_KEY_LEN); // plus "/" is one byte over
    let err = s.set(&long_key, b"v").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    let big = vec![0u8; wire::MAX_VALUE_LEN + 1];
    assert_eq!(
        s.set("k", &big).unwrap_err().status,
        Status::InvalidArgument
    );
    assert_eq!(
        s.get(&long_key, Duration::from_secs(1)).unwrap_err().status,
        Status::InvalidArgument
    );
    assert_eq!(s.num_keys().unwrap(), 0);
    server.join().unwrap();
}

#[test]
fn connect_retries_until_the_server_appears_and_times_out_otherwise() {
    let (unlistened, port) = crate::net::unlistened_loopback_port().unwrap();
    let start = Instant::now();
    let err = TcpStore::connect("127.0.0.1", port, &opts(300)).unwrap_err();
    assert_eq!(err.status, Status::Timeout, "{err}");
    assert!(
        err.message.contains(&format!("(127.0.0.1, {port})")),
        "{}",
        err.message
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(start.elapsed() < Duration::from_secs(3));

    drop(unlistened);
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let server = StoreServer::bind("127.0.0.1", port).unwrap();
        std::thread::sleep(Duration::from_millis(1000));
        server.shutdown();
    });
    let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
    s.ping().unwrap();
    drop(s);
    late.join().unwrap();
}

#[test]
fn a_wrong_ping_echo_is_retried_on_a_new_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        for echo_ok in [false, true] {
            let (mut sock, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; handshake_bytes().len()];
            sock.read_exact(&mut buf).unwrap();
            let nonce = std::process::id().wrapping_add(u32::from(!echo_ok));
            sock.write_all(&nonce.to_le_bytes()).unwrap();
            if echo_ok {
                let mut b = [0u8; 1];
                sock.read_exact(&mut b).unwrap();
                sock.write_all(&0i64.to_le_bytes()).unwrap();
            }
        }
    });
    let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
    assert_eq!(s.num_keys().unwrap(), 0);
    server.join().unwrap();
}

#[test]
fn resolves_localhost_ipv6_mapped_first() {
    let addrs = resolve("127.0.0.1", 80).unwrap();
    assert_eq!(addrs.last().unwrap(), &"127.0.0.1:80".parse().unwrap());
    if addrs.len() == 2 {
        assert_eq!(addrs[0], "[::ffff:127.0.0.1]:80".parse().unwrap());
    }
    assert!(resolve("no-such-host.invalid", 80).is_err());
}

#[test]
fn backoff_starts_short_grows_and_is_capped() {
    let mut b = Backoff::new();
    let first = b.next_delay();
    assert!(
        first >= BACKOFF_INITIAL / 2 && first <= BACKOFF_INITIAL * 3 / 2,
        "{first:?}"
    );
    for _ in 0..50 {
        assert!(b.next_delay() <= BACKOFF_MAX * 3 / 2);
    }
}

#[test]
fn against_the_embedded_server() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let o = ConnectOptions {
        wait_for_workers: Some(1),
        ..opts(5000)
    };
    let s = std::sync::Arc::new(TcpStore::connect("127.0.0.1", server.port(), &o).unwrap());
    let t = Duration::from_secs(5);
    s.set("bin", b"\x00\xff").unwrap();
    assert_eq!(s.get("bin", t).unwrap(), b"\x00\xff");
    assert_eq!(s.add("n", 5).unwrap(), 5);
    assert_eq!(s.get("n", t).unwrap(), b"5");
    assert_eq!(s.compare_set("m", b"e", b"v").unwrap(), b"e");
    assert!(!s.check(&["m"]).unwrap());
    let mut keys = s.list().unwrap();
    keys.sort();
    assert_eq!(keys, vec!["bin".to_owned(), "n".to_owned()]);
    assert_eq!(s.num_keys().unwrap(), 3); // init/ counts
    let big = vec![7u8; wire::MAX_VALUE_LEN];
    s.set("big", &big).unwrap();
    assert_eq!(s.get("big", t).unwrap(), big);
    // A WAIT satisfied by another connection.
    let setter = {
        let port = server.port();
        std::thread::spawn(move || {
            let other = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            other.set("late", b"x").unwrap();
        })
    };
    s.wait(&["late"], t).unwrap();
    setter.join().unwrap();
    let err = s.wait(&["never"], Duration::from_millis(20)).unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    s.set_timeout(Duration::from_millis(20));
    assert_eq!(s.timeout(), Duration::from_millis(20));
    assert_eq!(
        s.queue_pop("q", Some(Duration::from_millis(20)))
            .unwrap_err()
            .status,
        Status::Timeout
    );
    s.queue_push("q", b"1").unwrap();
    assert_eq!(s.queue_pop("q", Some(t)).unwrap(), Some(b"1".to_vec()));
    assert!(s.peer_addr().unwrap().port() == server.port());
    // Threads share the one connection.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let s = std::sync::Arc::clone(&s);
            std::thread::spawn(move || {
                for _ in 0..50 {
                    s.add("c", 1).unwrap();
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(s.add("c", 0).unwrap(), 200);
    server.shutdown();
    let err = s.add("c", 0).unwrap_err();
    assert_eq!(err.status, Status::Io, "{err}");
    s.reconnect().unwrap_err();
}

/// The connection a background user gets: its own (the server counts two clients), usable
/// while the first is busy, with the first's timeouts.
#[test]
fn a_duplicate_is_another_client_that_is_not_a_new_worker() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let o = ConnectOptions {
        wait_for_workers: Some(1),
        ..opts(5000)
    };
    let first = TcpStore::connect("127.0.0.1", server.port(), &o).unwrap();
    let second = first.duplicate().expect("a TCP store opens another");
    let t = Duration::from_secs(5);
    let start = std::time::Instant::now();
    while server.connected_clients() < 2 {
        assert!(
            start.elapsed() < t,
            "{} clients",
            server.connected_clients()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(second.timeout(), first.timeout());
    // The first connection is blocked in a WAIT; the second still serves at once.
    std::thread::scope(|s| {
        let waiter = s.spawn(|| first.get("later", t));
        std::thread::sleep(Duration::from_millis(50));
        second.set("now", b"1").unwrap();
        assert_eq!(second.get("now", t).unwrap(), b"1");
        second.set("later", b"2").unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), b"2");
    });
    drop(second);
    server.shutdown();
}

/// A server that answers the handshake with `reply` and closes.
fn answering(reply: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        while let Ok((mut sock, _)) = listener.accept() {
            let mut request = [0u8; 64];
            let _ = sock.read(&mut request);
            let _ = sock.write_all(reply);
        }
    });
    port
}

#[test]
fn another_kind_of_server_is_named_at_once() {
    let cases: [(&[u8], &str); 4] = [
        (
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            "an HTTP server answered (\"HTTP/1.1 400 Bad Request\")",
        ),
        (b"\x15\x03\x01\x00\x02\x02\x32", "a TLS server answered"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "an SSH server answered"),
        (b"\x01\x02\x03\x04\x05", "answered bytes 01 02 03 04 05"),
    ];
    for (reply, expected) in cases {
        let port = answering(reply);
        let start = Instant::now();
        let err = TcpStore::connect("127.0.0.1", port, &opts(30_000)).unwrap_err();
        assert_eq!(err.status, Status::Protocol, "{err}");
        assert!(
            err.message.contains("is not a PyTorch TCPStore server"),
            "{err}"
        );
        assert!(err.message.contains(expected), "{err}");
        assert!(err.message.contains("MASTER_ADDR"), "{err}");
        // Named at once, not after the 30 s connect timeout.
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }
}
