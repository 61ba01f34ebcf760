use super::*;

#[test]
fn dual_stack_listener_accepts_ipv4_and_ipv6() {
    let listener = bind_listener("", 0).unwrap();
    let addr = listener.local_addr().unwrap();
    assert!(addr.ip().is_unspecified());
    std::net::TcpStream::connect(("127.0.0.1", addr.port())).unwrap();
    if addr.is_ipv6() {
        std::net::TcpStream::connect(("::1", addr.port())).unwrap();
    }
}

#[test]
fn explicit_hosts_bind_as_given_and_reuse_addr_allows_rebinding() {
    let listener = bind_listener("127.0.0.1", 0).unwrap();
    let addr = listener.local_addr().unwrap();
    assert_eq!(addr.ip(), Ipv4Addr::LOCALHOST);
    // Occupied port: a clear error.
    let err = bind_listener("127.0.0.1", addr.port()).unwrap_err();
    assert!(err.message.contains("in use"), "{}", err.message);
    drop(listener);
    bind_listener("0.0.0.0", addr.port()).unwrap();
    bind_listener("localhost", 0).unwrap();
    assert!(bind_listener("no-such-host.invalid", 0).is_err());
}

#[test]
fn fd_limit_is_raised_to_what_is_wanted_at_most() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    // Already enough: unchanged, never lowered.
    assert_eq!(raise_fd_limit(16), lim.rlim_cur);
    // More than the hard limit allows: capped there, not an error.
    let got = raise_fd_limit(u64::MAX);
    assert!(got >= lim.rlim_cur && got <= lim.rlim_max, "{got}");
}
