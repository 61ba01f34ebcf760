//! The store's TCP sockets, made like torch's: name resolution, `poll` on one socket, the
//! listening socket (dual-stack `[::]`, SO_REUSEADDR, a large backlog) and its open-file limit,
//! errno checks.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;
use std::mem;
use std::net::{
    Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, TcpStream,
    ToSocketAddrs,
};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
/// Resolves like torch: AF_INET6 with `AI_V4MAPPED | AI_ALL` first, then AF_INET.
pub fn resolve(host: &str, port: u16) -> std::result::Result<Vec<SocketAddr>, String> {
    let mut addrs = Vec::new();
    let mut errors = Vec::new();
    let v4_mapped = libc::AI_V4MAPPED | libc::AI_ALL;
    for (family, flags) in [(libc::AF_INET6, v4_mapped), (libc::AF_INET, 0)] {
        if let Err(e) = getaddrinfo(host, port, family, libc::AI_NUMERICSERV | flags, &mut addrs) {
            errors.push(e);
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

fn getaddrinfo(
    host: &str,
    port: u16,
    family: libc::c_int,
    flags: libc::c_int,
    out: &mut Vec<SocketAddr>,
) -> std::result::Result<(), String> {
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
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getaddrinfo returned, not yet freed.
        let ai = unsafe { &*cur };
        if let Some(addr) = sockaddr_to_std(ai).filter(|a| !out.contains(a)) {
            out.push(addr);
        }
        cur = ai.ai_next;
    }
    // SAFETY: `list` came from a successful getaddrinfo and is freed exactly once.
    unsafe { libc::freeaddrinfo(list) };
    Ok(())
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
        match poll_one(stream, libc::POLLIN, ms) {
            Ok(0) if Instant::now() >= deadline => return Ok(false),
            Ok(0) => {}
            // POLLHUP/POLLERR also count: the following read reports what happened.
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// `poll` of `events` on `stream` for at most `ms` milliseconds; the `revents` (0: timed out).
fn poll_one(stream: &TcpStream, events: i16, ms: libc::c_int) -> io::Result<i16> {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid, initialized pollfd that lives across the call, and the count
    // passed is 1; the fd belongs to `stream`, which outlives the call.
    cvt(unsafe { libc::poll(&mut pfd, 1, ms) })?;
    Ok(pfd.revents)
}

/// True when the other end has closed `stream` (or it failed), seen without sending or consuming.
pub fn peer_hung_up(stream: &TcpStream) -> bool {
    let revents = match poll_one(stream, libc::POLLIN | libc::POLLRDHUP, 0) {
        // Nothing to read and no hang-up (or poll itself failed: nothing is known).
        Ok(0) | Err(_) => return false,
        Ok(revents) => revents,
    };
    if revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0 {
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

/// True when `e` says descriptors or socket memory ran out (an `accept` worth retrying later).
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Requested listen backlog; the kernel clamps it to `net.core.somaxconn`.
const LISTEN_BACKLOG: libc::c_int = 16384;

/// Binds and listens. `""` and `"::"` mean every address, IPv6 and IPv4.
pub fn bind_listener(host: &str, port: u16) -> Result<TcpListener> {
    if host.is_empty() || host == "::" {
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        return match listen_on(any6, true) {
            Ok(listener) => Ok(listener),
            Err(e) if ipv6_unavailable(&e) => {
                let any4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
                listen_on(any4, false).map_err(|e| {
                    Error::from_io(
                        format!("store server: cannot listen on 0.0.0.0:{port} (IPv6 unavailable)"),
                        &e,
                    )
                })
            }
            Err(e) => Err(Error::from_io(
                format!("store server: cannot listen on [::]:{port}; is the port in use?"),
                &e,
            )),
        };
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::from_io(format!("store server: cannot resolve host {host:?}"), &e))?
        .collect();
    let mut last_error = None;
    for addr in &addrs {
        match listen_on(*addr, addr.ip().is_unspecified()) {
            Ok(listener) => return Ok(listener),
            Err(e) => last_error = Some((addr, e)),
        }
    }
    Err(match last_error {
        Some((addr, e)) => Error::from_io(
            format!("store server: cannot listen on {addr} (host {host:?}); is the port in use?"),
            &e,
        ),
        None => Error::invalid(format!(
            "store server: host {host:?} resolved to no address"
        )),
    })
}

fn ipv6_unavailable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT | libc::EADDRNOTAVAIL)
    )
}

fn listen_on(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    let domain = if addr.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    let fd = tcp_socket(domain)?;
    set_int_option(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if addr.is_ipv6() && dual_stack {
        set_int_option(&fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    }
    bind_fd(&fd, &addr)?;
    // SAFETY: listen(2) on a descriptor we own; no pointers.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), LISTEN_BACKLOG) })?;
    Ok(TcpListener::from(fd))
}

fn tcp_socket(domain: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; the result is checked before use.
    let raw = cvt(unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A TCP socket bound to an ephemeral loopback port that never listens, for tests of refused
/// connections: the kernel answers a connect with a reset, and while the socket lives no other
/// bind (another test's or another job's server) and no connect's source port can take the port,
/// as they could take one learnt from a listener that was then closed.
#[cfg(test)]
pub(crate) fn unlistened_loopback_port() -> io::Result<(OwnedFd, u16)> {
    let fd = tcp_socket(libc::AF_INET)?;
    bind_fd(&fd, &SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    // getsockname(2) through std: an unconnected TcpStream over the fd, then its fd back.
    let socket = TcpStream::from(fd);
    let port = socket.local_addr()?.port();
    Ok((OwnedFd::from(socket), port))
}

fn set_int_option(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, a live c_int, for the whole call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

fn bind_fd(fd: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
    fn bind<T>(fd: &OwnedFd, sa: &T) -> libc::c_int {
        // SAFETY: the pointer and length describe `sa`, a valid sockaddr_in or sockaddr_in6.
        unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (sa as *const T).cast(),
                mem::size_of::<T>() as libc::socklen_t,
            )
        }
    }
    let rc = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_in is plain old data for which all-zero bytes are valid.
            let mut sa: libc::sockaddr_in = unsafe { mem::zeroed() };
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_port = a.port().to_be();
            sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            bind(fd, &sa)
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_in6 is plain old data for which all-zero bytes are valid.
            let mut sa: libc::sockaddr_in6 = unsafe { mem::zeroed() };
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_port = a.port().to_be();
            sa.sin6_addr.s6_addr = a.ip().octets();
            sa.sin6_flowinfo = a.flowinfo();
            sa.sin6_scope_id = a.scope_id();
            bind(fd, &sa)
        }
    };
    cvt(rc)?;
    Ok(())
}

/// The soft and hard RLIMIT_NOFILE of this process (`u64::MAX` for unlimited).
pub fn fd_limits() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    Some((lim.rlim_cur, lim.rlim_max))
}

/// Raises the soft RLIMIT_NOFILE towards `wanted` (never beyond it or the hard limit, never
/// down); returns the soft limit now in force.
pub fn raise_fd_limit(wanted: u64) -> u64 {
    let Some((soft, hard)) = fd_limits() else {
        return wanted;
    };
    let target = wanted.min(hard);
    if soft >= wanted || target <= soft {
        return soft;
    }
    let raised = libc::rlimit {
        rlim_cur: target,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        return target;
    }
    soft
}

/// `rc` of a libc call that succeeded (non-negative), else the `errno` it left.
fn cvt<T: Default + PartialOrd>(rc: T) -> io::Result<T> {
    if rc < T::default() {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

#[cfg(test)]
mod tests;
