//! Damage inside the ledger: result records whose outputs cannot be read,
//! and small objects kept inline that no longer hash to their names.
//!
//! A record that cannot be read is an error wherever it is read, never
//! "no outputs" (that would be a fresh hit that restores nothing).
//! `cairn audit --repair` finds such records and sets them aside: the
//! result is marked failed with the reason, so its stage runs again and
//! `status` says why.

use rusqlite::{OptionalExtension, params};

use super::{Ledger, ResultRecord};
use crate::fingerprint::Digest;
use crate::store::StoreError;
use crate::store::output_record::OutputRecord;

/// The error text a set-aside result carries (shown by `status`, `why`).
pub const SET_ASIDE_REASON: &str =
    "its recorded outputs could not be read; set aside by `cairn audit --repair`";

/// A result whose recorded outputs cannot be read.
#[derive(Debug, Clone)]
pub struct UnreadableResult {
    pub id: i64,
    pub stage: String,
    pub detail: String,
}

/// A result's recorded outputs, or why they cannot be read.
pub(super) fn parse_outputs(text: &str) -> Result<Vec<OutputRecord>, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

impl Ledger {
    /// The error for a result whose outputs cannot be read, saying how to
    /// go on.
    pub(super) fn unreadable_result(&self, record: &ResultRecord, detail: &str) -> StoreError {
        StoreError::Corrupt {
            path: self.path().to_owned(),
            detail: format!(
                "result {} of stage `{}` has unreadable outputs ({detail}); `cairn audit --repair` sets it aside so the stage runs again",
                record.id, record.stage
            ),
        }
    }

    /// Every result whose recorded outputs cannot be read.
    pub fn unreadable_results(&self) -> Result<Vec<UnreadableResult>, StoreError> {
        let mut statement = self
            .conn
            .prepare("SELECT id, stage, outputs_json FROM results WHERE pipeline = ?1")
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map([&self.pipeline.name], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| self.db(e))?;
        let mut unreadable = Vec::new();
        for row in rows {
            let (id, stage, text) = row.map_err(|e| self.db(e))?;
            if let Err(detail) = parse_outputs(&text) {
                unreadable.push(UnreadableResult { id, stage, detail });
            }
        }
        Ok(unreadable)
    }

    /// Marks a result failed (with [`SET_ASIDE_REASON`]) and forgets its
    /// outputs; the stage's newest successful result becomes the one
    /// before it, if any.
    pub fn set_aside_result(&self, id: i64) -> Result<(), StoreError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        tx.execute(
            "UPDATE results SET status = 'failed', outputs_json = '[]', error = ?2 WHERE id = ?1 AND pipeline = ?3",
            params![id, SET_ASIDE_REASON, self.pipeline.name],
        )
        .map_err(|e| self.db(e))?;
        tx.execute(
            "UPDATE heads SET ok_id = (SELECT max(r.id) FROM results r WHERE r.pipeline = heads.pipeline AND r.stage = heads.stage AND r.status = 'ok') WHERE pipeline = ?2 AND ok_id = ?1",
            params![id, self.pipeline.name],
        )
        .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))
    }

    /// Whether the ledger holds the inline object `digest`.
    pub fn has_inline_object(&self, digest: &Digest) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached("SELECT 1 FROM objects WHERE digest = ?1")
            .and_then(|mut s| {
                s.query_row(params![&digest.as_bytes()[..]], |_| Ok(()))
                    .optional()
            })
            .map(|found| found.is_some())
            .map_err(|e| self.db(e))
    }

    /// Which of `digests` name inline objects the ledger holds: one query
    /// per 500, for checking many results at once.
    pub fn inline_objects_held(
        &self,
        digests: &[Digest],
    ) -> Result<std::collections::HashSet<Digest>, StoreError> {
        let mut held = std::collections::HashSet::new();
        for chunk in digests.chunks(500) {
            let marks = vec!["?"; chunk.len()].join(",");
            let mut statement = self
                .conn
                .prepare(&format!(
                    "SELECT digest FROM objects WHERE digest IN ({marks})"
                ))
                .map_err(|e| self.db(e))?;
            let params = rusqlite::params_from_iter(chunk.iter().map(|d| &d.as_bytes()[..]));
            let rows = statement
                .query_map(params, |row| row.get::<_, Vec<u8>>(0))
                .map_err(|e| self.db(e))?;
            for row in rows {
                let bytes = row.map_err(|e| self.db(e))?;
                if let Ok(bytes) = <[u8; 32]>::try_from(bytes.as_slice()) {
                    held.insert(Digest::from_bytes(bytes));
                }
            }
        }
        Ok(held)
    }

    /// Stores an inline object again; the caller checked `bytes` hash to
    /// `digest`.
    pub fn put_inline_object(&self, digest: &Digest, bytes: &[u8]) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO objects (digest, bytes) VALUES (?1, ?2)",
                params![&digest.as_bytes()[..], bytes],
            )
            .map(drop)
            .map_err(|e| self.db(e))
    }

    /// Removes a damaged inline object: results that need it are then
    /// incomplete and their stages run again.
    pub fn drop_inline_object(&self, digest: &Digest) -> Result<(), StoreError> {
        self.conn
            .execute(
                "DELETE FROM objects WHERE digest = ?1",
                params![&digest.as_bytes()[..]],
            )
            .map(drop)
            .map_err(|e| self.db(e))
    }
}
