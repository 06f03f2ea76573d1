//! Responses running in this process: their events so far, the response as
//! it stands, a switch that cancels the generation, and subscribers that
//! stream the events (from a sequence number on) as they come.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use gyre_api::v1::{Response, ResponseEvent};
use tokio::sync::{mpsc, watch};
use tonic::Status;

/// Events buffered per subscriber before it waits for its client.
const SUBSCRIBER_BUFFER: usize = 64;

struct State {
    events: Vec<ResponseEvent>,
    response: Response,
    done: bool,
}

/// One running response.
pub struct Live {
    state: Mutex<State>,
    /// Bumped on every change of `state`.
    changed: watch::Sender<u64>,
    /// Set to cancel the generation.
    pub cancel: watch::Sender<bool>,
    pub background: bool,
    /// The tenant that created it: only its requests see it.
    pub tenant: Arc<str>,
}

impl Live {
    pub fn new(
        events: Vec<ResponseEvent>,
        response: Response,
        background: bool,
        tenant: Arc<str>,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                events,
                response,
                done: false,
            }),
            changed: watch::channel(0).0,
            cancel: watch::channel(false).0,
            background,
            tenant,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind: use it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// New events and the response after them.
    pub fn push(&self, events: Vec<ResponseEvent>, response: &Response) {
        {
            let mut s = self.state();
            s.events.extend(events);
            s.response = response.clone();
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// The response ended (and is stored, when it is).
    pub fn finish(&self) {
        self.state().done = true;
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn snapshot(&self) -> Response {
        self.state().response.clone()
    }

    /// Waits until the response ended; its final state.
    pub async fn ended(&self) -> Response {
        let mut rx = self.changed.subscribe();
        loop {
            {
                let s = self.state();
                if s.done {
                    return s.response.clone();
                }
            }
            if rx.changed().await.is_err() {
                return self.snapshot();
            }
        }
    }

    /// Its events after `after` (all when None), then new ones as they come,
    /// until it ends. With `cancel_on_drop`, a client that goes away
    /// cancels the generation.
    pub fn subscribe(
        self: &Arc<Self>,
        after: Option<u64>,
        cancel_on_drop: bool,
    ) -> mpsc::Receiver<Result<ResponseEvent, Status>> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let live = self.clone();
        tokio::spawn(async move {
            let mut changed = live.changed.subscribe();
            let mut next = after.map_or(0, |a| a.saturating_add(1));
            loop {
                let (batch, done) = {
                    let s = live.state();
                    let batch: Vec<ResponseEvent> = s
                        .events
                        .iter()
                        .filter(|e| e.sequence_number >= next)
                        .cloned()
                        .collect();
                    (batch, s.done)
                };
                for e in batch {
                    next = e.sequence_number + 1;
                    if tx.send(Ok(e)).await.is_err() {
                        if cancel_on_drop {
                            live.cancel.send_replace(true);
                        }
                        return;
                    }
                }
                if done {
                    return;
                }
                tokio::select! {
                    r = changed.changed() => if r.is_err() { return },
                    _ = tx.closed() => {
                        if cancel_on_drop {
                            live.cancel.send_replace(true);
                        }
                        return;
                    }
                }
            }
        });
        rx
    }
}

/// The running responses of this process, by id.
#[derive(Default)]
pub struct Registry(Mutex<HashMap<String, Arc<Live>>>);

impl Registry {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Live>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, id: &str, live: Arc<Live>) {
        self.map().insert(id.to_string(), live);
    }

    /// The live response `id` of `tenant` (None for another tenant's).
    pub fn get(&self, id: &str, tenant: &str) -> Option<Arc<Live>> {
        self.map().get(id).filter(|l| &*l.tenant == tenant).cloned()
    }

    pub fn remove(&self, id: &str) {
        self.map().remove(id);
    }
}
