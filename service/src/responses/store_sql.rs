//! The SQL of the store (`store.rs`): its schema, and the statements
//! that several of its writes share (events, conversation items, eviction).

use gyre_api::v1::{Item, ResponseEvent};
use prost::Message;
use rusqlite::{Connection, params};

use super::store::{StoreConfig, StoreError};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS responses(
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL,
  status TEXT NOT NULL,
  owner TEXT NOT NULL,
  previous_id TEXT,
  body BLOB NOT NULL,
  tenant TEXT NOT NULL DEFAULT 'anonymous');
CREATE TABLE IF NOT EXISTS input_items(
  response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
  pos INTEGER NOT NULL, item_id TEXT NOT NULL, body BLOB NOT NULL,
  PRIMARY KEY(response_id, pos));
CREATE TABLE IF NOT EXISTS events(
  response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
  seq INTEGER NOT NULL, body BLOB NOT NULL,
  PRIMARY KEY(response_id, seq));
CREATE TABLE IF NOT EXISTS conversations(
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL,
  body BLOB NOT NULL,
  tenant TEXT NOT NULL DEFAULT 'anonymous');
CREATE TABLE IF NOT EXISTS conversation_items(
  conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  pos INTEGER NOT NULL, item_id TEXT NOT NULL, body BLOB NOT NULL,
  PRIMARY KEY(conversation_id, pos));
";

/// Adds the `tenant` column to the tables of a store made before it
/// existed (their rows belong to `anonymous`, the tenant of every request
/// when no keys are configured).
pub(super) fn migrate(conn: &rusqlite::Connection) -> Result<(), StoreError> {
    for table in ["responses", "conversations"] {
        let has: bool = conn.query_row(
            &format!("SELECT COUNT(*) > 0 FROM pragma_table_info('{table}') WHERE name = 'tenant'"),
            [],
            |r| r.get(0),
        )?;
        if !has {
            conn.execute_batch(&format!(
                "ALTER TABLE {table} ADD COLUMN tenant TEXT NOT NULL DEFAULT 'anonymous'"
            ))?;
        }
    }
    Ok(())
}

pub(super) fn insert_events(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    events: &[ResponseEvent],
) -> Result<(), StoreError> {
    let mut st =
        tx.prepare("INSERT OR REPLACE INTO events(response_id, seq, body) VALUES (?1, ?2, ?3)")?;
    for e in events {
        st.execute(params![
            id,
            e.sequence_number.min(i64::MAX as u64) as i64,
            e.encode_to_vec()
        ])?;
    }
    Ok(())
}

pub(super) fn append_items(
    tx: &rusqlite::Transaction<'_>,
    conv: &str,
    items: &[Item],
) -> Result<(), StoreError> {
    // A conversation deleted (or evicted) meanwhile takes nothing.
    let exists: bool = tx.query_row(
        "SELECT EXISTS(SELECT 1 FROM conversations WHERE id = ?1)",
        params![conv],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(());
    }
    let next: i64 = tx.query_row(
        "SELECT COALESCE(MAX(pos) + 1, 0) FROM conversation_items WHERE conversation_id = ?1",
        params![conv],
        |r| r.get(0),
    )?;
    for (i, item) in items.iter().enumerate() {
        tx.execute(
            "INSERT INTO conversation_items(conversation_id, pos, item_id, body)
             VALUES (?1, ?2, ?3, ?4)",
            params![conv, next + i as i64, item.id, item.encode_to_vec()],
        )?;
    }
    Ok(())
}

pub(super) fn items_of(
    conn: &Connection,
    table: &str,
    key: &str,
    id: &str,
) -> Result<Vec<Item>, StoreError> {
    let mut st = conn.prepare(&format!(
        "SELECT body FROM {table} WHERE {key} = ?1 ORDER BY pos ASC"
    ))?;
    let rows = st
        .query_map(params![id], |r| r.get::<_, Vec<u8>>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows
        .iter()
        .map(|b| Item::decode(b.as_slice()))
        .collect::<Result<_, _>>()?)
}

/// Deletes finished responses older than the age bound, then the oldest
/// finished ones past the count bound; conversations the same way.
pub(super) fn evict(
    tx: &rusqlite::Transaction<'_>,
    cfg: &StoreConfig,
    now: i64,
) -> Result<(), StoreError> {
    let cutoff = now.saturating_sub(cfg.max_age.as_secs().min(i64::MAX as u64) as i64);
    let max = cfg.max_entries.min(i64::MAX as u64) as i64;
    tx.execute(
        "DELETE FROM responses WHERE status NOT IN ('queued', 'in_progress') AND created_at < ?1",
        params![cutoff],
    )?;
    tx.execute(
        "DELETE FROM responses WHERE seq IN (
           SELECT seq FROM responses WHERE status NOT IN ('queued', 'in_progress')
           ORDER BY seq ASC
           LIMIT MAX(0, (SELECT COUNT(*) FROM responses) - ?1))",
        params![max],
    )?;
    tx.execute(
        "DELETE FROM conversations WHERE created_at < ?1",
        params![cutoff],
    )?;
    tx.execute(
        "DELETE FROM conversations WHERE seq IN (
           SELECT seq FROM conversations ORDER BY seq ASC
           LIMIT MAX(0, (SELECT COUNT(*) FROM conversations) - ?1))",
        params![max],
    )?;
    Ok(())
}
