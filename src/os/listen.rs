//! The listening socket, set up like torch's: SO_REUSEADDR, dual-stack `[::]` with
//! IPV6_V6ONLY=0 (falling back to 0.0.0.0 without IPv6), a large backlog, close-on-exec.
//! Also raises the soft RLIMIT_NOFILE as far as the server's connection limit needs.

use crate::error::{Error, Result};
use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
    let raw = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    set_int_option(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if addr.is_ipv6() && dual_stack {
        set_int_option(&fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    }
    bind_fd(&fd, &addr)?;
    // SAFETY: listen(2) on a descriptor we own; no pointers.
    if unsafe { libc::listen(fd.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpListener::from(fd))
}

fn set_int_option(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, a live c_int, for the whole call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn bind_fd(fd: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
    let rc = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_in is plain old data for which all-zero bytes are valid.
            let mut sa: libc::sockaddr_in = unsafe { mem::zeroed() };
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_port = a.port().to_be();
            sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            // SAFETY: the pointer and length describe `sa`, a valid sockaddr_in.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in).cast(),
                    mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_in6 is plain old data for which all-zero bytes are valid.
            let mut sa: libc::sockaddr_in6 = unsafe { mem::zeroed() };
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_port = a.port().to_be();
            sa.sin6_addr.s6_addr = a.ip().octets();
            sa.sin6_flowinfo = a.flowinfo();
            sa.sin6_scope_id = a.scope_id();
            // SAFETY: the pointer and length describe `sa`, a valid sockaddr_in6.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in6).cast(),
                    mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
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

/// Raises the soft RLIMIT_NOFILE to `wanted` when it is lower and the hard limit allows it (to
/// the hard limit when that is lower), never beyond `wanted` and never down. Returns the soft
/// limit now in force; a limit that cannot be raised is not an error: the server then takes
/// fewer clients at once (see `ServerOptions::max_connections`).
pub fn raise_fd_limit(wanted: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return wanted;
    }
    let soft: u64 = lim.rlim_cur;
    if soft >= wanted {
        return soft;
    }
    let target = wanted.min(lim.rlim_max);
    if target > soft {
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return target;
        }
    }
    soft
}

#[cfg(test)]
mod tests;
