//! The binary encoding proofs, kept plans and kept histories share:
//! little-endian numbers, varints, length-prefixed texts and paths, a
//! path after what it shares with the one before.

use std::path::{Path, PathBuf};

use crate::fingerprint::{Digest, StatEntry};

pub(crate) struct Encoder(pub(crate) Vec<u8>);

impl Encoder {
    pub(crate) fn u64(&mut self, n: u64) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }

    pub(crate) fn text(&mut self, text: &str) {
        self.bytes(text.as_bytes());
    }

    pub(crate) fn path(&mut self, path: &Path) {
        self.bytes(path.as_os_str().as_encoded_bytes());
    }

    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    /// `n` in LEB128: seven bits a byte, low bits first.
    pub(crate) fn var(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.0.push(n as u8 | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }

    /// An mtime, then the ctime and the time seen as differences from it
    /// (zigzag: small either way).
    pub(crate) fn times(&mut self, mtime_ns: i64, ctime_ns: i64, seen_ns: i64) {
        let zigzag = |n: i64| ((n << 1) ^ (n >> 63)) as u64;
        self.var(zigzag(mtime_ns));
        self.var(zigzag(ctime_ns.wrapping_sub(mtime_ns)));
        self.var(zigzag(seen_ns.wrapping_sub(mtime_ns)));
    }

    /// `path` as the length it shares with `before`, then the rest.
    pub(crate) fn path_after(&mut self, before: &[u8], path: &[u8]) {
        let shared = before.iter().zip(path).take_while(|(a, b)| a == b).count();
        self.var(shared as u64);
        self.var((path.len() - shared) as u64);
        self.0.extend_from_slice(&path[shared..]);
    }

    pub(crate) fn stat_entry(&mut self, entry: &StatEntry) {
        for n in [entry.dev, entry.ino, entry.size] {
            self.u64(n);
        }
        for n in [entry.mtime_ns, entry.ctime_ns, entry.seen_ns] {
            self.u64(n as u64);
        }
        self.0.extend_from_slice(entry.digest.as_bytes());
    }
}

pub(crate) struct Decoder<'b>(pub(crate) &'b [u8]);

impl<'b> Decoder<'b> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    pub(crate) fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn i64(&mut self) -> Option<i64> {
        Some(self.u64()? as i64)
    }

    /// A count of things each at least a byte long: no more than are left.
    pub(crate) fn count(&mut self) -> Option<usize> {
        let n = usize::try_from(self.u64()?).ok()?;
        (n <= self.0.len()).then_some(n)
    }

    pub(crate) fn bytes(&mut self) -> Option<&'b [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }

    pub(crate) fn text(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }

    pub(crate) fn path(&mut self) -> Option<PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(self.bytes()?)))
    }

    pub(crate) fn var(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            // (The tenth byte holds the top bit alone.)
            if shift == 63 && byte > 1 {
                return None;
            }
            n |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }

    pub(crate) fn times(&mut self) -> Option<(i64, i64, i64)> {
        let unzigzag = |n: u64| ((n >> 1) as i64) ^ -((n & 1) as i64);
        let mtime_ns = unzigzag(self.var()?);
        let ctime_ns = mtime_ns.wrapping_add(unzigzag(self.var()?));
        let seen_ns = mtime_ns.wrapping_add(unzigzag(self.var()?));
        Some((mtime_ns, ctime_ns, seen_ns))
    }

    /// A path written by [`Encoder::path_after`] after `before`, which
    /// becomes it.
    pub(crate) fn path_after(&mut self, before: &mut Vec<u8>) -> Option<PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        let shared = usize::try_from(self.var()?).ok()?;
        let rest = usize::try_from(self.var()?).ok()?;
        if shared > before.len() {
            return None;
        }
        before.truncate(shared);
        before.extend_from_slice(self.take(rest)?);
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(before)))
    }

    pub(crate) fn digest(&mut self) -> Option<Digest> {
        let bytes: [u8; 32] = self.take(32)?.try_into().ok()?;
        Some(Digest::from_hash(blake3::Hash::from_bytes(bytes)))
    }

    pub(crate) fn stat_entry(&mut self) -> Option<StatEntry> {
        let (dev, ino, size) = (self.u64()?, self.u64()?, self.u64()?);
        let (mtime_ns, ctime_ns, seen_ns) = (self.i64()?, self.i64()?, self.i64()?);
        Some(StatEntry {
            dev,
            ino,
            size,
            mtime_ns,
            ctime_ns,
            digest: self.digest()?,
            seen_ns,
        })
    }
}
