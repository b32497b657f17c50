//! `<manifest-stem>.lock`: the committed record of validated results.
//!
//! Deterministic TOML (stages and outputs sorted by name), rewritten
//! atomically only when its content changes, so it diffs cleanly in git.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::StoreError;
use super::output_record::{OutputKind, OutputRecord};
use crate::fingerprint::Digest;

/// 2: the file carries a checksum of its own content.
pub const LOCK_FORMAT_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockFile {
    pub version: u32,
    pub pipeline: String,
    /// BLAKE3 of the file as cairn renders it without this line: a hand
    /// edit (or a merge) shows as a mismatch. Absent in version 1 files.
    #[serde(default, skip_serializing)]
    pub checksum: Option<Digest>,
    #[serde(default)]
    pub stages: BTreeMap<String, LockedStage>,
}

/// What is wrong with a lock file that cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockProblem {
    /// Not TOML of the lock's shape.
    Unparsable(String),
    /// Its checksum does not match its content.
    Edited,
    /// Written by a newer cairn.
    NewerFormat(u32),
    /// It records another pipeline.
    OtherPipeline(String),
}

impl std::fmt::Display for LockProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockProblem::Unparsable(e) => write!(f, "it cannot be parsed: {e}"),
            LockProblem::Edited => write!(
                f,
                "its checksum does not match its content: it was edited by hand (or merged)"
            ),
            LockProblem::NewerFormat(v) => write!(
                f,
                "it has format version {v}; this cairn reads up to {LOCK_FORMAT_VERSION}"
            ),
            LockProblem::OtherPipeline(name) => {
                write!(f, "it records pipeline `{name}`, not this manifest's")
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedStage {
    pub fingerprint: Digest,
    #[serde(default)]
    pub outputs: BTreeMap<String, LockedOutput>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedOutput {
    pub path: String,
    pub kind: OutputKind,
    pub digest: Digest,
    pub size: u64,
}

impl LockFile {
    pub fn new(pipeline: &str) -> Self {
        Self {
            version: LOCK_FORMAT_VERSION,
            pipeline: pipeline.to_owned(),
            checksum: None,
            stages: BTreeMap::new(),
        }
    }

    /// Reads and verifies the lock file at `path` of pipeline `pipeline`:
    /// `Ok(None)` if there is none, `Err` (with the problem) if it is
    /// there but cannot be trusted.
    pub fn read(path: &Path, pipeline: &str) -> Result<Option<Self>, StoreError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(path, e)),
        };
        Self::verify(&text, pipeline)
            .map(Some)
            .map_err(|problem| StoreError::LockFile {
                path: path.to_owned(),
                problem,
            })
    }

    /// Parses `text` and checks its format version, pipeline and checksum.
    pub fn verify(text: &str, pipeline: &str) -> Result<Self, LockProblem> {
        // A file as cairn wrote it is read without a TOML parser; its
        // checksum proves the reading right (else the parser decides).
        if let Some(lock) = Self::parse_as_rendered(text)
            && lock.version == LOCK_FORMAT_VERSION
            && lock.pipeline == pipeline
            && lock.checksum.is_some_and(|checksum| {
                text_checksum(text) == Some(checksum) || lock.content_checksum() == checksum
            })
        {
            return Ok(lock);
        }
        let lock = Self::parse(text).map_err(|e| LockProblem::Unparsable(e.to_string()))?;
        if lock.version > LOCK_FORMAT_VERSION {
            return Err(LockProblem::NewerFormat(lock.version));
        }
        if lock.pipeline != pipeline {
            return Err(LockProblem::OtherPipeline(lock.pipeline));
        }
        if lock.version >= 2 && lock.checksum != Some(lock.content_checksum()) {
            return Err(LockProblem::Edited);
        }
        Ok(lock)
    }

    /// The checksum of the content as cairn renders it: of the text
    /// without its checksum line.
    fn content_checksum(&self) -> Digest {
        self.checksum_of(&self.render_stages())
    }

    fn checksum_of(&self, stages: &str) -> Digest {
        let mut hasher = blake3::Hasher::new();
        hasher.update(self.render_head(None).as_bytes());
        hasher.update(stages.as_bytes());
        Digest::from_hash(hasher.finalize())
    }

    pub fn insert(&mut self, stage: &str, fingerprint: Digest, outputs: &[OutputRecord]) {
        self.stages.insert(
            stage.to_owned(),
            LockedStage {
                fingerprint,
                outputs: outputs
                    .iter()
                    .map(|o| {
                        (
                            o.name.clone(),
                            LockedOutput {
                                path: o.path.clone(),
                                kind: o.kind,
                                digest: o.digest,
                                size: o.size,
                            },
                        )
                    })
                    .collect(),
            },
        );
    }

    /// The TOML text. Written by hand (no serializer) because this runs at
    /// the end of every `cairn run`, and for a thousand stages a generic
    /// serializer costs more than the whole no-op run should.
    pub fn render(&self) -> String {
        // The stages are rendered once: the checksum covers them too.
        let stages = self.render_stages();
        let mut out = self.render_head(Some(self.checksum_of(&stages)));
        out.push_str(&stages);
        out
    }

    fn render_head(&self, checksum: Option<Digest>) -> String {
        use std::fmt::Write;
        let mut out = String::with_capacity(256);
        out.push_str(
            "# Written by cairn: the validated fingerprint and output digests of each stage.\n",
        );
        out.push_str(
            "# Commit this file; a collaborator's checkout can be verified against it.\n\n",
        );
        let _ = writeln!(out, "version = {}", self.version);
        let _ = writeln!(out, "pipeline = {}", quote(&self.pipeline));
        if let Some(checksum) = checksum {
            let _ = writeln!(out, "checksum = \"{checksum}\"");
        }
        out
    }

    fn render_stages(&self) -> String {
        let mut out = String::with_capacity(self.stages.len() * 320);
        for (name, stage) in &self.stages {
            render_stage(&mut out, name, stage);
        }
        out
    }

    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// Reads `text` if it has exactly the shape [`Self::render`] writes
    /// with plain names and paths (no quoted keys, no escapes); `None` for
    /// anything else, which [`Self::parse`] reads. Fast: a no-op run reads
    /// a lock of every stage.
    fn parse_as_rendered(text: &str) -> Option<Self> {
        let mut lock = LockFile::new("");
        lock.version = 0;
        // The stage and output the lines below a header belong to.
        let mut stage: Option<String> = None;
        let mut output: Option<OutputLines> = None;
        let finish =
            |lock: &mut LockFile, stage: &Option<String>, output: &mut Option<OutputLines>| {
                let Some(out) = output.take() else {
                    return Some(());
                };
                let locked = LockedOutput {
                    path: out.path,
                    kind: out.kind?,
                    digest: out.digest?,
                    size: out.size?,
                };
                let stage = lock.stages.get_mut(stage.as_ref()?)?;
                stage.outputs.insert(out.name, locked);
                Some(())
            };
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(header) = line
                .strip_prefix("[stages.")
                .and_then(|h| h.strip_suffix(']'))
            {
                finish(&mut lock, &stage, &mut output)?;
                match header.split_once(".outputs.") {
                    None => {
                        let name = bare(header)?;
                        lock.stages.insert(
                            name.to_owned(),
                            LockedStage {
                                fingerprint: Digest::of(b""),
                                outputs: BTreeMap::new(),
                            },
                        );
                        stage = Some(name.to_owned());
                    }
                    Some((of, name)) => {
                        if Some(bare(of)?) != stage.as_deref() {
                            return None;
                        }
                        output = Some(OutputLines {
                            name: bare(name)?.to_owned(),
                            ..OutputLines::default()
                        });
                    }
                }
                continue;
            }
            let (key, value) = line.split_once(" = ")?;
            match (key, &mut output, &stage) {
                ("version", None, None) => lock.version = value.parse().ok()?,
                ("pipeline", None, None) => lock.pipeline = plain_string(value)?.to_owned(),
                ("checksum", None, None) => lock.checksum = plain_string(value)?.parse().ok(),
                ("fingerprint", None, Some(name)) => {
                    lock.stages.get_mut(name)?.fingerprint = plain_string(value)?.parse().ok()?
                }
                ("path", Some(out), _) => out.path = plain_string(value)?.to_owned(),
                ("kind", Some(out), _) => {
                    out.kind = Some(match plain_string(value)? {
                        "file" => OutputKind::File,
                        "dir" => OutputKind::Dir,
                        _ => return None,
                    })
                }
                ("digest", Some(out), _) => out.digest = plain_string(value)?.parse().ok(),
                ("size", Some(out), _) => out.size = value.parse().ok(),
                _ => return None,
            }
        }
        finish(&mut lock, &stage, &mut output)?;
        Some(lock)
    }

    /// Writes `text`, a lock file as rendered, if it is not what the file
    /// holds (temp file + rename); returns it.
    pub fn write_text(path: &Path, text: String) -> Result<String, StoreError> {
        if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
            return Ok(text);
        }
        let temp = path.with_extension("lock.tmp");
        std::fs::write(&temp, text.as_bytes()).map_err(|e| StoreError::io(&temp, e))?;
        std::fs::rename(&temp, path).map_err(|e| StoreError::io(path, e))?;
        Ok(text)
    }
}

/// The lines of some stages of a lock file, rendered ahead and joined in
/// name order: the lock file with more stages is rendered by putting
/// theirs in their places ([`Self::render_with`]). A run renders those of
/// the stages it has done while its last commands run.
#[derive(Debug)]
pub struct RenderedStages {
    text: String,
    /// Each stage's name and where its lines end in `text`, in name order.
    ends: Vec<(String, usize)>,
}

impl RenderedStages {
    /// The lines of every stage of `lock`.
    pub fn of(lock: &LockFile) -> Self {
        let mut text = String::with_capacity(lock.stages.len() * 320);
        let ends = lock
            .stages
            .iter()
            .map(|(name, stage)| {
                render_stage(&mut text, name, stage);
                (name.clone(), text.len())
            })
            .collect();
        Self { text, ends }
    }

    /// The text of `lock`, which holds the stages rendered here, each with
    /// the entry it was rendered from, and of `others` those it holds: the
    /// lines of these are rendered now and put in their places.
    pub fn render_with(&self, lock: &LockFile, others: &[&str]) -> String {
        let mut others: Vec<(&str, &LockedStage)> = others
            .iter()
            .filter_map(|name| lock.stages.get_key_value(*name))
            .map(|(name, stage)| (name.as_str(), stage))
            .collect();
        others.sort_unstable_by_key(|(name, _)| *name);
        let mut stages = String::with_capacity(self.text.len() + others.len() * 320);
        let mut copied = 0;
        for (name, stage) in others {
            // After the last stage rendered ahead whose name sorts before.
            let before = self
                .ends
                .partition_point(|(ahead, _)| ahead.as_str() < name);
            let at = before.checked_sub(1).map_or(0, |last| self.ends[last].1);
            stages.push_str(&self.text[copied..at]);
            copied = at;
            render_stage(&mut stages, name, stage);
        }
        stages.push_str(&self.text[copied..]);
        let mut out = lock.render_head(Some(lock.checksum_of(&stages)));
        out.push_str(&stages);
        debug_assert_eq!(out, lock.render(), "a lock file rendered ahead in part");
        out
    }
}

/// Appends the lines of stage `name`: its table and each output's.
/// (Written piece by piece: a thousand stages' keys and paths are not each
/// made a string of their own first.)
fn render_stage(out: &mut String, name: &str, stage: &LockedStage) {
    use std::fmt::Write;
    out.push_str("\n[stages.");
    push_key(out, name);
    let _ = writeln!(out, "]\nfingerprint = \"{}\"", stage.fingerprint);
    for (output, locked) in &stage.outputs {
        let kind = match locked.kind {
            OutputKind::File => "file",
            OutputKind::Dir => "dir",
        };
        out.push_str("\n[stages.");
        push_key(out, name);
        out.push_str(".outputs.");
        push_key(out, output);
        out.push_str("]\npath = ");
        push_quoted(out, &locked.path);
        let _ = writeln!(
            out,
            "\nkind = \"{kind}\"\ndigest = \"{}\"\nsize = {}",
            locked.digest, locked.size
        );
    }
}

/// The checksum of `text` as it is, without its checksum line: the
/// checksum it records if the rest is what cairn rendered (the checksum
/// line may have moved among the lines above the first stage, which reads
/// the same), and then its reading as rendered is the lock that was
/// rendered. Its lines are not rendered again to tell.
fn text_checksum(text: &str) -> Option<Digest> {
    let at = text.find("\nchecksum = \"")? + 1;
    let end = at + text[at..].find('\n')? + 1;
    let mut hasher = blake3::Hasher::new();
    hasher.update(&text.as_bytes()[..at]);
    hasher.update(&text.as_bytes()[end..]);
    Some(Digest::from_hash(hasher.finalize()))
}

/// The checksum the head of `text` (a lock file as cairn renders it)
/// records, as reading it gives it.
pub fn recorded_checksum(text: &str) -> Option<Digest> {
    const LINE: &str = "\nchecksum = \"";
    let at = text.find(LINE)? + LINE.len();
    text[at..].split('"').next()?.parse().ok()
}

/// Whether `name` is written as a bare TOML key.
fn is_bare(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// Writes `name` as a TOML key: bare if it can be, quoted otherwise.
fn push_key(out: &mut String, name: &str) {
    if is_bare(name) {
        out.push_str(name);
    } else {
        push_quoted(out, name);
    }
}

/// An output's table while its lines are read.
#[derive(Default)]
struct OutputLines {
    name: String,
    path: String,
    kind: Option<OutputKind>,
    digest: Option<Digest>,
    size: Option<u64>,
}

/// `name` if it is a bare TOML key (as [`push_key`] writes a plain name).
fn bare(name: &str) -> Option<&str> {
    is_bare(name).then_some(name)
}

/// The text of a TOML basic string with no escapes in it.
fn plain_string(value: &str) -> Option<&str> {
    let inner = value.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains(['"', '\\'])).then_some(inner)
}

/// A TOML basic string.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    push_quoted(&mut out, text);
    out
}

/// Writes `text` as a TOML basic string.
fn push_quoted(out: &mut String, text: &str) {
    use std::fmt::Write;
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_lock_is_read_without_the_toml_parser_and_alike() {
        let record = |name: &str, path: &str, kind| OutputRecord {
            name: name.into(),
            path: path.into(),
            kind,
            digest: Digest::of(path.as_bytes()),
            size: 7,
            executable: false,
            inline: false,
        };
        let mut lock = LockFile::new("pipe");
        lock.insert(
            "a",
            Digest::of(b"a"),
            &[record("out", "out/a.txt", OutputKind::File)],
        );
        lock.insert(
            "b-2",
            Digest::of(b"b"),
            &[record("d", "data", OutputKind::Dir)],
        );
        lock.insert("empty", Digest::of(b"e"), &[]);
        let text = lock.render();
        let fast = LockFile::parse_as_rendered(&text).expect("the fast reading");
        assert_eq!(fast, LockFile::parse(&text).unwrap());
        assert_eq!(LockFile::verify(&text, "pipe").unwrap(), fast);
        // Its checksum is checked on its text as it is.
        assert_eq!(text_checksum(&text), Some(lock.content_checksum()));
        // A hand edit is caught either way.
        let edited = text.replace("size = 7", "size = 8");
        assert_eq!(LockFile::verify(&edited, "pipe"), Err(LockProblem::Edited));
        // A lock that reads as rendered but is not so byte for byte (a
        // comment added) is checked on its content, as rendered again.
        let commented = text.replace("\n[stages.b-2]", "\n# why b-2\n[stages.b-2]");
        assert_ne!(text_checksum(&commented), Some(lock.content_checksum()));
        assert_eq!(LockFile::verify(&commented, "pipe").unwrap(), fast);
        let commented_and_edited = commented.replace("size = 7", "size = 8");
        assert_eq!(
            LockFile::verify(&commented_and_edited, "pipe"),
            Err(LockProblem::Edited)
        );
        // Names it does not read plainly go to the TOML parser.
        let mut quoted = LockFile::new("pipe");
        quoted.insert(
            "a b",
            Digest::of(b"a"),
            &[record("o", "say \"hi\".txt", OutputKind::File)],
        );
        let text = quoted.render();
        assert_eq!(text_checksum(&text), Some(quoted.content_checksum()));
        assert_eq!(LockFile::parse_as_rendered(&text), None);
        assert_eq!(LockFile::verify(&text, "pipe").unwrap().stages.len(), 1);
    }

    #[test]
    fn rendered_lock_file_parses_back_to_itself() {
        let mut lock = LockFile::new("pipe \"line\"");
        let outputs = vec![
            OutputRecord {
                name: "plain".into(),
                path: "state/a b.txt".into(),
                kind: OutputKind::File,
                digest: Digest::of(b"a"),
                size: 1,
                executable: false,
                inline: false,
            },
            OutputRecord {
                name: "with.dot".into(),
                path: "state/tab\there\\x".into(),
                kind: OutputKind::Dir,
                digest: Digest::of(b"b"),
                size: 2,
                executable: false,
                inline: false,
            },
        ];
        lock.insert("stage.with.dots", Digest::of(b"fp"), &outputs);
        lock.insert("plain-stage", Digest::of(b"fp2"), &outputs[..1]);
        let text = lock.render();
        let mut parsed = LockFile::parse(&text).unwrap();
        assert!(parsed.checksum.is_some(), "{text}");
        parsed.checksum = None;
        assert_eq!(parsed, lock, "{text}");
        assert_eq!(
            LockFile::verify(&text, "pipe \"line\"").map(|mut l| {
                l.checksum = None;
                l
            }),
            Ok(lock)
        );
    }

    #[test]
    fn a_lock_file_rendered_ahead_in_part_is_the_lock_file_rendered_whole() {
        let output = |name: &str| OutputRecord {
            name: "out".into(),
            path: format!("out/{name}.txt"),
            kind: OutputKind::File,
            digest: Digest::of(name.as_bytes()),
            size: name.len() as u64,
            executable: false,
            inline: false,
        };
        let enter = |lock: &mut LockFile, names: &[&str]| {
            for name in names {
                lock.insert(name, Digest::of(name.as_bytes()), &[output(name)]);
            }
        };
        // Ahead: some stages; then the others, before, between and after
        // them (one of which has no entry), or none.
        for (ahead, others) in [
            (&["b", "d"][..], &["a", "c", "e", "gone"][..]),
            (&["b", "d"][..], &[][..]),
            (&[][..], &["a", "c"][..]),
            (&["a.b", "a-b", "ab"][..], &["a", "a.c", "b"][..]),
        ] {
            let mut drafted = LockFile::new("p");
            enter(&mut drafted, ahead);
            let rendered = RenderedStages::of(&drafted);
            let mut lock = drafted.clone();
            enter(
                &mut lock,
                &others
                    .iter()
                    .filter(|n| **n != "gone")
                    .copied()
                    .collect::<Vec<_>>(),
            );
            assert_eq!(
                rendered.render_with(&lock, others),
                lock.render(),
                "{ahead:?} then {others:?}"
            );
        }
    }

    #[test]
    fn an_edited_lock_file_fails_its_checksum() {
        let mut lock = LockFile::new("p");
        lock.insert("a", Digest::of(b"fp"), &[]);
        let text = lock.render();
        let edited = text.replace(
            &Digest::of(b"fp").to_string(),
            &Digest::of(b"x").to_string(),
        );
        assert_eq!(LockFile::verify(&edited, "p"), Err(LockProblem::Edited));
        assert!(matches!(
            LockFile::verify("version = [", "p"),
            Err(LockProblem::Unparsable(_))
        ));
        assert_eq!(
            LockFile::verify(&text, "q"),
            Err(LockProblem::OtherPipeline("p".to_owned()))
        );
    }
}
