//! The life of stored responses over real loopback gRPC against the real
//! server (tiny fixture model, in-memory store):
//! - background: detached from the call, pollable, cancellable, replayable
//!   while it runs; without background, dropping the call cancels;
//! - input items paginate both ways; `store: false` stores nothing; the
//!   store's count bound evicts the oldest; Delete;
//! - conversations collect input and output, and later turns read them.

mod responses_util;

use gyre_api::v1::{
    self, CreateConversationRequest, CreateResponseRequest, GetResponseRequest, Item, Items,
    ListConversationItemsRequest, ListInputItemsRequest, ReplayResponseRequest, content_part::Part,
    create_response_request::Input, item::Item as It, response_event::Event as Ev,
};
use gyre_service::responses::StoreConfig;
use responses_util::{Server, bad_field, check_stream, collect, kind, text, user, wait_for};
use tonic::Code;

#[tokio::test]
async fn background_runs_detached_pollable_and_cancellable() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    // Detached: the stream is dropped after its first events, the
    // response still completes.
    let short = CreateResponseRequest {
        background: Some(true),
        ..text("Count with me", 4)
    };
    let mut s = c.create(short).await.expect("create").into_inner();
    let first = s.message().await.expect("event").expect("created");
    let second = s.message().await.expect("event").expect("queued");
    drop(s);
    let r = match first.event {
        Some(Ev::Created(r)) => r,
        e => panic!("{e:?}"),
    };
    assert_eq!(r.status, "queued");
    assert_eq!(kind(&second), "queued");
    let done = wait_for(&mut c, &r.id, |r| {
        r.status != "queued" && r.status != "in_progress"
    })
    .await;
    assert!(
        done.status == "completed" || done.status == "incomplete",
        "{done:?}"
    );
    assert!(!done.output.is_empty());

    // A long one: replayed live, then cancelled.
    let long = CreateResponseRequest {
        background: Some(true),
        temperature: Some(1.0),
        ..text("Tell me a long story", 100_000)
    };
    let mut s = c.create(long).await.expect("create").into_inner();
    let id = match s.message().await.expect("event").and_then(|e| e.event) {
        Some(Ev::Created(r)) => r.id,
        e => panic!("{e:?}"),
    };
    drop(s);
    let mut live = c
        .replay(ReplayResponseRequest {
            response_id: id.clone(),
            starting_after: Some(1),
        })
        .await
        .expect("replay")
        .into_inner();
    let e = live.message().await.expect("event").expect("one");
    assert_eq!(e.sequence_number, 2);
    let running = wait_for(&mut c, &id, |r| r.status == "in_progress").await;
    assert_eq!(running.id, id);
    let cancelled = c
        .cancel(v1::CancelResponseRequest {
            response_id: id.clone(),
        })
        .await
        .expect("cancel")
        .into_inner();
    assert_eq!(cancelled.status, "cancelled");
    // The live replay ends, its numbers running on by one.
    let mut last = e.sequence_number;
    while let Some(e) = live.message().await.expect("replay stays healthy") {
        assert_eq!(e.sequence_number, last + 1);
        last = e.sequence_number;
    }
    let got = c
        .get(GetResponseRequest {
            response_id: id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.status, "cancelled");
    // Cancelling again returns it unchanged.
    let again = c
        .cancel(v1::CancelResponseRequest { response_id: id })
        .await
        .expect("cancel again")
        .into_inner();
    assert_eq!(again, got);
    server.stop().await;
}

#[tokio::test]
async fn dropping_a_foreground_stream_cancels_it() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let long = CreateResponseRequest {
        temperature: Some(1.0),
        ..text("Tell me a long story", 100_000)
    };
    let mut s = c.create(long).await.expect("create").into_inner();
    let id = match s.message().await.expect("event").and_then(|e| e.event) {
        Some(Ev::Created(r)) => r.id,
        e => panic!("{e:?}"),
    };
    // Not background: Cancel is refused.
    let err = c
        .cancel(v1::CancelResponseRequest {
            response_id: id.clone(),
        })
        .await
        .expect_err("not background");
    assert_eq!(err.code(), Code::FailedPrecondition);
    drop(s);
    let r = wait_for(&mut c, &id, |r| r.status == "cancelled").await;
    // OpenAI's completed_at is there only when the status is completed.
    assert_eq!(r.completed_at, None);
    server.stop().await;
}

#[tokio::test]
async fn input_items_paginate_both_ways() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let items: Vec<Item> = (0..5).map(|i| user(&format!("message {i}"))).collect();
    let req = CreateResponseRequest {
        input: Some(Input::Items(Items { items })),
        ..text("", 2)
    };
    let resp = check_stream(&collect(c.create(req).await.expect("create").into_inner()).await);
    let list =
        |after: Option<String>, limit: Option<u32>, order: Option<&str>| ListInputItemsRequest {
            response_id: resp.id.clone(),
            after,
            limit,
            order: order.map(str::to_string),
        };
    let texts = |l: &v1::ItemList| -> Vec<String> {
        l.data
            .iter()
            .map(|i| match &i.item {
                Some(It::Message(m)) => match &m.content[0].part {
                    Some(Part::InputText(t)) => t.clone(),
                    p => panic!("{p:?}"),
                },
                i => panic!("{i:?}"),
            })
            .collect()
    };
    let page = c
        .list_input_items(list(None, Some(2), Some("asc")))
        .await
        .expect("page")
        .into_inner();
    assert_eq!(texts(&page), ["message 0", "message 1"]);
    assert!(page.has_more);
    assert!(page.data.iter().all(|i| i.id.starts_with("in_")));
    let next = c
        .list_input_items(list(Some(page.data[1].id.clone()), Some(100), Some("asc")))
        .await
        .expect("page")
        .into_inner();
    assert_eq!(texts(&next), ["message 2", "message 3", "message 4"]);
    assert!(!next.has_more);
    // Default order is newest first.
    let desc = c
        .list_input_items(list(None, Some(2), None))
        .await
        .expect("page")
        .into_inner();
    assert_eq!(texts(&desc), ["message 4", "message 3"]);
    for (bad, field) in [
        (list(None, Some(0), None), "limit"),
        (list(None, Some(101), None), "limit"),
        (list(None, None, Some("up")), "order"),
        (list(Some("in_nope".into()), None, None), "after"),
    ] {
        let e = c.list_input_items(bad).await.expect_err("bad");
        assert_eq!(e.code(), Code::InvalidArgument, "{field}");
        assert_eq!(bad_field(&e), field);
    }
    let e = c
        .list_input_items(ListInputItemsRequest {
            response_id: "resp_nope".into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    server.stop().await;
}

#[tokio::test]
async fn store_false_writes_nothing_and_bounds_evict_the_oldest() {
    let server = Server::start(StoreConfig {
        max_entries: 2,
        ..StoreConfig::default()
    })
    .await;
    let mut c = server.client().await;
    let unstored = CreateResponseRequest {
        store: Some(false),
        ..text("hi", 2)
    };
    let events = collect(c.create(unstored).await.expect("create").into_inner()).await;
    let id = check_stream(&events).id;
    let get = |id: &str| GetResponseRequest {
        response_id: id.to_string(),
    };
    assert_eq!(
        c.get(get(&id)).await.expect_err("not stored").code(),
        Code::NotFound
    );
    let replay = ReplayResponseRequest {
        response_id: id.clone(),
        starting_after: None,
    };
    assert_eq!(
        c.replay(replay).await.err().map(|e| e.code()),
        Some(Code::NotFound)
    );
    let chained = CreateResponseRequest {
        previous_response_id: Some(id.clone()),
        ..text("more", 2)
    };
    let e = c.create(chained).await.expect_err("unknown previous");
    assert_eq!(
        (e.code(), bad_field(&e).as_str()),
        (Code::NotFound, "previous_response_id")
    );

    let mut ids = Vec::new();
    for i in 0..3 {
        let events = collect(
            c.create(text(&format!("n{i}"), 2))
                .await
                .expect("create")
                .into_inner(),
        )
        .await;
        ids.push(check_stream(&events).id);
    }
    assert_eq!(
        c.get(get(&ids[0])).await.expect_err("evicted").code(),
        Code::NotFound
    );
    for id in &ids[1..] {
        c.get(get(id)).await.expect("kept");
    }
    // Delete, then it is gone.
    let d = c
        .delete(v1::DeleteResponseRequest {
            response_id: ids[2].clone(),
        })
        .await
        .expect("delete")
        .into_inner();
    assert!(d.deleted);
    assert_eq!(
        c.get(get(&ids[2])).await.expect_err("deleted").code(),
        Code::NotFound
    );
    let again = c
        .delete(v1::DeleteResponseRequest {
            response_id: ids[2].clone(),
        })
        .await
        .expect_err("already deleted");
    assert_eq!(again.code(), Code::NotFound);
    server.stop().await;
}

#[tokio::test]
async fn conversations_collect_input_and_output() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let conv = c
        .create_conversation(CreateConversationRequest {
            items: vec![user("first")],
            metadata: [("topic".to_string(), "tests".to_string())].into(),
        })
        .await
        .expect("create")
        .into_inner();
    assert!(conv.id.starts_with("conv_"));
    let req = CreateResponseRequest {
        conversation: Some(conv.id.clone()),
        ..text("second", 3)
    };
    let count = c
        .count_input_tokens(req.clone())
        .await
        .expect("count")
        .into_inner()
        .input_tokens;
    let resp = check_stream(&collect(c.create(req).await.expect("create").into_inner()).await);
    assert_eq!(resp.usage.expect("usage").input_tokens, count);
    let items = c
        .list_conversation_items(ListConversationItemsRequest {
            conversation_id: conv.id.clone(),
            order: Some("asc".into()),
            ..Default::default()
        })
        .await
        .expect("items")
        .into_inner();
    // The first item, the input, then the output.
    assert_eq!(items.data.len(), 2 + resp.output.len());
    assert_eq!(items.data[0].item, user("first").item);
    assert_eq!(items.data[1].item, user("second").item);
    assert_eq!(items.data[2..], resp.output[..]);
    // A second turn sees both earlier turns.
    let next = CreateResponseRequest {
        conversation: Some(conv.id.clone()),
        ..text("third", 2)
    };
    let more = c
        .count_input_tokens(next)
        .await
        .expect("count")
        .into_inner()
        .input_tokens;
    assert!(more > count);
    let got = c
        .get_conversation(v1::GetConversationRequest {
            conversation_id: conv.id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got, conv);
    c.delete_conversation(v1::DeleteConversationRequest {
        conversation_id: conv.id.clone(),
    })
    .await
    .expect("delete");
    let e = c
        .get_conversation(v1::GetConversationRequest {
            conversation_id: conv.id.clone(),
        })
        .await
        .expect_err("deleted");
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .create(CreateResponseRequest {
            conversation: Some(conv.id),
            ..text("x", 2)
        })
        .await
        .expect_err("unknown conversation");
    assert_eq!(
        (e.code(), bad_field(&e).as_str()),
        (Code::NotFound, "conversation")
    );
    server.stop().await;
}
