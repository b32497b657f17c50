//! How the listing of a stored directory is kept (`cache/trees/<digest>.tree`):
//! each entry's path, kind, content digest and size, in path order, each
//! path written as what it shares with the one before and the rest.
//!
//! ```text
//! "cairn-tree" 0x00 0x01          name, version
//! count                            LEB128
//! per entry:
//!   shared, rest length            LEB128 each; then the rest's bytes
//!   kind                           one byte: f, x, l or d
//!   digest                         32 bytes
//!   size                           LEB128
//! ```
//!
//! Listings were pretty-printed JSON before (`<digest>.json`, several times
//! the bytes, parsed again at every check that a directory is stored
//! whole). Those are still read, and so is a JSON listing downloaded from
//! a remote cache an older cairn filled (kept as it came, under the new
//! name). Either way the entries are checked against the digest the
//! listing is named by before they are used ([`super::ObjectStore::tree`]).

use std::os::unix::ffi::OsStrExt;

use crate::fingerprint::{Digest, EntryKind, TreeEntry, path_bytes, tree_digest};

const MAGIC: &[u8; 12] = b"cairn-tree\x00\x01";

/// The listing of `entries`, compactly (see the module doc). Entries in
/// path order (as [`crate::fingerprint::tree_digest`] leaves them) share
/// most of each path with the one before.
pub fn encode(entries: &[TreeEntry]) -> Vec<u8> {
    let paths: usize = entries.iter().map(|e| path_bytes(&e.path).len()).sum();
    let mut out = Vec::with_capacity(MAGIC.len() + 10 + entries.len() * 40 + paths / 4);
    out.extend_from_slice(MAGIC);
    put_varint(&mut out, entries.len() as u64);
    let mut before: &[u8] = &[];
    for entry in entries {
        let path = path_bytes(&entry.path);
        let shared = before.iter().zip(path).take_while(|(a, b)| a == b).count();
        put_varint(&mut out, shared as u64);
        put_varint(&mut out, (path.len() - shared) as u64);
        out.extend_from_slice(&path[shared..]);
        out.push(entry.kind.tag());
        out.extend_from_slice(entry.digest.as_bytes());
        put_varint(&mut out, entry.size);
        before = path;
    }
    out
}

/// The entries of a listing, compact or (as older cairns wrote it) JSON;
/// why not, if it is neither.
pub fn decode(bytes: &[u8]) -> Result<Vec<TreeEntry>, String> {
    let Some(body) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return serde_json::from_slice(bytes).map_err(|e| format!("not a tree listing: {e}"));
    };
    let mut reader = Reader { bytes: body };
    let count = reader.varint()?;
    // (A count is not trusted for more room than the bytes could hold:
    // the smallest entry is four bytes and a digest.)
    let fits = body.len() / (4 + 32);
    let mut entries = Vec::with_capacity(usize::try_from(count).map_or(fits, |c| c.min(fits)));
    let mut path: Vec<u8> = Vec::new();
    for _ in 0..count {
        let shared = reader.length()?;
        if shared > path.len() {
            return Err("an entry shares more of its path than the one before has".to_owned());
        }
        path.truncate(shared);
        let rest = reader.length()?;
        path.extend_from_slice(reader.take(rest)?);
        let tag = reader.take(1)?[0];
        let kind = EntryKind::from_tag(tag)
            .ok_or_else(|| format!("an entry of an unknown kind ({tag:#04x})"))?;
        let mut digest = [0u8; 32];
        digest.copy_from_slice(reader.take(32)?);
        let size = reader.varint()?;
        entries.push(TreeEntry {
            path: std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&path)),
            kind,
            digest: Digest::from_bytes(digest),
            size,
        });
    }
    if !reader.bytes.is_empty() {
        return Err(format!("{} bytes after the last entry", reader.bytes.len()));
    }
    Ok(entries)
}

/// The entries of the listing of tree `digest` ([`decode`]), in path
/// order; why not, if the bytes are no listing or another tree's.
pub fn decode_checked(bytes: &[u8], digest: &Digest) -> Result<Vec<TreeEntry>, String> {
    let mut entries = decode(bytes)?;
    if tree_digest(&mut entries) != *digest {
        return Err("the listing does not match its digest".to_owned());
    }
    Ok(entries)
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// What is left of a listing being decoded.
struct Reader<'b> {
    bytes: &'b [u8],
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], String> {
        if n > self.bytes.len() {
            return Err("the listing ends inside an entry".to_owned());
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err("a number longer than 64 bits".to_owned());
            }
            n |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err("a number longer than 64 bits".to_owned())
    }

    fn length(&mut self) -> Result<usize, String> {
        let n = self.varint()?;
        usize::try_from(n).map_err(|_| format!("a length of {n} bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::tree_digest;

    fn entries() -> Vec<TreeEntry> {
        let mut entries = vec![
            TreeEntry {
                path: "src".to_owned().into(),
                kind: EntryKind::Dir,
                digest: Digest::from_bytes([0; 32]),
                size: 0,
            },
            TreeEntry {
                path: "src/main.rs".to_owned().into(),
                kind: EntryKind::File,
                digest: Digest::of(b"fn main() {}"),
                size: 12,
            },
            TreeEntry {
                path: "src/mañana.rs".to_owned().into(),
                kind: EntryKind::Executable,
                digest: Digest::of(b"later"),
                size: u64::MAX,
            },
            TreeEntry {
                path: "link".to_owned().into(),
                kind: EntryKind::Symlink,
                digest: Digest::of(b"src/main.rs"),
                size: 11,
            },
        ];
        for n in 0..300 {
            entries.push(TreeEntry {
                path: format!("data/shard-{n:05}.jsonl").into(),
                kind: EntryKind::File,
                digest: Digest::of(format!("{n}").as_bytes()),
                size: 1000 + n,
            });
        }
        tree_digest(&mut entries);
        entries
    }

    #[test]
    fn a_listing_reads_back_as_written_and_is_a_fraction_of_the_json() {
        let entries = entries();
        let compact = encode(&entries);
        assert_eq!(decode(&compact).unwrap(), entries);
        assert_eq!(decode(&encode(&[])).unwrap(), Vec::new());
        let json = serde_json::to_vec_pretty(&entries).unwrap();
        assert!(
            compact.len() * 3 < json.len(),
            "{} bytes against {} as JSON",
            compact.len(),
            json.len()
        );
    }

    /// Any Unix file name is carried as its bytes: two names a lossy
    /// conversion would make one (`n\xff`, `n\xfe`, `n\u{fffd}`) stay three,
    /// each read back byte-exact, and their tree digests differ.
    #[test]
    fn names_that_are_not_utf8_read_back_byte_exact() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let named = |name: &[u8]| {
            let mut entries = vec![TreeEntry {
                path: OsStr::from_bytes(name).into(),
                kind: EntryKind::File,
                digest: Digest::of(b"x"),
                size: 1,
            }];
            let digest = tree_digest(&mut entries);
            (entries, digest)
        };
        let names: [&[u8]; 3] = [b"n\xff", b"n\xfe", "n\u{fffd}".as_bytes()];
        let mut digests = Vec::new();
        for name in names {
            let (entries, digest) = named(name);
            let read = decode_checked(&encode(&entries), &digest).unwrap();
            assert_eq!(read[0].path.as_os_str().as_bytes(), name);
            digests.push(digest);
        }
        digests.sort_by_key(|d| d.hex());
        digests.dedup();
        assert_eq!(digests.len(), 3);
    }

    /// What older cairns wrote, and what a remote cache they filled holds.
    #[test]
    fn a_json_listing_is_still_read() {
        let entries = entries();
        let pretty = serde_json::to_vec_pretty(&entries).unwrap();
        assert_eq!(decode(&pretty).unwrap(), entries);
        assert_eq!(
            decode(&serde_json::to_vec(&entries).unwrap()).unwrap(),
            entries
        );
    }

    /// A listing cut anywhere is refused; one with a byte changed is
    /// refused or reads as other entries (their digest, which names the
    /// listing, then refuses all but a changed size); none panics.
    #[test]
    fn a_damaged_listing_is_refused_without_a_panic() {
        let entries = entries();
        let compact = encode(&entries);
        for cut in 0..compact.len() {
            assert!(decode(&compact[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = compact.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        for at in 0..compact.len().min(2_000) {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut damaged = compact.clone();
                damaged[at] ^= flip;
                if let Ok(read) = decode(&damaged) {
                    assert_ne!(read, entries, "byte {at} ^ {flip:#x} read as the same");
                }
            }
        }
        // A count far beyond the bytes asks for no room it cannot fill.
        let mut huge = MAGIC.to_vec();
        put_varint(&mut huge, u64::MAX);
        assert!(decode(&huge).is_err());
    }
}
