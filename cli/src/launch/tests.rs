use super::*;
use crate::args::parse;

#[test]
fn parses_ranks_port_and_command() {
    let a: LaunchArgs = parse(&["-n", "4", "--port=7", "--", "echo", "-x"]).unwrap();
    assert_eq!(a.ranks, 4);
    assert_eq!(a.port, 7);
    assert_eq!(a.command, ["echo", "-x"]);
    let a: LaunchArgs = parse(&["-n=2", "sh", "-c", "true", "--help"]).unwrap();
    assert_eq!(a.command, ["sh", "-c", "true", "--help"]);
    let a: LaunchArgs = parse(&["--nproc", "3", "--kill-grace-ms=0", "true"]).unwrap();
    assert_eq!((a.ranks, a.grace), (3, Duration::ZERO));
    for bad in [
        &["echo"][..],
        &["-n", "0", "--", "echo"],
        &["-n", "2"],
        &["-n", "2", "--"],
        &["-n", "x", "--", "echo"],
        &["-n", "2", "--what", "--", "echo"],
    ] {
        assert!(parse::<LaunchArgs>(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn shell_status_maps_signals() {
    assert_eq!(shell_status(ExitStatus::from_raw(3 << 8)), 3);
    assert_eq!(shell_status(ExitStatus::from_raw(libc::SIGKILL)), 137);
}
