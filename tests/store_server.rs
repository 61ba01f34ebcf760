//! The embedded TCPStore server over real sockets, driven with hand-built frames (independent of
//! the crate's own codec), including misbehaving clients and 1024 concurrent ones.
//!
//! `NVFIPC_TEST_STORE_THREADS=N` runs every test against a server with N event loops (the default
//! on a small machine is one); the tests at the end always use several.
//!
//! The server writes a WARN line for each client it closes for misbehaving. The tests that
//! misbehave on purpose name the lines they provoke ([`expect_warnings`]) and check that they
//! were written ([`assert_warned`]); those lines stay off the console, and every other line of
//! the library still reaches stderr, so a WARN printed while this suite runs is a real one.

use nvfuser_ipc::store::server::{ServerOptions, StoreServer};
use nvfuser_ipc::tools::logging;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::{Duration, Instant};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

// ----------------------------------------------------------------------------------------------
// Frame building, written out by hand from the protocol description.

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const COMPARE_SET: u8 = 2;
const GET: u8 = 3;
const ADD: u8 = 4;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const GETNUMKEYS: u8 = 7;
const DELETE_KEY: u8 = 8;
const APPEND: u8 = 9;
const MULTI_GET: u8 = 10;
const MULTI_SET: u8 = 11;
const CANCEL_WAIT: u8 = 12;
const PING: u8 = 13;
const QUEUE_PUSH: u8 = 14;
const QUEUE_POP: u8 = 15;
const QUEUE_LEN: u8 = 16;
const LIST: u8 = 17;
const MAGIC: [u8; 4] = [0xCE, 0xF7, 0x85, 0x3C];

#[derive(Default)]
struct Frame(Vec<u8>);

impl Frame {
    fn cmd(c: u8) -> Frame {
        Frame(vec![c])
    }
    fn u64(mut self, v: u64) -> Frame {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(self, v: i64) -> Frame {
        self.u64(v as u64)
    }
    fn raw(mut self, b: &[u8]) -> Frame {
        self.0.extend_from_slice(b);
        self
    }
    fn blob(self, b: &[u8]) -> Frame {
        self.u64(b.len() as u64).raw(b)
    }
    fn keys(self, keys: &[&[u8]]) -> Frame {
        keys.iter()
            .fold(self.u64(keys.len() as u64), |f, k| f.blob(k))
    }
}

fn blob_reply(b: &[u8]) -> Vec<u8> {
    Frame::default().blob(b).0
}

fn validate_frame() -> Vec<u8> {
    Frame::cmd(VALIDATE).raw(&MAGIC).0
}

// ----------------------------------------------------------------------------------------------
// A minimal blocking client.

struct Client {
    s: TcpStream,
}

impl Client {
    /// Connects without saying anything.
    fn raw(port: u16) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the store server");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        Client { s }
    }

    /// Connects and completes the handshake (VALIDATE, then PING like torch's client).
    fn connect(port: u16) -> Client {
        let mut c = Client::raw(port);
        c.send(&validate_frame());
        assert_eq!(c.ping(0xC0FFEE), 0xC0FFEE);
        c
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("send to the store server");
    }

    fn recv(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s
            .read_exact(&mut b)
            .expect("reply from the store server");
        b
    }

    fn recv_i64(&mut self) -> i64 {
        i64::from_le_bytes(self.recv(8).try_into().unwrap())
    }

    fn recv_blob(&mut self) -> Vec<u8> {
        let len = self.recv_i64() as usize;
        self.recv(len)
    }

    fn ping(&mut self, nonce: u32) -> u32 {
        self.send(&Frame::cmd(PING).raw(&nonce.to_le_bytes()).0);
        u32::from_le_bytes(self.recv(4).try_into().unwrap())
    }

    fn set(&mut self, k: &[u8], v: &[u8]) {
        self.send(&Frame::cmd(SET).blob(k).blob(v).0);
    }

    fn get(&mut self, k: &[u8]) -> Vec<u8> {
        self.send(&Frame::cmd(GET).blob(k).0);
        self.recv_blob()
    }

    fn add(&mut self, k: &[u8], d: i64) -> i64 {
        self.send(&Frame::cmd(ADD).blob(k).i64(d).0);
        self.recv_i64()
    }

    fn check(&mut self, keys: &[&[u8]]) -> u8 {
        self.send(&Frame::cmd(CHECK).keys(keys).0);
        self.recv(1)[0]
    }

    /// Asserts the server closes this connection (EOF or reset) within the I/O timeout, without
    /// sending anything first.
    fn expect_closed(&mut self) {
        let mut buf = [0u8; 256];
        let start = Instant::now();
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => panic!(
                    "expected the server to close the connection, got {e} after {:?}",
                    start.elapsed()
                ),
            }
        }
    }

    /// Asserts nothing arrives within `d`.
    fn expect_silence(&mut self, d: Duration) {
        self.s.set_read_timeout(Some(d)).unwrap();
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            other => panic!("expected no reply, got {other:?} {b:?}"),
        }
        self.s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    }
}

/// Server options for this run: the default, with `NVFIPC_TEST_STORE_THREADS` event loops when
/// that is set.
fn options() -> ServerOptions {
    let threads = match std::env::var("NVFIPC_TEST_STORE_THREADS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("NVFIPC_TEST_STORE_THREADS={v:?} is not a count")),
        Err(_) => 0,
    };
    ServerOptions {
        threads,
        ..ServerOptions::default()
    }
}

fn server() -> StoreServer {
    StoreServer::bind_with("127.0.0.1", 0, &options()).expect("bind the store server")
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

// ----------------------------------------------------------------------------------------------
// The warnings the tests provoke.

/// Parts of the log lines the tests provoke on purpose.
static EXPECTED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
/// The lines of the library's log that matched one of them.
static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps the log lines containing any of `parts` off the console, for the rest of the run (a
/// server with several event loops may write one per loop, later), and records them for
/// [`assert_warned`]. The library's other lines are written to stderr as it would write them.
fn expect_warnings(parts: &[&'static str]) {
    static CAPTURE: Once = Once::new();
    CAPTURE.call_once(|| {
        logging::set_callback(Some(Arc::new(|_, _, line: &str| {
            let expected = EXPECTED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|part| line.contains(part));
            if expected {
                WARNED
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(line.to_string());
            } else {
                let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
            }
        })));
    });
    EXPECTED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend_from_slice(parts);
}

/// Fails unless a WARN line containing `part` (named to [`expect_warnings`] first) is written
/// within the I/O timeout: a server closing a misbehaving client says why.
fn assert_warned(part: &str) {
    wait_until(&format!("a warning about {part:?}"), IO_TIMEOUT, || {
        WARNED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|line| line.contains(" NVFIPC WARN server: ") && line.contains(part))
    });
}

/// After a misbehaving client: the store still answers and still holds `/keep`.
fn assert_still_serving(port: u16) {
    let mut c = Client::connect(port);
    assert_eq!(c.get(b"/keep"), b"kept");
    c.set(b"/after", b"ok");
    assert_eq!(c.get(b"/after"), b"ok");
}

fn server_with_data() -> (StoreServer, Client) {
    let srv = server();
    let mut c = Client::connect(srv.port());
    c.set(b"/keep", b"kept");
    assert_eq!(c.get(b"/keep"), b"kept");
    (srv, c)
}

// ----------------------------------------------------------------------------------------------

#[test]
fn every_command_answers_like_torch() {
    let srv = server();
    let mut c = Client::connect(srv.port());

    c.set(b"/k", b"v1");
    assert_eq!(c.get(b"/k"), b"v1");
    assert_eq!(c.get(b"/missing"), b"");
    assert_eq!(c.add(b"/n", 3), 3);
    assert_eq!(c.add(b"/n", -1), 2);
    assert_eq!(c.get(b"/n"), b"2");
    assert_eq!(c.check(&[b"/k", b"/n"]), 0);
    assert_eq!(c.check(&[b"/k", b"/zz"]), 1);

    c.send(&Frame::cmd(WAIT).keys(&[b"/k"]).0);
    assert_eq!(c.recv(1), [0]);

    c.send(
        &Frame::cmd(COMPARE_SET)
            .blob(b"/k")
            .blob(b"v1")
            .blob(b"v2")
            .0,
    );
    assert_eq!(c.recv_blob(), b"v2");
    c.send(
        &Frame::cmd(COMPARE_SET)
            .blob(b"/k")
            .blob(b"bad")
            .blob(b"zzz")
            .0,
    );
    assert_eq!(c.recv_blob(), b"v2");
    c.send(&Frame::cmd(COMPARE_SET).blob(b"/m").blob(b"e").blob(b"v1").0);
    assert_eq!(c.recv_blob(), b"e");
    c.send(&Frame::cmd(COMPARE_SET).blob(b"/c").blob(b"").blob(b"new").0);
    assert_eq!(c.recv_blob(), b"new");

    c.send(&Frame::cmd(APPEND).blob(b"/k").blob(b"+").0);
    assert_eq!(c.get(b"/k"), b"v2+");

    c.send(
        &Frame::cmd(MULTI_SET)
            .u64(2)
            .blob(b"/a")
            .blob(b"1")
            .blob(b"/b")
            .blob(b"2")
            .0,
    );
    c.send(&Frame::cmd(MULTI_GET).keys(&[b"/a", b"/nope", b"/b"]).0);
    assert_eq!(c.recv_blob(), b"1");
    assert_eq!(c.recv_blob(), b"");
    assert_eq!(c.recv_blob(), b"2");

    c.send(&Frame::cmd(DELETE_KEY).blob(b"/a").0);
    assert_eq!(c.recv_i64(), 1);
    c.send(&Frame::cmd(DELETE_KEY).blob(b"/a").0);
    assert_eq!(c.recv_i64(), 0);

    // Keys now: /k /n /c /b.
    c.send(&Frame::cmd(GETNUMKEYS).0);
    assert_eq!(c.recv_i64(), 4);
    c.send(&Frame::cmd(LIST).0);
    let n = c.recv_i64();
    let mut keys: Vec<Vec<u8>> = (0..n).map(|_| c.recv_blob()).collect();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            b"/b".to_vec(),
            b"/c".to_vec(),
            b"/k".to_vec(),
            b"/n".to_vec()
        ]
    );

    c.send(&Frame::cmd(CANCEL_WAIT).0);
    assert_eq!(c.recv(1), [1]);

    c.send(&Frame::cmd(QUEUE_PUSH).blob(b"/q").blob(b"x").0);
    c.send(&Frame::cmd(QUEUE_PUSH).blob(b"/q").blob(b"y").0);
    c.send(&Frame::cmd(QUEUE_LEN).blob(b"/q").0);
    assert_eq!(c.recv_i64(), 2);
    c.send(&Frame::cmd(QUEUE_POP).blob(b"/q").0);
    assert_eq!((c.recv_i64(), c.recv_blob()), (2, b"x".to_vec()));
    c.send(&Frame::cmd(QUEUE_POP).blob(b"/q").0);
    assert_eq!((c.recv_i64(), c.recv_blob()), (1, b"y".to_vec()));
    c.send(&Frame::cmd(QUEUE_POP).blob(b"/q").0);
    assert_eq!(c.recv_i64(), 0);
    // Queues are not KV keys.
    c.send(&Frame::cmd(GETNUMKEYS).0);
    assert_eq!(c.recv_i64(), 4);

    // Binary keys and values survive untouched.
    c.set(b"/\x00\xff", b"\x00\x01\xfe");
    assert_eq!(c.get(b"/\x00\xff"), b"\x00\x01\xfe");
    assert!(srv.stats().requests > 30);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let srv = server();
    let mut c = Client::raw(srv.port());
    let mut burst = validate_frame();
    let mut expected = Vec::new();
    for i in 0..500u32 {
        let key = format!("/p{i}").into_bytes();
        let value = format!("value-{i}").into_bytes();
        burst.extend(Frame::cmd(SET).blob(&key).blob(&value).0);
        burst.extend(Frame::cmd(GET).blob(&key).0);
        expected.extend(blob_reply(&value));
        burst.extend(Frame::cmd(ADD).blob(b"/count").i64(1).0);
        expected.extend((i64::from(i) + 1).to_le_bytes());
        burst.extend(Frame::cmd(PING).raw(&i.to_le_bytes()).0);
        expected.extend(i.to_le_bytes());
    }
    c.send(&burst);
    assert_eq!(c.recv(expected.len()), expected);
    c.expect_silence(Duration::from_millis(50));
}

#[test]
fn requests_split_byte_by_byte_are_reassembled() {
    let srv = server();
    let mut c = Client::raw(srv.port());
    let mut bytes = validate_frame();
    bytes.extend(Frame::cmd(SET).blob(b"/split").blob(b"slowly").0);
    bytes.extend(Frame::cmd(GET).blob(b"/split").0);
    for (i, b) in bytes.iter().enumerate() {
        c.send(&[*b]);
        if i % 4 == 0 {
            thread::sleep(Duration::from_millis(2));
        }
    }
    assert_eq!(c.recv_blob(), b"slowly");
    // torch's `_splitSet`: key, a pause, then the value.
    let frame = Frame::cmd(SET).blob(b"/k2").blob(b"v2").0;
    c.send(&frame[..13]);
    thread::sleep(Duration::from_millis(200));
    c.send(&frame[13..]);
    assert_eq!(c.get(b"/k2"), b"v2");
}

#[test]
fn wait_is_woken_by_another_client_exactly_once() {
    let srv = server();
    let mut waiter = Client::connect(srv.port());
    let mut writer = Client::connect(srv.port());
    waiter.send(&Frame::cmd(WAIT).keys(&[b"/w1", b"/w2"]).0);
    waiter.expect_silence(Duration::from_millis(100));
    writer.set(b"/w1", b"a");
    waiter.expect_silence(Duration::from_millis(50));
    assert_eq!(writer.add(b"/w2", 5), 5);
    assert_eq!(waiter.recv(1), [0]);
    writer.set(b"/w2", b"again");
    // A SET has no reply: a round trip on the writer's connection shows it was applied before
    // the waiter's GET below (with several event loops it could otherwise overtake it).
    writer.ping(7);
    // STOP_WAITING at most once; CANCEL_WAIT afterwards still answers 0x01.
    waiter.send(&Frame::cmd(CANCEL_WAIT).0);
    assert_eq!(waiter.recv(1), [1]);
    assert_eq!(waiter.get(b"/w2"), b"again");
}

#[test]
fn cancel_wait_drops_the_registration() {
    let srv = server();
    let mut waiter = Client::connect(srv.port());
    let mut writer = Client::connect(srv.port());
    waiter.send(&Frame::cmd(WAIT).keys(&[b"/never"]).0);
    waiter.expect_silence(Duration::from_millis(50));
    waiter.send(&Frame::cmd(CANCEL_WAIT).0);
    assert_eq!(waiter.recv(1), [1]);
    writer.set(b"/never", b"now");
    // A SET has no reply: a round trip on the writer's connection shows it was applied (with
    // several loops the waiter's next request could otherwise overtake it).
    writer.ping(7);
    // No stray STOP_WAITING: the next reply is the GET's.
    assert_eq!(waiter.get(b"/never"), b"now");
}

#[test]
fn queue_push_wakes_one_waiting_client() {
    let srv = server();
    let mut w1 = Client::connect(srv.port());
    let mut w2 = Client::connect(srv.port());
    let mut pusher = Client::connect(srv.port());
    w1.send(&Frame::cmd(WAIT).keys(&[b"/jobs"]).0);
    w1.expect_silence(Duration::from_millis(30));
    w2.send(&Frame::cmd(WAIT).keys(&[b"/jobs"]).0);
    w2.expect_silence(Duration::from_millis(30));
    pusher.send(&Frame::cmd(QUEUE_PUSH).blob(b"/jobs").blob(b"j1").0);
    assert_eq!(w1.recv(1), [0]);
    w2.expect_silence(Duration::from_millis(50));
    w1.send(&Frame::cmd(QUEUE_POP).blob(b"/jobs").0);
    assert_eq!((w1.recv_i64(), w1.recv_blob()), (1, b"j1".to_vec()));
    pusher.send(&Frame::cmd(QUEUE_PUSH).blob(b"/jobs").blob(b"j2").0);
    assert_eq!(w2.recv(1), [0]);
}

#[test]
fn wrong_first_message_closes_only_that_connection() {
    let not_validate = "first message was not the TCPStore VALIDATE handshake";
    expect_warnings(&[not_validate]);
    let (srv, mut good) = server_with_data();
    // PING before VALIDATE.
    let mut c = Client::raw(srv.port());
    c.send(&Frame::cmd(PING).raw(&[1, 2, 3, 4]).0);
    c.expect_closed();
    // VALIDATE with the wrong magic.
    let mut c = Client::raw(srv.port());
    c.send(&Frame::cmd(VALIDATE).raw(&[1, 2, 3, 4]).0);
    c.expect_closed();
    // A G1-era client (no VALIDATE; byte 1 was COMPARE_SET there).
    let mut c = Client::raw(srv.port());
    c.send(&Frame::cmd(1).blob(b"/k").blob(b"").blob(b"v").0);
    c.expect_closed();
    assert_eq!(good.get(b"/keep"), b"kept");
    assert_still_serving(srv.port());
    assert!(srv.stats().closed_handshake >= 3);
    assert_warned(not_validate);
}

#[test]
fn unknown_command_byte_closes_the_connection() {
    let unknown = "malformed TCPStore frame: unknown command byte";
    expect_warnings(&[unknown]);
    let (srv, mut good) = server_with_data();
    let mut c = Client::connect(srv.port());
    c.send(&[19]);
    c.expect_closed();
    let mut c = Client::connect(srv.port());
    c.send(&[0xff, 0, 0, 0]);
    c.expect_closed();
    assert_eq!(good.get(b"/keep"), b"kept");
    assert_still_serving(srv.port());
    let stats = srv.stats();
    assert_eq!(stats.closed_malformed, 2);
    assert!(stats.last_error.unwrap().contains("unknown command byte"));
    assert_warned(unknown);
}

#[test]
fn truncated_frames_followed_by_close_do_not_disturb_the_store() {
    let (srv, mut good) = server_with_data();
    let frames = [
        Frame::cmd(SET).blob(b"/keep").blob(b"overwritten").0,
        Frame::cmd(MULTI_SET).u64(2).blob(b"/keep").blob(b"x").0,
        Frame::cmd(ADD).blob(b"/keep").0,
    ];
    for frame in frames {
        for cut in [1, frame.len() / 2, frame.len() - 1] {
            let mut c = Client::connect(srv.port());
            c.send(&frame[..cut]);
            c.s.shutdown(Shutdown::Write).unwrap();
            c.expect_closed();
        }
    }
    assert_eq!(good.get(b"/keep"), b"kept");
    assert_still_serving(srv.port());
}

#[test]
fn over_limit_key_value_and_count_close_the_connection() {
    let long_key = "malformed TCPStore frame: GET key is 8193 bytes";
    expect_warnings(&[
        long_key,
        "malformed TCPStore frame: SET value is 9437184 bytes",
        "malformed TCPStore frame: MULTI_GET key count is 131073",
    ]);
    let (srv, mut good) = server_with_data();
    // A key of exactly 8 KiB is fine.
    let key = vec![b'k'; 8192];
    good.set(&key, b"big-key");
    assert_eq!(good.get(&key), b"big-key");
    // 8 KiB + 1 is not: closed as soon as the length arrives.
    let mut c = Client::connect(srv.port());
    c.send(&Frame::cmd(GET).u64(8193).0);
    c.expect_closed();
    // A value over 8 MiB: closed before the payload is accepted.
    let mut c = Client::connect(srv.port());
    c.send(&Frame::cmd(SET).blob(b"/keep").u64(9 << 20).0);
    let _ = c.s.write_all(&vec![7u8; 1 << 20]);
    c.expect_closed();
    // Too many keys.
    let mut c = Client::connect(srv.port());
    c.send(&Frame::cmd(MULTI_GET).u64(131_073).0);
    c.expect_closed();
    assert_eq!(good.get(b"/keep"), b"kept");
    assert_still_serving(srv.port());
    assert!(srv.stats().closed_malformed >= 3);
    // The first on a new server is never held back by the server's one line a second.
    assert_warned(long_key);
}

#[test]
fn values_up_to_8_mib_round_trip() {
    let srv = server();
    let mut c = Client::connect(srv.port());
    let value: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
    c.set(b"/big", &value);
    assert_eq!(c.get(b"/big"), value);
}

#[test]
fn add_on_a_non_number_closes_the_connection_and_keeps_the_value() {
    let not_a_number = "ADD or BARRIER on key \"/text\" whose value is not a decimal i64";
    expect_warnings(&[not_a_number]);
    let (srv, mut good) = server_with_data();
    let mut c = Client::connect(srv.port());
    c.set(b"/text", b"not a number");
    c.send(&Frame::cmd(ADD).blob(b"/text").i64(1).0);
    c.expect_closed();
    assert_eq!(good.get(b"/text"), b"not a number");
    good.set(b"/num", b"  -7 apples");
    assert_eq!(good.add(b"/num", 10), 3);
    assert_still_serving(srv.port());
    assert_warned(not_a_number);
}

#[test]
fn client_disconnecting_mid_wait_is_forgotten() {
    let (srv, mut good) = server_with_data();
    let mut w = Client::connect(srv.port());
    w.send(&Frame::cmd(WAIT).keys(&[b"/late"]).0);
    w.expect_silence(Duration::from_millis(30));
    drop(w);
    wait_until("the waiter to be gone", IO_TIMEOUT, || {
        srv.connected_clients() == 1
    });
    let mut w2 = Client::connect(srv.port());
    w2.send(&Frame::cmd(WAIT).keys(&[b"/late"]).0);
    w2.expect_silence(Duration::from_millis(30));
    good.set(b"/late", b"here");
    assert_eq!(w2.recv(1), [0]);
    assert_eq!(good.get(b"/keep"), b"kept");
    assert_still_serving(srv.port());
}

#[test]
fn silent_client_does_not_block_others() {
    let (srv, mut good) = server_with_data();
    let silent = Client::raw(srv.port());
    let half = {
        let mut c = Client::raw(srv.port());
        c.send(&[VALIDATE, 0xCE]);
        c
    };
    for i in 0..50 {
        assert_eq!(good.add(b"/ticks", 1), i + 1);
    }
    assert_still_serving(srv.port());
    wait_until("all four clients", IO_TIMEOUT, || {
        srv.connected_clients() >= 3
    });
    drop((silent, half));
}

#[test]
fn handshake_timeout_closes_silent_clients_when_configured() {
    let silence = "a client sent no complete handshake in time";
    expect_warnings(&[silence]);
    let opts = ServerOptions {
        handshake_timeout: Some(Duration::from_millis(200)),
        ..options()
    };
    let srv = StoreServer::bind_with("127.0.0.1", 0, &opts).unwrap();
    let mut silent = Client::raw(srv.port());
    let mut good = Client::connect(srv.port());
    let start = Instant::now();
    silent.expect_closed();
    assert!(start.elapsed() < Duration::from_secs(5));
    thread::sleep(Duration::from_millis(300));
    assert_eq!(good.ping(7), 7);
    assert_eq!(srv.stats().closed_handshake, 1);
    assert_warned(silence);
}

#[test]
fn slow_reader_gets_backpressure_and_others_are_served() {
    let srv = server();
    let mut slow = Client::connect(srv.port());
    let value = vec![0x5a; 1 << 20];
    slow.set(b"/mb", &value);
    // 48 MiB of replies requested without reading any of them.
    let gets: Vec<u8> = (0..48)
        .flat_map(|_| Frame::cmd(GET).blob(b"/mb").0)
        .collect();
    slow.send(&gets);
    let mut other = Client::connect(srv.port());
    for i in 0..20 {
        assert_eq!(other.add(b"/n", 1), i + 1);
    }
    for _ in 0..48 {
        assert_eq!(slow.recv_blob(), value);
    }
    assert_eq!(slow.ping(1), 1);
}

#[test]
fn dual_stack_default_accepts_ipv4_and_ipv6() {
    let srv = StoreServer::bind_with("", 0, &options()).unwrap();
    let addr = srv.local_addr().unwrap();
    assert!(addr.ip().is_unspecified());
    assert_ne!(srv.port(), 0);
    let mut v4 = Client::connect(srv.port());
    v4.set(b"/family", b"both");
    if addr.is_ipv6() {
        let mut s = TcpStream::connect(("::1", srv.port())).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(&validate_frame()).unwrap();
        s.write_all(&Frame::cmd(GET).blob(b"/family").0).unwrap();
        let mut reply = vec![0u8; 12];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(reply, blob_reply(b"both"));
    }
}

#[test]
fn shutdown_is_idempotent_and_closes_clients() {
    let srv = server();
    let mut c = Client::connect(srv.port());
    srv.shutdown();
    srv.shutdown();
    assert!(!srv.is_running());
    assert!(srv.local_addr().is_err());
    c.expect_closed();
    assert_eq!(srv.connected_clients(), 0);
    drop(srv);
}

#[test]
fn shutdown_when_idle_returns_once_clients_leave() {
    let srv = server();
    let c = Client::connect(srv.port());
    wait_until("the client", IO_TIMEOUT, || srv.connected_clients() == 1);
    let leaver = thread::spawn(move || {
        thread::sleep(Duration::from_millis(150));
        drop(c);
    });
    let start = Instant::now();
    srv.shutdown_when_idle(Duration::from_secs(10)).unwrap();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(100),
        "returned before the client left"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(!srv.is_running());
    leaver.join().unwrap();
}

#[test]
fn shutdown_when_idle_times_out_when_a_client_stays() {
    let srv = server();
    let mut stayer = Client::connect(srv.port());
    wait_until("the client", IO_TIMEOUT, || srv.connected_clients() == 1);
    let start = Instant::now();
    let err = nvfuser_ipc::Error::from(
        srv.shutdown_when_idle(Duration::from_millis(300))
            .unwrap_err(),
    );
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(5));
    assert_eq!(err.status, nvfuser_ipc::Status::Timeout);
    assert!(err.message.contains("1 client"), "{}", err.message);
    assert!(!srv.is_running());
    stayer.expect_closed();
}

/// 1024 clients at once, driven by a few threads, each socket doing set/get/add rounds.
#[test]
fn thousand_clients_set_get_add_concurrently() {
    const CLIENTS: usize = 1024;
    const THREADS: usize = 8;
    const ROUNDS: usize = 10;
    let srv = server();
    let port = srv.port();
    let start = Instant::now();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let barrier = barrier.clone();
            thread::spawn(move || {
                let ids: Vec<usize> = (t..CLIENTS).step_by(THREADS).collect();
                let mut clients: Vec<Client> = ids.iter().map(|_| Client::connect(port)).collect();
                barrier.wait();
                barrier.wait();
                for round in 0..ROUNDS {
                    // Every socket sends, then every socket reads: all are in flight at once.
                    for (c, id) in clients.iter_mut().zip(&ids) {
                        let key = format!("/c{id}/r{round}").into_bytes();
                        let value = format!("value of client {id} round {round}").into_bytes();
                        let mut req = Frame::cmd(SET).blob(&key).blob(&value).0;
                        req.extend(Frame::cmd(GET).blob(&key).0);
                        req.extend(Frame::cmd(ADD).blob(b"/total").i64(1).0);
                        c.send(&req);
                    }
                    for (c, id) in clients.iter_mut().zip(&ids) {
                        let value = format!("value of client {id} round {round}").into_bytes();
                        assert_eq!(c.recv_blob(), value);
                        let total = c.recv_i64();
                        assert!(total >= 1 && total <= (CLIENTS * ROUNDS) as i64);
                    }
                }
                // Read back a neighbour's values written by another thread.
                for (c, id) in clients.iter_mut().zip(&ids).take(8) {
                    let other = (id + 1) % CLIENTS;
                    let key = format!("/c{other}/r{}", ROUNDS - 1).into_bytes();
                    c.send(&Frame::cmd(WAIT).keys(&[&key]).0);
                    assert_eq!(c.recv(1), [0]);
                    let expect = format!("value of client {other} round {}", ROUNDS - 1);
                    assert_eq!(c.get(&key), expect.into_bytes());
                }
                clients
            })
        })
        .collect();
    barrier.wait();
    wait_until("1024 connected clients", Duration::from_secs(20), || {
        srv.connected_clients() == CLIENTS
    });
    barrier.wait();
    let clients: Vec<Vec<Client>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let mut check = Client::connect(port);
    assert_eq!(check.add(b"/total", 0), (CLIENTS * ROUNDS) as i64);
    check.send(&Frame::cmd(GETNUMKEYS).0);
    assert_eq!(check.recv_i64(), (CLIENTS * ROUNDS + 1) as i64);
    drop(clients);
    drop(check);
    srv.shutdown_when_idle(Duration::from_secs(10)).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "1024-client load took {:?}",
        start.elapsed()
    );
}

/// With several event loops a WAIT is often completed by a writer on another loop while its
/// own client cancels it: the STOP_WAITING byte must come before the CANCEL_WAIT reply (`00 01`)
/// or not at all (`01`), and never after, or the client's stream would be out of step.
#[test]
fn cross_loop_wakeups_and_cancels_keep_every_stream_in_step() {
    use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
    use nvfuser_ipc::store::Store;
    const ROUNDS: usize = 3000;
    let opts = ServerOptions {
        threads: 4,
        ..ServerOptions::default()
    };
    let srv = StoreServer::bind_with("127.0.0.1", 0, &opts).unwrap();
    assert_eq!(srv.threads(), 4);
    let port = srv.port();
    let connect = ConnectOptions::with_timeout(IO_TIMEOUT);
    // Connections are dealt to the loops in turn: waiter and setter sit on different loops.
    let waiter = TcpStore::connect("127.0.0.1", port, &connect).unwrap();
    let setter = TcpStore::connect("127.0.0.1", port, &connect).unwrap();
    let go = std::sync::Arc::new(std::sync::Barrier::new(2));
    let setter_thread = {
        let go = go.clone();
        thread::spawn(move || {
            for i in 0..ROUNDS {
                go.wait();
                setter.set(&format!("race/{i}"), b"x").unwrap();
            }
        })
    };
    let (mut woken, mut cancelled) = (0, 0);
    for i in 0..ROUNDS {
        go.wait();
        // A zero timeout sends WAIT and, unless the reply is already there, CANCEL_WAIT.
        match Store::wait(&waiter, &[&format!("race/{i}")], Duration::ZERO) {
            Ok(()) => woken += 1,
            Err(e) => {
                assert_eq!(e.status, nvfuser_ipc::Status::Timeout, "{e}");
                cancelled += 1;
            }
        }
        if i % 64 == 0 {
            waiter.ping().unwrap();
        }
    }
    setter_thread.join().unwrap();
    waiter.ping().unwrap();
    assert_eq!(waiter.get("race/0", IO_TIMEOUT).unwrap(), b"x");
    assert_eq!(woken + cancelled, ROUNDS);
    eprintln!("{woken} waits woken, {cancelled} cancelled");
    srv.shutdown();
}

/// Barriers of 24 ranks over a server with three loops: every wake-up crosses loops.
#[test]
fn barriers_over_several_loops() {
    use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
    use nvfuser_ipc::tools::barrier::{barrier, BarrierState};
    const RANKS: usize = 24;
    const ROUNDS: u64 = 60;
    let opts = ServerOptions {
        threads: 3,
        ..ServerOptions::default()
    };
    let srv = StoreServer::bind_with("127.0.0.1", 0, &opts).unwrap();
    let port = srv.port();
    let ranks: Vec<_> = (0..RANKS)
        .map(|rank| {
            thread::spawn(move || {
                let store =
                    TcpStore::connect("127.0.0.1", port, &ConnectOptions::with_timeout(IO_TIMEOUT))
                        .unwrap();
                let state = BarrierState::new();
                for round in 0..ROUNDS {
                    assert_eq!(
                        barrier(&store, &state, rank, RANKS, None, IO_TIMEOUT).unwrap(),
                        round
                    );
                }
            })
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
    wait_until("the ranks to disconnect", IO_TIMEOUT, || {
        srv.connected_clients() == 0
    });
    srv.shutdown();
}

/// Large replies (GET, MULTI_GET, LIST, a COMPARE_SET returning the stored value) are streamed
/// from a snapshot: byte-exact and in order with the connection's other replies; a write after
/// the request does not change what is streamed; a WAIT completed while a reply streams is
/// answered after it.
#[test]
fn streamed_replies_are_exact_and_in_order() {
    let srv = server();
    let mut w = Client::connect(srv.port());
    w.set(b"/keep", b"kept");
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i % 253) as u8).collect();
    w.set(b"/big", &big);
    let suffix = vec![b'f'; 4000];
    let mut expected: Vec<Vec<u8>> = vec![b"/big".to_vec(), b"/keep".to_vec()];
    for i in 0..300 {
        // Long keys so that LIST's reply passes the streaming threshold.
        let mut key = format!("/k{i:04}").into_bytes();
        key.extend_from_slice(&suffix);
        w.set(&key, b"v");
        expected.push(key);
    }
    expected.sort();

    let mut c = Client::connect(srv.port());
    let mut pipelined = Frame::cmd(GET).blob(b"/big").0;
    pipelined.extend(Frame::cmd(MULTI_GET).keys(&[b"/big", b"/none", b"/big"]).0);
    pipelined.extend(
        Frame::cmd(COMPARE_SET)
            .blob(b"/big")
            .blob(b"x")
            .blob(b"y")
            .0,
    );
    pipelined.extend(Frame::cmd(LIST).0);
    pipelined.extend(Frame::cmd(PING).raw(&7u32.to_le_bytes()).0);
    c.send(&pipelined);
    assert!(c.recv_blob() == big, "GET");
    assert!(c.recv_blob() == big, "MULTI_GET 1");
    assert!(c.recv_blob().is_empty(), "MULTI_GET 2");
    assert!(c.recv_blob() == big, "MULTI_GET 3");
    assert!(c.recv_blob() == big, "COMPARE_SET returns the stored value");
    let n = c.recv_i64();
    let mut listed: Vec<Vec<u8>> = (0..n).map(|_| c.recv_blob()).collect();
    listed.sort();
    assert!(listed == expected, "LIST: {} keys", listed.len());
    assert_eq!(u32::from_le_bytes(c.recv(4).try_into().unwrap()), 7);

    // A pending WAIT, then a streamed GET the client does not read yet.
    let before = srv.stats().requests;
    c.send(&Frame::cmd(WAIT).keys(&[b"/later"]).0);
    c.send(&Frame::cmd(GET).blob(b"/big").0);
    wait_until("WAIT and GET applied", IO_TIMEOUT, || {
        srv.stats().requests >= before + 2
    });
    // The value changes and the WAIT completes while the reply is still going out.
    w.set(b"/big", b"small now");
    w.set(b"/later", b"1");
    assert_eq!(w.get(b"/big"), b"small now");
    assert!(
        c.recv_blob() == big,
        "the GET streams the value it was applied to"
    );
    assert_eq!(c.recv(1), vec![0u8], "then the WAIT's reply");
    assert_eq!(c.get(b"/big"), b"small now");
    assert_still_serving(srv.port());
}
