use super::*;
use crate::host::tests::fdpass_pair as test_fdpass_pair;
use crate::os::memfd;
use crate::transport::record::local_host;

fn record_for(buf: &LocalBuffer, handle: &ExportedHandle, slab: &ExportedHandle) -> Record {
    Record {
        handle_type: handle.handle_type,
        flags: 0,
        offset: buf.offset(),
        bytes: buf.bytes,
        alloc_bytes: buf.alloc_bytes,
        buffer_id: buf.buffer_id,
        host_id: local_host().id,
        version: 1,
        device_uuid: [0; 16],
        pid: std::process::id(),
        rank: 0,
        host_name: [0; 32],
        payload: handle.payload,
        sem_type: slab.handle_type,
        sem_slot: 0,
        sem_payload: slab.payload,
        segments: Vec::new(),
    }
}

impl HostTransport {
    /// Number of peer semaphore slabs currently mapped.
    pub(crate) fn live_peer_slabs(&self) -> usize {
        self.slab.live_peer_slabs()
    }

    /// Number of local buffers currently offered to peers.
    fn offered_buffers(&self) -> usize {
        lock(&self.offered).len()
    }
}

const T: Duration = Duration::from_secs(5);

#[test]
fn export_import_dedup_release() {
    let (fa, fb) = test_fdpass_pair("unit_tr");
    let exporter = HostTransport::with_fdpass(fa).unwrap();
    let importer = HostTransport::with_fdpass(fb).unwrap();
    let buf = alloc::alloc_for_job("unit_tr", 4096).unwrap();
    buf.write(100, b"hello").unwrap();
    let local = exporter.resolve(buf.addr() + 100, 5).unwrap();
    assert_eq!(local.offset(), 100);
    let handle = exporter.export(&local).unwrap();
    assert_eq!(exporter.export(&local).unwrap(), handle, "offered once");
    assert_eq!(exporter.offered_buffers(), 1);
    let rec = record_for(&local, &handle, &exporter.semaphores().export().unwrap());
    let rec = Record::decode(&rec.encode()).unwrap();
    let m1 = importer.import(&rec, T).unwrap();
    let m2 = importer.import(&rec, T).unwrap();
    assert_eq!(m1, m2);
    assert_eq!(importer.live_mappings(), 1);
    let mut got = [0u8; 5];
    // SAFETY: m1.ptr() maps 5 readable bytes of the exporter's buffer.
    unsafe { std::ptr::copy_nonoverlapping(m1.ptr() as *const u8, got.as_mut_ptr(), 5) };
    assert_eq!(&got, b"hello");
    // Writes through the mapping reach the exporter's buffer.
    // SAFETY: m1.ptr() maps at least 5 writable bytes.
    unsafe { std::ptr::copy_nonoverlapping(b"HELLO".as_ptr(), m1.ptr() as *mut u8, 5) };
    let mut back = [0u8; 5];
    buf.read(100, &mut back).unwrap();
    assert_eq!(&back, b"HELLO");
    drop(m1);
    assert_eq!(importer.live_mappings(), 1);
    drop(m2);
    assert_eq!(importer.live_mappings(), 0);
    // Freeing withdraws the offer: a late importer is told the buffer is gone.
    drop(buf);
    assert_eq!(exporter.offered_buffers(), 0);
    let err = importer.import(&rec, T).unwrap_err();
    assert_eq!(err.status, Status::NotFound, "{err}");
    assert!(err.message.contains("no longer exists"), "{err}");
}

#[test]
fn a_dropped_transport_withdraws_its_offers() {
    let (fa, _) = test_fdpass_pair("unit_tr4");
    let t = HostTransport::with_fdpass(fa.clone()).unwrap();
    let buf = alloc::alloc_for_job("unit_tr", 64).unwrap();
    t.export(&t.resolve(buf.addr(), 8).unwrap()).unwrap();
    t.semaphores().export().unwrap();
    assert_eq!(fa.registered(), 2, "the buffer and the slab");
    drop(t);
    // Another test's free may hold a strong reference to this transport for a moment (the
    // allocator upgrades its listeners while it tells them): the offers go with the last one.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while fa.registered() != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(fa.registered(), 0);
}

#[test]
fn resolve_rejects_bad_pointers() {
    let (fa, _) = test_fdpass_pair("unit_tr2");
    let t = HostTransport::with_fdpass(fa).unwrap();
    assert!(t.resolve(0, 4).unwrap_err().message.contains("NULL"));
    let stack = 5u64;
    let err = t.resolve(&stack as *const u64 as u64, 8).unwrap_err();
    assert!(err.message.contains("not a shared-memory buffer"), "{err}");
    assert!(
        err.message.contains("freed, or is it on the stack"),
        "{err}"
    );
    let buf = alloc::alloc_for_job("unit_tr", 64).unwrap();
    assert!(t.resolve(buf.addr(), 0).is_err());
    assert!(t.resolve(buf.addr(), 65).is_err());
    let addr = buf.addr();
    let freed_id = t.resolve(addr, 8).unwrap().buffer_id;
    drop(buf);
    // Another test's buffer may take the address at once; the freed buffer is never resolved.
    match t.resolve(addr, 8) {
        Err(err) => assert!(err.message.contains("freed"), "{err}"),
        Ok(other) => assert_ne!(other.buffer_id, freed_id, "a freed buffer was resolved"),
    }
}

#[test]
fn records_of_other_kinds_are_refused() {
    let (fa, _) = test_fdpass_pair("unit_tr3");
    let t = HostTransport::with_fdpass(fa).unwrap();
    let buf = alloc::alloc_for_job("unit_tr", 64).unwrap();
    let local = t.resolve(buf.addr(), 8).unwrap();
    let handle = t.export(&local).unwrap();
    let mut rec = record_for(&local, &handle, &handle);
    rec.handle_type = crate::transport::record::HandleType::CudaLegacyIpc;
    let err = t.import(&rec, T).unwrap_err();
    assert_eq!(err.status, Status::Protocol, "{err}");
}

#[test]
fn buffers_at_the_same_place_of_their_page_line_up() {
    let page = page_size();
    let files: Vec<_> = (0..3)
        .map(|_| memfd::create_mapped("unit-hostview", 3 * page).unwrap())
        .collect();
    let offset = page + 24;
    let members: Vec<HostMember> = files
        .iter()
        .enumerate()
        .map(|(rank, f)| HostMember {
            rank,
            fd: f.fd().try_clone_to_owned().unwrap(),
            offset,
            bytes: page,
        })
        .collect();
    for (rank, f) in files.iter().enumerate() {
        // SAFETY: [offset, + page) lies inside the 3-page mapping.
        unsafe {
            std::ptr::write_bytes(
                (f.addr() + offset) as *mut u8,
                rank as u8 + 1,
                page as usize,
            )
        };
    }
    let view = map_view(&members).unwrap();
    assert_eq!(view.stride(), 2 * page, "a page crossing buffer takes two");
    assert_eq!(view.base() % page, 24);
    for rank in 0..3 {
        let at = view.base() + rank as u64 * view.stride();
        // SAFETY: the view maps each member's buffer at `at`.
        let got = unsafe { std::slice::from_raw_parts(at as *const u8, page as usize) };
        assert!(got.iter().all(|&b| b == rank as u8 + 1), "member {rank}");
    }
    let mut other = members;
    other[1].offset = 16;
    let err = map_view(&other).err().unwrap();
    assert!(err.message.contains("rank 1: 16"), "{err}");
}

/// A peer's file that could shrink under the mapping (no size seals) is never mapped, and the
/// library's own buffers cannot be truncated by anyone holding their descriptor.
#[test]
fn unsealed_files_are_refused_and_own_buffers_cannot_shrink() {
    let (fa, fb) = test_fdpass_pair("unit_seal");
    let exporter = HostTransport::with_fdpass(fa.clone()).unwrap();
    let importer = HostTransport::with_fdpass(fb).unwrap();
    let buf = alloc::alloc_for_job("unit_seal", 4096).unwrap();
    let local = exporter.resolve(buf.addr(), 4096).unwrap();
    let slab = exporter.semaphores().export().unwrap();
    // The library's buffer: sealed, so its descriptor cannot truncate it.
    let seg = alloc::lookup(buf.addr(), 1).unwrap();
    let file = std::fs::File::from(seg.fd);
    assert!(file.set_len(0).is_err(), "a host buffer's file shrank");
    let handle = exporter.export(&local).unwrap();
    let _mapped = importer
        .import(&record_for(&local, &handle, &slab), T)
        .unwrap();
    // A file without seals, offered under a record of the same shape: refused, not mapped.
    let plain = memfd::create("unit-unsealed").unwrap();
    std::fs::File::from(plain.try_clone().unwrap())
        .set_len(4096)
        .unwrap();
    let id = fa.register(plain).unwrap();
    let mut rec = record_for(&local, &crate::host::fd_handle(&id), &slab);
    rec.buffer_id += 1;
    let err = importer.import(&rec, T).unwrap_err();
    assert_eq!(err.status, Status::Protocol, "{err}");
    assert!(err.message.contains("not sealed"), "{err}");
    assert_eq!(importer.live_mappings(), 1);
}
