//! The `stat_cache` table: file metadata → content digest, so a no-op run
//! hashes nothing it hashed before.

use super::*;

impl Ledger {
    pub fn load_stat_cache(&self) -> Result<Vec<(PathBuf, StatEntry)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT path, dev, ino, size, mtime_ns, ctime_ns, digest, seen_ns FROM stat_cache",
            )
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map([], |row| {
                // A malformed row is a miss, not an error: this is a cache.
                let digest = row.get_ref(6)?.as_blob().ok();
                let Some(Ok(digest)) = digest.map(<[u8; 32]>::try_from) else {
                    return Ok(None);
                };
                let entry = StatEntry {
                    dev: row.get::<_, i64>(1)? as u64,
                    ino: row.get::<_, i64>(2)? as u64,
                    size: row.get::<_, i64>(3)? as u64,
                    mtime_ns: row.get(4)?,
                    ctime_ns: row.get(5)?,
                    digest: Digest::from_bytes(digest),
                    seen_ns: row.get(7)?,
                };
                Ok(Some((PathBuf::from(row.get::<_, String>(0)?), entry)))
            })
            .map_err(|e| self.db(e))?;
        let mut entries = Vec::new();
        for row in rows {
            entries.extend(row.map_err(|e| self.db(e))?);
        }
        Ok(entries)
    }

    /// Writes `updates` and deletes the entries of `forgotten` paths, in
    /// one transaction.
    pub fn save_stat_cache(
        &mut self,
        updates: &[(PathBuf, StatEntry)],
        forgotten: &[PathBuf],
    ) -> Result<(), StoreError> {
        if updates.is_empty() && forgotten.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction()
            .map_err(|e| StoreError::db(&path, e))?;
        {
            let mut insert = tx
                .prepare("INSERT OR REPLACE INTO stat_cache (path, dev, ino, size, mtime_ns, ctime_ns, digest, seen_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
                .map_err(|e| StoreError::db(&path, e))?;
            for (file, entry) in updates {
                insert
                    .execute(params![
                        file.to_string_lossy(),
                        entry.dev as i64,
                        entry.ino as i64,
                        entry.size as i64,
                        entry.mtime_ns,
                        entry.ctime_ns,
                        entry.digest.as_bytes().as_slice(),
                        entry.seen_ns,
                    ])
                    .map_err(|e| StoreError::db(&path, e))?;
            }
            let mut delete = tx
                .prepare("DELETE FROM stat_cache WHERE path = ?1")
                .map_err(|e| StoreError::db(&path, e))?;
            for file in forgotten {
                delete
                    .execute(params![file.to_string_lossy()])
                    .map_err(|e| StoreError::db(&path, e))?;
            }
        }
        tx.commit().map_err(|e| StoreError::db(&path, e))
    }
}
