//! Feeds arbitrary bytes to the TCPStore request parser, whole and in arbitrary pieces.
//!
//! Checks: no panic; a parsed request re-encodes to exactly the bytes it was parsed from and
//! parses back identically; "need more bytes" hints are beyond what is buffered; and feeding the
//! same stream in pieces (as the server does) yields the same requests and the same final error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvfipc_store::wire::{parse_frame, parse_request, ParseError, Parsed};

/// The requests (as re-encoded bytes) found in `stream`, and the error that stopped parsing.
fn parse_whole(stream: &[u8]) -> (Vec<Vec<u8>>, Option<ParseError>) {
    let mut found = Vec::new();
    let mut pos = 0;
    loop {
        match parse_frame(&stream[pos..]) {
            Ok(Parsed::Request(req, used)) => {
                assert!(used > 0 && used <= stream.len() - pos);
                let mut encoded = Vec::new();
                req.encode(&mut encoded);
                assert_eq!(encoded, &stream[pos..pos + used], "re-encoding differs");
                assert_eq!(
                    parse_request(&encoded),
                    Ok(Some((req, used))),
                    "re-encoded request parses differently"
                );
                found.push(encoded);
                pos += used;
            }
            Ok(Parsed::Incomplete { needed }) => {
                assert!(
                    needed > stream.len() - pos,
                    "hint {needed} within buffered bytes"
                );
                return (found, None);
            }
            Err(e) => return (found, Some(e)),
        }
    }
}

/// The same, fed in pieces whose sizes come from `splits`, consuming like the server does.
fn parse_in_pieces(stream: &[u8], splits: &[u8]) -> (Vec<Vec<u8>>, Option<ParseError>) {
    let mut found = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut i = 0;
    while fed < stream.len() {
        let piece = splits.get(i).map_or(stream.len(), |&s| usize::from(s) + 1);
        i += 1;
        let end = (fed + piece).min(stream.len());
        buf.extend_from_slice(&stream[fed..end]);
        fed = end;
        loop {
            match parse_request(&buf) {
                Ok(Some((req, used))) => {
                    let mut encoded = Vec::new();
                    req.encode(&mut encoded);
                    found.push(encoded);
                    buf.drain(..used);
                }
                Ok(None) => break,
                Err(e) => return (found, Some(e)),
            }
        }
    }
    (found, None)
}

fuzz_target!(|data: &[u8]| {
    // First byte: how many of the following bytes are split sizes; the rest is the stream.
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 32).min(rest.len());
    let (splits, stream) = rest.split_at(n);
    let whole = parse_whole(stream);
    let pieces = parse_in_pieces(stream, splits);
    assert_eq!(
        whole, pieces,
        "piecewise parsing differs from whole-buffer parsing"
    );
});
