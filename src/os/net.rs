//! Name resolution and socket readiness for the store client, made like torch's client:
//! `getaddrinfo` per address family, `poll` on one socket.

use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Resolves like torch: AF_INET6 with `AI_V4MAPPED | AI_ALL` first, then AF_INET.
pub fn resolve(host: &str, port: u16) -> std::result::Result<Vec<SocketAddr>, String> {
    let mut addrs = Vec::new();
    let mut errors = Vec::new();
    for family in [libc::AF_INET6, libc::AF_INET] {
        let flags = libc::AI_NUMERICSERV
            | if family == libc::AF_INET6 {
                libc::AI_V4MAPPED | libc::AI_ALL
            } else {
                0
            };
        match getaddrinfo(host, port, family, flags) {
            Ok(found) => {
                for a in found {
                    if !addrs.contains(&a) {
                        addrs.push(a);
                    }
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if addrs.is_empty() {
        return Err(format!(
            "cannot resolve host {host:?}: {}",
            errors.join("; ")
        ));
    }
    Ok(addrs)
}

/// Safe wrapper over `getaddrinfo` for one address family (stream sockets only).
fn getaddrinfo(
    host: &str,
    port: u16,
    family: libc::c_int,
    flags: libc::c_int,
) -> std::result::Result<Vec<SocketAddr>, String> {
    let c_host = CString::new(host).map_err(|_| format!("host name {host:?} contains NUL"))?;
    let c_port = CString::new(port.to_string()).expect("digits contain no NUL");
    // SAFETY: addrinfo is a plain C struct for which all-zero is a valid "no hints" value.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = family;
    hints.ai_socktype = libc::SOCK_STREAM;
    hints.ai_flags = flags;
    let mut list: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: both strings are NUL-terminated and live across the call; `hints` is initialized;
    // `list` is a valid out-pointer, filled only on success and freed below.
    let rc = unsafe { libc::getaddrinfo(c_host.as_ptr(), c_port.as_ptr(), &hints, &mut list) };
    if rc != 0 {
        // SAFETY: gai_strerror returns a pointer to a static NUL-terminated string.
        let msg = unsafe { std::ffi::CStr::from_ptr(libc::gai_strerror(rc)) };
        return Err(msg.to_string_lossy().into_owned());
    }
    let mut out = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getaddrinfo returned, not yet freed.
        let ai = unsafe { &*cur };
        if let Some(addr) = sockaddr_to_std(ai) {
            out.push(addr);
        }
        cur = ai.ai_next;
    }
    // SAFETY: `list` came from a successful getaddrinfo and is freed exactly once.
    unsafe { libc::freeaddrinfo(list) };
    Ok(out)
}

fn sockaddr_to_std(ai: &libc::addrinfo) -> Option<SocketAddr> {
    if ai.ai_addr.is_null() {
        return None;
    }
    let len = ai.ai_addrlen as usize;
    match ai.ai_family {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: family AF_INET with a long enough buffer means ai_addr is a sockaddr_in;
            // read_unaligned copes with any alignment.
            let sa = unsafe { std::ptr::read_unaligned(ai.ai_addr as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
                u16::from_be(sa.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for AF_INET6 and sockaddr_in6.
            let sa = unsafe { std::ptr::read_unaligned(ai.ai_addr as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sa.sin6_addr.s6_addr),
                u16::from_be(sa.sin6_port),
                sa.sin6_flowinfo,
                sa.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `poll(POLLIN)` on the socket for up to `timeout`; true when a reply can be read.
pub fn poll_readable(stream: &TcpStream, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Round up so that a sub-millisecond remainder still waits instead of spinning.
        let ms = left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
        let mut pfd = libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid, initialized pollfd that lives across the call, and the
        // count passed is 1; the fd belongs to `stream`, which outlives the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc > 0 {
            // POLLHUP/POLLERR also count: the following read reports what happened.
            return Ok(true);
        }
        if rc == 0 {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            continue;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// True when the other end has closed `stream` (or it failed): a non-blocking look that sends
/// nothing and consumes nothing, so a store client can tell its server is gone without a request
/// that would fail.
pub fn peer_hung_up(stream: &TcpStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid, initialized pollfd that lives across the call, and the count
    // passed is 1; the fd belongs to `stream`, which outlives the call. Timeout 0: never blocks.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    if rc <= 0 {
        // Nothing to read and no hang-up (or poll itself failed: nothing is known).
        return false;
    }
    if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0 {
        return true;
    }
    let mut byte = 0u8;
    // SAFETY: `byte` is one writable byte that lives across the call; MSG_PEEK leaves the data in
    // the socket and MSG_DONTWAIT keeps the call from blocking.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    // 0: end of stream; < 0 other than "would block": the connection failed.
    n == 0 || (n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock)
}

/// True when `e` is a bind failure because the address is in use.
pub fn is_addr_in_use(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EADDRINUSE)
}

/// The message of an "address in use" error, as `io::Error` words it (for matching errors that
/// were turned into text).
pub fn addr_in_use_message() -> String {
    io::Error::from_raw_os_error(libc::EADDRINUSE).to_string()
}

/// True when `e` says the process or system ran out of descriptors or memory for sockets (an
/// `accept` worth retrying later).
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}
