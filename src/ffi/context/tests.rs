use super::*;
use crate::ffi::barrier::nvfipc_barrier;
use crate::ffi::store::nvfipc_store_free;
use crate::ffi::store::tests::mem_store;

#[test]
fn create_query_barrier_and_free() {
    let store = mem_store();
    let mut ctx = std::ptr::null_mut();
    assert_eq!(
        nvfipc_context_create(0, 1, 0, 1, store, &mut ctx),
        Status::Ok
    );
    // The context keeps its own reference to the store.
    assert_eq!(nvfipc_store_free(store), Status::Ok);
    let (mut rank, mut world, mut local, mut local_world) = (-1, -1, -1, -1);
    assert_eq!(nvfipc_context_rank(ctx, &mut rank), Status::Ok);
    assert_eq!(nvfipc_context_world_size(ctx, &mut world), Status::Ok);
    assert_eq!(nvfipc_context_local_rank(ctx, &mut local), Status::Ok);
    assert_eq!(
        nvfipc_context_local_world_size(ctx, &mut local_world),
        Status::Ok
    );
    assert_eq!((rank, world, local, local_world), (0, 1, 0, 1));
    let mut port = 1u16;
    assert_eq!(nvfipc_context_hosted_port(ctx, &mut port), Status::Ok);
    assert_eq!(port, 0);
    for _ in 0..3 {
        assert_eq!(nvfipc_barrier(ctx, std::ptr::null(), 0, 0), Status::Ok);
    }
    let bad = [0i64, 1];
    assert_eq!(
        nvfipc_barrier(ctx, bad.as_ptr(), 2, 0),
        Status::InvalidArgument
    );
    assert_eq!(nvfipc_context_free(ctx), Status::Ok);
    assert_eq!(nvfipc_context_free(ctx), Status::InvalidState);
    assert_eq!(nvfipc_context_free(std::ptr::null_mut()), Status::Ok);
}

#[test]
fn rank_layout_names_the_bad_argument() {
    let err = |r, w, lr, lw| rank_layout(r, w, lr, lw).unwrap_err().message;
    assert!(err(3, 2, 0, 1).contains("`rank` = 3"));
    assert!(err(0, 0, 0, 1).contains("`world_size` = 0"));
    assert!(err(0, 2, 0, -1).contains("`local_world_size` = -1"));
    assert!(err(0, 2, 2, 2).contains("`local_rank` = 2"));
    assert!(err(0, 2, 0, 3).contains("larger than world_size"));
    assert_eq!(rank_layout(1, 4, 1, 2).unwrap(), (1, 4, 1, 2));
}

#[test]
fn barrier_member_counts_above_the_world_size_are_refused_before_the_list_is_read() {
    let store = mem_store();
    let mut ctx = std::ptr::null_mut();
    assert_eq!(
        nvfipc_context_create(0, 1, 0, 1, store, &mut ctx),
        Status::Ok
    );
    let two = [0i64, 0];
    for n in [2usize, 1 << 40, usize::MAX] {
        assert_eq!(
            nvfipc_barrier(ctx, two.as_ptr(), n, 0),
            Status::InvalidArgument
        );
        let message = crate::ffi::tests::last_error_message();
        let expected = format!("`n_ranks` = {n} is above the limit of the world size = 1");
        assert!(message.contains(&expected), "{message}");
    }
    assert_eq!(nvfipc_barrier(ctx, two.as_ptr(), 1, 0), Status::Ok);
    assert_eq!(nvfipc_context_free(ctx), Status::Ok);
    assert_eq!(nvfipc_store_free(store), Status::Ok);
}
