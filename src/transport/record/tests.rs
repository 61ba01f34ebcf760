use super::*;
use crate::error::Status;

fn sample() -> Record {
    let host = local_host();
    Record {
        handle_type: HandleType::PosixFd,
        flags: 0,
        offset: 64,
        bytes: 128,
        alloc_bytes: 4096,
        buffer_id: 7,
        host_id: host.id,
        version: 3,
        device_uuid: [0; 16],
        pid: 1234,
        rank: 2,
        host_name: to_fixed(&host.name).unwrap(),
        payload: to_fixed("/nvfipc-job-1-2").unwrap(),
        sem_type: HandleType::PosixFd,
        sem_slot: 5,
        sem_payload: to_fixed("/nvfipc-job-sem-2").unwrap(),
        segments: Vec::new(),
    }
}

fn vmm_sample() -> Record {
    let mut rec = sample();
    rec.handle_type = HandleType::CudaVmmFd;
    rec.flags = flags::DEVICE;
    rec.payload = [0; 64];
    rec.alloc_bytes = 6 << 20;
    rec.segments = (0..3)
        .map(|i| Segment {
            bytes: 2 << 20,
            id: 100 + i,
            handle: [i as u8 + 1; 64],
        })
        .collect();
    rec
}

#[test]
fn vmm_records_round_trip_with_their_segments() {
    let rec = vmm_sample();
    let bytes = rec.encode();
    assert_eq!(bytes.len(), RECORD_LEN + 3 * SEGMENT_LEN);
    assert_eq!(Record::decode(&bytes).unwrap(), rec);
}

#[test]
fn segment_lists_are_validated() {
    let good = vmm_sample();
    let mut short = good.encode();
    short.truncate(short.len() - 1);
    assert!(Record::decode(&short)
        .unwrap_err()
        .message
        .contains("segment(s) make"));
    let mut huge = good.encode();
    huge[248..252].copy_from_slice(&(MAX_SEGMENTS as u32 + 1).to_le_bytes());
    assert!(Record::decode(&huge)
        .unwrap_err()
        .message
        .contains("more than"));
    let mut sizes = good.clone();
    sizes.alloc_bytes += 1;
    sizes.bytes = 1;
    assert!(Record::decode(&sizes.encode())
        .unwrap_err()
        .message
        .contains("add up"));
    let mut empty = good.clone();
    empty.segments[1].handle = [0; 64];
    assert!(Record::decode(&empty.encode())
        .unwrap_err()
        .message
        .contains("empty handle"));
    let mut none = good.clone();
    none.segments.clear();
    assert!(Record::decode(&none.encode())
        .unwrap_err()
        .message
        .contains("0 segment"));
    let mut host = sample();
    host.segments = good.segments.clone();
    assert!(Record::decode(&host.encode())
        .unwrap_err()
        .message
        .contains("cannot list"));
    let mut pool = good;
    pool.handle_type = HandleType::CudaPool;
    pool.payload = [7; 64];
    assert!(Record::decode(&pool.encode())
        .unwrap_err()
        .message
        .contains("cannot list 3"));
    pool.segments.truncate(1);
    pool.segments[0].bytes = 0;
    assert_eq!(Record::decode(&pool.encode()).unwrap(), pool);
}

#[test]
fn round_trips() {
    let rec = sample();
    let bytes = rec.encode();
    assert_eq!(bytes.len(), RECORD_LEN);
    assert_eq!(&bytes[0..4], b"NVFI");
    assert_eq!(Record::decode(&bytes).unwrap(), rec);
}

#[test]
fn device_record_round_trips() {
    let mut rec = sample();
    rec.handle_type = HandleType::CudaLegacyIpc;
    rec.flags = flags::DEVICE;
    rec.device_uuid = [9; 16];
    rec.payload = [0xab; 64];
    assert_eq!(Record::decode(&rec.encode()).unwrap(), rec);
}

#[test]
fn rejects_truncated_and_oversized() {
    let bytes = sample().encode();
    for len in [0, 3, 8, 100, RECORD_LEN - 1] {
        let err = Record::decode(&bytes[..len]).unwrap_err();
        assert_eq!(err.status, Status::Protocol, "len {len}: {err}");
    }
    let mut long = bytes.clone();
    long.push(0);
    let err = Record::decode(&long).unwrap_err();
    assert!(err.message.contains("length mismatch"), "{err}");
    let mut reserved = bytes.clone();
    reserved[253] = 1;
    assert!(Record::decode(&reserved)
        .unwrap_err()
        .message
        .contains("reserved"));
}

#[test]
fn rejects_garbled_fields() {
    let good = sample().encode();
    let cases: Vec<(usize, u8, &str)> = vec![
        (0, b'X', "magic"),
        (4, 1, "version"),
        (6, 1, "length"),
        (8, 9, "unknown handle type"),
        (8, 4, "does not match"),
        (9, 0x80, "unknown flag"),
        (10, 0, "semaphore handle type"),
        (11, 1, "reserved"),
        (9, flags::DEVICE, "does not match"),
        (31, 0xff, "outside its allocation"),
    ];
    for (at, value, needle) in cases {
        let mut bad = good.clone();
        bad[at] = value;
        let err = Record::decode(&bad).unwrap_err();
        assert_eq!(err.status, Status::Protocol, "byte {at}: {err}");
        assert!(err.message.contains(needle), "byte {at}: {err}");
    }
}

#[test]
fn rejects_zero_sizes_and_empty_payloads() {
    let mut rec = sample();
    rec.bytes = 0;
    assert!(Record::decode(&rec.encode())
        .unwrap_err()
        .message
        .contains("zero"));
    let mut rec = sample();
    rec.payload = [0; 64];
    assert!(Record::decode(&rec.encode())
        .unwrap_err()
        .message
        .contains("empty"));
    let mut rec = sample();
    rec.offset = u64::MAX;
    assert_eq!(
        Record::decode(&rec.encode()).unwrap_err().status,
        Status::Protocol
    );
}

#[test]
fn rejects_other_host() {
    let bytes = sample().encode();
    let other = HostIdentity {
        id: local_host().id ^ 1,
        name: "elsewhere".into(),
    };
    let err = Record::decode_for_host(&bytes, &other).unwrap_err();
    assert_eq!(err.status, Status::Unsupported);
    assert!(
        err.message.contains("cannot be opened on host elsewhere"),
        "{err}"
    );
    assert!(err.message.contains("node-local"), "{err}");
}

#[test]
fn fixed_names() {
    let a: [u8; 8] = to_fixed("abcdefghij").unwrap();
    assert_eq!(from_fixed(&a), "abcdefg");
    assert!(to_fixed::<8>("a\0b").is_err());
}
