//! One cairn process writes a workspace at a time.
//!
//! An advisory lock (`flock`) on `cache/lock`, held for the process's life
//! and released by the kernel even after `kill -9`. The holder writes its
//! pid into the file so that a waiting process can say whom it waits for.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use super::StoreError;

#[derive(Debug)]
pub struct WorkspaceLock {
    _file: File,
}

/// What to do when another process holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenLocked {
    Wait,
    Fail,
}

impl WorkspaceLock {
    /// Takes the lock; `on_wait` is called once, with the holder's pid if
    /// known, before blocking.
    pub fn acquire(
        cache: &Path,
        when_locked: WhenLocked,
        on_wait: impl FnOnce(Option<u32>),
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(cache).map_err(|e| StoreError::io(cache, e))?;
        let path = super::layout::workspace_lock(cache);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let holder = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse().ok());
                if when_locked == WhenLocked::Fail {
                    return Err(StoreError::Locked { path, holder });
                }
                on_wait(holder);
                file.lock().map_err(|e| StoreError::io(&path, e))?;
            }
            Err(TryLockError::Error(e)) => return Err(StoreError::io(&path, e)),
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| write!(file, "{}", std::process::id()))
            .map_err(|e| StoreError::io(&path, e))?;
        Ok(Self { _file: file })
    }

    /// Takes the lock only if it is free.
    pub fn try_acquire(cache: &Path) -> Option<Self> {
        Self::acquire(cache, WhenLocked::Fail, |_| {}).ok()
    }

    /// Whether this process holds the lock (the holder's pid is in the file).
    pub fn held_here(cache: &Path) -> bool {
        std::fs::read_to_string(super::layout::workspace_lock(cache))
            .is_ok_and(|text| text.trim().parse() == Ok(std::process::id()))
    }
}
