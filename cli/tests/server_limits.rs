//! The store server under hostile requests and tight process limits, run as `nvfipc serve` in a
//! child process (so a server that aborts fails the test instead of taking the test down):
//! replies many times larger than their request under an address-space limit, and a low
//! open-file limit with more clients than it allows.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const IO_TIMEOUT: Duration = Duration::from_secs(20);
const MAGIC: [u8; 4] = [0xCE, 0xF7, 0x85, 0x3C];
const SET: u8 = 1;
const GET: u8 = 3;
const MULTI_GET: u8 = 10;
const PING: u8 = 13;

/// `nvfipc serve` on an ephemeral port after the shell `limits` (e.g. `ulimit -v 1000000`), with
/// its stderr lines forwarded to a channel.
struct Server {
    child: Child,
    port: u16,
    stderr: mpsc::Receiver<String>,
}

impl Server {
    fn start(limits: &str) -> Server {
        Server::start_with(limits, "")
    }

    /// [`Server::start`] with more `nvfipc serve` options.
    fn start_with(limits: &str, options: &str) -> Server {
        let exe = env!("CARGO_BIN_EXE_nvfipc");
        let script =
            format!("{limits}; exec \"$0\" serve --host 127.0.0.1 --port 0 --threads 1 {options}");
        let mut child = Command::new("sh")
            .args(["-c", &script, exe])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nvfipc serve");
        let stdout = child.stdout.take().unwrap();
        let (line_tx, line_rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = line_tx.send(line);
            }
        });
        let stderr = forward(child.stderr.take().unwrap());
        let first = match line_rx.recv_timeout(IO_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let said: Vec<String> = stderr.try_iter().collect();
                panic!("nvfipc serve under `{limits}` did not start; stderr: {said:?}");
            }
        };
        let port = first
            .rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        Server {
            child,
            port,
            stderr,
        }
    }

    /// Whether the server process is still running.
    fn alive(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("wait for nvfipc serve")
            .is_none()
    }

    /// A line of /proc/<pid>/status or /proc/<pid>/limits starting with `prefix`.
    fn proc_line(&self, file: &str, prefix: &str) -> String {
        let text = std::fs::read_to_string(format!("/proc/{}/{file}", self.child.id()))
            .expect("read the server's /proc entry");
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in /proc/pid/{file}"))
            .to_string()
    }

    /// Resident memory of the server, in KiB.
    fn rss_kib(&self) -> u64 {
        let line = self.proc_line("status", "VmRSS:");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn forward(stderr: ChildStderr) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

fn blob(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

struct Client(TcpStream);

impl Client {
    fn connect(port: u16) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to nvfipc serve");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut c = Client(s);
        let mut hello = vec![0u8];
        hello.extend_from_slice(&MAGIC);
        c.0.write_all(&hello).unwrap();
        assert_eq!(c.ping(7).expect("ping after the handshake"), 7);
        c
    }

    fn ping(&mut self, nonce: u32) -> std::io::Result<u32> {
        let mut frame = vec![PING];
        frame.extend_from_slice(&nonce.to_le_bytes());
        self.0.write_all(&frame)?;
        let mut b = [0u8; 4];
        self.0.read_exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn set(&mut self, k: &[u8], v: &[u8]) {
        let mut frame = vec![SET];
        blob(&mut frame, k);
        blob(&mut frame, v);
        self.0.write_all(&frame).unwrap();
    }

    fn get(&mut self, k: &[u8]) -> Vec<u8> {
        let mut frame = vec![GET];
        blob(&mut frame, k);
        self.0.write_all(&frame).unwrap();
        self.read_blob()
    }

    fn read_blob(&mut self) -> Vec<u8> {
        let mut len = [0u8; 8];
        self.0.read_exact(&mut len).expect("blob length");
        let mut v = vec![0u8; u64::from_le_bytes(len) as usize];
        self.0.read_exact(&mut v).expect("blob bytes");
        v
    }
}

fn big_value() -> Vec<u8> {
    (0..4u32 << 20).map(|i| (i % 251) as u8).collect()
}

/// One MULTI_GET naming a 4 MiB key 131072 times asks for 512 GiB. Under a 3 GiB address-space
/// limit the server must stream it (or refuse it), never build it: it stays up, serves other
/// clients meanwhile, and its memory stays small while the reply goes out.
#[test]
fn amplified_multi_get_is_streamed_within_bounded_memory() {
    let mut server = Server::start("ulimit -v 3145728");
    let value = big_value();
    let mut writer = Client::connect(server.port);
    writer.set(b"/big", &value);
    assert_eq!(writer.get(b"/big").len(), value.len());

    let mut frame = vec![MULTI_GET];
    let count = 131_072u64;
    frame.extend_from_slice(&count.to_le_bytes());
    for _ in 0..count {
        blob(&mut frame, b"/big");
    }
    let mut greedy = Client::connect(server.port);
    greedy.0.write_all(&frame).unwrap();
    // Read the first 16 values of the reply: each is the whole value.
    for i in 0..16 {
        let got = greedy.read_blob();
        assert!(got == value, "value {i} of the streamed reply differs");
    }
    assert!(server.alive(), "the server died serving the reply");
    // Others are served while the reply is half sent, and writes are not blocked by it.
    let mut other = Client::connect(server.port);
    other.set(b"/big", b"replaced");
    assert_eq!(other.get(b"/big"), b"replaced");
    assert_eq!(other.ping(42).unwrap(), 42);
    // The rest of the reply still shows the value as it was when MULTI_GET was applied.
    assert!(greedy.read_blob() == value);
    let rss = server.rss_kib();
    assert!(
        rss < 512 * 1024,
        "the server holds {rss} KiB while streaming a 512 GiB reply"
    );

    // A second client asks the same and never reads: its connection holds little.
    let mut stalled = Client::connect(server.port);
    stalled.0.write_all(&frame).unwrap();
    drop(greedy);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(other.ping(43).unwrap(), 43);
    let rss = server.rss_kib();
    assert!(
        rss < 512 * 1024,
        "the server holds {rss} KiB with a client that does not read"
    );
    drop(stalled);
    assert_eq!(other.ping(44).unwrap(), 44);
    assert!(server.alive());
}

/// Raises this test process's own soft open-file limit so it can hold `n` sockets.
fn allow_open_files(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_cur < n && lim.rlim_max >= n {
        lim.rlim_cur = n;
        // SAFETY: setrlimit reads the struct we pass.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    }
}

/// Waits for the server's answer on a fresh connection: `Some(nonce)` when served, `None` when
/// the server closed it.
fn try_ping(port: u16) -> Option<u32> {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut c = Client(s);
    let mut hello = vec![0u8];
    hello.extend_from_slice(&MAGIC);
    if c.0.write_all(&hello).is_err() {
        return None;
    }
    match c.ping(9) {
        Ok(n) => Some(n),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
            ) =>
        {
            None
        }
        Err(e) => panic!("unexpected error from the server: {e}"),
    }
}

/// With soft = hard = 1024 open files (common in containers) the server starts and serves; the
/// clients beyond what the limit allows are refused with a line on stderr, and served again
/// once others leave.
#[test]
fn serves_under_ulimit_n_1024_and_refuses_clients_beyond_it() {
    allow_open_files(4096);
    let server = Server::start("ulimit -n 1024");
    let limits = server.proc_line("limits", "Max open files");
    assert!(limits.contains(" 1024 "), "{limits}");
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..1100 {
        match try_ping(server.port) {
            Some(9) => {}
            Some(other) => panic!("ping answered {other}"),
            None => refused += 1,
        }
        // Keep every connection open (served or not) to press on the limit.
        held.push(TcpStream::connect(("127.0.0.1", server.port)).expect("connect"));
    }
    assert!(
        refused > 0,
        "1100 clients fit under a 1024 open-file limit?"
    );
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut said = Vec::new();
    while Instant::now() < deadline {
        match server.stderr.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => said.push(line),
            Err(_) if !said.is_empty() => break,
            Err(_) => {}
        }
    }
    assert!(
        said.iter()
            .any(|l| l.contains("refused a client") && l.contains("open-file limit")),
        "no line about refused clients on stderr: {said:?}"
    );
    drop(held);
    // Once the others left, a client is served again.
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        if try_ping(server.port) == Some(9) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not served again after clients left"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// With a low soft limit under a high hard one, the server raises the soft limit to what its
/// connection limit needs, not to the hard limit.
#[test]
fn raises_the_soft_limit_only_as_far_as_it_needs() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_max <= 1024 + 64 {
        eprintln!(
            "hard open-file limit {} is too low for this check",
            lim.rlim_max
        );
        return;
    }
    let server = Server::start("ulimit -Sn 256");
    let limits = server.proc_line("limits", "Max open files");
    let soft: u64 = limits.split_whitespace().nth(3).unwrap().parse().unwrap();
    let wanted = (16384 + 64).min(lim.rlim_max);
    assert_eq!(soft, wanted, "{limits}");
    assert_eq!(try_ping(server.port), Some(9));
}

/// LIST (one byte asking for every key) and COMPARE_SET returning a large stored value (grown
/// by APPEND) from many connections that do not read: each would hold a copy before streaming.
#[test]
fn list_and_compare_set_replies_are_streamed_too() {
    let mut server = Server::start("ulimit -v 3145728");
    let mut writer = Client::connect(server.port);
    let mut batch = Vec::new();
    for i in 0..12_000u32 {
        let mut key = format!("/key{i:06}/").into_bytes();
        key.resize(8000, b'k');
        batch.push(SET);
        blob(&mut batch, &key);
        blob(&mut batch, b"");
    }
    writer.0.write_all(&batch).unwrap();
    let chunk = vec![b'a'; 8 << 20];
    for _ in 0..8 {
        let mut frame = vec![9u8]; // APPEND
        blob(&mut frame, b"/grown");
        blob(&mut frame, &chunk);
        writer.0.write_all(&frame).unwrap();
    }
    assert_eq!(writer.get(b"/grown").len(), 64 << 20);
    let mut stalled = Vec::new();
    for i in 0..40 {
        let mut c = Client::connect(server.port);
        let frame = if i % 2 == 0 {
            vec![17u8] // LIST
        } else {
            let mut f = vec![2u8]; // COMPARE_SET with a wrong expected value
            blob(&mut f, b"/grown");
            blob(&mut f, b"x");
            blob(&mut f, b"y");
            f
        };
        c.0.write_all(&frame).unwrap();
        stalled.push(c);
    }
    thread::sleep(Duration::from_millis(500));
    assert!(server.alive(), "the server died");
    assert_eq!(writer.ping(5).unwrap(), 5);
    let rss = server.rss_kib();
    assert!(
        rss < 768 * 1024,
        "the server holds {rss} KiB for 40 unread replies"
    );
    // The replies are whole once read.
    let mut list = stalled.swap_remove(0);
    let mut n = [0u8; 8];
    list.0.read_exact(&mut n).unwrap();
    assert_eq!(i64::from_le_bytes(n), 12_001);
    let mut cas = stalled.swap_remove(0);
    assert_eq!(cas.read_blob().len(), 64 << 20);
}

/// A client that sends garbage is closed with a WARN line of the `server` subsystem on stderr
/// (by default, without NVFIPC_DEBUG), at most one a second however many do it, and the server
/// keeps serving.
#[test]
fn bad_frames_are_logged_at_warn_and_rate_limited() {
    let mut server = Server::start("true");
    for _ in 0..20 {
        let mut s = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(&[0xFF; 64]).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    assert!(server.alive(), "the server died on garbage");
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut warned: Vec<String> = Vec::new();
    while warned.is_empty() && Instant::now() < deadline {
        warned.extend(
            server
                .stderr
                .recv_timeout(Duration::from_millis(100))
                .into_iter()
                .filter(|l| l.contains("NVFIPC WARN server: store server:")),
        );
    }
    assert!(!warned.is_empty(), "no WARN line about the bad clients");
    assert!(warned[0].contains("connection closed"), "{warned:?}");
    thread::sleep(Duration::from_millis(200));
    warned.extend(
        server
            .stderr
            .try_iter()
            .filter(|l| l.contains("NVFIPC WARN")),
    );
    assert!(
        warned.len() <= 2,
        "20 bad clients within a second logged {} lines: {warned:?}",
        warned.len()
    );
}

/// Resident memory once it has stopped changing (the server applies what it was sent).
fn settled_rss_kib(server: &Server) -> u64 {
    let mut last = server.rss_kib();
    for _ in 0..40 {
        thread::sleep(Duration::from_millis(100));
        let now = server.rss_kib();
        if now.abs_diff(last) < 1024 {
            return now;
        }
        last = now;
    }
    last
}

/// A client that sent `frame` after its handshake and reads nothing.
fn non_reader(port: u16, frame: &[u8]) -> Client {
    let mut c = Client::connect(port);
    c.0.write_all(frame).unwrap();
    c
}

/// Stores `count` keys with empty values, 50,000 per MULTI_SET.
fn store_small_keys(c: &mut Client, prefix: &str, count: u32) {
    for start in (0..count).step_by(50_000) {
        let n = (count - start).min(50_000);
        let mut frame = vec![11u8]; // MULTI_SET
        frame.extend_from_slice(&u64::from(n).to_le_bytes());
        for i in start..start + n {
            blob(&mut frame, format!("{prefix}{i:08}").as_bytes());
            blob(&mut frame, b"");
        }
        c.0.write_all(&frame).unwrap();
    }
    assert_eq!(c.ping(1).unwrap(), 1);
}

/// Reads a LIST reply; returns how many keys it held.
fn read_list(c: &mut Client) -> i64 {
    let mut n = [0u8; 8];
    c.0.read_exact(&mut n).unwrap();
    let n = i64::from_le_bytes(n);
    for _ in 0..n {
        c.read_blob();
    }
    n
}

/// 250,000 small keys, then 100 connections that each send a one-byte LIST and never read, then
/// 100 more that each add a key before their LIST (so no two see the same keys): the server's
/// memory stays within the reply budget (`--reply-budget-mib 64`), not 100 times the key list,
/// others are served meanwhile, and the memory goes back once the clients have gone.
#[test]
fn unread_list_replies_stay_within_the_server_budget() {
    const KEYS: u32 = 250_000;
    const CLIENTS: usize = 100;
    let mut server = Server::start_with("true", "--reply-budget-mib 64");
    let mut writer = Client::connect(server.port);
    store_small_keys(&mut writer, "/small/", KEYS);
    let base = settled_rss_kib(&server);

    let mut stalled: Vec<Client> = (0..CLIENTS)
        .map(|_| non_reader(server.port, &[17u8]))
        .collect();
    assert_eq!(writer.ping(2).unwrap(), 2);
    let same_keys = settled_rss_kib(&server);

    for i in 0..CLIENTS {
        let mut frame = vec![SET];
        blob(&mut frame, format!("/fresh/{i}").as_bytes());
        blob(&mut frame, b"");
        frame.push(17); // LIST
        stalled.push(non_reader(server.port, &frame));
    }
    // Small requests are served while the budget is spent.
    assert_eq!(writer.ping(3).unwrap(), 3);
    writer.set(b"/during", b"v");
    assert_eq!(writer.get(b"/during"), b"v");
    let distinct_keys = settled_rss_kib(&server);
    eprintln!(
        "server RSS: {base} KiB with {KEYS} keys, {same_keys} KiB with {CLIENTS} unread LISTs, \
         {distinct_keys} KiB with {CLIENTS} more over distinct key sets"
    );
    assert!(server.alive(), "the server died");
    assert!(
        same_keys < base + 48 * 1024,
        "{CLIENTS} unread LISTs of the same keys took the server from {base} KiB to {same_keys}"
    );
    assert!(
        distinct_keys < base + 160 * 1024,
        "{CLIENTS} more unread LISTs over distinct key sets took the server from {base} KiB to \
         {distinct_keys} (budget 64 MiB)"
    );

    // A stalled client that starts reading gets its whole reply.
    let mut first = stalled.swap_remove(0);
    assert_eq!(read_list(&mut first), i64::from(KEYS));
    drop(first);
    drop(stalled);
    // Once they have gone, a waiting LIST is served and the memory is given back.
    let mut lister = Client::connect(server.port);
    lister.0.write_all(&[17u8]).unwrap();
    assert_eq!(read_list(&mut lister), i64::from(KEYS) + 1 + CLIENTS as i64);
    let after = settled_rss_kib(&server);
    eprintln!("server RSS: {after} KiB once the clients have gone");
    assert!(
        after < base + 32 * 1024,
        "the server holds {after} KiB after the clients left (it held {base} KiB before them)"
    );
}

const WAIT: u8 = 6;

/// A WAIT frame naming `count` keys of `len` bytes each, all starting with `prefix`.
fn wait_frame(prefix: &str, count: u32, len: usize) -> Vec<u8> {
    let mut frame = vec![WAIT];
    frame.extend_from_slice(&u64::from(count).to_le_bytes());
    for i in 0..count {
        let mut key = format!("{prefix}{i:08}/").into_bytes();
        key.resize(len, b'k');
        blob(&mut frame, &key);
    }
    frame
}

/// Reads until the server closes the connection (failing if it does not within the timeout).
fn expect_closed(c: &mut Client, what: &str) {
    let mut rest = Vec::new();
    match c.0.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("{what}: the server did not close the connection: {e}"),
    }
}

/// The first stderr line of the server containing `needle`, within the timeout.
fn stderr_line(server: &Server, needle: &str) -> String {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut said = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = server.stderr.recv_timeout(Duration::from_millis(100)) {
            if line.contains(needle) {
                return line;
            }
            said.push(line);
        }
    }
    panic!("no line with {needle:?} on the server's stderr: {said:?}");
}

/// WAITs on 131072 missing keys (a legal request) from many clients: a client whose WAITs would
/// hold more than `--pending-per-client-mib`, or one whose WAIT finds `--pending-budget-mib`
/// spent, is closed with a WARN line naming it and the limit, while the others keep being
/// served; a request whose length fields alone exceed the per-client limit is closed before it
/// is read; and the memory the waiters held is given back once they leave.
#[test]
fn wait_registrations_are_bounded_and_given_back_when_waiters_leave() {
    const KEYS: u32 = 131_072;
    const FITTING: usize = 6;
    let mut server = Server::start_with(
        "true",
        "--pending-budget-mib 192 --pending-per-client-mib 48",
    );
    let mut other = Client::connect(server.port);
    let base = settled_rss_kib(&server);

    // Two WAITs on 131072 keys of 100 bytes on one connection, each about 28 MiB of the pending
    // budget: the second is over the per-client limit.
    let mut greedy = non_reader(server.port, &wait_frame("/g1/", KEYS, 100));
    let _ = greedy.0.write_all(&wait_frame("/g2/", KEYS, 100)); // closed while it is sent
    expect_closed(&mut greedy, "two WAITs over the per-client limit");
    let line = stderr_line(&server, "per-client limit");
    assert!(
        line.contains("NVFIPC WARN server: store server: client 127.0.0.1:")
            && line.contains("a WAIT on 131072 missing keys")
            && line.contains(&format!("limit of {}", 48 << 20))
            && line.contains("connection closed"),
        "{line}"
    );
    // Clients with one such WAIT each, within the budget (one after the other, so that they
    // take turns with one input buffer of the server's pool).
    let mut waiters: Vec<Client> = (0..FITTING as u32)
        .map(|w| {
            let mut c = non_reader(server.port, &wait_frame(&format!("/w{w}/"), KEYS, 100));
            assert_eq!(c.ping(w).unwrap(), w, "waiter {w} was refused");
            c
        })
        .collect();
    let peak = settled_rss_kib(&server);

    // One more WAIT that would fit a client but not what is left of the budget.
    let mut late = non_reader(server.port, &wait_frame("/late/", KEYS, 100));
    expect_closed(&mut late, "a WAIT over the pending budget");
    // A WAIT of 131072 keys of 8 KiB (1 GiB), sent as it is made: refused once its length fields
    // pass the per-client limit, long before all of it was sent.
    let mut big = Client::connect(server.port);
    let mut sent = 0usize;
    let mut chunk = vec![WAIT];
    chunk.extend_from_slice(&u64::from(KEYS).to_le_bytes());
    for i in 0..KEYS {
        blob(&mut chunk, &[b'/', (i % 251) as u8].repeat(4096));
        if chunk.len() >= 1 << 20 || i + 1 == KEYS {
            if big.0.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
            chunk.clear();
        }
    }
    expect_closed(&mut big, "a 1 GiB WAIT");
    assert!(
        sent < 256 << 20,
        "the server read {sent} bytes of a 1 GiB WAIT"
    );
    // Everyone else is served all along.
    assert_eq!(other.ping(77).unwrap(), 77);
    other.set(b"/during", b"v");
    assert_eq!(other.get(b"/during"), b"v");
    for (i, w) in waiters.iter_mut().enumerate() {
        assert_eq!(w.ping(100 + i as u32).unwrap(), 100 + i as u32);
    }
    assert!(server.alive(), "the server died");

    drop(waiters);
    assert_eq!(other.ping(78).unwrap(), 78);
    let after = settled_rss_kib(&server);
    eprintln!(
        "server RSS: {base} KiB before, {peak} KiB with {FITTING} waiters, {after} KiB after"
    );
    assert!(
        peak > base + 64 * 1024,
        "{FITTING} WAITs on {KEYS} keys took the server only from {base} KiB to {peak} KiB"
    );
    assert!(
        after < base + (peak - base) / 4,
        "the server holds {after} KiB after the waiters left (it held {base} KiB before them \
         and {peak} KiB with them)"
    );
}
