use super::*;
use crate::error::Status;

fn device(ptr: u64) -> PointerInfo {
    PointerInfo {
        ptr,
        memory_type: MemoryType::Device,
        context: 0x55,
        device_ordinal: 0,
        buffer_id: 42,
        is_managed: false,
        legacy_ipc_capable: true,
        range_start: 0x7000_0000,
        range_size: 2 << 20,
        allowed_handle_types: 0,
        mempool: 0,
        mapping_base: 0,
        mapping_size: 0,
        block_id: 0,
        vmm: false,
    }
}

#[test]
fn legacy_allocation_resolves_with_offset() {
    let alloc = classify(&device(0x7000_0040), 16).unwrap();
    assert_eq!(alloc.kind, DeviceMemoryKind::Legacy);
    assert_eq!(alloc.base, 0x7000_0000);
    assert_eq!(alloc.offset(), 0x40);
    assert_eq!(alloc.buffer_id, 42);
    assert_eq!(alloc.size, 2 << 20);
}

#[test]
fn unknown_and_host_pointers_are_invalid_arguments() {
    let mut info = device(0x1234);
    info.memory_type = MemoryType::Unknown;
    let err = classify(&info, 4).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("0x1234"), "{err}");
    assert!(
        err.message.contains("freed, or is it on the stack"),
        "{err}"
    );
    info.memory_type = MemoryType::Host;
    let err = classify(&info, 4).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("host"), "{err}");
}

#[test]
fn vmm_memory_is_exported_per_physical_allocation() {
    let mut info = device(0x7020_0040);
    info.legacy_ipc_capable = false;
    info.allowed_handle_types = 1;
    info.vmm = true;
    // The reserved range is larger than the physical allocation mapped at the pointer.
    info.range_size = 1 << 30;
    info.mapping_base = 0x7020_0000;
    info.mapping_size = 2 << 20;
    info.block_id = 77;
    // The buffer may run past the first physical allocation: the segment walk checks that.
    let alloc = classify(&info, 8 << 20).unwrap();
    assert_eq!(alloc.kind, DeviceMemoryKind::Vmm { handle_types: 1 });
    assert_eq!(
        (alloc.base, alloc.size, alloc.bytes),
        (0x7020_0000, 2 << 20, 8 << 20)
    );
    assert_eq!(alloc.buffer_id, 77);
    info.mapping_size = 0;
    assert_eq!(classify(&info, 8).unwrap_err().status, Status::Internal);
}

#[test]
fn vmm_memory_without_a_shareable_handle_type_is_refused_with_a_remedy() {
    let mut info = device(0x7000_0000);
    info.legacy_ipc_capable = false;
    info.allowed_handle_types = 0;
    info.vmm = true;
    let err = classify(&info, 4).unwrap_err();
    assert_eq!(err.status, Status::Unsupported);
    assert!(
        err.message
            .contains("allocation at 0x70000000 (pointer 0x70000000) is VMM memory"),
        "{err}"
    );
    assert!(
        err.message
            .contains("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"),
        "{err}"
    );
    assert!(err.message.contains("expandable_segments:False"), "{err}");
}

#[test]
fn pool_memory_is_exported_through_its_pool_and_managed_memory_is_refused() {
    let mut info = device(0x7000_0000);
    info.legacy_ipc_capable = false;
    info.mempool = 0xdead;
    let alloc = classify(&info, 4).unwrap();
    assert_eq!(alloc.kind, DeviceMemoryKind::Pool { pool: 0xdead });
    let mut info = device(0x7000_0000);
    info.legacy_ipc_capable = false;
    let err = classify(&info, 4).unwrap_err();
    assert_eq!(err.status, Status::Unsupported);
    assert!(err.message.contains("neither by legacy CUDA IPC"), "{err}");
    let mut info = device(0x7000_0000);
    info.is_managed = true;
    assert_eq!(classify(&info, 4).unwrap_err().status, Status::Unsupported);
}

#[test]
fn ranges_must_fit_and_be_nonempty() {
    let info = device(0x7000_0000 + (2 << 20) - 8);
    assert!(classify(&info, 8).is_ok());
    let err = classify(&info, 9).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("does not fit"), "{err}");
    assert_eq!(
        classify(&info, 0).unwrap_err().status,
        Status::InvalidArgument
    );
    assert_eq!(
        classify(&device(0), 4).unwrap_err().status,
        Status::InvalidArgument
    );
    let info = device(u64::MAX - 2);
    assert!(classify(&info, 8).is_err());
}

#[test]
fn resolve_without_driver_is_a_status() {
    assert_eq!(resolve(0, 4).unwrap_err().status, Status::InvalidArgument);
    if !driver::is_available() {
        let err = resolve(0x1000, 4).unwrap_err();
        assert_eq!(err.status, Status::CudaUnavailable);
    }
}
