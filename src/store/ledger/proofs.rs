//! The `fresh_proofs` table: what the last run that left every stage of a
//! pipeline valid saw, for a no-op to check without deciding anything
//! again (see `schedule::proof`). Its triggers (in [`schema`])
//! delete every proof when a result, an item outcome or an inline object
//! is written.

use super::*;

/// What a proof keeps beside it, each encoded (see
/// [`Ledger::keep_fresh_proof`]).
#[derive(Debug, Clone, Copy)]
pub struct KeptBeside<'a> {
    pub plans: Option<&'a [u8]>,
    pub manifest: Option<&'a [u8]>,
    pub history: Option<&'a [u8]>,
}

impl Ledger {
    /// Opens the ledger in `cache` only to read the proof kept under `key`:
    /// `None` if there is no ledger, it is of another schema, or it keeps
    /// no such proof. The connection then speaks for the proof's pipeline.
    /// Nothing is created, migrated or claimed.
    pub fn open_for_proof(cache: &Path, key: &[u8]) -> Result<Option<(Self, Vec<u8>)>, StoreError> {
        let path = crate::store::layout::ledger(cache);
        if !path.exists() {
            return Ok(None);
        }
        // The caller holds the workspace lock. A damaged log could have
        // lost the write that voided the proof: it is checked first.
        super::super::ledger_health::check_wal(&path)?;
        let conn = Connection::open(&path).map_err(|e| StoreError::db(&path, e))?;
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(|e| StoreError::db(&path, e))?;
        configure(&conn).map_err(|e| StoreError::db(&path, e))?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| StoreError::db(&path, e))?;
        if version != LEDGER_SCHEMA_VERSION {
            return Ok(None);
        }
        let found: Option<(String, String, Vec<u8>)> = conn
            .query_row(
                "SELECT p.pipeline, m.manifest, p.body FROM fresh_proofs p
                   JOIN pipelines m ON m.name = p.pipeline AND m.manifest = p.manifest
                  WHERE p.key = ?1",
                [key],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()
            .map_err(|e| StoreError::db(&path, e))?;
        Ok(found.map(|(name, manifest, body)| {
            let ledger = Self {
                conn,
                path,
                pipeline: PipelineId { name, manifest },
            };
            (ledger, body)
        }))
    }

    /// Keeps `body` as this pipeline's proof under `key`, in place of any
    /// it had, and `plans` and `manifest` (when given) as its item plans
    /// and its validated manifest; `history` as its history, or none (a
    /// history kept is good only for the proof it was kept with). Written
    /// after everything else the run wrote: a write to a voiding table
    /// after it would delete the proof.
    pub fn keep_fresh_proof(
        &self,
        key: &[u8],
        body: &[u8],
        kept: KeptBeside<'_>,
    ) -> Result<(), StoreError> {
        let KeptBeside {
            plans,
            manifest,
            history,
        } = kept;
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        // Each kept thing replaced under the new key; one not given stays
        // as it is, but a history, good only for its own proof, goes.
        let keep = |table: &str, body: Option<&[u8]>, or_delete: bool| match body {
            Some(body) => tx.execute(
                &format!(
                    "INSERT OR REPLACE INTO {table} (pipeline, key, body) VALUES (?1, ?2, ?3)"
                ),
                params![self.pipeline.name, key, body],
            ),
            None if or_delete => tx.execute(
                &format!("DELETE FROM {table} WHERE pipeline = ?1"),
                [&self.pipeline.name],
            ),
            None => Ok(0),
        };
        tx.execute(
            "DELETE FROM fresh_proofs WHERE pipeline = ?1",
            [&self.pipeline.name],
        )
        .and_then(|_| {
            tx.execute(
                "INSERT INTO fresh_proofs (key, pipeline, manifest, made_ms, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![key, self.pipeline.name, self.pipeline.manifest, now_ms(), body],
            )
        })
        .and_then(|_| keep("kept_plans", plans, false))
        .and_then(|_| keep("kept_manifests", manifest, false))
        .and_then(|_| keep("kept_histories", history, true))
        .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))
    }

    /// The item plans kept beside this pipeline's last proof, if it was
    /// made under `key` (see `schedule::proof::kept_plans`).
    pub fn kept_plans(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.kept_beside("kept_plans", key)
    }

    /// The validated manifest kept beside this pipeline's last proof, if
    /// it was kept under `key` (see `manifest::kept`).
    pub fn kept_manifest(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.kept_beside("kept_manifests", key)
    }

    /// The history kept beside this pipeline's last proof, if it was kept
    /// under `key` (see `schedule::proof::kept_history`).
    pub fn kept_history(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.kept_beside("kept_histories", key)
    }

    /// The body `table` keeps for this pipeline, if it was kept under `key`.
    fn kept_beside(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.conn
            .prepare_cached(&format!(
                "SELECT body FROM {table} WHERE pipeline = ?1 AND key = ?2"
            ))
            .and_then(|mut select| {
                select
                    .query_row(params![self.pipeline.name, key], |row| row.get(0))
                    .optional()
            })
            .map_err(|e| self.db(e))
    }

    /// Whether a manifest is kept for this pipeline under `key` (then a
    /// run that keeps a proof under it need not encode it again).
    pub fn keeps_manifest(&self, key: &[u8]) -> Result<bool, StoreError> {
        self.conn
            .query_row(
                "SELECT 1 FROM kept_manifests WHERE pipeline = ?1 AND key = ?2",
                params![self.pipeline.name, key],
                |_| Ok(()),
            )
            .optional()
            .map(|found| found.is_some())
            .map_err(|e| self.db(e))
    }

    /// Replaces the body of the proof under `key`, if it is still kept.
    pub fn renew_fresh_proof(&self, key: &[u8], body: &[u8]) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE fresh_proofs SET body = ?2 WHERE key = ?1",
                params![key, body],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// Whether any proof is kept (for tests of what voids them).
    pub fn fresh_proofs(&self) -> Result<usize, StoreError> {
        self.conn
            .query_row("SELECT count(*) FROM fresh_proofs", [], |row| {
                row.get::<_, i64>(0)
            })
            .map(|n| n as usize)
            .map_err(|e| self.db(e))
    }
}
