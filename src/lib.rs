//! cairn: a declarative pipeline engine.
//!
//! Layers, each depending only on those before it:
//! `manifest` → `graph` → `fingerprint` → `store` → `release` → `builtins` →
//! `exec` → `schedule` → `cli`. `records` (JSON record files),
//! `canonical_json`, `causes` (errors on one line), `file_stat` (`stat`s by
//! name), `side_by_side` (work in shares on threads), `tls` (the one TLS
//! provider) and `trajectory` (what an agent harness's trajectory says)
//! stand apart.

pub mod builtins;
pub mod canonical_json;
pub mod causes;
pub mod cli;
pub mod exec;
pub mod file_stat;
pub mod fingerprint;
pub mod graph;
pub mod manifest;
pub mod records;
pub mod release;
pub mod schedule;
pub mod side_by_side;
pub mod store;
pub mod tls;
pub mod trajectory;
