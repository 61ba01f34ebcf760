use super::*;

#[test]
fn parses_transport_names() {
    use clap::ValueEnum;
    for choice in TransportChoice::value_variants() {
        assert_eq!(TransportChoice::from_str(choice.name(), false), Ok(*choice));
    }
    assert!(TransportChoice::from_str("gpu", false).is_err());
    assert_eq!(TransportChoice::Host.resolve().unwrap(), MemKind::Host);
    // Auto never fails: it falls back to shared memory.
    assert!(TransportChoice::Auto.resolve().is_ok());
}
