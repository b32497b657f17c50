//! Room kept beside the ledger, so that a run on a disk that filled up
//! while it ran can still record how it ended: a file made when a run
//! begins, removed to make room when closing the run is refused.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Enough for the ledger's pages that closing a run writes.
const RESERVE_BYTES: usize = 256 * 1024;

fn path(cache: &Path) -> PathBuf {
    super::layout::reserve(cache)
}

/// Makes the reserve if it is not there; a disk too full for it already
/// goes without (closing the run may then fail, as it would have).
pub fn keep(cache: &Path) {
    let path = path(cache);
    if path.exists() {
        return;
    }
    let tmp = cache.join("reserve.tmp");
    // Not zeros: a compressing file system would keep no room for them.
    let mut bytes = vec![0; RESERVE_BYTES];
    blake3::Hasher::new()
        .update(b"cairn reserve")
        .finalize_xof()
        .fill(&mut bytes);
    let written = std::fs::File::create(&tmp).and_then(|mut file| {
        file.write_all(&bytes)?;
        file.sync_all()
    });
    match written {
        Ok(()) => {
            let _ = std::fs::rename(&tmp, &path);
        }
        Err(_) => {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// Gives the reserve's room back; whether there was one.
pub fn release(cache: &Path) -> bool {
    std::fs::remove_file(path(cache)).is_ok()
}
