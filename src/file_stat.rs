//! What cairn reads of a file's `stat`, and `stat`s taken by name in a
//! directory held open: where thousands of paths are `stat`ed (a per-item
//! stage's inputs, a fresh proof's files, a manifest's declared paths),
//! walking each path from `/` was half the time of its `stat`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What cairn reads of a file's `stat`, from std's `Metadata` or from a
/// `stat` of a name in an open directory (see [`stat_in_dir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// `st_mode`: the file's type and permission bits.
    pub mode: u32,
}

impl From<&Metadata> for FileStat {
    fn from(meta: &Metadata) -> Self {
        FileStat {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: mtime_ns(meta),
            ctime_ns: ctime_ns(meta),
            mode: meta.mode(),
        }
    }
}

impl From<&rustix::fs::Stat> for FileStat {
    fn from(stat: &rustix::fs::Stat) -> Self {
        FileStat {
            dev: stat.st_dev,
            ino: stat.st_ino,
            size: stat.st_size as u64,
            mtime_ns: nanos(stat.st_mtime, stat.st_mtime_nsec as i64),
            ctime_ns: nanos(stat.st_ctime, stat.st_ctime_nsec as i64),
            mode: stat.st_mode,
        }
    }
}

impl FileStat {
    fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    /// (Only an `lstat` sees one.)
    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }

    /// An error naming `path` unless this is a regular file: what it is
    /// instead (a FIFO, a socket, a device), for messages.
    pub fn refuse_special(&self, path: &Path) -> io::Result<()> {
        let kind = match self.kind() {
            libc::S_IFREG => return Ok(()),
            libc::S_IFIFO => "a FIFO",
            libc::S_IFSOCK => "a socket",
            libc::S_IFCHR => "a character device",
            libc::S_IFBLK => "a block device",
            _ => "not a regular file",
        };
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "`{}` is {kind}, not a regular file or directory",
                path.display()
            ),
        ))
    }
}

/// The directory of the last path [`stat_in_dir`] `stat`ed by name (or
/// would have: the first of a directory is `stat`ed whole), and whether it
/// holds it open (by an `O_PATH` descriptor).
#[derive(Debug, Default)]
pub struct OpenDir(Option<(PathBuf, Held)>);

/// How [`OpenDir`] holds its directory.
#[derive(Debug)]
enum Held {
    /// Not opened: one path of it was `stat`ed whole. Opening a directory
    /// walks its path as a `stat` does, so it pays only from the second
    /// path in a row that lies in it.
    Once,
    Open(rustix::fd::OwnedFd),
    /// It could not be opened: its paths are `stat`ed whole.
    Unopenable,
}

/// The `stat` of `path` (following a symbolic link), taken by its name in
/// its directory, which `dir` holds open: opened here when the path before
/// lay in it too (the first path of a directory is `stat`ed whole). A path
/// with no name, or in a directory that cannot be opened, is `stat`ed
/// whole (its error is then the usual one).
pub fn stat_in_dir(path: &Path, dir: &mut OpenDir) -> io::Result<FileStat> {
    stat_by_name(path, dir, true)
}

/// [`stat_in_dir`] not following a symbolic link that `path` names (an
/// `lstat`): what [`std::fs::symlink_metadata`] says of it.
pub fn lstat_in_dir(path: &Path, dir: &mut OpenDir) -> io::Result<FileStat> {
    stat_by_name(path, dir, false)
}

fn stat_by_name(path: &Path, dir: &mut OpenDir, follow: bool) -> io::Result<FileStat> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    let whole = |path: &Path| {
        let meta = if follow {
            std::fs::metadata(path)
        } else {
            std::fs::symlink_metadata(path)
        };
        meta.map(|meta| FileStat::from(&meta))
    };
    // (A trailing `/` asks for a directory: the whole path says so.)
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return whole(path);
    };
    // (`x/.` names `x` as a directory, though its file name is `x`.)
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.ends_with(b"/") || bytes.ends_with(b"/.") {
        return whole(path);
    }
    let held = match &mut dir.0 {
        Some((open, held)) if open == parent => held,
        _ => {
            dir.0 = Some((parent.to_owned(), Held::Once));
            return whole(path);
        }
    };
    if matches!(held, Held::Once) {
        *held = match rustix::fs::open(
            parent,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => Held::Open(fd),
            Err(_) => Held::Unopenable,
        };
    }
    let flags = if follow {
        AtFlags::empty()
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    match held {
        Held::Open(fd) => rustix::fs::statat(&*fd, name, flags)
            .map(|stat| FileStat::from(&stat))
            .map_err(io::Error::from),
        Held::Once | Held::Unopenable => whole(path),
    }
}

/// `stat`s of files this process took moments ago while it held the
/// workspace, by path, each with the moment before it was taken and
/// whether the path itself is a symbolic link (the `stat` is then of what
/// it points to): a fresh proof that failed leaves those of the files it
/// found as the last run left them (see [`crate::schedule::proof`]).
/// Each stands in once for the `stat` of its path a run would make next,
/// so a path is `stat`ed once a run; they are taken only for paths no
/// stage of the run writes before it looks (see
/// `StatCache::content_with_stated`), and an entry the stat cache learns
/// anew forgets its path's.
#[derive(Debug, Default)]
pub struct Stated(HashMap<OsString, Found, foldhash::fast::RandomState>);

/// A file as a [`Stated`] found it.
#[derive(Debug, Clone, Copy)]
pub struct Found {
    /// The `stat` of the file (through a link, the file it points to).
    pub stat: FileStat,
    /// When it was about to be taken.
    pub seen_ns: i64,
    /// Whether the path is a symbolic link.
    pub link: bool,
}

impl Stated {
    pub fn insert(&mut self, path: PathBuf, found: Found) {
        self.0.insert(path.into_os_string(), found);
    }

    /// Whether `path` was found there (a file, or a link to one).
    pub fn contains(&self, path: &Path) -> bool {
        self.0.contains_key(path.as_os_str())
    }

    /// Whether `path` was found there as a file itself, not a link.
    pub fn found_plain(&self, path: &Path) -> bool {
        self.0
            .get(path.as_os_str())
            .is_some_and(|found| !found.link)
    }

    /// How `path` was found, given once.
    pub fn take(&mut self, path: &Path) -> Option<Found> {
        self.0.remove(path.as_os_str())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A file's modification time in nanoseconds since the epoch.
pub fn mtime_ns(meta: &Metadata) -> i64 {
    nanos(meta.mtime(), meta.mtime_nsec())
}

/// A file's status change time in nanoseconds since the epoch.
pub fn ctime_ns(meta: &Metadata) -> i64 {
    nanos(meta.ctime(), meta.ctime_nsec())
}

/// Seconds and nanoseconds as nanoseconds, saturating far from the epoch.
fn nanos(secs: i64, nsec: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `stat` by name in an open directory says what a `stat` of the
    /// whole path says, error for error (and an `lstat` what an `lstat`
    /// says): across directories taken in turns, through a symbolic link,
    /// with a trailing `/`, and in a directory that is not there or is a
    /// file.
    #[test]
    fn a_stat_in_an_open_directory_is_the_stat_of_the_whole_path() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        std::fs::write(a.join("f"), "one").unwrap();
        std::fs::write(b.join("f"), "three").unwrap();
        std::os::unix::fs::symlink(b.join("f"), a.join("link")).unwrap();
        std::os::unix::fs::symlink("nowhere", a.join("dangling")).unwrap();
        // (A directory is opened from its second path in a row: most of
        // these come in a row.)
        let paths = [
            a.join("f"),
            b.join("f"),
            a.join("f"),
            a.join("link"),
            a.join("dangling"),
            a.join("missing"),
            a.join("f/"),
            a.join("f/."),
            b.join("."),
            b.clone(),
            a.join("f").join("under"),
            a.join("f").join("under"),
            dir.path().join("missing").join("f"),
            dir.path().join("missing").join("g"),
            b.join("f"),
            b.join("link"),
            PathBuf::from("/"),
        ];
        type Whole = fn(&Path) -> io::Result<std::fs::Metadata>;
        type ByName = fn(&Path, &mut OpenDir) -> io::Result<FileStat>;
        let ways: [(Whole, ByName); 2] = [
            (|p| std::fs::metadata(p), stat_in_dir),
            (|p| std::fs::symlink_metadata(p), lstat_in_dir),
        ];
        for (whole_stat, stat_by_name) in ways {
            let mut open = OpenDir::default();
            for path in &paths {
                let whole = whole_stat(path).map(|meta| FileStat::from(&meta));
                let by_name = stat_by_name(path, &mut open);
                match (whole, by_name) {
                    (Ok(whole), Ok(by_name)) => assert_eq!(whole, by_name, "{}", path.display()),
                    (Err(whole), Err(by_name)) => {
                        assert_eq!(
                            whole.raw_os_error(),
                            by_name.raw_os_error(),
                            "{}",
                            path.display()
                        )
                    }
                    (whole, by_name) => panic!("{}: {whole:?} but {by_name:?}", path.display()),
                }
            }
            // The paths in a row in `b` were `stat`ed by name in it.
            assert!(
                matches!(&open.0, Some((dir, Held::Open(_))) if *dir == b),
                "{open:?}"
            );
        }
    }
}
