//! How a stored file and its workspace copy share the disk (`[cache]
//! link`): two copies (`copy`, the default), one set of blocks shared
//! copy-on-write (`reflink`, where the file system can), or one inode made
//! read-only (`hardlink`). Where a link cannot be made (another file
//! system, no reflink support), the file is copied: a link is an
//! optimisation, never a requirement.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub use crate::manifest::Link;

/// Makes `dest` (a new path) a reflink of `src`: its own file sharing
/// `src`'s blocks. `Ok(false)` if the file system cannot.
pub fn reflink(src: &Path, dest: &Path, mode: u32) -> io::Result<bool> {
    let from = File::open(src)?;
    let to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(dest)?;
    match rustix::fs::ioctl_ficlone(&to, &from) {
        Ok(()) => {
            // The mode asked for, whatever the umask.
            fs::set_permissions(dest, fs::Permissions::from_mode(mode))?;
            to.sync_all()?;
            Ok(true)
        }
        Err(_) => {
            drop(to);
            fs::remove_file(dest)?;
            Ok(false)
        }
    }
}

/// Makes `dest` (a new path) a hard link of `src`, whose inode is made
/// read-only first: an edit in place of either would change both.
/// `Ok(false)` if they are on two file systems (or links are refused).
pub fn hardlink(src: &Path, dest: &Path) -> io::Result<bool> {
    // Only a regular file is linked (a link to a symbolic link would be
    // stored as one).
    if !fs::symlink_metadata(src)?.is_file() {
        return Ok(false);
    }
    match fs::hard_link(src, dest) {
        Ok(()) => {
            read_only(dest)?;
            Ok(true)
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EXDEV | libc::EPERM | libc::EMLINK)
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Clears the write bits of `path`'s inode (not following a symbolic
/// link: the callers pass regular files).
pub fn read_only(path: &Path) -> io::Result<()> {
    let mode = fs::symlink_metadata(path)?.permissions().mode();
    if mode & 0o222 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode & !0o222))?;
    }
    Ok(())
}

/// Whether the file at `path` is executable by its owner.
pub fn is_executable(path: &Path) -> io::Result<bool> {
    Ok(fs::metadata(path)?.permissions().mode() & 0o100 != 0)
}
