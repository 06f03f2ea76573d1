//! The store on its own: round trips, chains, pages, bounds, recovery,
//! tenants.

use super::*;
use gyre_api::v1::{MessageItem, item::Item as It};

/// The tenant the tests store under.
const T: &str = "tenant-a";

fn resp(id: &str, status: &str, created_at: i64) -> Response {
    Response {
        id: id.into(),
        status: status.into(),
        created_at,
        ..Default::default()
    }
}

fn msg(id: &str) -> Item {
    Item {
        id: id.into(),
        status: "completed".into(),
        item: Some(It::Message(MessageItem {
            role: "user".into(),
            content: Vec::new(),
        })),
    }
}

fn cfg(dir: Option<PathBuf>, max_entries: u64, max_age: u64) -> StoreConfig {
    StoreConfig {
        dir,
        max_entries,
        max_age: Duration::from_secs(max_age),
    }
}

#[test]
fn responses_round_trip_and_chain_in_order() {
    let s = Store::open(StoreConfig::default()).expect("open");
    let mut a = resp("resp_a", "in_progress", now());
    s.insert_response(&a, None, &[msg("in_1")], &[], T)
        .expect("insert");
    a.status = "completed".into();
    a.output.push(msg("msg_a"));
    s.update_response(&a, &[], None).expect("update");
    let b = Response {
        output: vec![msg("msg_b")],
        ..resp("resp_b", "completed", now())
    };
    s.insert_response(&b, Some("resp_a"), &[msg("in_2")], &[], T)
        .expect("insert");
    let got = s.get_response("resp_a", T).expect("get").expect("stored");
    assert_eq!(got.response, a);
    let ids: Vec<String> = s
        .history("resp_b", T)
        .expect("history")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, ["in_1", "msg_a", "in_2", "msg_b"]);
    assert!(s.delete_response("resp_a", T).expect("delete"));
    assert!(!s.delete_response("resp_a", T).expect("delete again"));
    assert!(s.input_items("resp_a").expect("items").is_empty());
}

#[test]
fn pages_go_both_ways_with_has_more() {
    let s = Store::open(StoreConfig::default()).expect("open");
    let items: Vec<Item> = (0..5).map(|i| msg(&format!("in_{i}"))).collect();
    s.insert_response(&resp("r", "completed", now()), None, &items, &[], T)
        .expect("insert");
    let of = Owner::Response("r".into());
    let ids = |p: (Vec<Item>, bool)| (p.0.into_iter().map(|i| i.id).collect::<Vec<_>>(), p.1);
    let p = s.page(&of, None, 2, false).expect("page").expect("some");
    assert_eq!(ids(p), (vec!["in_0".to_string(), "in_1".into()], true));
    let p = s
        .page(&of, Some("in_1"), 10, false)
        .expect("page")
        .expect("some");
    assert_eq!(
        ids(p),
        (
            vec!["in_2".to_string(), "in_3".into(), "in_4".into()],
            false
        )
    );
    let p = s
        .page(&of, Some("in_3"), 2, true)
        .expect("page")
        .expect("some");
    assert_eq!(ids(p), (vec!["in_2".to_string(), "in_1".into()], true));
    assert!(s.page(&of, Some("nope"), 2, true).expect("page").is_none());
}

/// Items sharing an id (stored before duplicates were refused) cannot
/// make a page after that id come back to it: paging ends, both ways.
#[test]
fn pages_after_a_repeated_id_never_repeat() {
    let s = Store::open(StoreConfig::default()).expect("open");
    let items = [msg("a"), msg("d"), msg("d"), msg("z")];
    s.insert_response(&resp("r", "completed", now()), None, &items, &[], T)
        .expect("insert");
    let of = Owner::Response("r".into());
    for desc in [false, true] {
        let (mut after, mut seen) = (None::<String>, Vec::new());
        loop {
            let (page, more) = s
                .page(&of, after.as_deref(), 1, desc)
                .expect("page")
                .expect("some");
            seen.extend(page.iter().map(|i| i.id.clone()));
            assert!(seen.len() <= items.len(), "desc {desc}: {seen:?}");
            if !more {
                break;
            }
            after = page.last().map(|i| i.id.clone());
        }
        let want: &[&str] = if desc {
            &["z", "d", "a"]
        } else {
            &["a", "d", "z"]
        };
        assert_eq!(seen, want, "desc {desc}");
    }
}

#[test]
fn bounds_evict_the_oldest_finished_never_running_ones() {
    let s = Store::open(cfg(None, 2, 1000)).expect("open");
    let t = now();
    s.insert_response(&resp("running", "in_progress", t), None, &[], &[], T)
        .expect("insert");
    for id in ["old", "mid", "new"] {
        s.insert_response(&resp(id, "completed", t), None, &[], &[], T)
            .expect("insert");
    }
    let have = |id: &str| s.get_response(id, T).expect("get").is_some();
    assert!(have("running"), "running ones are never evicted");
    assert!(
        !have("old") && !have("mid"),
        "oldest finished evicted first"
    );
    assert!(have("new"));
    // Age: as of a time past the bound, only the running one stays.
    s.evict_at(t + 1001).expect("evict");
    assert!(have("running") && !have("new"));
}

#[test]
fn a_gone_owners_running_responses_fail_on_open() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let s = Store::open(cfg(Some(dir.path().into()), 10, 1000)).expect("open");
        s.insert_response(&resp("r", "in_progress", now()), None, &[], &[], T)
            .expect("insert");
        // A second process sharing the directory leaves it alone while
        // the first lives.
        let other = Store::open(cfg(Some(dir.path().into()), 10, 1000)).expect("open 2");
        let r = other.get_response("r", T).expect("get").expect("stored");
        assert_eq!(r.response.status, "in_progress");
    }
    let s = Store::open(cfg(Some(dir.path().into()), 10, 1000)).expect("reopen");
    let r = s
        .get_response("r", T)
        .expect("get")
        .expect("stored")
        .response;
    assert_eq!(r.status, "failed");
    assert_eq!(r.error.expect("error").code, "server_restarted");
    let events = s.events_after("r", None).expect("events");
    assert!(matches!(
        events.last().and_then(|e| e.event.as_ref()),
        Some(response_event::Event::Failed(_))
    ));
}

#[test]
fn conversations_keep_items_in_order() {
    let s = Store::open(StoreConfig::default()).expect("open");
    let c = Conversation {
        id: "conv_1".into(),
        created_at: now(),
        ..Default::default()
    };
    s.insert_conversation(&c, &[msg("a")], T).expect("insert");
    let r = resp("r", "completed", now());
    s.insert_response(&r, None, &[], &[], T).expect("insert");
    s.update_response(&r, &[], Some(("conv_1", &[msg("b"), msg("c")])))
        .expect("append");
    let ids: Vec<String> = s
        .conversation_items("conv_1")
        .expect("items")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(s.delete_conversation("conv_1", T).expect("delete"));
    assert!(s.get_conversation("conv_1", T).expect("get").is_none());
    // Appending to a deleted conversation is no error.
    s.update_response(&r, &[], Some(("conv_1", &[msg("d")])))
        .expect("append to deleted");
}

#[test]
fn another_tenants_rows_read_as_unknown() {
    let s = Store::open(StoreConfig::default()).expect("open");
    s.insert_response(
        &resp("resp_a", "completed", now()),
        None,
        &[msg("in_1")],
        &[],
        T,
    )
    .expect("insert");
    s.insert_response(
        &resp("resp_b", "completed", now()),
        Some("resp_a"),
        &[msg("in_2")],
        &[],
        "tenant-b",
    )
    .expect("insert");
    assert!(s.get_response("resp_a", "tenant-b").expect("get").is_none());
    assert!(!s.delete_response("resp_a", "tenant-b").expect("delete"));
    assert!(s.get_response("resp_a", T).expect("get").is_some());
    // A chain never crosses into another tenant's responses.
    let ids: Vec<String> = s
        .history("resp_b", "tenant-b")
        .expect("history")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, ["in_2"]);
    let c = Conversation {
        id: "conv_1".into(),
        created_at: now(),
        ..Default::default()
    };
    s.insert_conversation(&c, &[msg("a")], T).expect("insert");
    assert!(
        s.get_conversation("conv_1", "tenant-b")
            .expect("get")
            .is_none()
    );
    assert!(!s.delete_conversation("conv_1", "tenant-b").expect("delete"));
    assert!(s.get_conversation("conv_1", T).expect("get").is_some());
}

#[test]
fn a_store_from_before_tenants_opens_with_its_rows_anonymous() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        // The tables as they were before the tenant column.
        let conn = Connection::open(dir.path().join("responses.sqlite3")).expect("db");
        conn.execute_batch(
            "CREATE TABLE responses(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
               created_at INTEGER NOT NULL, status TEXT NOT NULL, owner TEXT NOT NULL,
               previous_id TEXT, body BLOB NOT NULL);
             CREATE TABLE conversations(seq INTEGER PRIMARY KEY AUTOINCREMENT,
               id TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL, body BLOB NOT NULL);",
        )
        .expect("old schema");
        let r = resp("resp_old", "completed", now());
        conn.execute(
            "INSERT INTO responses(id, created_at, status, owner, body) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![r.id, r.created_at, r.status, "gone", r.encode_to_vec()],
        )
        .expect("old row");
    }
    let s = Store::open(cfg(Some(dir.path().into()), 10, 1000)).expect("open");
    assert!(
        s.get_response("resp_old", "anonymous")
            .expect("get")
            .is_some()
    );
    assert!(s.get_response("resp_old", T).expect("get").is_none());
    s.insert_response(&resp("resp_new", "completed", now()), None, &[], &[], T)
        .expect("insert after migration");
}
