use super::*;

#[test]
fn context_keeps_status_and_prefixes_message() {
    let e = Error::timeout("wait for key /a").context("rank 2");
    assert_eq!(e.status, Status::Timeout);
    assert_eq!(e.message, "rank 2: wait for key /a");
    assert_eq!(e.to_string(), "rank 2: wait for key /a (timeout)");
}

#[test]
fn io_errors_map_timeouts() {
    let e = Error::from_io("recv", &std::io::Error::from(std::io::ErrorKind::TimedOut));
    assert_eq!(e.status, Status::Timeout);
    let e = Error::from_io(
        "connect",
        &std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
    );
    assert_eq!(e.status, Status::Io);
    assert!(e.message.starts_with("connect: "));
}
