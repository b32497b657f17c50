//! What the ledger records of a stored output, and the store restores.

use serde::{Deserialize, Serialize};

use crate::fingerprint::Digest;

/// A stored output: what to restore, and how to check it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub name: String,
    pub path: String,
    pub kind: OutputKind,
    pub digest: Digest,
    /// Bytes of the file, or the sum over the tree's files.
    pub size: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
    /// A small file kept inside the ledger rather than in `objects/`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inline: bool,
}

/// Files up to this size are stored inside the ledger, in the same
/// transaction as the result that refers to them: no file, no fsync, no
/// rename, and the object exists exactly when its result does.
pub const INLINE_MAX: u64 = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputKind {
    File,
    Dir,
}
