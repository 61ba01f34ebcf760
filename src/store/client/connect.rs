//! Connection set-up: name resolution (`getaddrinfo`, v4-mapped IPv6 then IPv4), one
//! non-blocking connect per address retried with jittered exponential backoff until the connect
//! timeout, then torch's `VALIDATE` + `PING` handshake.

use super::*;
use std::time::SystemTime;

/// First connect retry delay; short because ranks usually start at the same time as the server.
pub(super) const BACKOFF_INITIAL: Duration = Duration::from_millis(10);
const BACKOFF_FACTOR: f64 = 1.5;
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Connects with retries until `connect_timeout`, then VALIDATE + PING.
pub(super) fn open(
    host: &str,
    port: u16,
    connect_timeout: Duration,
    timeout: Duration,
) -> Result<Conn> {
    let start = Instant::now();
    let deadline = start + connect_timeout;
    let mut backoff = Backoff::new();
    let mut last_error: Option<String> = None;
    let mut attempted = false;
    loop {
        match crate::os::net::resolve(host, port) {
            Ok(addrs) => {
                for addr in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    // Even a zero connect timeout gets one try per address.
                    if left.is_zero() && attempted {
                        break;
                    }
                    attempted = true;
                    match try_connect(addr, left.max(Duration::from_millis(1)), timeout) {
                        Ok(conn) => return Ok(conn),
                        Err(e) => last_error = Some(format!("{addr}: {e}")),
                    }
                }
            }
            // Name resolution can fail while a cluster's DNS catches up: retry it too.
            Err(e) => last_error = Some(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::timeout(format!(
                "The client socket has timed out after {}ms while trying to connect to \
                 ({host}, {port}); last error: {}. Check that the store server is running \
                 and reachable, or raise the connect timeout",
                start.elapsed().as_millis(),
                last_error.as_deref().unwrap_or("none"),
            )));
        }
        std::thread::sleep(backoff.next_delay().min(left));
    }
}

/// One connection attempt to one address, including the handshake. std creates the socket with
/// `SOCK_CLOEXEC` and connects it non-blocking with `poll(POLLOUT)`, then makes it blocking
/// again, as torch does.
fn try_connect(addr: SocketAddr, left: Duration, timeout: Duration) -> io::Result<Conn> {
    let stream = TcpStream::connect_timeout(&addr, left)?;
    stream.set_nodelay(true)?;
    // The handshake reply is bounded by what is left of the connect deadline too.
    let reply_timeout = timeout.max(MIN_REPLY_TIMEOUT);
    let mut conn = Conn::new(
        stream,
        reply_timeout.min(left.max(Duration::from_millis(1))),
    )?;
    let nonce = std::process::id();
    conn.out.clear();
    wire::encode_validate(&mut conn.out);
    wire::encode_ping(&mut conn.out, nonce);
    match conn.send() {
        Ok(()) => {}
        Err(Fail::Io(e)) => return Err(e),
        Err(_) => return Err(io::Error::other("handshake could not be sent")),
    }
    let echoed = wire::read_u32(&mut conn.reader)?;
    if echoed != nonce {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "Ping failed, invalid value returned from server. Expected: {nonce}, Got: {echoed}"
            ),
        ));
    }
    conn.apply_reply_timeout(reply_timeout)?;
    Ok(conn)
}

/// Exponential backoff with ±50 % jitter, so ranks started together do not retry in lockstep.
pub(super) struct Backoff {
    next: Duration,
    rng: u64,
}

impl Backoff {
    pub(super) fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Backoff {
            next: BACKOFF_INITIAL,
            // Any non-zero seed works for xorshift; mix in the pid so ranks differ.
            rng: (nanos ^ (u64::from(std::process::id()) << 32)) | 1,
        }
    }

    pub(super) fn next_delay(&mut self) -> Duration {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        let delay = self.next.mul_f64(0.5 + unit);
        self.next = self.next.mul_f64(BACKOFF_FACTOR).min(BACKOFF_MAX);
        delay
    }
}
