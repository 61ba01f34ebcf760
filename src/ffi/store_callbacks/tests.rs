//! Tests of [`CallbackStore`] against a host written as a C++ host would write it: a map behind
//! a mutex, reached through the vtable.

use super::*;
use std::collections::HashMap;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// The host side: a map behind a mutex, as a C++ host would keep it.
#[derive(Default)]
struct Host {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
    last_error: Mutex<CString>,
    freed: AtomicUsize,
    /// The timeout of every `get` called.
    get_timeouts: Mutex<Vec<i64>>,
}

/// Runs a callback body; a panic becomes an error code instead of unwinding into C.
fn guarded(ctx: *mut c_void, body: impl FnOnce(&Host) -> c_int) -> c_int {
    // SAFETY: every test passes a pointer to a Host that outlives the store.
    let host = unsafe { &*(ctx as *const Host) };
    catch_unwind(AssertUnwindSafe(|| body(host))).unwrap_or(11)
}

fn fail(host: &Host, code: c_int, msg: &str) -> c_int {
    *host.last_error.lock().unwrap() = CString::new(msg).unwrap();
    code
}

/// The span (`p`, `len`) as a slice; NULL is allowed when `len` is 0.
///
/// # Safety
/// When `len` is not 0, `p` points to `len` readable bytes that outlive `'a`.
unsafe fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract, for a non-empty span.
        unsafe { std::slice::from_raw_parts(p, len) }
    }
}

/// Copies the `n` keys of a vtable call.
///
/// # Safety
/// `keys` and `lens` point to `n` entries each, and each key to its length in bytes.
unsafe fn key_list(keys: *const *const c_char, lens: *const usize, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        // SAFETY: `i < n`, inside both arrays; each key spans its length (the caller's contract).
        .map(|i| unsafe { bytes(*keys.add(i) as *const u8, *lens.add(i)) }.to_vec())
        .collect()
}

fn malloc_copy(v: &[u8]) -> *mut u8 {
    if v.is_empty() {
        return ptr::null_mut();
    }
    // SAFETY: malloc of a non-zero size; checked for NULL; we copy exactly v.len() bytes.
    unsafe {
        let p = libc::malloc(v.len()) as *mut u8;
        assert!(!p.is_null());
        ptr::copy_nonoverlapping(v.as_ptr(), p, v.len());
        p
    }
}

unsafe extern "C" fn cb_set(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    value: *const u8,
    value_len: usize,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `key` and `value` hold `key_len` and `value_len` bytes for the call.
    unsafe {
        guarded(ctx, |h| {
            let k = bytes(key as *const u8, key_len).to_vec();
            h.map
                .lock()
                .unwrap()
                .insert(k, bytes(value, value_len).to_vec());
            h.changed.notify_all();
            0
        })
    }
}

/// Waits on the host map until `ready` holds or `timeout_ms` passes.
fn wait_until(
    h: &Host,
    timeout_ms: i64,
    ready: impl Fn(&HashMap<Vec<u8>, Vec<u8>>) -> bool,
) -> bool {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.max(0) as u64);
    let mut map = h.map.lock().unwrap();
    while !ready(&map) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        map = h.changed.wait_timeout(map, left).unwrap().0;
    }
    true
}

unsafe extern "C" fn cb_get(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    timeout_ms: i64,
    out_value: *mut *mut u8,
    out_len: *mut usize,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `key` holds `key_len` bytes and both outputs are writable.
    unsafe {
        guarded(ctx, |h| {
            h.get_timeouts.lock().unwrap().push(timeout_ms);
            let k = bytes(key as *const u8, key_len).to_vec();
            if !wait_until(h, timeout_ms, |m| m.contains_key(&k)) {
                return fail(h, 2, "key did not appear");
            }
            let v = h.map.lock().unwrap()[&k].clone();
            *out_value = malloc_copy(&v);
            *out_len = v.len();
            0
        })
    }
}

unsafe extern "C" fn cb_add(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    delta: i64,
    out: *mut i64,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `key` holds `key_len` bytes and `out` is writable.
    unsafe {
        guarded(ctx, |h| {
            let k = bytes(key as *const u8, key_len).to_vec();
            let mut map = h.map.lock().unwrap();
            let old: i64 = match map.get(&k) {
                None => 0,
                Some(v) => match std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()) {
                    Some(n) => n,
                    None => return fail(h, 1, "value is not a number"),
                },
            };
            map.insert(k, (old + delta).to_string().into_bytes());
            h.changed.notify_all();
            *out = old + delta;
            0
        })
    }
}

unsafe extern "C" fn cb_check(
    ctx: *mut c_void,
    keys: *const *const c_char,
    key_lens: *const usize,
    n: usize,
    out: *mut bool,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `keys` and `key_lens` hold `n` spans and `out` is writable.
    unsafe {
        guarded(ctx, |h| {
            let keys = key_list(keys, key_lens, n);
            let map = h.map.lock().unwrap();
            *out = keys.iter().all(|k| map.contains_key(k));
            0
        })
    }
}

unsafe extern "C" fn cb_delete(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    out: *mut bool,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `key` holds `key_len` bytes and `out` is writable.
    unsafe {
        guarded(ctx, |h| {
            let k = bytes(key as *const u8, key_len);
            *out = h.map.lock().unwrap().remove(k).is_some();
            0
        })
    }
}

unsafe extern "C" fn cb_wait(
    ctx: *mut c_void,
    keys: *const *const c_char,
    key_lens: *const usize,
    n: usize,
    timeout_ms: i64,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `keys` and `key_lens` hold `n` spans.
    unsafe {
        guarded(ctx, |h| {
            let keys = key_list(keys, key_lens, n);
            if wait_until(h, timeout_ms, |m| keys.iter().all(|k| m.contains_key(k))) {
                0
            } else {
                fail(h, 2, "keys did not appear")
            }
        })
    }
}

unsafe extern "C" fn cb_num_keys(ctx: *mut c_void, out: *mut i64) -> c_int {
    // SAFETY: the library calls this as the vtable says: `out` is writable.
    unsafe {
        guarded(ctx, |h| {
            *out = h.map.lock().unwrap().len() as i64;
            0
        })
    }
}

unsafe extern "C" fn cb_compare_set(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    expected: *const u8,
    expected_len: usize,
    desired: *const u8,
    desired_len: usize,
    out_value: *mut *mut u8,
    out_len: *mut usize,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `key`, `expected` and `desired` hold their lengths in bytes and both outputs are writable.
    unsafe {
        guarded(ctx, |h| {
            let k = bytes(key as *const u8, key_len).to_vec();
            let (expected, desired) = (bytes(expected, expected_len), bytes(desired, desired_len));
            let mut map = h.map.lock().unwrap();
            let result = match map.get(&k) {
                Some(cur) if cur.as_slice() == expected => {
                    map.insert(k, desired.to_vec());
                    desired.to_vec()
                }
                Some(cur) => cur.clone(),
                None if expected.is_empty() => {
                    map.insert(k, desired.to_vec());
                    desired.to_vec()
                }
                None => expected.to_vec(),
            };
            *out_value = malloc_copy(&result);
            *out_len = result.len();
            0
        })
    }
}

unsafe extern "C" fn cb_append(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    value: *const u8,
    value_len: usize,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `key` and `value` hold `key_len` and `value_len` bytes for the call.
    unsafe {
        guarded(ctx, |h| {
            let k = bytes(key as *const u8, key_len).to_vec();
            let mut map = h.map.lock().unwrap();
            map.entry(k)
                .or_default()
                .extend_from_slice(bytes(value, value_len));
            h.changed.notify_all();
            0
        })
    }
}

unsafe extern "C" fn cb_multi_set(
    ctx: *mut c_void,
    keys: *const *const c_char,
    key_lens: *const usize,
    values: *const *const u8,
    value_lens: *const usize,
    n: usize,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: the four arrays hold `n` entries each, every span valid for its length.
    unsafe {
        guarded(ctx, |h| {
            let keys = key_list(keys, key_lens, n);
            let mut map = h.map.lock().unwrap();
            for (i, k) in keys.into_iter().enumerate() {
                map.insert(k, bytes(*values.add(i), *value_lens.add(i)).to_vec());
            }
            h.changed.notify_all();
            0
        })
    }
}

unsafe extern "C" fn cb_multi_get(
    ctx: *mut c_void,
    keys: *const *const c_char,
    key_lens: *const usize,
    n: usize,
    timeout_ms: i64,
    out_values: *mut *mut u8,
    out_lens: *mut usize,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: `keys` and `key_lens` hold `n` spans and both output arrays have `n` writable slots.
    unsafe {
        guarded(ctx, |h| {
            let keys = key_list(keys, key_lens, n);
            if !wait_until(h, timeout_ms, |m| keys.iter().all(|k| m.contains_key(k))) {
                return fail(h, 2, "keys did not appear");
            }
            let map = h.map.lock().unwrap();
            for (i, k) in keys.iter().enumerate() {
                *out_values.add(i) = malloc_copy(&map[k]);
                *out_lens.add(i) = map[k].len();
            }
            0
        })
    }
}

unsafe extern "C" fn cb_free_value(ctx: *mut c_void, p: *mut u8, _len: usize) {
    guarded(ctx, |h| {
        h.freed.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the library hands back each value once, and every value came from malloc_copy.
        unsafe { libc::free(p as *mut c_void) };
        0
    });
}

unsafe extern "C" fn cb_error_message(ctx: *mut c_void) -> *const c_char {
    // SAFETY: ctx is the test's Host; the CString stays in it until the next failure.
    let host = unsafe { &*(ctx as *const Host) };
    host.last_error.lock().unwrap().as_ptr()
}

fn required_only(host: &Arc<Host>) -> nvfipc_store_callbacks {
    nvfipc_store_callbacks {
        ctx: Arc::as_ptr(host) as *mut c_void,
        set: Some(cb_set),
        get: Some(cb_get),
        add: Some(cb_add),
        check: Some(cb_check),
        delete_key: Some(cb_delete),
        wait: Some(cb_wait),
        compare_set: None,
        append: None,
        num_keys: None,
        multi_set: None,
        multi_get: None,
        free_value: None,
        error_message: None,
    }
}

fn full(host: &Arc<Host>) -> nvfipc_store_callbacks {
    nvfipc_store_callbacks {
        compare_set: Some(cb_compare_set),
        append: Some(cb_append),
        num_keys: Some(cb_num_keys),
        multi_set: Some(cb_multi_set),
        multi_get: Some(cb_multi_get),
        free_value: Some(cb_free_value),
        error_message: Some(cb_error_message),
        ..required_only(host)
    }
}

#[test]
fn new_names_the_missing_required_callback() {
    let host = Arc::new(Host::default());
    type Clear = fn(&mut nvfipc_store_callbacks);
    let cases: [(&str, Clear); 6] = [
        ("set", |c| c.set = None),
        ("get", |c| c.get = None),
        ("add", |c| c.add = None),
        ("check", |c| c.check = None),
        ("delete_key", |c| c.delete_key = None),
        ("wait", |c| c.wait = None),
    ];
    for (name, clear) in cases {
        let mut cb = required_only(&host);
        clear(&mut cb);
        let err = CallbackStore::new(cb).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument);
        assert!(
            err.message.contains(&format!(".{name} is NULL")),
            "{}",
            err.message
        );
    }
    assert!(CallbackStore::new(required_only(&host)).is_ok());
}

#[test]
fn basic_operations_round_trip_binary_values() {
    let host = Arc::new(Host::default());
    let store = CallbackStore::new(full(&host)).unwrap();
    store.set("bin", b"\x00\xff\x00").unwrap();
    store.set("empty", b"").unwrap();
    assert_eq!(
        store.get("bin", Duration::from_secs(1)).unwrap(),
        b"\x00\xff\x00"
    );
    assert_eq!(store.get("empty", Duration::from_secs(1)).unwrap(), b"");
    assert_eq!(store.add("n", 3).unwrap(), 3);
    assert_eq!(store.add("n", -1).unwrap(), 2);
    assert_eq!(store.get("n", Duration::ZERO).unwrap(), b"2");
    assert!(store.check(&["bin", "n"]).unwrap());
    assert!(!store.check(&["bin", "missing"]).unwrap());
    assert!(store.check(&[]).unwrap());
    assert!(store.delete_key("n").unwrap());
    assert!(!store.delete_key("n").unwrap());
    assert_eq!(store.num_keys().unwrap(), 2);
    // Every non-empty returned value was released through free_value (one per get).
    assert_eq!(host.freed.load(Ordering::SeqCst), 2);
}

#[test]
fn compare_set_append_and_multi_ops_use_optional_callbacks() {
    let host = Arc::new(Host::default());
    let store = CallbackStore::new(full(&host)).unwrap();
    assert_eq!(store.compare_set("c", b"", b"v1").unwrap(), b"v1");
    assert_eq!(store.compare_set("c", b"v1", b"v2").unwrap(), b"v2");
    assert_eq!(store.compare_set("c", b"bad", b"zz").unwrap(), b"v2");
    assert_eq!(store.compare_set("m", b"e", b"x").unwrap(), b"e");
    assert!(!store.check(&["m"]).unwrap());
    store.append("a", b"x").unwrap();
    store.append("a", b"\x00y").unwrap();
    store
        .multi_set(&[("k1", b"1".as_slice()), ("k2", b"".as_slice())])
        .unwrap();
    let got = store
        .multi_get(&["a", "k1", "k2"], Duration::from_secs(1))
        .unwrap();
    assert_eq!(got, vec![b"x\x00y".to_vec(), b"1".to_vec(), Vec::new()]);
}

#[test]
fn missing_optional_callbacks_are_unsupported_or_emulated() {
    let host = Arc::new(Host::default());
    let store = CallbackStore::new(required_only(&host)).unwrap();
    for err in [
        store.compare_set("c", b"", b"v").unwrap_err(),
        store.append("a", b"x").unwrap_err(),
        store.num_keys().unwrap_err(),
    ] {
        assert_eq!(err.status, Status::Unsupported, "{err}");
    }
    // multi_set / multi_get fall back to set, and wait + get (values freed with free()).
    store
        .multi_set(&[("a", b"1".as_slice()), ("b", b"2".as_slice())])
        .unwrap();
    let got = store
        .multi_get(&["b", "a"], Duration::from_secs(1))
        .unwrap();
    assert_eq!(got, vec![b"2".to_vec(), b"1".to_vec()]);
    // The gets have what the wait left of the call's timeout, not all of it again.
    let gets = host.get_timeouts.lock().unwrap().clone();
    assert!(
        gets.len() == 2 && gets.iter().all(|&ms| ms < 1000),
        "{gets:?}"
    );
}

#[test]
fn wait_is_satisfied_by_another_thread() {
    let host = Arc::new(Host::default());
    let store = Arc::new(CallbackStore::new(full(&host)).unwrap());
    let setter = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            store.set("late", b"here").unwrap();
        })
    };
    store.wait(&["late"], Duration::from_secs(5)).unwrap();
    assert_eq!(store.get("late", Duration::ZERO).unwrap(), b"here");
    setter.join().unwrap();
}

#[test]
fn timeouts_and_failures_carry_status_and_host_message() {
    let host = Arc::new(Host::default());
    let store = CallbackStore::new(full(&host)).unwrap();
    let start = Instant::now();
    let err = store.get("never", Duration::from_millis(50)).unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    assert!(
        err.message.contains("key did not appear"),
        "{}",
        err.message
    );
    assert!(err.message.contains("\"never\""), "{}", err.message);
    assert!(start.elapsed() >= Duration::from_millis(50));
    let err = store.wait(&["x", "y"], Duration::ZERO).unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    let err = store.multi_get(&["x"], Duration::ZERO).unwrap_err();
    assert_eq!(err.status, Status::Timeout);

    store.set("word", b"abc").unwrap();
    let err = store.add("word", 1).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message.contains("value is not a number"),
        "{}",
        err.message
    );
    // Without error_message the code alone is reported.
    let bare = CallbackStore::new(required_only(&host)).unwrap();
    let err = bare.add("word", 1).unwrap_err();
    assert!(err.message.contains("code 1"), "{}", err.message);
}

#[test]
fn unknown_codes_map_to_io_and_known_ones_to_their_status() {
    assert_eq!(status_of(5), Status::NotFound);
    assert_eq!(status_of(2), Status::Timeout);
    assert_eq!(status_of(42), Status::Io);
    assert_eq!(status_of(-1), Status::Io);
    assert_eq!(timeout_ms(Duration::MAX), i64::MAX);
}

#[test]
fn concurrent_use_from_many_threads() {
    let host = Arc::new(Host::default());
    let store = Arc::new(CallbackStore::new(full(&host)).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for _ in 0..100 {
                    store.add("counter", 1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(store.get("counter", Duration::ZERO).unwrap(), b"400");
}

#[test]
fn liveness_follows_a_server_of_this_machine_and_is_unknown_elsewhere() {
    let host = Arc::new(Host::default());
    let store = CallbackStore::new(required_only(&host)).unwrap();
    assert_eq!(store.liveness(), Liveness::Unknown, "no address given");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    store.set_server_address("localhost", port);
    // The server runs in this process (a server of another process is `Alive`: see
    // tests/quiet_exit.rs); a client of this process is not another's.
    assert_eq!(store.liveness(), Liveness::ServedHere { other_clients: 0 });
    let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (accepted, _) = listener.accept().unwrap();
    assert_eq!(store.liveness(), Liveness::ServedHere { other_clients: 0 });
    drop((client, accepted));
    drop(listener);
    assert_eq!(
        store.liveness(),
        Liveness::Gone,
        "nothing listens on {port} any more"
    );
    // A server on another machine cannot be seen from here.
    store.set_server_address("192.0.2.1", port);
    assert_eq!(store.liveness(), Liveness::Unknown);
}

unsafe extern "C" fn cb_get_huge(
    ctx: *mut c_void,
    _key: *const c_char,
    _key_len: usize,
    _timeout_ms: i64,
    out_value: *mut *mut u8,
    out_len: *mut usize,
) -> c_int {
    // SAFETY: the library calls this as the vtable says: both outputs are writable.
    unsafe {
        guarded(ctx, |_| {
            *out_value = malloc_copy(b"x");
            *out_len = 1 << 40;
            0
        })
    }
}

#[test]
fn a_returned_length_above_the_limit_is_refused_unread_and_the_value_released() {
    let host = Arc::new(Host::default());
    let store = CallbackStore::new(nvfipc_store_callbacks {
        get: Some(cb_get_huge),
        ..full(&host)
    })
    .unwrap();
    let err = store.get("k", Duration::ZERO).unwrap_err();
    assert_eq!(err.status, Status::Protocol);
    assert!(
        err.message.contains("a value of 1099511627776 bytes"),
        "{}",
        err.message
    );
    assert_eq!(host.freed.load(Ordering::SeqCst), 1);
}
