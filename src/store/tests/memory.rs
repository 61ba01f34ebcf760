//! A thread-safe in-memory [`Store`] with c10d semantics (blocking waits, counters,
//! compare-and-set), the one store every unit test of the layers above uses when it needs no
//! network. Compiled for tests only.

use crate::error::{Error, Result};
use crate::store::{Liveness, Store};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.map.lock().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }
}

impl Store for MemoryStore {
    fn liveness(&self) -> Liveness {
        // In this process: there as long as it is.
        Liveness::Alive
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.map
            .lock()
            .unwrap()
            .insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait(&[key], timeout)?;
        Ok(self.map.lock().unwrap()[key].clone())
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut map = self.map.lock().unwrap();
        let old = map
            .get(key)
            .map(|v| String::from_utf8_lossy(v).parse::<i64>().unwrap())
            .unwrap_or(0);
        map.insert(key.to_string(), (old + delta).to_string().into_bytes());
        self.changed.notify_all();
        Ok(old + delta)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        let map = self.map.lock().unwrap();
        Ok(keys.iter().all(|k| map.contains_key(*k)))
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut map = self.map.lock().unwrap();
        loop {
            if keys.iter().all(|k| map.contains_key(*k)) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::timeout(format!("wait timeout, keys: {keys:?}")));
            }
            map = self.changed.wait_timeout(map, deadline - now).unwrap().0;
        }
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.map.lock().unwrap().remove(key).is_some())
    }
    fn num_keys(&self) -> Result<i64> {
        Ok(self.map.lock().unwrap().len() as i64)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let mut map = self.map.lock().unwrap();
        let result = match map.get(key) {
            None if expected.is_empty() => {
                map.insert(key.to_string(), desired.to_vec());
                desired.to_vec()
            }
            None => expected.to_vec(),
            Some(current) if current.as_slice() == expected => {
                map.insert(key.to_string(), desired.to_vec());
                desired.to_vec()
            }
            Some(current) => current.clone(),
        };
        self.changed.notify_all();
        Ok(result)
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.map
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .extend_from_slice(value);
        self.changed.notify_all();
        Ok(())
    }
}
