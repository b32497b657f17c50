//! Which pipeline a ledger connection speaks for.
//!
//! A project root holds one `cache/`: one object store and one ledger file,
//! shared by every manifest whose root it is. Inside the ledger, runs,
//! results, heads and items belong to a pipeline, named by its
//! `[pipeline] name`, so two manifests in one root never see (or collect)
//! each other's history, while identical content is stored once.
//!
//! The `pipelines` table records which manifest (its path relative to the
//! root) each name belongs to. A second manifest with a name already taken
//! by a manifest that still exists is refused: silently sharing one history
//! between two different pipelines is what the names are there to prevent.
//! A name whose recorded manifest is gone (it was moved or renamed), or no
//! longer declares that name, passes to the manifest that now uses it,
//! with its history.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};

use crate::manifest::Manifest;

/// A pipeline: its name and its manifest, relative to the project root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineId {
    pub name: String,
    /// `/`-separated, relative to the root when the manifest is inside it
    /// (else absolute), so that moving the whole project changes nothing.
    pub manifest: String,
}

impl PipelineId {
    pub fn of(manifest: &Manifest) -> Self {
        Self {
            name: manifest.name.clone(),
            manifest: relative_to_root(&manifest.path, &manifest.root),
        }
    }

    /// A pipeline with no manifest on disk (tests, tools).
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            manifest: format!("{name}.toml"),
        }
    }

    /// The manifest's absolute path under `root`.
    pub fn manifest_path(&self, root: &Path) -> PathBuf {
        root.join(&self.manifest)
    }
}

fn relative_to_root(manifest: &Path, root: &Path) -> String {
    let manifest = manifest
        .canonicalize()
        .unwrap_or_else(|_| manifest.to_owned());
    let root = root.canonicalize().unwrap_or_else(|_| root.to_owned());
    match manifest.strip_prefix(&root) {
        Ok(inside) => inside
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/"),
        Err(_) => manifest.to_string_lossy().into_owned(),
    }
}

/// What the `pipelines` table says about a name.
pub enum Claim {
    /// Nobody holds the name yet.
    Free,
    /// This very manifest holds it.
    Ours,
    /// A manifest that no longer exists held it; it passes to this one.
    Orphaned,
    /// A different manifest that still exists holds it.
    Taken { manifest: String },
}

/// Who holds `pipeline.name` in the ledger at `root`.
pub fn claim(conn: &Connection, root: &Path, pipeline: &PipelineId) -> rusqlite::Result<Claim> {
    let holder: Option<String> = conn
        .query_row(
            "SELECT manifest FROM pipelines WHERE name = ?1",
            [&pipeline.name],
            |row| row.get(0),
        )
        .optional()?;
    Ok(match holder {
        None => Claim::Free,
        Some(manifest) if manifest == pipeline.manifest => Claim::Ours,
        Some(manifest) if still_named(&root.join(&manifest), &pipeline.name) => {
            Claim::Taken { manifest }
        }
        Some(_) => Claim::Orphaned,
    })
}

/// Whether the manifest at `path` exists and still declares `name` (one
/// that does not parse is taken to: better refused than shared).
fn still_named(path: &Path, name: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return true;
    };
    table
        .get("pipeline")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .is_none_or(|declared| declared == name)
}

/// Records that `pipeline.name` belongs to `pipeline.manifest`.
pub fn register(conn: &Connection, pipeline: &PipelineId) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO pipelines (name, manifest) VALUES (?1, ?2)
         ON CONFLICT(name) DO UPDATE SET manifest = ?2",
        params![pipeline.name, pipeline.manifest],
    )?;
    Ok(())
}

/// Every pipeline recorded in the ledger.
pub fn all(conn: &Connection) -> rusqlite::Result<Vec<PipelineId>> {
    let mut statement = conn.prepare("SELECT name, manifest FROM pipelines ORDER BY name")?;
    let rows = statement.query_map([], |row| {
        Ok(PipelineId {
            name: row.get(0)?,
            manifest: row.get(1)?,
        })
    })?;
    rows.collect()
}
