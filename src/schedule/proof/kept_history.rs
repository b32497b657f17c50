//! The history a fresh proof keeps, for the run after it when the proof
//! fails.
//!
//! A run decides from its history: the lock file, and each stage's current
//! result, newest failure and held inline objects, read from the ledger
//! (see [`super::History`]). A thousand stages take a thousand results
//! parsed and the lock file read, before the first command can start. When
//! one input is edited, all of that is what the run that made the proof
//! left: the proof is deleted by any write to the tables it is read from
//! (`results`, `heads`, `objects`, …), so while the proof is there they
//! are as that run left them; and the lock file is the one it wrote if
//! its bytes are. So the proof keeps what that run's history became, and
//! a run whose proof failed takes it up instead of reading the ledger,
//! when the lock file's bytes are the ones it was kept with. The stat
//! cache is read as usual: it is not among those tables, and each of its
//! entries is checked by itself.
//!
//! With `CAIRN_CHECK_FRESH_PROOF` set (as the test suite does) the history
//! is also read the usual way, and a difference is an error.

use std::collections::{HashMap, HashSet};

use super::codec::{Decoder, Encoder};
use crate::fingerprint::Digest;
use crate::store::{
    LOCK_FORMAT_VERSION, LockFile, OutputKind, OutputRecord, ResultRecord, ResultStatus,
    recorded_checksum,
};

/// What a run's history was when it kept its proof.
#[derive(Debug)]
pub struct KeptHistory {
    /// The digest of the lock file's bytes it is good for...
    pub lock_digest: Digest,
    /// ...and that lock file, as reading it gives it.
    pub lock: LockFile,
    pub latest_ok: HashMap<String, ResultRecord>,
    pub latest_failure: HashMap<String, ResultRecord>,
    pub inline_held: HashSet<Digest>,
}

/// A history as the ledger keeps it beside a proof: the lock file of
/// pipeline `pipeline` rendered as `lock_text`, which names `locked`, and
/// the results. Each stage the lock names must have its current result in
/// `latest_ok`, under the fingerprint and with the outputs the lock gives
/// it: the lock is kept as its stages' names and made again from those
/// results.
pub fn encode<'a>(
    lock_text: &str,
    pipeline: &str,
    locked: impl ExactSizeIterator<Item = &'a str>,
    latest_ok: &HashMap<String, ResultRecord>,
    latest_failure: &HashMap<String, ResultRecord>,
    inline_held: &HashSet<Digest>,
) -> Vec<u8> {
    let mut out = Encoder(Vec::with_capacity(256 + latest_ok.len() * 192));
    out.digest(&Digest::of(lock_text.as_bytes()));
    out.var(u64::from(LOCK_FORMAT_VERSION));
    out.short_text(pipeline);
    out.optional_digest(recorded_checksum(lock_text).as_ref());
    out.var(locked.len() as u64);
    for name in locked {
        out.short_text(name);
    }
    for records in [latest_ok, latest_failure] {
        out.var(records.len() as u64);
        for record in records.values() {
            out.record(record);
        }
    }
    out.var(inline_held.len() as u64);
    for digest in inline_held {
        out.digest(digest);
    }
    out.0
}

/// The digest of the lock file's bytes the history `bytes` encode is good
/// for (read before the rest is decoded).
pub fn lock_digest(bytes: &[u8]) -> Option<Digest> {
    Decoder(bytes).digest()
}

/// The history `bytes` encode; `None` for anything else.
pub fn decode(bytes: &[u8]) -> Option<KeptHistory> {
    let mut d = Decoder(bytes);
    let lock_digest = d.digest()?;
    let version = u32::try_from(d.var()?).ok()?;
    let pipeline = d.short_text()?;
    let checksum = d.optional_digest()?;
    let locked = (0..d.short_count()?)
        .map(|_| d.short_text())
        .collect::<Option<Vec<_>>>()?;
    let mut records = || {
        (0..d.short_count()?)
            .map(|_| d.record().map(|r| (r.stage.clone(), r)))
            .collect::<Option<HashMap<_, _>>>()
    };
    let latest_ok = records()?;
    let latest_failure = records()?;
    let inline_held = (0..d.short_count()?)
        .map(|_| d.digest())
        .collect::<Option<HashSet<_>>>()?;
    if !d.0.is_empty() {
        return None;
    }
    let mut lock = LockFile::new(&pipeline);
    lock.version = version;
    lock.checksum = checksum;
    for name in &locked {
        let record = latest_ok.get(name)?;
        lock.insert(name, record.fingerprint, &record.outputs);
    }
    Some(KeptHistory {
        lock_digest,
        lock,
        latest_ok,
        latest_failure,
        inline_held,
    })
}

impl Encoder {
    fn short_text(&mut self, text: &str) {
        self.var(text.len() as u64);
        self.0.extend_from_slice(text.as_bytes());
    }

    fn digest(&mut self, digest: &Digest) {
        self.0.extend_from_slice(digest.as_bytes());
    }

    fn optional_digest(&mut self, digest: Option<&Digest>) {
        match digest {
            Some(digest) => {
                self.0.push(1);
                self.digest(digest);
            }
            None => self.0.push(0),
        }
    }

    fn optional_text(&mut self, text: Option<&str>) {
        match text {
            Some(text) => {
                self.0.push(1);
                self.short_text(text);
            }
            None => self.0.push(0),
        }
    }

    fn kind(&mut self, kind: OutputKind) {
        self.0.push(match kind {
            OutputKind::File => 0,
            OutputKind::Dir => 1,
        });
    }

    fn record(&mut self, record: &ResultRecord) {
        self.var(record.id as u64);
        self.var(record.run_id as u64);
        self.short_text(&record.stage);
        self.digest(&record.fingerprint);
        self.0.push(match record.status {
            ResultStatus::Ok => 0,
            ResultStatus::Failed => 1,
        });
        self.var(record.outputs.len() as u64);
        for output in &record.outputs {
            self.short_text(&output.name);
            self.short_text(&output.path);
            self.kind(output.kind);
            self.digest(&output.digest);
            self.var(output.size);
            self.0.push(u8::from(output.executable));
            self.0.push(u8::from(output.inline));
        }
        self.short_text(&record.command);
        self.var(record.started_ms as u64);
        self.var(record.finished_ms as u64);
        match record.exit_code {
            Some(code) => {
                self.0.push(1);
                self.var(i64::from(code) as u64);
            }
            None => self.0.push(0),
        }
        self.optional_text(record.log_path.as_deref());
        self.optional_text(record.error.as_deref());
        self.optional_text(record.origin.as_deref());
    }
}

impl Decoder<'_> {
    fn short_text(&mut self) -> Option<String> {
        let n = usize::try_from(self.var()?).ok()?;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }

    /// A count of things each at least a byte long: no more than are left.
    fn short_count(&mut self) -> Option<usize> {
        let n = usize::try_from(self.var()?).ok()?;
        (n <= self.0.len()).then_some(n)
    }

    fn flag(&mut self) -> Option<bool> {
        match self.byte()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn optional_digest(&mut self) -> Option<Option<Digest>> {
        match self.flag()? {
            true => self.digest().map(Some),
            false => Some(None),
        }
    }

    fn optional_text(&mut self) -> Option<Option<String>> {
        match self.flag()? {
            true => self.short_text().map(Some),
            false => Some(None),
        }
    }

    fn kind(&mut self) -> Option<OutputKind> {
        match self.byte()? {
            0 => Some(OutputKind::File),
            1 => Some(OutputKind::Dir),
            _ => None,
        }
    }

    fn record(&mut self) -> Option<ResultRecord> {
        let id = self.var()? as i64;
        let run_id = self.var()? as i64;
        let stage = self.short_text()?;
        let fingerprint = self.digest()?;
        let status = match self.byte()? {
            0 => ResultStatus::Ok,
            1 => ResultStatus::Failed,
            _ => return None,
        };
        let outputs = (0..self.short_count()?)
            .map(|_| {
                Some(OutputRecord {
                    name: self.short_text()?,
                    path: self.short_text()?,
                    kind: self.kind()?,
                    digest: self.digest()?,
                    size: self.var()?,
                    executable: self.flag()?,
                    inline: self.flag()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let command = self.short_text()?;
        let started_ms = self.var()? as i64;
        let finished_ms = self.var()? as i64;
        let exit_code = match self.flag()? {
            true => Some(i32::try_from(self.var()? as i64).ok()?),
            false => None,
        };
        Some(ResultRecord {
            id,
            run_id,
            stage,
            fingerprint,
            status,
            outputs,
            command,
            started_ms,
            finished_ms,
            exit_code,
            log_path: self.optional_text()?,
            error: self.optional_text()?,
            origin: self.optional_text()?,
        })
    }
}

/// What of `kept` differs from `read` (a history read the usual way), if
/// anything does.
pub fn difference(kept: &KeptHistory, read: &KeptHistory) -> Option<&'static str> {
    fn sorted<T: std::fmt::Debug>(map: &HashMap<String, T>) -> Vec<String> {
        let mut entries: Vec<String> = map.iter().map(|e| format!("{e:?}")).collect();
        entries.sort();
        entries
    }
    let held = |set: &HashSet<Digest>| {
        let mut held: Vec<Digest> = set.iter().copied().collect();
        held.sort();
        held
    };
    if kept.lock != read.lock {
        Some("the lock file differs")
    } else if sorted(&kept.latest_ok) != sorted(&read.latest_ok) {
        Some("the current results differ")
    } else if sorted(&kept.latest_failure) != sorted(&read.latest_failure) {
        Some("the newest failures differ")
    } else if held(&kept.inline_held) != held(&read.inline_held) {
        Some("the inline objects held differ")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(stage: &str, id: i64, status: ResultStatus) -> ResultRecord {
        ResultRecord {
            id,
            run_id: 7,
            stage: stage.to_owned(),
            fingerprint: Digest::of(stage.as_bytes()),
            status,
            outputs: vec![OutputRecord {
                name: "out".to_owned(),
                path: format!("{stage}/out.txt"),
                kind: OutputKind::File,
                digest: Digest::of(format!("{stage} out").as_bytes()),
                size: 300,
                executable: id % 2 == 0,
                inline: true,
            }],
            command: format!("make {stage} > {stage}/out.txt"),
            started_ms: 1_700_000_000_000 + id,
            finished_ms: 1_700_000_000_100 + id,
            exit_code: (status == ResultStatus::Failed).then_some(-2),
            log_path: (id > 1).then(|| format!("cache/logs/{stage}.log")),
            error: (status == ResultStatus::Failed).then(|| "command exited 2".to_owned()),
            origin: None,
        }
    }

    /// A history of three stages (`b` failed since its result), with the
    /// lock file those results render as.
    fn history() -> (String, KeptHistory) {
        let latest_ok: HashMap<String, ResultRecord> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, s)| (s.to_string(), record(s, i as i64 + 1, ResultStatus::Ok)))
            .collect();
        let latest_failure =
            HashMap::from([("b".to_owned(), record("b", 9, ResultStatus::Failed))]);
        let mut lock = LockFile::new("kept");
        for name in ["a", "b", "c"] {
            let r = &latest_ok[name];
            lock.insert(name, r.fingerprint, &r.outputs);
        }
        let text = lock.render();
        lock.checksum = recorded_checksum(&text);
        let inline_held = latest_ok
            .values()
            .map(|r| r.outputs[0].digest)
            .take(2)
            .collect();
        let history = KeptHistory {
            lock_digest: Digest::of(text.as_bytes()),
            lock,
            latest_ok,
            latest_failure,
            inline_held,
        };
        (text, history)
    }

    fn encoded(text: &str, history: &KeptHistory) -> Vec<u8> {
        encode(
            text,
            "kept",
            history.lock.stages.keys().map(String::as_str),
            &history.latest_ok,
            &history.latest_failure,
            &history.inline_held,
        )
    }

    #[test]
    fn a_history_comes_back_as_it_was_kept_with_its_lock_file_as_reading_it_gives_it() {
        let (text, history) = history();
        let back = decode(&encoded(&text, &history)).unwrap();
        assert_eq!(back.lock_digest, Digest::of(text.as_bytes()));
        assert_eq!(difference(&back, &history), None);
        // The lock made again from the results is the lock as read.
        assert_eq!(back.lock, LockFile::verify(&text, "kept").unwrap());
    }

    #[test]
    fn each_part_of_a_history_that_differs_is_named() {
        let (text, history) = history();
        let mut other = decode(&encoded(&text, &history)).unwrap();
        other.inline_held.clear();
        assert_eq!(
            difference(&other, &history),
            Some("the inline objects held differ")
        );
        other.latest_failure.clear();
        assert_eq!(
            difference(&other, &history),
            Some("the newest failures differ")
        );
        other.latest_ok.get_mut("c").unwrap().finished_ms += 1;
        assert_eq!(
            difference(&other, &history),
            Some("the current results differ")
        );
        other.lock.stages.remove("c");
        assert_eq!(difference(&other, &history), Some("the lock file differs"));
    }

    #[test]
    fn a_cut_or_garbled_history_is_refused() {
        let (text, history) = history();
        let bytes = encoded(&text, &history);
        for cut in [0, 1, 32, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_none(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_none());
        // A stage the lock names without a current result.
        let mut without = decode(&bytes).unwrap();
        without.latest_ok.remove("b");
        let bytes = encode(
            &text,
            "kept",
            ["a", "b", "c"].into_iter(),
            &without.latest_ok,
            &without.latest_failure,
            &without.inline_held,
        );
        assert!(decode(&bytes).is_none());
    }
}
