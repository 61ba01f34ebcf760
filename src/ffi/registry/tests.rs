use super::*;
use crate::ffi::boundary::nvfipc_last_error_message;
use std::ffi::CStr;
use std::sync::Arc;

fn message_of_last_error() -> String {
    // SAFETY: nvfipc_last_error_message never returns NULL and the string lives until the
    // next failing call on this thread; we copy it at once.
    unsafe { CStr::from_ptr(nvfipc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

#[derive(Clone, Debug)]
struct Apple(Arc<u32>);
impl Handle for Apple {
    fn c_name() -> &'static str {
        "test_apple"
    }
}
#[derive(Clone, Debug)]
struct Pear;
impl Handle for Pear {
    fn c_name() -> &'static str {
        "test_pear"
    }
}

#[test]
fn registry_detects_double_free_and_wrong_types() {
    let apple = into_handle(Apple(Arc::new(5)));
    let pear = into_handle(Pear);
    assert_eq!(*handle_ref(apple, "apple").unwrap().0, 5);

    let err = handle_ref(pear.cast::<Apple>(), "apple").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message
            .contains("is a live test_pear, not a test_apple"),
        "{}",
        err.message
    );
    assert!(take_handle(pear.cast::<Apple>(), "apple").is_err());

    let err = handle_ref::<Apple>(std::ptr::null(), "apple").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);

    let kept = handle_ref(apple, "apple").unwrap();
    assert!(take_handle(apple, "apple").unwrap().is_some());
    // A clone taken before the free stays usable.
    assert_eq!(*kept.0, 5);
    let err = take_handle(apple, "apple").unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
    assert!(
        err.message.contains("not a live test_apple"),
        "{}",
        err.message
    );
    assert!(handle_ref(apple, "apple").is_err());
    assert!(take_handle::<Apple>(std::ptr::null_mut(), "apple")
        .unwrap()
        .is_none());
    assert!(take_handle(pear, "pear").unwrap().is_some());
}

#[test]
fn buffers_are_nul_terminated_and_freed_once() {
    let (ptr, len) = into_buffer(b"value".to_vec());
    assert_eq!(len, 5);
    // SAFETY: into_buffer allocates len + 1 bytes.
    let all = unsafe { std::slice::from_raw_parts(ptr, len + 1) };
    assert_eq!(all, b"value\0");
    let err = free_buffer(ptr, 4).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(nvfipc_buffer_free(ptr, len), Status::Ok);
    assert_eq!(nvfipc_buffer_free(ptr, len), Status::InvalidState);
    assert!(message_of_last_error().contains("not live"));
    assert_eq!(nvfipc_buffer_free(std::ptr::null_mut(), 3), Status::Ok);

    let (empty, len) = into_buffer(Vec::new());
    assert!(!empty.is_null());
    assert_eq!(len, 0);
    let apple = into_handle(Apple(Arc::new(1)));
    assert_eq!(
        nvfipc_buffer_free(apple.cast(), 0),
        Status::InvalidState,
        "a handle is not a buffer"
    );
    assert!(message_of_last_error().contains("is a live test_apple"));
    assert!(take_handle(apple, "apple").unwrap().is_some());
    assert_eq!(nvfipc_buffer_free(empty, 0), Status::Ok);
}

mod warm_get_bench {
    // What the registry's global lock costs on the warm `nvfipc_cache_get` path (a hit: no store
    // traffic). Ignored: run with
    // `cargo test --release --lib warm_get_bench -- --ignored --nocapture`.
    // Two ranks run as threads of this process over an embedded store and exchange one host
    // channel; then the calls are timed from one thread and from several at once.

    use crate::error::Status;
    use crate::ffi::context::{nvfipc_context, nvfipc_context_connect, nvfipc_context_free};
    use crate::ffi::exchange::*;
    use crate::ffi::host::nvfipc_host_alloc;
    use crate::ffi::registry::handle_ref;
    use crate::ffi::store::{nvfipc_server_free, nvfipc_store_serve};
    use std::ffi::{c_void, CString};
    use std::ptr::null_mut;
    use std::sync::Barrier;
    use std::time::Instant;

    const CALLS: usize = 2_000_000;

    /// Nanoseconds per call of `f`, run `CALLS` times on each of `threads` threads at once (the
    /// slowest thread's figure).
    fn ns_per_call(threads: usize, f: impl Fn() + Sync) -> f64 {
        let start = Barrier::new(threads);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        let t = Instant::now();
                        for _ in 0..CALLS {
                            f();
                        }
                        t.elapsed().as_nanos() as f64 / CALLS as f64
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .fold(0.0, f64::max)
        })
    }

    /// Pointers handed between the rank threads.
    #[derive(Clone, Copy)]
    struct Shared(
        *mut nvfipc_cache,
        *mut nvfipc_context,
        *mut c_void,
        *mut c_void,
    );
    // SAFETY: the pointers are only passed to the thread-safe C ABI, which checks them.
    unsafe impl Send for Shared {}

    impl Shared {
        fn free(self) {
            assert_eq!(nvfipc_cache_free(self.0), Status::Ok);
            assert_eq!(nvfipc_context_free(self.1), Status::Ok);
        }
    }

    /// The warm lookup timed from several threads: a cache and an exchanged request.
    struct Lookup(*const nvfipc_cache, nvfipc_request);
    // SAFETY: the cache is a thread-safe C object; the request's tag outlives every thread (scoped).
    unsafe impl Sync for Lookup {}

    impl Lookup {
        fn get(&self) {
            let mut h = nvfipc_p2p_handle::default();
            assert_eq!(nvfipc_cache_get(self.0, &self.1, &mut h), Status::Ok);
        }
        fn request_only(&self, cache: &crate::exchange::HandleCache) {
            single_request(cache, &self.1).unwrap();
        }
        fn registry_only(&self) {
            handle_ref(self.0, "cache").unwrap();
        }
    }

    #[test]
    #[ignore = "a timing, run by hand with --release"]
    fn warm_cache_get_with_and_without_the_registry_lock() {
        let mut port = 0u16;
        let mut server = null_mut();
        let any = c"127.0.0.1";
        assert_eq!(
            nvfipc_store_serve(any.as_ptr(), 0, &mut port, &mut server),
            Status::Ok
        );
        let tag = CString::new("bench").unwrap();
        let sides: Vec<Shared> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..2i64)
                .map(|rank| {
                    let tag = &tag;
                    s.spawn(move || {
                        let mut ctx = null_mut();
                        let st = nvfipc_context_connect(
                            rank,
                            2,
                            any.as_ptr(),
                            port,
                            false,
                            20_000,
                            &mut ctx,
                        );
                        assert_eq!(st, Status::Ok);
                        let mut cache = null_mut();
                        assert_eq!(nvfipc_cache_create(ctx, &mut cache), Status::Ok);
                        let (mut send, mut recv) = (null_mut(), null_mut());
                        assert_eq!(nvfipc_host_alloc(4096, &mut send), Status::Ok);
                        assert_eq!(nvfipc_host_alloc(4096, &mut recv), Status::Ok);
                        let reqs = requests(1 - rank, tag, send, recv);
                        assert_eq!(nvfipc_exchange_handles(cache, reqs.as_ptr(), 2), Status::Ok);
                        Shared(cache, ctx, send, recv)
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let Shared(cache, _, send, recv) = sides[0];
        let reqs = requests(1, &tag, send, recv);
        let lookup = Lookup(cache, reqs[1]);
        let rust_cache = handle_ref(cache.cast_const(), "cache").unwrap().cache;
        let request = single_request(&rust_cache, &reqs[1]).unwrap();
        let direct = || {
            rust_cache.get(&request).unwrap();
        };
        for threads in [1, 2, 4] {
            println!(
                "threads {threads}: nvfipc_cache_get {:.1} ns/call, registry lookup alone {:.1} \
                 ns/call, request conversion alone {:.1} ns/call, HandleCache::get alone {:.1} \
                 ns/call",
                ns_per_call(threads, || lookup.get()),
                ns_per_call(threads, || lookup.registry_only()),
                ns_per_call(threads, || lookup.request_only(&rust_cache)),
                ns_per_call(threads, direct)
            );
        }
        drop(rust_cache);
        // Both at once: a cache's free waits (bounded) for its peer's.
        std::thread::scope(|s| {
            for side in sides {
                s.spawn(move || side.free());
            }
        });
        assert_eq!(nvfipc_server_free(server, 0), Status::Ok);
    }

    fn requests(
        peer: i64,
        tag: &CString,
        send: *mut c_void,
        recv: *mut c_void,
    ) -> [nvfipc_request; 2] {
        let request = |direction, ptr: *mut c_void| nvfipc_request {
            peer,
            direction,
            kind: NVFIPC_MEM_HOST,
            tag: tag.as_ptr(),
            ptr: ptr as u64,
            bytes: 4096,
        };
        [
            request(NVFIPC_DIRECTION_SEND, send),
            request(NVFIPC_DIRECTION_RECV, recv),
        ]
    }
}
