use super::*;
use crate::config::{DEBUG_FILE_VAR, DEBUG_SUBSYS_VAR, DEBUG_VAR};

fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        pairs
            .iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn defaults_warn_every_subsystem_to_stderr() {
    let c = LogConfig::from_lookup(env(&[]), "h", 1);
    assert_eq!(c.level, LevelFilter::Warn);
    assert_eq!(c.subsystems, Subsystem::ALL_MASK);
    assert_eq!(c.file, None);
    assert!(c.problems.is_empty());
}

#[test]
fn levels_in_any_case() {
    for (text, want) in [
        ("info", LevelFilter::Info),
        (" TRACE ", LevelFilter::Trace),
        ("Warn", LevelFilter::Warn),
        ("off", LevelFilter::Off),
        ("debug", LevelFilter::Debug),
    ] {
        assert_eq!(parse_level(text), Some(want), "{text}");
    }
    assert_eq!(parse_level("verbose"), None);
}

#[test]
fn a_bad_level_is_reported_and_warn_is_used() {
    let c = LogConfig::from_lookup(env(&[(DEBUG_VAR, "loud")]), "h", 1);
    assert_eq!(c.level, LevelFilter::Warn);
    assert_eq!(c.problems.len(), 1);
    assert!(
        c.problems[0].contains("NVFIPC_DEBUG=\"loud\""),
        "{:?}",
        c.problems
    );
}

#[test]
fn subsystem_lists_and_exclusions() {
    let ex = Subsystem::Exchange.bit();
    let st = Subsystem::Store.bit();
    assert_eq!(parse_subsystems("exchange,store"), Ok(ex | st));
    assert_eq!(parse_subsystems(" EXCHANGE , "), Ok(ex));
    assert_eq!(parse_subsystems("ALL"), Ok(Subsystem::ALL_MASK));
    assert_eq!(parse_subsystems("^exchange"), Ok(Subsystem::ALL_MASK & !ex));
    assert_eq!(parse_subsystems("exchange,nccl"), Err("nccl".to_string()));
    let c = LogConfig::from_lookup(env(&[(DEBUG_SUBSYS_VAR, "gpu")]), "h", 1);
    assert_eq!(c.subsystems, Subsystem::ALL_MASK);
    assert!(
        c.problems[0].contains("\"gpu\" is not a subsystem"),
        "{:?}",
        c.problems
    );
}

#[test]
fn file_paths_expand_host_and_pid() {
    assert_eq!(
        expand_path("/tmp/%h.%p.log", "node7", 42),
        "/tmp/node7.42.log"
    );
    assert_eq!(expand_path("a%%b%", "h", 1), "a%b%");
    assert_eq!(expand_path("x%qy", "h", 1), "x%qy");
    let c = LogConfig::from_lookup(env(&[(DEBUG_FILE_VAR, "/l/%p")]), "h", 9);
    assert_eq!(c.file.as_deref(), Some("/l/9"));
    let c = LogConfig::from_lookup(env(&[(DEBUG_FILE_VAR, " ")]), "h", 9);
    assert_eq!(c.file, None);
    assert_eq!(c.problems.len(), 1);
}
