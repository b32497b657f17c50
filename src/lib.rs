//! cairn: a declarative pipeline engine.
//!
//! Layers, each depending only on those before it:
//! `manifest` → `graph` → `fingerprint` → `store` → `exec` → `schedule` → `cli`.

pub mod cli;
pub mod exec;
pub mod fingerprint;
pub mod graph;
pub mod manifest;
pub mod schedule;
pub mod store;
