//! The store's TCP sockets, made like torch's: name resolution, the listening socket (dual-stack
//! `[::]`, SO_REUSEADDR, a large backlog) and its open-file limit, `poll` on one socket, errno
//! checks, and what `/proc/net/tcp{,6}` tell about a server of this machine without connecting.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;
use std::mem;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, TcpStream,
    ToSocketAddrs, UdpSocket,
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
    super::cvt(unsafe { libc::poll(&mut pfd, 1, ms) })?;
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

/// The text of an "address in use" `io::Error` (to match errors turned into text).
pub fn addr_in_use_message() -> String {
    io::Error::from_raw_os_error(libc::EADDRINUSE).to_string()
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
    // SAFETY: socket(2) takes no pointers; the result is checked before use.
    let raw =
        super::cvt(unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    set_int_option(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if addr.is_ipv6() && dual_stack {
        set_int_option(&fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    }
    bind_fd(&fd, &addr)?;
    // SAFETY: listen(2) on a descriptor we own; no pointers.
    super::cvt(unsafe { libc::listen(fd.as_raw_fd(), LISTEN_BACKLOG) })?;
    Ok(TcpListener::from(fd))
}

fn set_int_option(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, a live c_int, for the whole call.
    super::cvt(unsafe {
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
    super::cvt(rc)?;
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
