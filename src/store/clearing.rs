//! A stage's stale outputs cleared out of the way before its command runs.
//!
//! Each is moved into the store's temporary area by one `rename` and
//! removed there by a thread of its own, so the command starts without
//! waiting for the file system to free the old bytes: removing a file took
//! about 0.1 ms here against 0.015 ms for the rename, and a large
//! directory takes seconds. A run waits for the removals before it returns
//! ([`cleared`]); what a killed run leaves there, `cairn gc` removes.
//! A removal that fails is a warning, and what it left stays there until
//! `cairn gc` (which reports what it cannot remove either): the output is
//! gone from its path all the same.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, mpsc};

enum Work {
    Remove(PathBuf),
    /// Answered once everything sent before it is removed.
    Done(mpsc::SyncSender<()>),
}

/// The remover thread's queue (`None` if it could not be started).
static REMOVER: OnceLock<Option<Mutex<mpsc::Sender<Work>>>> = OnceLock::new();

/// Makes `path` (a file, a link or a directory; absent is fine) no longer
/// there: moved to `aside` (a path in the store's temporary area `tmp`
/// that nothing else uses) and removed there later. Where it cannot be
/// moved (another file system, say) it is removed here and now.
pub fn clear_away(path: &Path, tmp: &Path, aside: PathBuf) -> io::Result<()> {
    let Some(remover) = remover() else {
        return remove_path(path);
    };
    let moved = match std::fs::rename(path, &aside) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // The temporary area is what is missing.
            _ => std::fs::create_dir_all(tmp).and_then(|()| std::fs::rename(path, &aside)),
        },
        moved => moved,
    };
    if moved.is_err() {
        return remove_path(path);
    }
    let sent = remover
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send(Work::Remove(aside.clone()));
    match sent {
        Ok(()) => Ok(()),
        Err(_) => remove_path(&aside),
    }
}

/// Everything cleared away so far, being removed: [`Cleared::wait`] waits
/// until it is, so that what else there is to do is done meanwhile.
pub fn cleared() -> Cleared {
    let Some(Some(remover)) = REMOVER.get() else {
        return Cleared(None);
    };
    let (done, removed) = mpsc::sync_channel(1);
    let sent = remover
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send(Work::Done(done));
    Cleared(sent.is_ok().then_some(removed))
}

/// The removal of everything cleared away before [`cleared`] was called.
pub struct Cleared(Option<mpsc::Receiver<()>>);

impl Cleared {
    /// Waits until that removal is done.
    pub fn wait(self) {
        if let Some(removed) = self.0 {
            let _ = removed.recv();
        }
    }
}

fn remover() -> Option<&'static Mutex<mpsc::Sender<Work>>> {
    REMOVER
        .get_or_init(|| {
            let (queue, work) = mpsc::channel();
            std::thread::Builder::new()
                .name("cairn-clearing".to_owned())
                .spawn(move || remove_all(&work))
                .ok()
                .map(|_| Mutex::new(queue))
        })
        .as_ref()
}

fn remove_all(work: &mpsc::Receiver<Work>) {
    for next in work {
        match next {
            Work::Remove(path) => {
                if let Err(error) = remove_path(&path) {
                    tracing::warn!(
                        "could not remove `{}`, a stale output set aside: {error}",
                        path.display()
                    );
                }
            }
            Work::Done(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Removes a file or directory tree; absent is fine.
pub fn remove_path(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_and_a_directory_cleared_away_are_gone_at_once_and_removed_by_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("cache/tmp");
        let file = dir.path().join("out.txt");
        let tree = dir.path().join("out");
        std::fs::write(&file, "stale").unwrap();
        std::fs::create_dir_all(tree.join("deep")).unwrap();
        std::fs::write(tree.join("deep/part.txt"), "stale").unwrap();

        // The temporary area does not exist yet: it is made.
        clear_away(&file, &tmp, tmp.join("a")).unwrap();
        clear_away(&tree, &tmp, tmp.join("b")).unwrap();
        clear_away(&dir.path().join("absent"), &tmp, tmp.join("c")).unwrap();
        assert!(!file.exists() && !tree.exists());

        cleared().wait();
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_path_that_cannot_be_moved_aside_is_removed_in_place() {
        let dir = tempfile::tempdir().unwrap();
        // A temporary area that cannot be made (its parent is a file).
        std::fs::write(dir.path().join("cache"), "").unwrap();
        let tmp = dir.path().join("cache/tmp");
        let tree = dir.path().join("out");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(tree.join("part.txt"), "stale").unwrap();

        clear_away(&tree, &tmp, tmp.join("a")).unwrap();
        assert!(!tree.exists());
    }
}
