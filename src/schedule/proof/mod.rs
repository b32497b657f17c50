//! Freshness without deciding: what cairn keeps so that a run with
//! nothing to do, or a `status`, need not decide every stage again, and
//! the check that cross-examines each kept thing.
//!
//! | mechanism | what it keeps | where | what cross-examines it |
//! |---|---|---|---|
//! | fingerprints | each stage's and item's key: the content it reads and how it runs | `crate::fingerprint`, `schedule::context` | the proptest that a prediction (`status`, `run -n`) is what a run does |
//! | the stat cache | each file's digest under its `stat` | `crate::fingerprint::stat` | a racy entry (written within a timestamp tick of being hashed) is hashed again |
//! | the fresh proof | what a run that left every stage valid saw | [`record`] (what it holds), [`draft`] (made), [`check`] (checked), [`key`] (found) | `CAIRN_CHECK_FRESH_PROOF` ([`CHECK_VAR`]): a run the proof answers also decides every stage the slow way and fails loudly if any is not fresh |
//! | kept plans | each per-item stage's item plans, beside the proof | [`kept_plans`] | with [`CHECK_VAR`] set, a stage planned from a kept plan is also planned the usual way, and a difference is an error |
//! | kept history | the ledger's history as the proof's run left it | [`kept_history`] | with [`CHECK_VAR`] set, the history is also read from the ledger, and a difference is an error |
//! | the kept manifest | the parsed manifest, beside the proof | `crate::manifest::kept` | it is kept under the manifest's bytes ([`key`]), so a different byte is another key; with [`CHECK_VAR`] set, the manifest is also loaded the usual way, and a difference is an error |
//!
//! Whether a run may use a proof or keep one is decided in one place,
//! [`Policy`].
//!
//! A fresh proof: what a run that left every stage of a pipeline valid saw,
//! kept so that the next `cairn run` with nothing to do can tell so by
//! `stat` alone, as ninja and make do, without loading the manifest or
//! deciding any stage again.
//!
//! A run decides every stage from four things: the manifest (its bytes,
//! where it is, the profile), the variables the keys read from the
//! environment, the ledger, and the files the stages read and write. A
//! proof holds each of them fixed:
//!
//! - it is kept under [`key`], the digest of the manifest's bytes, its
//!   path, the working directory, the profile and the cairn binary;
//! - it lists the digest of every variable the keys read;
//! - it lives in the ledger, whose triggers delete every proof in the same
//!   transaction as any write of a result, an item outcome or an inline
//!   object (see `store::ledger::schema`);
//! - it lists the stat of every file and directory the stages read and
//!   write, every stored object their results name, the lock file, and the
//!   directories those paths lie in.
//!
//! It is made only after checking that what it lists *is* what the run
//! decided from: each input's and output's digest, as the stat cache
//! vouches for it from the files' stats now, must be the digest the run
//! used or recorded, and the lock file must say what the run would write.
//! A file written within a timestamp tick of being hashed (racy, see
//! [`StatEntry::racy`]) when the proof was made is hashed again when it is
//! checked.
//!
//! A per-item stage's proof also lists its item list (unchanged since it
//! was read) and every item's inputs; its items' outcomes are in the
//! ledger. Stages whose freshness rests on anything else get no proof:
//! per-item stages with `item_outputs` (checked against the store item by
//! item), stages in an
//! image (a tag is pinned by asking a registry), built-ins with work beyond
//! their outputs (`register`, `oci-mirror`), and remote caches.

mod check;
mod codec;
mod draft;
mod early_history;
pub mod kept_history;
pub mod kept_plans;
mod key;
mod policy;
mod record;
#[cfg(test)]
mod tests;

pub use check::Checked;
pub use draft::ProofDraft;
pub use early_history::{EarlyHistory, FailedProof};
pub use key::{key, key_of, root_hint};
pub use policy::Policy;
pub use record::Proof;

/// Set (to anything) to have every `run` that a proof answers also decide
/// every stage the slow way and fail loudly if any is not fresh: how the
/// test suite checks each proof it meets.
pub const CHECK_VAR: &str = "CAIRN_CHECK_FRESH_PROOF";
