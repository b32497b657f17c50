//! The ed25519 keys cache entries are signed with: this machine's signing
//! key (made once, kept outside every workspace like an ssh key) and the
//! public keys a remote's entries are trusted from.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

/// The prefix of a public key written as text: `ed25519:BASE64`.
const PREFIX: &str = "ed25519:";

/// Where the signing key comes from, in order: the key itself in
/// `CAIRN_SIGNING_KEY` (a secret, for CI), a file named by
/// `CAIRN_SIGNING_KEY_FILE` or the manifest's `[cache.remote] key`, else
/// `~/.config/cairn/signing-key` (made on first use).
pub const KEY_VARIABLE: &str = "CAIRN_SIGNING_KEY";
pub const KEY_FILE_VARIABLE: &str = "CAIRN_SIGNING_KEY_FILE";

/// An ed25519 public key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// Parses `ed25519:BASE64` (32 bytes).
    pub fn parse(text: &str) -> Result<Self, String> {
        let body = text
            .trim()
            .strip_prefix(PREFIX)
            .ok_or_else(|| format!("`{text}` is not an ed25519 public key (`ed25519:BASE64`)"))?;
        let bytes = BASE64
            .decode(body)
            .map_err(|e| format!("`{text}` is not valid base64: {e}"))?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| format!("`{text}` does not hold 32 bytes"))?;
        Ok(Self(bytes))
    }

    /// Whether `signature` signs `message` under this key.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.0)
            .verify(message, signature)
            .is_ok()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", BASE64.encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// This machine's signing key. Its seed never leaves this value: not in a
/// log, an entry or a debug print.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    /// Where it was read from, for `cairn key`.
    pub source: String,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({}, from {})", self.public(), self.source)
    }
}

impl SigningKey {
    /// The key from the environment, the file `configured`, or the default
    /// file (created, mode 0600, if there is none).
    pub fn load(configured: Option<&Path>) -> Result<Self, String> {
        if let Ok(text) = std::env::var(KEY_VARIABLE) {
            return Self::from_text(&text, &format!("${KEY_VARIABLE}"));
        }
        let path = match std::env::var_os(KEY_FILE_VARIABLE) {
            Some(path) => PathBuf::from(path),
            None => match configured {
                Some(path) => path.to_owned(),
                None => default_path()?,
            },
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::from_text(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::create(&path),
            Err(e) => Err(format!(
                "cannot read the signing key `{}`: {e}",
                path.display()
            )),
        }
    }

    /// A key from its text form: `ed25519-seed:BASE64` (32 bytes).
    fn from_text(text: &str, source: &str) -> Result<Self, String> {
        let seed = text
            .trim()
            .strip_prefix("ed25519-seed:")
            .and_then(|body| BASE64.decode(body).ok())
            .filter(|seed| seed.len() == 32)
            .ok_or_else(|| {
                let fix = if source.starts_with('$') {
                    format!("set {source} to the text of a key file, or unset it")
                } else {
                    "move it aside and `cairn key` makes a new one".to_owned()
                };
                format!(
                    "the signing key in {source} is not `ed25519-seed:BASE64` (32 bytes); {fix}"
                )
            })?;
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|_| format!("the signing key in {source} is not a valid ed25519 seed"))?;
        Ok(Self {
            pair,
            source: source.to_owned(),
        })
    }

    /// Makes a new key at `path`, readable by its owner only.
    pub fn create(path: &Path) -> Result<Self, String> {
        use ring::rand::SecureRandom as _;
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut seed = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut seed)
            .map_err(|_| "the system's random source failed".to_owned())?;
        let text = format!("ed25519-seed:{}\n", BASE64.encode(seed));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
        }
        // A name of its own: two processes making a key at once each write
        // theirs, and the first link wins for both.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let temp = path.with_extension(format!("tmp.{}.{nanos}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .and_then(|mut file| {
                file.write_all(text.as_bytes())?;
                file.sync_all()
            })
            // Never replaces a key another process made meanwhile.
            .and_then(|()| std::fs::hard_link(&temp, path));
        let _ = std::fs::remove_file(&temp);
        match written {
            Ok(()) => {
                tracing::info!("made a new signing key at {}", path.display());
                Self::from_text(&text, &path.display().to_string())
            }
            // Another process made one first: that one is the key.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!("cannot read the signing key `{}`: {e}", path.display())
                })?;
                Self::from_text(&text, &path.display().to_string())
            }
            Err(e) => Err(format!(
                "cannot write a signing key to `{}`: {e}",
                path.display()
            )),
        }
    }

    pub fn public(&self) -> PublicKey {
        let bytes: [u8; 32] = self
            .pair
            .public_key()
            .as_ref()
            .try_into()
            .expect("an ed25519 public key is 32 bytes");
        PublicKey(bytes)
    }

    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }
}

/// `~/.config/cairn/signing-key` (or under `$XDG_CONFIG_HOME`).
pub fn default_path() -> Result<PathBuf, String> {
    if let Some(config) = std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(config).join("cairn").join("signing-key"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            format!("no HOME to keep a signing key in; set {KEY_FILE_VARIABLE} to a file")
        })?;
    Ok(PathBuf::from(home)
        .join(".config")
        .join("cairn")
        .join("signing-key"))
}

pub fn encode(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

pub fn decode(text: &str) -> Option<Vec<u8>> {
    BASE64.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_key_is_read_back_and_signs_what_its_public_key_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested").join("signing-key");
        let made = SigningKey::create(&path).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let again = SigningKey::load(Some(&path)).unwrap();
        assert_eq!(made.public(), again.public());
        let signature = again.sign(b"entry");
        assert!(made.public().verifies(b"entry", &signature));
        assert!(!made.public().verifies(b"other entry", &signature));
        let parsed = PublicKey::parse(&made.public().to_string()).unwrap();
        assert_eq!(parsed, made.public());
        // The seed is not in what a log would print.
        let seed = std::fs::read_to_string(&path).unwrap();
        let body = seed.trim().strip_prefix("ed25519-seed:").unwrap();
        assert!(!format!("{again:?}").contains(body));
    }

    #[test]
    fn a_bad_public_key_says_what_is_wrong() {
        assert!(
            PublicKey::parse("ssh-ed25519 AAAA")
                .unwrap_err()
                .contains("ed25519:BASE64")
        );
        assert!(
            PublicKey::parse("ed25519:!!")
                .unwrap_err()
                .contains("base64")
        );
        assert!(
            PublicKey::parse("ed25519:AAAA")
                .unwrap_err()
                .contains("32 bytes")
        );
    }
}
