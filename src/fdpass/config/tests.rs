use super::*;
use crate::config::{PTRACER_VAR, RUNGS_VAR, SOCKET_DIR_VAR};
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn reads_the_environment_and_refuses_nonsense() {
    let c = FdPassConfig::from_lookup(env(&[])).unwrap();
    assert_eq!(c, FdPassConfig::default());
    assert!(c.socket_dir.is_some());
    let c = FdPassConfig::from_lookup(env(&[
        (SOCKET_DIR_VAR, "/shared/sock"),
        (RUNGS_VAR, "pidfd, path,pidfd"),
        (PTRACER_VAR, "none"),
    ]))
    .unwrap();
    assert_eq!(c.socket_dir, Some(PathBuf::from("/shared/sock")));
    assert_eq!(c.rungs, vec![Rung::Pidfd, Rung::Path]);
    assert!(!c.allow_ptracer);
    assert!(
        !FdPassConfig::default().allow_ptracer,
        "no PR_SET_PTRACER_ANY by default"
    );
    let c = FdPassConfig::from_lookup(env(&[(PTRACER_VAR, "any")])).unwrap();
    assert!(c.allow_ptracer);
    let c = FdPassConfig::from_lookup(env(&[(SOCKET_DIR_VAR, "none")])).unwrap();
    assert_eq!(c.socket_dir, None);
    for (k, v, needle) in [
        (SOCKET_DIR_VAR, "rel/dir", "absolute"),
        (RUNGS_VAR, "abstract,tcp", "\"tcp\" is not a rung"),
        (PTRACER_VAR, "maybe", "any"),
    ] {
        let e = FdPassConfig::from_lookup(env(&[(k, v)])).unwrap_err();
        assert!(e.message.contains(needle) && e.message.contains(k), "{e}");
    }
}

#[test]
fn the_rung_table_is_in_discriminant_order() {
    for (i, (rung, name, _)) in RUNGS.iter().enumerate() {
        assert_eq!(*rung as usize, i);
        assert_eq!(rung.name(), *name);
        assert_eq!(Rung::parse(name), Some(*rung));
    }
}
