//! Tests of the key store: admission through a caller, the rejection
//! counter, and reloads that keep the old keys when the file is bad.

use std::sync::Mutex;

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

use super::*;
use crate::keys::hash_key;

/// Each increment: the counter's name, its labels and the amount.
type Seen = Arc<Mutex<Vec<(String, Vec<(String, String)>, u64)>>>;

/// Records the counters incremented, by name and labels.
#[derive(Default)]
struct Counts(Seen);

struct One(Seen, Key);

impl CounterFn for One {
    fn increment(&self, value: u64) {
        let labels = self
            .1
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect();
        lock(&self.0).push((self.1.name().to_string(), labels, value));
    }
    fn absolute(&self, _: u64) {}
}

impl Recorder for Counts {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(One(self.0.clone(), key.clone())))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn file(dir: &std::path::Path, tenant: &str, rpm: u64, key: &str) -> PathBuf {
    let path = dir.join("keys.toml");
    let text = format!(
        "[tenants.{tenant}]\nrequests_per_minute = {rpm}\n[[keys]]\nsha256 = \"{}\"\ntenant = \"{tenant}\"\n",
        hash_key(key)
    );
    std::fs::write(&path, text).expect("write keys file");
    path
}

fn caller(store: &Arc<KeyStore>, key: &str) -> Option<Caller> {
    store.current().find(key).map(|policy| Caller {
        policy,
        store: store.clone(),
    })
}

#[test]
fn a_refusal_counts_a_rejection_by_tenant_and_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = KeyStore::open(file(dir.path(), "acme", 1, "k1")).expect("valid file");
    let c = caller(&store, "k1").expect("known key");
    let counts = Counts::default();
    let seen = counts.0.clone();
    metrics::with_local_recorder(&counts, || {
        let first = c.admit(10).expect("first request");
        assert_eq!(
            first.headers()[..2],
            [
                ("x-ratelimit-limit-requests", "1".to_string()),
                ("x-ratelimit-remaining-requests", "0".to_string()),
            ]
        );
        drop(first);
        let refused = c.admit(10).err().expect("over the minute's requests");
        assert!(
            matches!(refused, ServiceError::RateLimited(ref r) if r.limit == "requests_per_minute")
        );
    });
    let seen = lock(&seen).clone();
    assert_eq!(
        seen,
        vec![(
            "gyre:rate_limit_rejections_total".to_string(),
            vec![
                ("tenant".to_string(), "acme".to_string()),
                ("limit".to_string(), "requests_per_minute".to_string()),
            ],
            1
        )]
    );
}

#[test]
fn a_bad_reload_keeps_the_keys_and_a_good_one_replaces_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = file(dir.path(), "acme", 5, "k1");
    let store = KeyStore::open(path.clone()).expect("valid file");
    std::fs::write(&path, "not [toml").expect("write");
    assert!(!store.reload("test"));
    assert!(caller(&store, "k1").is_some());
    file(dir.path(), "acme", 5, "k2");
    assert!(store.reload("test"));
    assert!(caller(&store, "k1").is_none());
    assert!(caller(&store, "k2").is_some());
}

#[test]
fn counters_survive_a_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = file(dir.path(), "acme", 1, "k1");
    let store = KeyStore::open(path).expect("valid file");
    drop(caller(&store, "k1").expect("k1").admit(0).expect("first"));
    file(dir.path(), "acme", 1, "k2");
    assert!(store.reload("test"));
    // The same tenant under a new key: its minute is used up already.
    assert!(caller(&store, "k2").expect("k2").admit(0).is_err());
}

#[test]
fn an_admission_never_submitted_settles_to_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("keys.toml");
    std::fs::write(
        &path,
        format!(
            "[tenants.t]\ntokens_per_minute = 100\n[[keys]]\nsha256 = \"{}\"\ntenant = \"t\"\n",
            hash_key("k")
        ),
    )
    .expect("write");
    let store = KeyStore::open(path).expect("valid file");
    let c = caller(&store, "k").expect("known key");
    drop(c.admit(100).expect("fits"));
    // Nothing was used: the whole limit is there again.
    let a = c.admit(100).expect("fits again");
    a.submitted(30);
    for _ in 0..10 {
        a.generated();
    }
    drop(a);
    // 40 used: 60 fit, 61 do not.
    assert!(c.admit(61).is_err());
    assert!(c.admit(60).is_ok());
}
