//! What a proof holds, and its encoding: compact, as most of a proof is
//! thousands of files.

use std::path::{Path, PathBuf};

use super::codec::{Decoder, Encoder};
use crate::fingerprint::{Digest, DirStat, StatEntry};

/// Bumped whenever the encoding or what a proof lists changes.
pub(super) const FORMAT: &[u8; 8] = b"cfproof3";

/// One thing a proof rests on, as it was when the proof was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Watched {
    /// A file the stages read or write (or the lock file), with the entry
    /// its digest was vouched for by. (A proof keeps the digest of a racy
    /// entry only: no other is hashed when it is checked.)
    File(PathBuf, StatEntry),
    /// A directory whose listing entered a digest.
    Dir(PathBuf, DirStat),
    /// A directory a path lies in (its own, not a link to another):
    /// replaced by a symbolic link, the path would be elsewhere.
    Place { path: PathBuf, dev: u64, ino: u64 },
    /// A stored object a result names: present with its size.
    Object {
        path: PathBuf,
        dev: u64,
        ino: u64,
        size: u64,
    },
}

impl Watched {
    pub(super) fn path(&self) -> &Path {
        match self {
            Watched::File(path, _) | Watched::Dir(path, _) => path,
            Watched::Place { path, .. } | Watched::Object { path, .. } => path,
        }
    }

    /// Whether `self` and `other` say the same of what is there, seen at
    /// whatever moment (a stage's input that a per-item stage also lists
    /// is vouched for twice, seen at two moments).
    pub(super) fn same_state(&self, other: &Watched) -> bool {
        match (self, other) {
            (Watched::File(_, a), Watched::File(_, b)) => {
                StatEntry { seen_ns: 0, ..*a } == StatEntry { seen_ns: 0, ..*b }
            }
            (Watched::Dir(_, a), Watched::Dir(_, b)) => {
                DirStat { seen_ns: 0, ..*a } == DirStat { seen_ns: 0, ..*b }
            }
            _ => self == other,
        }
    }
}

/// What a run that left every stage valid saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// The project root it was made for.
    pub root: PathBuf,
    /// Every stage, in the order the run decided them: its name and where
    /// its commands run (for the run's timeline).
    pub stages: Vec<(String, String)>,
    pub(super) env: Vec<(String, Option<Digest>)>,
    pub(super) watched: Vec<Watched>,
}

impl Proof {
    /// How many paths the proof rests on.
    pub fn paths(&self) -> usize {
        self.watched.len()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Encoder(Vec::with_capacity(64 + self.watched.len() * 96));
        out.0.extend_from_slice(FORMAT);
        out.path(&self.root);
        out.u64(self.stages.len() as u64);
        for (name, executor) in &self.stages {
            out.text(name);
            out.text(executor);
        }
        out.u64(self.env.len() as u64);
        for (name, digest) in &self.env {
            out.text(name);
            match digest {
                Some(digest) => {
                    out.0.push(1);
                    out.0.extend_from_slice(digest.as_bytes());
                }
                None => out.0.push(0),
            }
        }
        // Compact, as most of a proof is thousands of files: each path
        // after what it shares with the one before, numbers as varints,
        // a file's times after its mtime, and its digest only while it is
        // racy (the only time a check hashes it).
        out.u64(self.watched.len() as u64);
        let mut before: &[u8] = &[];
        for watched in &self.watched {
            let path = watched.path().as_os_str().as_encoded_bytes();
            match watched {
                Watched::File(_, entry) => {
                    out.0.push(0);
                    out.path_after(before, path);
                    out.var(entry.dev);
                    out.var(entry.ino);
                    out.var(entry.size);
                    out.times(entry.mtime_ns, entry.ctime_ns, entry.seen_ns);
                    if entry.racy() {
                        out.0.push(1);
                        out.0.extend_from_slice(entry.digest.as_bytes());
                    } else {
                        out.0.push(0);
                    }
                }
                Watched::Dir(_, d) => {
                    out.0.push(1);
                    out.path_after(before, path);
                    out.var(d.dev);
                    out.var(d.ino);
                    out.times(d.mtime_ns, d.ctime_ns, d.seen_ns);
                }
                Watched::Place { dev, ino, .. } => {
                    out.0.push(2);
                    out.path_after(before, path);
                    out.var(*dev);
                    out.var(*ino);
                }
                Watched::Object { dev, ino, size, .. } => {
                    out.0.push(3);
                    out.path_after(before, path);
                    out.var(*dev);
                    out.var(*ino);
                    out.var(*size);
                }
            }
            before = path;
        }
        out.0
    }

    /// The proof `bytes` encode; `None` for anything else (another format,
    /// a cut or damaged body).
    pub fn decode(bytes: &[u8]) -> Option<Proof> {
        let mut d = Decoder(bytes.strip_prefix(FORMAT)?);
        let root = d.path()?;
        let stages = (0..d.count()?)
            .map(|_| Some((d.text()?, d.text()?)))
            .collect::<Option<Vec<_>>>()?;
        let env = (0..d.count()?)
            .map(|_| {
                let name = d.text()?;
                let digest = match d.byte()? {
                    0 => None,
                    1 => Some(d.digest()?),
                    _ => return None,
                };
                Some((name, digest))
            })
            .collect::<Option<Vec<_>>>()?;
        let mut before = Vec::new();
        let watched = (0..d.count()?)
            .map(|_| {
                let kind = d.byte()?;
                let path = d.path_after(&mut before)?;
                Some(match kind {
                    0 => {
                        let (dev, ino, size) = (d.var()?, d.var()?, d.var()?);
                        let (mtime_ns, ctime_ns, seen_ns) = d.times()?;
                        let digest = match d.byte()? {
                            0 => None,
                            1 => Some(d.digest()?),
                            _ => return None,
                        };
                        let entry = StatEntry {
                            dev,
                            ino,
                            size,
                            mtime_ns,
                            ctime_ns,
                            // (Not racy: never hashed again, so never read.)
                            digest: digest
                                .unwrap_or(Digest::from_hash(blake3::Hash::from_bytes([0; 32]))),
                            seen_ns,
                        };
                        // A racy file is hashed when the proof is checked.
                        if digest.is_none() && entry.racy() {
                            return None;
                        }
                        Watched::File(path, entry)
                    }
                    1 => {
                        let (dev, ino) = (d.var()?, d.var()?);
                        let (mtime_ns, ctime_ns, seen_ns) = d.times()?;
                        let stat = DirStat {
                            dev,
                            ino,
                            mtime_ns,
                            ctime_ns,
                            seen_ns,
                        };
                        Watched::Dir(path, stat)
                    }
                    2 => Watched::Place {
                        path,
                        dev: d.var()?,
                        ino: d.var()?,
                    },
                    3 => Watched::Object {
                        path,
                        dev: d.var()?,
                        ino: d.var()?,
                        size: d.var()?,
                    },
                    _ => return None,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        d.0.is_empty().then_some(Proof {
            root,
            stages,
            env,
            watched,
        })
    }
}
