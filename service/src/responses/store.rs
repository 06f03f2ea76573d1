//! The store of responses and conversations: an embedded SQLite database
//! (rusqlite, SQLite compiled in) in WAL mode, each write one transaction.
//!
//! Rows hold protobuf-encoded messages (`Response`, `Item`,
//! `ResponseEvent`, `Conversation`), so what is read back is exactly what
//! was written. Bounded by entry count and age: every insert evicts the
//! oldest finished responses (and conversations) past either bound; running
//! ones (queued / in progress) are never evicted.
//!
//! Several gyre processes may share one directory: each process is an
//! *owner* holding a lock on its own file under `owners/`; at open, the
//! responses of owners whose lock is free (the process is gone, even after
//! `kill -9`) that were still queued or in progress are marked failed
//! (`server_restarted`), with a `failed` event appended for replays.
//!
//! Responses and conversations belong to the tenant that created them
//! (`crate::tenant`): lookups and deletes take the asking tenant and see
//! only its rows, so another tenant's id reads as unknown.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use gyre_api::v1::{Conversation, Item, Response, ResponseError, ResponseEvent, response_event};
use prost::Message;
use rusqlite::{Connection, OptionalExtension, params};

use super::store_sql::{SCHEMA, append_items, evict, insert_events, items_of, migrate};

/// What can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored row does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("responses directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the store's lock is poisoned")]
    Poisoned,
}

/// Where the store lives and how much it keeps.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The data directory; None keeps everything in memory (tests).
    pub dir: Option<PathBuf>,
    /// Most responses (and, separately, conversations) kept.
    pub max_entries: u64,
    /// Oldest age kept.
    pub max_age: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            dir: None,
            max_entries: 10_000,
            max_age: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// A stored response and how it was made.
#[derive(Debug, Clone)]
pub struct Stored {
    pub response: Response,
    pub previous_id: Option<String>,
}

/// Statuses of a response that is still running.
pub const RUNNING: [&str; 2] = ["queued", "in_progress"];

/// The store. Cheap calls; callers on async tasks run them on blocking
/// threads (`super::blocking`).
pub struct Store {
    conn: Mutex<Connection>,
    cfg: StoreConfig,
    owner: String,
    /// Held for the process's life: tells other processes this owner lives.
    _lock: Option<File>,
}

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Store {
    /// Opens (creating) the store, and fails the running responses of
    /// owners that are gone.
    pub fn open(cfg: StoreConfig) -> Result<Self, StoreError> {
        let owner = format!("{:016x}", rand::random::<u64>());
        let (conn, lock) = match &cfg.dir {
            None => (Connection::open_in_memory()?, None),
            Some(dir) => {
                let owners = dir.join("owners");
                std::fs::create_dir_all(&owners).map_err(io(&owners))?;
                let path = owners.join(format!("{owner}.lock"));
                let f = File::create(&path).map_err(io(&path))?;
                f.lock().map_err(io(&path))?;
                (Connection::open(dir.join("responses.sqlite3"))?, Some(f))
            }
        };
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(SCHEMA)?;
        migrate(&conn)?;
        let store = Self {
            conn: Mutex::new(conn),
            cfg,
            owner,
            _lock: lock,
        };
        store.recover()?;
        Ok(store)
    }

    fn conn(&self) -> Result<std::sync::MutexGuard<'_, Connection>, StoreError> {
        self.conn.lock().map_err(|_| StoreError::Poisoned)
    }

    /// Whether the process that owns `owner` is gone.
    fn owner_gone(&self, owner: &str) -> bool {
        if owner == self.owner {
            return false;
        }
        let Some(dir) = &self.cfg.dir else {
            return true;
        };
        let path = dir.join("owners").join(format!("{owner}.lock"));
        match File::options().write(true).open(&path) {
            Err(_) => true,
            Ok(f) => {
                let gone = f.try_lock().is_ok();
                if gone {
                    let _ = std::fs::remove_file(&path);
                }
                gone
            }
        }
    }

    /// Marks the running responses of gone owners failed.
    fn recover(&self) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let rows: Vec<(String, String, Vec<u8>)> = {
            let mut st = tx.prepare(
                "SELECT id, owner, body FROM responses WHERE status IN ('queued', 'in_progress')",
            )?;
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<_, _>>()?
        };
        for (id, owner, body) in rows {
            if !self.owner_gone(&owner) {
                continue;
            }
            let mut resp = Response::decode(body.as_slice())?;
            resp.status = "failed".into();
            resp.error = Some(ResponseError {
                code: "server_restarted".into(),
                message: "the server stopped before this response finished".into(),
            });
            let next: i64 = tx.query_row(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE response_id = ?1",
                params![id],
                |r| r.get(0),
            )?;
            let ev = ResponseEvent {
                sequence_number: next as u64,
                event: Some(response_event::Event::Failed(resp.clone())),
            };
            tx.execute(
                "INSERT INTO events(response_id, seq, body) VALUES (?1, ?2, ?3)",
                params![id, next, ev.encode_to_vec()],
            )?;
            tx.execute(
                "UPDATE responses SET status = 'failed', body = ?2 WHERE id = ?1",
                params![id, resp.encode_to_vec()],
            )?;
            tracing::warn!(response_id = %id, "response left running by a stopped server marked failed");
        }
        tx.commit()?;
        Ok(())
    }

    /// Stores a new response of `tenant` with its input items and first
    /// events, then evicts past the bounds.
    pub fn insert_response(
        &self,
        resp: &Response,
        previous_id: Option<&str>,
        input: &[Item],
        events: &[ResponseEvent],
        tenant: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO responses(id, created_at, status, owner, previous_id, body, tenant)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                resp.id,
                resp.created_at,
                resp.status,
                self.owner,
                previous_id,
                resp.encode_to_vec(),
                tenant
            ],
        )?;
        for (pos, item) in input.iter().enumerate() {
            tx.execute(
                "INSERT INTO input_items(response_id, pos, item_id, body) VALUES (?1, ?2, ?3, ?4)",
                params![resp.id, pos as i64, item.id, item.encode_to_vec()],
            )?;
        }
        insert_events(&tx, &resp.id, events)?;
        evict(&tx, &self.cfg, now())?;
        tx.commit()?;
        Ok(())
    }

    /// Updates a response (its status and body) and appends events; with
    /// `conversation`, appends these items to it in the same transaction.
    pub fn update_response(
        &self,
        resp: &Response,
        events: &[ResponseEvent],
        conversation: Option<(&str, &[Item])>,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE responses SET status = ?2, body = ?3 WHERE id = ?1",
            params![resp.id, resp.status, resp.encode_to_vec()],
        )?;
        insert_events(&tx, &resp.id, events)?;
        if let Some((conv, items)) = conversation {
            append_items(&tx, conv, items)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// A response of `tenant` (None for another tenant's).
    pub fn get_response(&self, id: &str, tenant: &str) -> Result<Option<Stored>, StoreError> {
        let conn = self.conn()?;
        let row: Option<(Vec<u8>, Option<String>)> = conn
            .query_row(
                "SELECT body, previous_id FROM responses WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        match row {
            None => Ok(None),
            Some((body, previous_id)) => Ok(Some(Stored {
                response: Response::decode(body.as_slice())?,
                previous_id,
            })),
        }
    }

    /// Deletes a response of `tenant`; false when it has none of that id.
    pub fn delete_response(&self, id: &str, tenant: &str) -> Result<bool, StoreError> {
        let conn = self.conn()?;
        Ok(conn.execute(
            "DELETE FROM responses WHERE id = ?1 AND tenant = ?2",
            params![id, tenant],
        )? > 0)
    }

    /// The stored events of a response after `after` (all when None).
    pub fn events_after(
        &self,
        id: &str,
        after: Option<u64>,
    ) -> Result<Vec<ResponseEvent>, StoreError> {
        let conn = self.conn()?;
        let mut st = conn.prepare(
            "SELECT body FROM events WHERE response_id = ?1 AND seq > ?2 ORDER BY seq ASC",
        )?;
        let from = after.map_or(-1, |a| a.min(i64::MAX as u64) as i64);
        let rows = st
            .query_map(params![id, from], |r| r.get::<_, Vec<u8>>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows
            .iter()
            .map(|b| ResponseEvent::decode(b.as_slice()))
            .collect::<Result<_, _>>()?)
    }

    /// Every input item of a response, in order.
    pub fn input_items(&self, id: &str) -> Result<Vec<Item>, StoreError> {
        let conn = self.conn()?;
        items_of(&conn, "input_items", "response_id", id)
    }

    /// The history `previous_response_id = id` continues: each response of
    /// the chain, oldest first, its input items then its output items. The
    /// chain ends at the first response no longer stored (or not `tenant`'s).
    pub fn history(&self, id: &str, tenant: &str) -> Result<Vec<Item>, StoreError> {
        let mut chain = Vec::new();
        let mut next = Some(id.to_string());
        while let Some(id) = next.take() {
            let Some(s) = self.get_response(&id, tenant)? else {
                break;
            };
            let mut items = self.input_items(&id)?;
            items.extend(s.response.output.iter().cloned());
            chain.push(items);
            next = s.previous_id;
        }
        Ok(chain.into_iter().rev().flatten().collect())
    }

    /// A page of a response's input items or a conversation's items:
    /// `after` an item id (exclusive), at most `limit`, `desc` newest first.
    /// None when `after` names no item of it.
    pub fn page(
        &self,
        of: &Owner,
        after: Option<&str>,
        limit: u32,
        desc: bool,
    ) -> Result<Option<(Vec<Item>, bool)>, StoreError> {
        let (table, key, id) = match of {
            Owner::Response(id) => ("input_items", "response_id", id.as_str()),
            Owner::Conversation(id) => ("conversation_items", "conversation_id", id.as_str()),
        };
        let conn = self.conn()?;
        let from: Option<i64> = match after {
            None => None,
            Some(item) => {
                let pos = conn
                    .query_row(
                        // Of several items with this id (stored before
                        // duplicates were refused), the one furthest along
                        // the order: a page after it never repeats it.
                        &format!(
                            "SELECT pos FROM {table} WHERE {key} = ?1 AND item_id = ?2 \
                             ORDER BY pos {} LIMIT 1",
                            if desc { "ASC" } else { "DESC" }
                        ),
                        params![id, item],
                        |r| r.get(0),
                    )
                    .optional()?;
                match pos {
                    None => return Ok(None),
                    p => p,
                }
            }
        };
        let (cmp, order) = if desc { ("<", "DESC") } else { (">", "ASC") };
        let bound = from.unwrap_or(if desc { i64::MAX } else { -1 });
        let mut st = conn.prepare(&format!(
            "SELECT body FROM {table} WHERE {key} = ?1 AND pos {cmp} ?2 ORDER BY pos {order} LIMIT ?3"
        ))?;
        let mut rows = st
            .query_map(params![id, bound, i64::from(limit) + 1], |r| {
                r.get::<_, Vec<u8>>(0)
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let items = rows
            .iter()
            .map(|b| Item::decode(b.as_slice()))
            .collect::<Result<_, _>>()?;
        Ok(Some((items, more)))
    }

    /// Stores a new conversation of `tenant`.
    pub fn insert_conversation(
        &self,
        c: &Conversation,
        items: &[Item],
        tenant: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO conversations(id, created_at, body, tenant) VALUES (?1, ?2, ?3, ?4)",
            params![c.id, c.created_at, c.encode_to_vec(), tenant],
        )?;
        append_items(&tx, &c.id, items)?;
        evict(&tx, &self.cfg, now())?;
        tx.commit()?;
        Ok(())
    }

    /// A conversation of `tenant` (None for another tenant's).
    pub fn get_conversation(
        &self,
        id: &str,
        tenant: &str,
    ) -> Result<Option<Conversation>, StoreError> {
        let conn = self.conn()?;
        let body: Option<Vec<u8>> = conn
            .query_row(
                "SELECT body FROM conversations WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
                |r| r.get(0),
            )
            .optional()?;
        Ok(body
            .map(|b| Conversation::decode(b.as_slice()))
            .transpose()?)
    }

    pub fn conversation_items(&self, id: &str) -> Result<Vec<Item>, StoreError> {
        let conn = self.conn()?;
        items_of(&conn, "conversation_items", "conversation_id", id)
    }

    /// Deletes a conversation of `tenant`; false when it has none of that id.
    pub fn delete_conversation(&self, id: &str, tenant: &str) -> Result<bool, StoreError> {
        let conn = self.conn()?;
        Ok(conn.execute(
            "DELETE FROM conversations WHERE id = ?1 AND tenant = ?2",
            params![id, tenant],
        )? > 0)
    }

    /// Evicts past the bounds as of `now` (Unix seconds).
    pub fn evict_at(&self, now: i64) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        evict(&tx, &self.cfg, now)?;
        tx.commit()?;
        Ok(())
    }
}

/// Whose items a page lists.
#[derive(Debug, Clone)]
pub enum Owner {
    Response(String),
    Conversation(String),
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
