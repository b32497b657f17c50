//! The proof wing's unit tests.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use super::super::Context;
use super::super::context::Keyed;
use super::check::*;
use super::draft::*;
use super::key::*;
use super::record::*;
use crate::file_stat::FileStat;
use crate::fingerprint::{Digest, DirStat, StatEntry, hash_file, now_ns};
use crate::store::{OutputKind, OutputRecord};

/// A stage drafted into a proof while the last commands run watches
/// its files as the stat cache has them once the run's end saves it:
/// an output written moments before the draft is not left racy.
#[test]
fn a_drafted_stage_watches_its_files_as_the_end_saved_them() {
    use crate::fingerprint::StatCache;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let source = "[pipeline]\nname = \"draft\"\n[stages.a]\nrun = \"true\"\n\
        inputs = [\"in.txt\"]\noutputs = [\"out.txt\"]\n";
    let path = root.join("cairn.toml");
    std::fs::write(&path, source).unwrap();
    let (input, output) = (root.join("in.txt"), root.join("out.txt"));
    std::fs::write(&input, "in").unwrap();
    std::fs::write(&output, "out").unwrap();
    let manifest = crate::manifest::load_str(&path, source.to_owned(), None).unwrap();
    let dag = crate::graph::Dag::build(&manifest).unwrap();
    let mut ctx = Context::new(&manifest, &dag, None).unwrap();
    // Both hashed the moment they were written: racy.
    let entry = |path: &Path, bytes: &[u8]| {
        let stat = FileStat::from(&std::fs::metadata(path).unwrap());
        StatEntry::of(&stat, Digest::of(bytes), stat.mtime_ns.max(stat.ctime_ns))
    };
    ctx.stat = StatCache::from_entries([]);
    ctx.stat.learn(input.clone(), entry(&input, b"in"));
    ctx.stat.learn(output.clone(), entry(&output, b"out"));
    let keyed = Keyed {
        inputs: vec![Digest::of(b"in")],
        image: None,
        items: None,
    };
    ctx.keep(0, keyed);
    let record = OutputRecord {
        name: "out.txt".into(),
        path: "out.txt".into(),
        kind: OutputKind::File,
        digest: Digest::of(b"out"),
        size: 3,
        executable: false,
        inline: true,
    };
    let used = HashMap::from([(0, (Digest::of(b"key"), vec![record]))]);
    let mut draft = ProofDraft::new(&ctx, dag.order());
    draft.add_used(&ctx, [0].into_iter(), &used).unwrap();
    draft.sort();
    // The end saves the cache a minute on.
    let saved_ns = now_ns() + 60_000_000_000;
    ctx.stat.take_updates(saved_ns);
    std::fs::write(manifest.lock_path(), "the lock").unwrap();
    let (proof, _) = draft.finish(&ctx, "the lock").unwrap();
    for file in [&input, &output] {
        let seen = proof.watched.iter().find_map(|watched| match watched {
            Watched::File(path, entry) if path == file => Some(entry.seen_ns),
            _ => None,
        });
        assert_eq!(seen, Some(saved_ns), "{}", file.display());
    }
}

#[test]
fn the_root_hint_reads_root_in_the_pipeline_table_only() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let manifest = dir.path().join("cairn.toml");
    let at = |text: &str| root_hint(&manifest, text);
    let top = dir.path().canonicalize().unwrap();
    assert_eq!(at("[pipeline]\nname = \"x\"\n"), Some(top.clone()));
    assert_eq!(
        at("[pipeline]\nname = \"x\"\nroot = \"sub\" # here\n"),
        Some(top.join("sub"))
    );
    assert_eq!(
        at("[pipeline]\nname = \"x\"\n[stages.a]\nroot = \"sub\"\n"),
        Some(top.clone())
    );
    assert_eq!(at("[pipeline]\nroot = \"s\\u0075b\"\n"), None);
}

#[test]
fn a_cut_or_foreign_body_decodes_to_nothing() {
    let entry = StatEntry {
        dev: 1,
        ino: 2,
        size: 3,
        mtime_ns: 4,
        ctime_ns: 5,
        digest: Digest::of(b"x"),
        seen_ns: 6,
    };
    let proof = Proof {
        root: PathBuf::from("/r"),
        stages: vec![("a".to_owned(), "local".to_owned())],
        env: vec![
            ("HOME".to_owned(), Some(Digest::of(b"/root"))),
            ("X".to_owned(), None),
        ],
        watched: vec![
            Watched::File(PathBuf::from("/r/a"), entry),
            Watched::Place {
                path: PathBuf::from("/r/d"),
                dev: 1,
                ino: 9,
            },
        ],
    };
    let bytes = proof.encode();
    assert_eq!(Proof::decode(&bytes), Some(proof));
    for cut in 0..bytes.len() {
        assert_eq!(Proof::decode(&bytes[..cut]), None, "cut at {cut}");
    }
    let mut other = bytes.clone();
    other[7] ^= 1;
    assert_eq!(Proof::decode(&other), None);
}

/// Each path is watched once, compared by its bytes as it is sorted: a
/// directory's listing check wins over the same directory as a place,
/// a place spelled otherwise stays beside it, and a file seen two ways
/// leaves the run without a proof.
#[test]
fn a_path_watched_twice_is_watched_once_unless_it_was_seen_two_ways() {
    let entry = |size| StatEntry {
        dev: 1,
        ino: 2,
        size,
        mtime_ns: 4,
        ctime_ns: 4,
        digest: Digest::of(b"x"),
        seen_ns: 9_000_000_000,
    };
    let dir = DirStat {
        dev: 1,
        ino: 3,
        mtime_ns: 4,
        ctime_ns: 4,
        seen_ns: 9_000_000_000,
    };
    let place = |path: &str| Watched::Place {
        path: PathBuf::from(path),
        dev: 1,
        ino: 3,
    };
    let mut watching = Watching::new(Path::new("/r"), 0);
    watching.watched.extend([
        Watched::Dir(PathBuf::from("/r/d/"), dir),
        Watched::File(PathBuf::from("/r/f"), entry(1)),
        Watched::Dir(PathBuf::from("/r/x"), dir),
        Watched::File(PathBuf::from("/r/f"), entry(1)),
    ]);
    for path in ["/r/d", "/r/x"] {
        watching.places.insert(PathBuf::from(path), place(path));
    }
    assert_eq!(
        watching.finish(),
        Ok(vec![
            place("/r/d"),
            Watched::Dir(PathBuf::from("/r/d/"), dir),
            Watched::File(PathBuf::from("/r/f"), entry(1)),
            Watched::Dir(PathBuf::from("/r/x"), dir),
        ])
    );
    let seen_later = StatEntry {
        seen_ns: 10_000_000_000,
        ..entry(1)
    };
    let mut watching = Watching::new(Path::new("/r"), 0);
    watching.watched.extend([
        Watched::File(PathBuf::from("/r/f"), entry(1)),
        Watched::File(PathBuf::from("/r/f"), seen_later),
    ]);
    assert_eq!(
        watching.finish(),
        Ok(vec![Watched::File(PathBuf::from("/r/f"), entry(1))])
    );
    let mut watching = Watching::new(Path::new("/r"), 0);
    watching.watched.extend([
        Watched::File(PathBuf::from("/r/f"), entry(1)),
        Watched::File(PathBuf::from("/r/f"), entry(2)),
    ]);
    assert_eq!(
        watching.finish(),
        Err("/r/f was seen two ways during the run".to_owned())
    );
}

/// A proof's encoding is pinned: a change to it must bump `FORMAT`
/// (a proof kept by an older cairn is then not read).
#[test]
fn a_proofs_encoding_is_pinned() {
    let proof = Proof {
        root: PathBuf::from("/r"),
        stages: vec![("a".to_owned(), "local".to_owned())],
        env: vec![("X".to_owned(), None)],
        watched: vec![
            Watched::File(
                PathBuf::from("/r/in/a"),
                StatEntry {
                    dev: 2049,
                    ino: 300,
                    size: 5,
                    mtime_ns: 1_000,
                    ctime_ns: 1_000,
                    digest: Digest::of(b"x"),
                    seen_ns: 10_000_000_000,
                },
            ),
            Watched::Place {
                path: PathBuf::from("/r/in"),
                dev: 2049,
                ino: 7,
            },
        ],
    };
    assert_eq!(hex(&proof.encode()), PINNED);
}

const PINNED: &str = "636670726f6f663302000000000000002f72010000000000000001000000000000006105000000000000006c6f63616c01000000000000000100000000000000580002000000000000000000072f722f696e2f618110ac0205d00f00b080dfc04a00020500811007";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Paths after the ones before them, numbers as varints (times before
/// 1970 and the largest too), and a digest only for a racy file: what
/// the check reads comes back, and a file takes a few dozen bytes.
#[test]
fn a_proof_of_many_files_is_compact_and_decodes_to_what_a_check_reads() {
    let second = 1_000_000_000;
    let settled = |n: u64| StatEntry {
        dev: 2049,
        ino: 1_000_000 + n,
        size: 20 + n % 7,
        mtime_ns: 1_764_000_000 * second + n as i64,
        ctime_ns: 1_764_000_000 * second + n as i64,
        digest: Digest::of(&n.to_le_bytes()),
        seen_ns: 1_764_000_100 * second,
    };
    let racy = StatEntry {
        mtime_ns: -5 * second,
        ctime_ns: i64::MAX,
        seen_ns: i64::MIN,
        dev: u64::MAX,
        ..settled(0)
    };
    assert!(racy.racy() && !settled(1).racy());
    let mut watched: Vec<Watched> = (0..10_000u64)
        .map(|n| Watched::File(PathBuf::from(format!("/work/tree/in/{n}.txt")), settled(n)))
        .collect();
    watched.push(Watched::File(PathBuf::from("/work/tree/racy"), racy));
    watched.push(Watched::Dir(
        PathBuf::from("/work/tree/out"),
        DirStat {
            dev: 1,
            ino: 2,
            mtime_ns: -1,
            ctime_ns: 3,
            seen_ns: 4,
        },
    ));
    watched.push(Watched::Object {
        path: PathBuf::from("/work/cache/objects/ab"),
        dev: 1,
        ino: u64::MAX,
        size: 0,
    });
    let proof = Proof {
        root: PathBuf::from("/work/tree"),
        stages: Vec::new(),
        env: Vec::new(),
        watched,
    };
    let bytes = proof.encode();
    assert!(bytes.len() < 10_003 * 40, "{} bytes", bytes.len());
    let decoded = Proof::decode(&bytes).unwrap();
    let unread = Digest::from_hash(blake3::Hash::from_bytes([0; 32]));
    let expected: Vec<Watched> = proof
        .watched
        .iter()
        .cloned()
        .map(|w| match w {
            Watched::File(path, entry) if !entry.racy() => Watched::File(
                path,
                StatEntry {
                    digest: unread,
                    ..entry
                },
            ),
            other => other,
        })
        .collect();
    assert_eq!(decoded.watched, expected);
    assert_eq!(decoded.encode(), bytes);
}

/// A proof of thousands of paths is checked in shares side by side: a
/// change in any share fails it, and a racy file found unchanged in any
/// share is trusted from when it was seen.
#[test]
fn a_proof_checked_in_shares_finds_a_change_in_any_and_renews_racy_files_in_all() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..2_000)
        .map(|n| dir.path().join(format!("{n:05}")))
        .collect();
    for (n, path) in paths.iter().enumerate() {
        std::fs::write(path, n.to_string()).unwrap();
    }
    // Entries 3 and 1,999 (the first share and the last) seen as the
    // files were written: racy. The others seen a minute later.
    let racy = [3, 1_999];
    let watched = || -> Vec<Watched> {
        paths
            .iter()
            .enumerate()
            .map(|(n, path)| {
                let meta = std::fs::metadata(path).unwrap();
                let digest = hash_file(path, meta.len(), false).unwrap();
                let written = meta.mtime() * 1_000_000_000 + meta.mtime_nsec();
                let seen_ns = if racy.contains(&n) {
                    written
                } else {
                    written + 60 * 1_000_000_000
                };
                Watched::File(path.clone(), StatEntry::new(&meta, digest, seen_ns))
            })
            .collect()
    };
    let seen = |watched: &[Watched], n: usize| match &watched[n] {
        Watched::File(_, entry) => entry.seen_ns,
        other => panic!("{other:?}"),
    };
    let listed = HashMap::new();
    for threads in [1, 2, 3] {
        let mut all = watched();
        let before: Vec<i64> = racy.iter().map(|&n| seen(&all, n)).collect();
        let settled = seen(&all, 1_000);
        assert!(matches!(
            check_in_shares(&mut all, &listed, threads),
            Checked::Holds { renewed: true }
        ));
        for (&n, before) in racy.iter().zip(before) {
            assert!(
                seen(&all, n) > before,
                "entry {n} not renewed ({threads} shares)"
            );
        }
        assert_eq!(
            seen(&all, 1_000),
            settled,
            "a settled entry is left as it was"
        );
    }
    // One file changed at a time, in the last share, then in the first:
    // the proof fails, and gives the `stat` of every other file but
    // the racy ones, which are not hashed once a `stat` differs. The
    // files after the difference are looked at all the same: the run
    // that follows looks at each.
    for changed in [1_990, 10] {
        let mut all = watched();
        std::fs::write(&paths[changed], "a longer text than before").unwrap();
        for threads in [1, 2, 3] {
            let Checked::Fails {
                why,
                stated,
                changed: found_changed,
            } = check_in_shares(&mut all, &listed, threads)
            else {
                panic!("the proof held after a change ({threads} shares)");
            };
            assert_eq!(why, format!("{} changed", paths[changed].display()));
            // The file that changed is named, for its readers to be
            // weighed first.
            assert_eq!(found_changed.as_ref(), Some(&paths[changed]));
            // Handed on: every file found unchanged, before the
            // difference and after it, never it nor a racy one.
            for (n, path) in paths.iter().enumerate() {
                let handed_on = n != changed && !racy.contains(&n);
                assert_eq!(stated.contains(path), handed_on, "{n} ({threads} shares)");
            }
            assert_eq!(stated.len(), paths.len() - 1 - racy.len());
        }
    }
    // A racy file whose `stat` held but whose bytes are not the ones
    // the proof vouched for (written again within the tick): found on
    // the second look, and not handed on; the other racy file, which
    // held, is.
    let mut all = watched();
    if let Watched::File(_, entry) = &mut all[3] {
        entry.digest = Digest::of(b"what it held before");
    }
    let Checked::Fails {
        why,
        stated,
        changed,
    } = check_in_shares(&mut all, &listed, 2)
    else {
        panic!("the proof held with a racy file rewritten");
    };
    assert_eq!(why, format!("{} changed", paths[3].display()));
    assert_eq!(changed.as_ref(), Some(&paths[3]));
    assert!(!stated.contains(&paths[3]) && stated.contains(&paths[1_999]));
    assert_eq!(stated.len(), paths.len() - 1);
    // A directory the files lie in that is not the one the proof saw:
    // nothing is handed on.
    let mut all = watched();
    all.push(Watched::Place {
        path: dir.path().to_owned(),
        dev: 0,
        ino: 0,
    });
    let Checked::Fails { stated, .. } = check_in_shares(&mut all, &listed, 2) else {
        panic!("the proof held with its directory swapped");
    };
    assert!(stated.is_empty());
    // A share only `stat`s: its racy files whose `stat` held are left
    // for the second look, the others vouched for; once another share
    // has found a difference, it still looks at every file (the run
    // takes what it found) and at no directory.
    let all = watched();
    let share = check_share(&all, 0, &AtomicBool::new(false));
    assert_eq!(share.differs, None);
    let racy_found: Vec<usize> = share.racy.iter().map(|(n, _)| *n).collect();
    assert_eq!(racy_found, racy);
    assert_eq!(share.stated.len(), paths.len() - racy.len());
    let stopped = check_share(&all, 0, &AtomicBool::new(true));
    assert_eq!(stopped.differs, None);
    assert_eq!(stopped.stated.len(), share.stated.len());
}
