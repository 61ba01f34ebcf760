use super::*;
use crate::store::memory::MemoryStore;

#[test]
fn unread_keys_are_deleted_once_they_arrive() {
    let store = Arc::new(MemoryStore::new());
    let deleted = Arc::new(AtomicU64::new(0));
    let mut c = Collector::start(store.clone(), deleted.clone()).unwrap();
    store.set("read", b"1").unwrap();
    c.delete(vec!["read".into()]);
    c.delete_when_written(vec!["late".into()]);
    std::thread::sleep(RETRY * 4);
    store.set("late", b"1").unwrap();
    c.finish();
    assert!(!store.check(&["read"]).unwrap());
    assert!(!store.check(&["late"]).unwrap(), "deleted once it arrived");
    assert_eq!(deleted.load(Ordering::Relaxed), 2);
}

/// A memory store whose deletes wait until the test lets them go.
struct Gated {
    inner: MemoryStore,
    entered: crossbeam::channel::Sender<()>,
    gate: crossbeam::channel::Receiver<()>,
}

impl Store for Gated {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(key, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(key, delta)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.inner.check(keys)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.inner.wait(keys, timeout)
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        let _ = self.entered.send(());
        let _ = self.gate.recv();
        self.inner.delete_key(key)
    }
    fn num_keys(&self) -> Result<i64> {
        self.inner.num_keys()
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.inner.compare_set(key, expected, desired)
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.append(key, value)
    }
}

#[test]
fn an_abandoned_collector_deletes_nothing_more() {
    let (open, gate) = crossbeam::channel::unbounded();
    let (entered, entering) = crossbeam::channel::unbounded();
    let store = Arc::new(Gated {
        inner: MemoryStore::new(),
        entered,
        gate,
    });
    for key in ["under-way", "queued", "late"] {
        store.set(key, b"1").unwrap();
    }
    let deleted = Arc::new(AtomicU64::new(0));
    let mut c = Collector::start(store.clone(), deleted.clone()).unwrap();
    // The first delete is under way (held at the gate) while the others wait behind it.
    c.delete(vec!["under-way".into()]);
    c.delete(vec!["queued".into()]);
    c.delete_when_written(vec!["late".into()]);
    entering.recv().unwrap();
    let abandoned = c.abandoned.clone();
    let closing = std::thread::spawn(move || c.abandon());
    while !abandoned.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    open.send(()).unwrap();
    closing.join().unwrap();
    assert!(
        !store.check(&["under-way"]).unwrap(),
        "the delete under way ends"
    );
    assert!(
        store.check(&["queued", "late"]).unwrap(),
        "nothing more is deleted"
    );
    assert_eq!(deleted.load(Ordering::Relaxed), 1);
}
