//! The `stat_cache` table: file metadata → content digest, so a no-op run
//! hashes nothing it hashed before.

use super::*;

impl Ledger {
    pub fn load_stat_cache(&self) -> Result<Vec<(PathBuf, StatEntry)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT path, dev, ino, size, mtime_ns, ctime_ns, digest FROM stat_cache")
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map([], |row| {
                let path: String = row.get(0)?;
                let digest: String = row.get(6)?;
                Ok((
                    path,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get(4)?,
                    row.get(5)?,
                    digest,
                ))
            })
            .map_err(|e| self.db(e))?;
        let mut entries = Vec::new();
        for row in rows {
            let (path, dev, ino, size, mtime_ns, ctime_ns, digest) = row.map_err(|e| self.db(e))?;
            if let Ok(digest) = digest.parse() {
                entries.push((
                    PathBuf::from(path),
                    StatEntry {
                        dev: dev as u64,
                        ino: ino as u64,
                        size: size as u64,
                        mtime_ns,
                        ctime_ns,
                        digest,
                    },
                ));
            }
        }
        Ok(entries)
    }

    pub fn save_stat_cache(&mut self, updates: &[(PathBuf, StatEntry)]) -> Result<(), StoreError> {
        if updates.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction()
            .map_err(|e| StoreError::db(&path, e))?;
        {
            let mut stmt = tx
                .prepare("INSERT OR REPLACE INTO stat_cache (path, dev, ino, size, mtime_ns, ctime_ns, digest) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
                .map_err(|e| StoreError::db(&path, e))?;
            for (file, entry) in updates {
                stmt.execute(params![
                    file.to_string_lossy(),
                    entry.dev as i64,
                    entry.ino as i64,
                    entry.size as i64,
                    entry.mtime_ns,
                    entry.ctime_ns,
                    entry.digest.to_string()
                ])
                .map_err(|e| StoreError::db(&path, e))?;
            }
        }
        tx.commit().map_err(|e| StoreError::db(&path, e))
    }
}
