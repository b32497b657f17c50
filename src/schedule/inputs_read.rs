//! What a command read, looked at again once it has ended.
//!
//! A stage's key is made from its inputs' content before its command
//! runs. An input written while the command runs (an editor saving, a sync
//! tool, the command itself) leaves outputs made from content the key
//! never saw; recorded under that key, they would be "fresh" again the
//! moment the input is put back. So when a command ends (a stage's, or an
//! item's), before anything of it is stored, recorded or shared, every
//! input it read is looked at again: by the `stat` identity the stat cache
//! keeps (device, inode, size, mtime, ctime), and by content where that
//! cannot vouch (a file written within a timestamp tick of its hashing, a
//! file the cache does not know). An input whose content is no longer the
//! one its key hashed fails the command, naming it; nothing is recorded
//! under the old key, so the next run decides the stage (or the item)
//! from the input as it then is. Bazel does the same ("file modified
//! during build").
//!
//! Inputs are looked at as the key looked at them: a file or a directory
//! tree by its content, an upstream output by the content it was recorded
//! with. What is not a path (an item's image, a sample's draw) is not
//! looked at. An output of a stage of this run (or a path inside one) is
//! taken as unchanged while every file of it is as the store saw it when
//! it copied it in, even within a tick of its writing: that is all the
//! upstream stage's own record rests on, and hashing a just-written
//! output again after every command that reads it would cost as much as
//! making it.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::file_stat::{FileStat, OpenDir, stat_in_dir};
use crate::fingerprint::{Digest, StatCache, now_ns};

/// One input as a key hashed it.
#[derive(Clone)]
pub struct Read {
    /// As the manifest (or the item) names it.
    pub shown: String,
    pub abs: PathBuf,
    pub digest: Digest,
    /// An output of this run's stages, or inside one (see the module doc).
    pub made: bool,
}

/// The inputs of one stage's commands as their keys hashed them, and the
/// stat cache's entries to look at them again by.
pub struct InputsRead {
    /// The stage's own inputs.
    stage: Vec<Read>,
    root: PathBuf,
    /// The outputs of this run's stages, by path, for the items' inputs
    /// (see the module doc); empty for a plain stage.
    produced: HashSet<String>,
    /// Entries of the files read, as the keys were made. Taken by one
    /// look at a time (items end side by side).
    stat: Mutex<StatCache>,
}

impl InputsRead {
    /// The inputs `stage` of a stage in a project at `root`, looked at
    /// again through `stat`; `produced` the outputs of this run's stages.
    pub fn new(
        stage: Vec<Read>,
        root: PathBuf,
        produced: HashSet<String>,
        stat: StatCache,
    ) -> Self {
        Self {
            stage,
            root,
            produced,
            stat: Mutex::new(stat),
        }
    }

    /// Why the stage's command cannot be recorded: the first of its inputs
    /// whose content changed since its key was made.
    pub fn changed_for_stage(&self) -> Option<String> {
        self.first_changed(self.stage.iter().map(Cow::Borrowed), "the stage ran")
    }

    /// [`Self::changed_for_stage`] for an item reading `inputs` (each path
    /// as the item names it, relative to the root, with its digest) beside
    /// the stage's own.
    pub fn changed_for_item(&self, inputs: &[(String, Digest)]) -> Option<String> {
        let own = inputs
            .iter()
            .filter(|(path, _)| !path.starts_with('\0'))
            .map(|(path, digest)| {
                Cow::Owned(Read {
                    shown: path.clone(),
                    abs: self.root.join(path),
                    digest: *digest,
                    made: made(path, |p| self.produced.contains(p)),
                })
            });
        let stage = self.stage.iter().map(Cow::Borrowed);
        self.first_changed(own.chain(stage), "the item ran")
    }

    fn first_changed<'a>(
        &self,
        inputs: impl Iterator<Item = Cow<'a, Read>>,
        while_what: &str,
    ) -> Option<String> {
        let mut stat = self.stat.lock().unwrap_or_else(|p| p.into_inner());
        // (Files are `stat`ed by name in their directory: most inputs of a
        // stage lie in a few.)
        let mut dir = OpenDir::default();
        for read in inputs {
            let Read {
                shown,
                abs,
                digest: hashed,
                made,
            } = &*read;
            let seen_ns = now_ns();
            let found = stat_in_dir(abs, &mut dir);
            if let Ok(found) = &found
                && !found.is_dir()
                && stat.entry(abs).is_some_and(|entry| {
                    entry.digest == *hashed && entry.matches_stat(found) && (*made || !entry.racy())
                })
            {
                continue;
            }
            if *made
                && found.as_ref().is_ok_and(FileStat::is_dir)
                && stat
                    .vouch(abs)
                    .is_some_and(|vouched| vouched.digest == *hashed)
            {
                continue;
            }
            let content = found.and_then(|found| stat.content_as_stated(abs, &found, seen_ns));
            let now = match content {
                Ok(content) if content.digest() == *hashed => continue,
                Ok(content) => content.digest().to_string(),
                Err(error) => format!("unreadable: {error}"),
            };
            return Some(format!(
                "input `{shown}` changed while {while_what} ({hashed} when its key was made, {now} after): nothing of this run of it is recorded"
            ));
        }
        None
    }
}

/// Whether `path` is a path `is_output` holds, or lies in one.
pub fn made(path: &str, is_output: impl Fn(&str) -> bool) -> bool {
    let mut rest = path;
    loop {
        if is_output(rest) {
            return true;
        }
        match rest.rfind('/') {
            Some(slash) => rest = &rest[..slash],
            None => return false,
        }
    }
}
