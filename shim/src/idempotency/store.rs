//! The keys of [`super`]: a map from scope hash to the running request or
//! its stored answer, bounded by keys and bytes, expired lazily.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::body::Bytes;
use http::{HeaderMap, StatusCode};

use super::Settings;

pub(super) type Hash = [u8; 32];

pub(super) struct Stored {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    expires: Instant,
}

impl Stored {
    fn size(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len())
                .sum::<usize>()
    }
}

enum KeyState {
    Running(u64),
    Done(Arc<Stored>),
}

struct Entry {
    fingerprint: Hash,
    state: KeyState,
    /// Insertion order, for eviction.
    seq: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Hash, Entry>,
    bytes: usize,
    next: u64,
}

/// The keys (see the module docs). Cheap to share behind an `Arc`.
pub struct Store {
    settings: Settings,
    inner: Mutex<Inner>,
}

pub(super) enum Lookup {
    Replay(Arc<Stored>),
    InUse,
    Reused,
    Full,
    Started(u64),
}

impl Store {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn begin(&self, scope: Hash, fingerprint: Hash) -> Lookup {
        let now = Instant::now();
        let mut inner = self.lock();
        let expired = |e: &Entry| matches!(&e.state, KeyState::Done(s) if s.expires <= now);
        if let Some(entry) = inner.map.get(&scope).filter(|e| !expired(e)) {
            if entry.fingerprint != fingerprint {
                return Lookup::Reused;
            }
            return match &entry.state {
                KeyState::Running(_) => Lookup::InUse,
                KeyState::Done(stored) => Lookup::Replay(stored.clone()),
            };
        }
        inner.remove(&scope);
        inner.evict_expired(now);
        if inner.map.len() >= self.settings.max_keys.max(1) && !inner.evict_oldest() {
            return Lookup::Full;
        }
        let id = inner.next;
        inner.next += 1;
        inner.map.insert(
            scope,
            Entry {
                fingerprint,
                state: KeyState::Running(id),
                seq: id,
            },
        );
        Lookup::Started(id)
    }

    /// Forgets `scope` if it still holds the running request `id`.
    pub(super) fn abandon(&self, scope: &Hash, id: u64) {
        let mut inner = self.lock();
        if matches!(inner.map.get(scope), Some(Entry { state: KeyState::Running(r), .. }) if *r == id)
        {
            inner.remove(scope);
        }
    }

    /// Stores the answer of the running request `id`.
    pub(super) fn finish(
        &self,
        scope: &Hash,
        id: u64,
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    ) {
        let stored = Stored {
            status,
            headers,
            body,
            expires: Instant::now() + self.settings.ttl,
        };
        let size = stored.size();
        let mut inner = self.lock();
        let Some(entry) = inner.map.get_mut(scope) else {
            return;
        };
        if !matches!(entry.state, KeyState::Running(r) if r == id) {
            return;
        }
        if size > self.settings.max_bytes {
            inner.remove(scope);
            return;
        }
        entry.state = KeyState::Done(Arc::new(stored));
        inner.bytes += size;
        while inner.bytes > self.settings.max_bytes && inner.evict_oldest() {}
    }

    /// Keys held (running and stored).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    fn remove(&mut self, scope: &Hash) {
        if let Some(Entry {
            state: KeyState::Done(s),
            ..
        }) = self.map.remove(scope)
        {
            self.bytes = self.bytes.saturating_sub(s.size());
        }
    }

    fn evict_expired(&mut self, now: Instant) {
        let gone: Vec<Hash> = self
            .map
            .iter()
            .filter(|(_, e)| matches!(&e.state, KeyState::Done(s) if s.expires <= now))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// Drops the oldest stored answer; false when none is stored.
    fn evict_oldest(&mut self) -> bool {
        let oldest = self
            .map
            .iter()
            .filter(|(_, e)| matches!(e.state, KeyState::Done(_)))
            .min_by_key(|(_, e)| e.seq)
            .map(|(k, _)| *k);
        match oldest {
            Some(k) => {
                self.remove(&k);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn store(max_keys: usize, max_bytes: usize) -> Store {
        Store::new(Settings {
            ttl: Duration::from_secs(60),
            max_keys,
            max_bytes,
        })
    }

    fn done(s: &Store, scope: u8, body: &'static [u8]) {
        let Lookup::Started(id) = s.begin([scope; 32], [0; 32]) else {
            panic!("key {scope} should start");
        };
        s.finish(
            &[scope; 32],
            id,
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(body),
        );
    }

    #[test]
    fn running_reused_replayed_and_abandoned() {
        let s = store(10, 1 << 20);
        let Lookup::Started(id) = s.begin([1; 32], [7; 32]) else {
            panic!("first use starts");
        };
        assert!(matches!(s.begin([1; 32], [7; 32]), Lookup::InUse));
        assert!(matches!(s.begin([1; 32], [8; 32]), Lookup::Reused));
        s.abandon(&[1; 32], id);
        assert!(s.is_empty());
        let Lookup::Started(id) = s.begin([1; 32], [8; 32]) else {
            panic!("a freed key starts again, with any body");
        };
        s.finish(
            &[1; 32],
            id,
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"x"),
        );
        assert!(matches!(s.begin([1; 32], [8; 32]), Lookup::Replay(r) if r.body == "x"));
        // Abandoning a stored answer's old id changes nothing.
        s.abandon(&[1; 32], id);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn bounded_by_keys_and_bytes() {
        let s = store(2, 1 << 20);
        done(&s, 1, b"a");
        done(&s, 2, b"b");
        done(&s, 3, b"c");
        assert_eq!(s.len(), 2);
        assert!(
            matches!(s.begin([1; 32], [0; 32]), Lookup::Started(_)),
            "oldest evicted"
        );
        // Two running keys fill the store: a third is refused.
        let s = store(2, 1 << 20);
        assert!(matches!(s.begin([1; 32], [0; 32]), Lookup::Started(_)));
        assert!(matches!(s.begin([2; 32], [0; 32]), Lookup::Started(_)));
        assert!(matches!(s.begin([3; 32], [0; 32]), Lookup::Full));
        let s = store(10, 5);
        done(&s, 1, b"aaa");
        done(&s, 2, b"bbb");
        assert_eq!(s.len(), 1, "over the byte budget the oldest goes");
        done(&s, 3, b"cccccc");
        assert!(
            matches!(s.begin([3; 32], [0; 32]), Lookup::Started(_)),
            "an answer over the whole budget is not kept"
        );
    }

    #[test]
    fn expired_keys_start_again() {
        let s = Store::new(Settings {
            ttl: Duration::ZERO,
            max_keys: 10,
            max_bytes: 1 << 20,
        });
        done(&s, 1, b"a");
        assert!(matches!(s.begin([1; 32], [9; 32]), Lookup::Started(_)));
    }
}
