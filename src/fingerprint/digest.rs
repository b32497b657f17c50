//! A BLAKE3 digest that prints as `blake3:<hex>`.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    pub const PREFIX: &'static str = "blake3:";

    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    pub fn from_hash(hash: blake3::Hash) -> Self {
        Self(*hash.as_bytes())
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }

    /// The first 12 hex digits, for compact listings.
    pub fn short(&self) -> String {
        self.hex()[..12].to_owned()
    }
}

/// Lowercase hex of any bytes (a SHA-256, say).
pub fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

impl fmt::Display for Digest {
    /// (Without a `String` on the heap: a lock file of a thousand stages
    /// prints two thousand digests.)
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::PREFIX)?;
        f.write_str(blake3::Hash::from_bytes(self.0).to_hex().as_str())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid digest `{0}`: expected `blake3:` and 64 hex digits")]
pub struct ParseDigestError(String);

impl FromStr for Digest {
    type Err = ParseDigestError;

    /// Lower- or uppercase hex, by a table (the ledger gives back
    /// thousands of digests a run).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s.strip_prefix(Self::PREFIX).unwrap_or(s).as_bytes();
        let invalid = || ParseDigestError(s.to_owned());
        if hex.len() != 64 {
            return Err(invalid());
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
            let (high, low) = (HEX_VALUE[pair[0] as usize], HEX_VALUE[pair[1] as usize]);
            if high | low == NOT_HEX {
                return Err(invalid());
            }
            *byte = high << 4 | low;
        }
        Ok(Self(bytes))
    }
}

/// A byte that is not a hex digit: or'ed with a digit's value (below 16),
/// it stays itself.
const NOT_HEX: u8 = 0xff;

/// Each byte's value as a hex digit, or [`NOT_HEX`].
const HEX_VALUE: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

/// Hashes a [`Digest`] as its first eight bytes: they are BLAKE3 output
/// already, so a map keyed by digests need not hash them again. (Only for
/// digests of content: bytes someone chose, as [`Digest::from_bytes`]
/// takes, could all collide.)
#[derive(Debug, Clone, Copy, Default)]
pub struct DigestHashed;

impl std::hash::BuildHasher for DigestHashed {
    type Hasher = FirstBytes;
    fn build_hasher(&self) -> FirstBytes {
        FirstBytes(0)
    }
}

/// See [`DigestHashed`]. Anything written that is not a digest's bytes
/// (the length a slice is hashed with) is folded in all the same.
#[derive(Debug)]
pub struct FirstBytes(u64);

impl std::hash::Hasher for FirstBytes {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut word = [0u8; 8];
        let first = &bytes[..bytes.len().min(8)];
        word[..first.len()].copy_from_slice(first);
        self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
    }
}

/// A map keyed by digests, hashed as they are ([`DigestHashed`]).
pub type DigestMap<V> = std::collections::HashMap<Digest, V, DigestHashed>;

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_reads_back_from_its_text_in_either_case_and_nothing_else_does() {
        let digest = Digest::of(b"cairn");
        assert_eq!(digest.to_string().parse::<Digest>().unwrap(), digest);
        assert_eq!(digest.hex().parse::<Digest>().unwrap(), digest);
        assert_eq!(
            digest.hex().to_uppercase().parse::<Digest>().unwrap(),
            digest
        );
        let hex = digest.hex();
        for bad in [
            String::new(),
            hex[..63].to_owned(),
            format!("{hex}0"),
            format!("g{}", &hex[1..]),
            format!("{} ", &hex[..63]),
            format!("sha256:{hex}"),
            format!("{}é", &hex[..62]),
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_map_keyed_by_digests_finds_each_of_many() {
        let digests: Vec<Digest> = (0u32..10_000)
            .map(|n| Digest::of(&n.to_le_bytes()))
            .collect();
        let map: DigestMap<usize> = digests.iter().enumerate().map(|(n, d)| (*d, n)).collect();
        assert_eq!(map.len(), digests.len());
        for (n, digest) in digests.iter().enumerate() {
            assert_eq!(map.get(digest), Some(&n));
        }
        assert_eq!(map.get(&Digest::of(b"absent")), None);
    }
}
