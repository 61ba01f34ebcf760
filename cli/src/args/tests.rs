use super::*;

#[test]
fn values_name_what_they_must_be() {
    assert_eq!(positive("7"), Ok(7));
    assert_eq!(positive("0").unwrap_err(), "must be at least 1");
    assert_eq!(ring_size("x").unwrap_err(), "\"x\" is not a number");
    assert_eq!(ring_size("1").unwrap_err(), "must be at least 2");
    assert_eq!(world_size("131072"), Ok(131072));
    for big in ["131073", "99999999999", "99999999999999999999999"] {
        assert_eq!(
            world_size(big).unwrap_err(),
            "must be at most 131072 ranks (NVFIPC_MAX_WORLD_SIZE)"
        );
    }
    assert!(positive("99999999999999999999999").is_err());
    assert_eq!(millis("0"), Ok(Duration::ZERO));
    assert!(positive_ms("0").is_err());
}
