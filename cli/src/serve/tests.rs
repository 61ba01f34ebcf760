use super::*;
use crate::args::parse;

#[test]
fn parses_host_and_port() {
    assert_eq!(
        parse::<ServeArgs>(&[]).unwrap(),
        ServeArgs {
            host: "::".into(),
            port: 29542,
            busy_poll_us: 50,
            threads: 0,
            max_connections: 16384,
            reply_budget_mib: 256,
            pending_budget_mib: 256,
            pending_per_client_mib: 64,
        }
    );
    assert_eq!(
        parse::<ServeArgs>(&[
            "--host",
            "127.0.0.1",
            "--port=0",
            "--busy-poll-us=0",
            "--threads",
            "3",
            "--max-connections=100",
            "--reply-budget-mib",
            "64",
            "--pending-budget-mib=512",
            "--pending-per-client-mib=8",
        ])
        .unwrap(),
        ServeArgs {
            host: "127.0.0.1".into(),
            port: 0,
            busy_poll_us: 0,
            threads: 3,
            max_connections: 100,
            reply_budget_mib: 64,
            pending_budget_mib: 512,
            pending_per_client_mib: 8,
        }
    );
    assert!(parse::<ServeArgs>(&["--port", "99999"]).is_err());
    assert!(parse::<ServeArgs>(&["--bogus"]).is_err());
    assert_eq!(
        parse::<ServeArgs>(&["--help"]).err().map(|e| e.kind()),
        Some(clap::error::ErrorKind::DisplayHelp)
    );
    assert!(parse::<ServeArgs>(&["--busy-poll-us", "-1"]).is_err());
    assert!(parse::<ServeArgs>(&["--reply-budget-mib", "0"]).is_err());
    assert!(parse::<ServeArgs>(&["--pending-per-client-mib", "0"]).is_err());
}
