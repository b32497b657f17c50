//! The ledger's tables and the ordered migrations that bring an older
//! ledger up to them.
//!
//! Schema history (`PRAGMA user_version`):
//!
//! | version | change |
//! |---|---|
//! | 3 | oldest ledger still read |
//! | 4 | items and item attempts record the code fingerprint behind them |
//! | 5 | items record their outputs |
//! | 6 | runs, results, heads, items and item attempts belong to a pipeline (its `[pipeline] name`); `pipelines` records which manifest each name belongs to |
//! | 7 | an item attempt is recorded when its job starts (class `running`, with the job's handle on its engine) and replaced when it ends; a run that died leaves it `abandoned` |
//! | 8 | results and item outcomes record their origin (`remote:URL` when a remote cache supplied them, else none) |
//! | 9 | `redraws` records each `cairn resample`: which samples of which stage are drawn anew |
//! | 10 | `stage_runs` records every selected stage of every run (its state, why, its times, where it ran); runs record the manifest's digest and cairn's version; item attempts are indexed by run |
//! | 11 | the stat cache records when each entry was seen (racy-clean), digests as bytes |
//! | 12 | inline objects in a table with rowids, their digests in an index of their own |
//! | 13 | item attempts indexed by class |
//! | 14 | `fresh_proofs`: what a run that left every stage valid saw, for the next no-op to check by `stat` alone; triggers on every table a stage's freshness is read from delete them |
//! | 15 | item attempts indexed by fingerprint (a stage's attempts so far under one fingerprint, counted from the index alone) |
//! | 16 | `kept_plans`: each pipeline's item plans, kept beside its last fresh proof for the run after it (see `schedule::proof::kept_plans`) |
//! | 17 | `kept_manifests`: each pipeline's validated manifest, kept beside its last fresh proof for the run after it (see `manifest::kept`) |
//! | 18 | `kept_histories`: each pipeline's history as its last fresh proof's run left it, kept beside the proof for the run after it (see `schedule::proof::kept_history`) |
//! | 19 | `fresh_stage_runs`: a run's fresh stages in one row (`stage_runs` holds the others) |
//! | 20 | the index of cancelled and abandoned attempts holds only those (`item_attempts_stopped`, partial; it replaces `item_attempts_by_class`) |
//! | 21 | item outcomes imported by `cairn import` (origin `import:sha256:HEX`) have an index of their own (`items_imported`, partial) |
//!
//! The object store, the inline objects and the stat cache are shared by
//! every pipeline of the project root: content is content, whoever made it.

use rusqlite::{Connection, Transaction, params};

/// Bumped on any change to the tables below.
pub const LEDGER_SCHEMA_VERSION: i64 = 21;

/// The oldest schema a migration starts from.
pub const OLDEST_MIGRATED: i64 = 3;

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started_ms INTEGER NOT NULL,
    finished_ms INTEGER,
    status TEXT NOT NULL,
    command TEXT NOT NULL,
    profile TEXT,
    token TEXT,
    executed INTEGER NOT NULL DEFAULT 0,
    fresh INTEGER NOT NULL DEFAULT 0,
    restored INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    pipeline TEXT NOT NULL DEFAULT '',
    -- BLAKE3 of the manifest's text, and the cairn that ran it.
    manifest_digest TEXT,
    cairn_version TEXT
);
-- Every stage a run selected, however it ended: `ran`, `fresh`,
-- `restored`, `remote`, `failed`, `partial`, `blocked`, `stopped` or
-- `interrupted`; why it ran (or how it was restored); what ended it (the
-- failure, the items left, what blocked it);
-- when it became ready, started (got its job slot), had its outputs hashed
-- and finished; on which executor and which host. Written when the run
-- closes, in one transaction.
CREATE TABLE IF NOT EXISTS stage_runs (
    run_id INTEGER NOT NULL,
    stage TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    message TEXT,
    ready_ms INTEGER,
    started_ms INTEGER,
    hashed_ms INTEGER,
    finished_ms INTEGER,
    executor TEXT NOT NULL,
    host TEXT NOT NULL,
    PRIMARY KEY (run_id, stage)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    key_json TEXT NOT NULL,
    outputs_json TEXT NOT NULL,
    command TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    finished_ms INTEGER NOT NULL,
    exit_code INTEGER,
    log_path TEXT,
    error TEXT,
    pipeline TEXT NOT NULL DEFAULT '',
    -- `remote:URL` if a remote cache supplied it; NULL if it ran here.
    origin TEXT
);
CREATE INDEX IF NOT EXISTS results_by_stage ON results(pipeline, stage, fingerprint, status);
-- The newest successful result and the newest attempt of each stage, kept
-- with every insert, so that reading them costs O(stages), not O(history).
CREATE TABLE IF NOT EXISTS heads (
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    ok_id INTEGER,
    attempt_id INTEGER NOT NULL,
    PRIMARY KEY (pipeline, stage)
);
-- Not WITHOUT ROWID: there every search compares whole rows, reading an
-- object's overflow pages each time its row lies on the search's path.
CREATE TABLE IF NOT EXISTS objects (
    digest BLOB PRIMARY KEY,
    bytes BLOB NOT NULL
);
-- The newest outcome of each item of a per-item stage, by fingerprint.
CREATE TABLE IF NOT EXISTS items (
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    class TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    run_id INTEGER NOT NULL,
    finished_ms INTEGER NOT NULL,
    -- The JSON result the item's command wrote (`item_result`), if any.
    result TEXT,
    -- The fingerprint of the stage's code (its template: command, checks,
    -- params, stage inputs, …) that produced this outcome.
    code TEXT,
    -- The item's outputs (`item_outputs`), as a JSON array of records.
    outputs TEXT,
    -- `remote:URL` if a remote cache supplied it, `import:sha256:HEX` if
    -- `cairn import` took it from a file of that digest; NULL if it ran here.
    origin TEXT,
    PRIMARY KEY (pipeline, stage, key, fingerprint)
) WITHOUT ROWID;
-- A stage's imported outcomes, found without reading its others. (The
-- range, not LIKE: a partial index's condition is fixed.)
CREATE INDEX IF NOT EXISTS items_imported ON items(pipeline, stage)
    WHERE origin >= 'import:' AND origin < 'import;';
-- Every attempt of every item.
CREATE TABLE IF NOT EXISTS item_attempts (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL,
    stage TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    started_ms INTEGER NOT NULL,
    finished_ms INTEGER NOT NULL,
    exit_code INTEGER,
    class TEXT NOT NULL,
    rule TEXT,
    log_path TEXT,
    code TEXT,
    pipeline TEXT NOT NULL DEFAULT '',
    handle TEXT
);
CREATE INDEX IF NOT EXISTS item_attempts_by_item ON item_attempts(pipeline, stage, key, id);
-- The few attempts cancelled or left abandoned, found without reading
-- every attempt of a stage (each run plans with them). Partial: an attempt
-- that starts and ends as most do (`running`, then its class) is never
-- written to it. A query uses it only if it says the same `class IN (…)`.
CREATE INDEX IF NOT EXISTS item_attempts_stopped ON item_attempts(pipeline, stage, class)
    WHERE class IN ('cancelled', 'abandoned');
-- A run's attempts, for its report.
CREATE INDEX IF NOT EXISTS item_attempts_by_run ON item_attempts(pipeline, run_id);
-- Attempts under one fingerprint, counted from the index alone as each
-- command starts (its attempt number counts every run's).
CREATE INDEX IF NOT EXISTS item_attempts_by_fingerprint
    ON item_attempts(pipeline, stage, key, fingerprint, run_id, class);
-- File metadata → BLAKE3 (32 bytes), trusted unless the file was written
-- within a timestamp tick of `seen_ns` (see fingerprint::StatEntry).
CREATE TABLE IF NOT EXISTS stat_cache (
    path TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    digest BLOB NOT NULL,
    seen_ns INTEGER NOT NULL
) WITHOUT ROWID;
-- Each `cairn resample`: the samples of a sampled stage it draws anew
-- (every item when `item` is null, every sample of it when `sample` is).
-- A sample's draw is the number of rows naming it; it enters the sample's
-- fingerprint.
CREATE TABLE IF NOT EXISTS redraws (
    id INTEGER PRIMARY KEY,
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    item TEXT,
    sample INTEGER,
    at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS redraws_by_stage ON redraws(pipeline, stage);
-- Which manifest (relative to the project root) each pipeline name is.
CREATE TABLE IF NOT EXISTS pipelines (
    name TEXT PRIMARY KEY,
    manifest TEXT NOT NULL
);
-- What the last run that left every stage of a pipeline valid saw (see
-- schedule::proof), under the digest of what it ran: the manifest's
-- bytes and path, the profile, the cairn binary. Any write to a table a
-- stage's freshness is read from deletes every proof (the triggers below),
-- in the transaction that writes it.
CREATE TABLE IF NOT EXISTS fresh_proofs (
    key BLOB PRIMARY KEY,
    pipeline TEXT NOT NULL,
    -- The manifest the pipeline's name belonged to: a proof counts only
    -- while `pipelines` still says so.
    manifest TEXT NOT NULL,
    made_ms INTEGER NOT NULL,
    body BLOB NOT NULL
);
-- Each pipeline's item plans (see schedule::proof::kept_plans), kept beside its
-- last proof under that proof's key. Not voided: a plan holds no verdict,
-- and is used only for the same key, stage code and unchanged item list.
CREATE TABLE IF NOT EXISTS kept_plans (
    pipeline TEXT PRIMARY KEY,
    key BLOB NOT NULL,
    body BLOB NOT NULL
);
-- Each pipeline's validated manifest (see manifest::kept), kept beside its
-- last proof under that proof's key. Not voided: it holds no verdict, and
-- is taken up only for the same key, after its checks on disk pass again.
CREATE TABLE IF NOT EXISTS kept_manifests (
    pipeline TEXT PRIMARY KEY,
    key BLOB NOT NULL,
    body BLOB NOT NULL
);
-- Each pipeline's history (its lock file, current results, failures and
-- held inline objects: see schedule::proof::kept_history) as the run that made
-- its last proof left it, kept and replaced with the proof. Taken up only
-- while that proof is kept (so the tables it was read from are unchanged)
-- and the lock file's bytes are the ones it was kept with.
CREATE TABLE IF NOT EXISTS kept_histories (
    pipeline TEXT PRIMARY KEY,
    key BLOB NOT NULL,
    body BLOB NOT NULL
);
-- The stages a run found fresh (with no reason, message or hashing time),
-- all in one row, beside its other stages in `stage_runs`: a no-op of a
-- thousand stages wrote a thousand rows, most of its writes. `stages`:
-- a JSON array of `[stage, executor, ready_ms, started_ms, finished_ms]`.
CREATE TABLE IF NOT EXISTS fresh_stage_runs (
    run_id INTEGER PRIMARY KEY,
    host TEXT NOT NULL,
    stages TEXT NOT NULL
);
";

/// The tables a stage's freshness is read from: a write to any of them
/// voids every fresh proof. (`runs`, `stage_runs`, `fresh_stage_runs` and
/// `stat_cache` are not: a no-op writes the first three, and the stat cache
/// is checked entry by entry; `pipelines` is rewritten by every command
/// that opens the ledger and decides no result.)
const VOIDING_TABLES: &[&str] = &[
    "results",
    "heads",
    "objects",
    "items",
    "item_attempts",
    "redraws",
];

/// The triggers that void the fresh proofs, one per table and kind of write.
pub fn voiding_triggers() -> String {
    let mut sql = String::new();
    for table in VOIDING_TABLES {
        for write in ["INSERT", "UPDATE", "DELETE"] {
            sql.push_str(&format!(
                "CREATE TRIGGER IF NOT EXISTS void_proofs_{table}_{write} AFTER {write} ON {table}
                 BEGIN DELETE FROM fresh_proofs; END;\n"
            ));
        }
    }
    sql
}

/// One step of the schema's history: brings a ledger from the version
/// before it to its own. Given the pipeline that opens the old ledger, and
/// that pipeline's manifest.
type Migration = fn(&Transaction<'_>, &str, &str) -> rusqlite::Result<()>;

/// Every migration, in order, by the version it brings a ledger to. The
/// last is [`LEDGER_SCHEMA_VERSION`].
const MIGRATIONS: &[(i64, Migration)] = &[
    (4, code_fingerprints),
    (5, item_outputs),
    (6, pipelines),
    (7, attempts_when_they_start),
    (8, origins),
    (9, redraws),
    (10, stage_runs),
    (11, racy_clean_stat_cache),
    (12, objects_by_rowid),
    (13, attempts_by_class),
    (14, fresh_proofs),
    (15, attempts_by_fingerprint),
    (16, kept_plans),
    (17, kept_manifests),
    (18, kept_histories),
    (19, fresh_stage_runs),
    (20, stopped_attempts),
    (21, imported_items),
];

/// Brings a ledger at `from` (≥ [`OLDEST_MIGRATED`]) up to
/// [`LEDGER_SCHEMA_VERSION`] in one transaction, each migration after
/// `from` in order. History recorded before pipelines had names belongs to
/// `pipeline` (with its `manifest`): the pipeline that opens the old ledger
/// first. A root with one manifest (the only layout older versions kept
/// apart) keeps all of its history.
pub fn migrate(
    conn: &Connection,
    from: i64,
    pipeline: &str,
    manifest: &str,
) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    for (version, migration) in MIGRATIONS {
        if from < *version {
            migration(&tx, pipeline, manifest)?;
        }
    }
    tx.execute_batch(&format!("PRAGMA user_version = {LEDGER_SCHEMA_VERSION}"))?;
    tx.commit()
}

/// 4: items and item attempts record the code fingerprint behind them.
fn code_fingerprints(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE items ADD COLUMN code TEXT;
         ALTER TABLE item_attempts ADD COLUMN code TEXT;",
    )
}

/// 5: items record their outputs.
fn item_outputs(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch("ALTER TABLE items ADD COLUMN outputs TEXT;")
}

/// 6: everything belongs to a pipeline; the old history to `pipeline`.
fn pipelines(tx: &Transaction<'_>, pipeline: &str, manifest: &str) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE runs ADD COLUMN pipeline TEXT NOT NULL DEFAULT '';
         ALTER TABLE results ADD COLUMN pipeline TEXT NOT NULL DEFAULT '';
         ALTER TABLE item_attempts ADD COLUMN pipeline TEXT NOT NULL DEFAULT '';
         DROP INDEX IF EXISTS results_by_stage;
         DROP INDEX IF EXISTS item_attempts_by_item;
         ALTER TABLE heads RENAME TO heads_v5;
         ALTER TABLE items RENAME TO items_v5;",
    )?;
    tx.execute_batch(SCHEMA)?;
    for table in ["runs", "results", "item_attempts"] {
        tx.execute(&format!("UPDATE {table} SET pipeline = ?1"), [pipeline])?;
    }
    tx.execute(
        "INSERT INTO heads (pipeline, stage, ok_id, attempt_id)
         SELECT ?1, stage, ok_id, attempt_id FROM heads_v5",
        [pipeline],
    )?;
    tx.execute(
        "INSERT INTO items (pipeline, stage, key, fingerprint, class, attempts, run_id, finished_ms, result, code, outputs)
         SELECT ?1, stage, key, fingerprint, class, attempts, run_id, finished_ms, result, code, outputs FROM items_v5",
        [pipeline],
    )?;
    tx.execute_batch("DROP TABLE heads_v5; DROP TABLE items_v5;")?;
    tx.execute(
        "INSERT OR REPLACE INTO pipelines (name, manifest) VALUES (?1, ?2)",
        params![pipeline, manifest],
    )?;
    Ok(())
}

/// 7: an item attempt is recorded when its job starts, with its handle.
fn attempts_when_they_start(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch("ALTER TABLE item_attempts ADD COLUMN handle TEXT;")
}

/// 8: results and item outcomes record where they came from. (A table
/// that migration 6 rebuilt from [`SCHEMA`] has the column already.)
fn origins(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    for table in ["results", "items"] {
        if !has_column(tx, table, "origin")? {
            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN origin TEXT;"))?;
        }
    }
    Ok(())
}

/// 9: `redraws`, the record of `cairn resample`. (Every other table is
/// as [`SCHEMA`] has it since 8, so it creates only this one.)
fn redraws(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)
}

/// 10: `stage_runs`, each run's manifest digest and cairn version, and
/// attempts indexed by run.
fn stage_runs(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    for column in ["manifest_digest", "cairn_version"] {
        if !has_column(tx, "runs", column)? {
            tx.execute_batch(&format!("ALTER TABLE runs ADD COLUMN {column} TEXT;"))?;
        }
    }
    tx.execute_batch(SCHEMA)
}

/// 11: the stat cache records when each entry was seen, and digests as
/// bytes. It is a cache: the old entries are dropped and the files hashed
/// once more.
fn racy_clean_stat_cache(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch("DROP TABLE IF EXISTS stat_cache;")?;
    tx.execute_batch(SCHEMA)
}

/// 12: inline objects move to a table with rowids, their digests to an
/// index of their own: a lookup by digest no longer reads the objects its
/// search passes (a 1,000-stage no-op made 3,600 reads of one 9 KB object).
fn objects_by_rowid(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch("ALTER TABLE objects RENAME TO objects_v11;")?;
    tx.execute_batch(SCHEMA)?;
    tx.execute_batch(
        "INSERT INTO objects (digest, bytes) SELECT digest, bytes FROM objects_v11;
         DROP TABLE objects_v11;",
    )
}

/// 13: item attempts indexed by class, for the few cancelled or abandoned
/// ones ([`SCHEMA`] creates the index).
fn attempts_by_class(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)
}

/// 14: `fresh_proofs` and the triggers that void them.
fn fresh_proofs(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)?;
    tx.execute_batch(&voiding_triggers())
}

/// 15: item attempts indexed by fingerprint ([`SCHEMA`] creates the index).
fn attempts_by_fingerprint(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)
}

/// 16: `kept_plans` ([`SCHEMA`] creates it).
fn kept_plans(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)
}

/// 17: `kept_manifests` ([`SCHEMA`] creates it).
fn kept_manifests(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)
}

/// 18: `kept_histories` ([`SCHEMA`] creates it).
fn kept_histories(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)
}

/// 19: `fresh_stage_runs` ([`SCHEMA`] creates it; the runs recorded
/// before keep their fresh stages in `stage_runs`).
fn fresh_stage_runs(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)
}

/// 20: only stopped attempts are indexed by class ([`SCHEMA`] creates the
/// partial index).
fn stopped_attempts(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch("DROP INDEX IF EXISTS item_attempts_by_class;")?;
    tx.execute_batch(SCHEMA)
}

fn imported_items(tx: &Transaction<'_>, _: &str, _: &str) -> rusqlite::Result<()> {
    tx.execute_batch(SCHEMA)
}

fn has_column(tx: &Transaction<'_>, table: &str, column: &str) -> rusqlite::Result<bool> {
    tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
        params![table, column],
        |row| row.get(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migrations_are_in_order_and_end_at_the_schema_version() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|(v, _)| *v).collect();
        let mut expected: Vec<i64> = (OLDEST_MIGRATED + 1..=LEDGER_SCHEMA_VERSION).collect();
        expected.dedup();
        assert_eq!(versions, expected, "one migration per version, in order");
    }
}
