use super::*;

const REQ: FetchRequest = FetchRequest {
    nonce: 0x0123_4567_89ab_cdef,
    serial: 42,
    rank: 3,
    pid: 4242,
    secret: Secret(0x0f1e_2d3c_4b5a_6978_8796_a5b4_c3d2_e1f0),
};

#[test]
fn requests_round_trip_and_arrive_in_pieces() {
    let bytes = REQ.encode();
    assert_eq!(bytes.len(), HEADER_LEN + FETCH_BODY);
    assert_eq!(
        FetchRequest::decode(&bytes),
        Ok(Parsed::Frame(REQ, bytes.len()))
    );
    for cut in 0..bytes.len() {
        match FetchRequest::decode(&bytes[..cut]) {
            Ok(Parsed::Incomplete(need)) => assert!(need > cut, "{cut} -> {need}"),
            other => panic!("{cut} bytes gave {other:?}"),
        }
    }
    // Two pipelined requests: the first is parsed, the rest left.
    let mut two = bytes.clone();
    two.extend_from_slice(&bytes);
    assert_eq!(
        FetchRequest::decode(&two),
        Ok(Parsed::Frame(REQ, bytes.len()))
    );
}

#[test]
fn malformed_requests_are_told_apart() {
    let good = REQ.encode();
    let mut magic = good.clone();
    magic[0] = b'G';
    let e = FetchRequest::decode(&magic).unwrap_err();
    assert_eq!(e.code, ErrorCode::Malformed);
    assert!(e.message.contains("magic"), "{}", e.message);
    // A wrong magic is seen from its first byte.
    assert_eq!(
        FetchRequest::decode(b"GET ").unwrap_err().code,
        ErrorCode::Malformed
    );
    let mut version = good.clone();
    version[4] = 9;
    let e = FetchRequest::decode(&version).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnsupportedVersion);
    assert!(e.message.contains("version 9"), "{}", e.message);
    let mut kind = good.clone();
    kind[6] = 7;
    assert!(FetchRequest::decode(&kind)
        .unwrap_err()
        .message
        .contains("kind 7"));
    let mut len = good.clone();
    len[8] = 23;
    assert!(FetchRequest::decode(&len)
        .unwrap_err()
        .message
        .contains("23 bytes"));
    let mut huge = good;
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(FetchRequest::decode(&huge)
        .unwrap_err()
        .message
        .contains("exceeds"));
    // A reply is not a request.
    let reply = Reply::Fd {
        serial: 1,
        dev: 2,
        ino: 3,
    }
    .encode();
    assert_eq!(
        FetchRequest::decode(&reply).unwrap_err().code,
        ErrorCode::Malformed
    );
}

#[test]
fn secrets_compare_whole_print_nothing_and_ride_in_every_request() {
    let a = Secret(u128::MAX - 1);
    assert!(a.matches(&Secret(u128::MAX - 1)));
    assert!(!a.matches(&Secret(u128::MAX)));
    assert!(!a.matches(&Secret(0)));
    assert_eq!(Secret::from_hex(&a.to_hex()), Some(a));
    assert_eq!(Secret::from_hex("12"), None);
    assert_eq!(Secret::from_hex(&"g".repeat(32)), None);
    assert_eq!(Secret::from_hex(&"+1".repeat(16)), None);
    assert_eq!(format!("{a:?}"), "Secret(..)");
    assert!(!format!("{REQ:?}").contains("f1e2d3c"), "{REQ:?}");
    // Another secret is another request.
    let other = FetchRequest {
        secret: Secret(1),
        ..REQ
    };
    let Ok(Parsed::Frame(got, _)) = FetchRequest::decode(&other.encode()) else {
        panic!("no request");
    };
    assert!(got.secret.matches(&Secret(1)) && !got.secret.matches(&REQ.secret));
    // Version 1 requests (no secret) are refused as another version.
    let mut v1 = REQ.encode();
    v1[4] = 1;
    assert_eq!(
        FetchRequest::decode(&v1).unwrap_err().code,
        ErrorCode::UnsupportedVersion
    );
}

#[test]
fn replies_round_trip() {
    let fd = Reply::Fd {
        serial: 7,
        dev: 8,
        ino: 9,
    };
    let b = fd.encode();
    assert_eq!(Reply::decode(&b), Ok(Parsed::Frame(fd, b.len())));
    for code in [
        ErrorCode::UnknownId,
        ErrorCode::Revoked,
        ErrorCode::Malformed,
        ErrorCode::WrongNonce,
        ErrorCode::UnsupportedVersion,
        ErrorCode::Busy,
        ErrorCode::Internal,
        ErrorCode::Denied,
    ] {
        let e = Reply::Error {
            code,
            serial: 5,
            message: format!("{} here", code.name()),
        };
        let b = e.encode();
        assert_eq!(Reply::decode(&b), Ok(Parsed::Frame(e, b.len())));
        assert!(matches!(
            Reply::decode(&b[..b.len() - 1]),
            Ok(Parsed::Incomplete(_))
        ));
    }
}

#[test]
fn long_messages_are_cut_at_a_char_boundary_and_bad_replies_refused() {
    let e = Reply::Error {
        code: ErrorCode::Internal,
        serial: 0,
        message: "é".repeat(400),
    };
    let b = e.encode();
    let Ok(Parsed::Frame(Reply::Error { message, .. }, _)) = Reply::decode(&b) else {
        panic!("no reply");
    };
    assert!(message.len() <= MAX_MESSAGE && message.chars().all(|c| c == 'é'));
    let mut code = b.clone();
    code[12] = 99;
    assert!(Reply::decode(&code)
        .unwrap_err()
        .message
        .contains("error code 99"));
    let mut len = b;
    len[22] = len[22].wrapping_add(1);
    assert_eq!(Reply::decode(&len).unwrap_err().code, ErrorCode::Malformed);
    assert_eq!(
        Reply::decode(&REQ.encode()).unwrap_err().code,
        ErrorCode::Malformed
    );
}
