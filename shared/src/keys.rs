//! The ed25519 keys of miners and validators (who signs a statement), and their key files. Not
//! to be confused with a GPU's identity, which device evidence proves (`evidence`).
//!
//! A key file holds the 32-byte secret seed as 64 hex digits and one newline. It is created
//! owner-only (0600) and refused at load if group or others can read it. The secret never
//! appears in Debug output or logs.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use std::fmt;
use std::io::Write;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("key file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("key file {path} already exists; refusing to overwrite a key")]
    Exists { path: String },
    #[error("key file {path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}`")]
    Permissions { path: String, mode: u32 },
    #[error("key file {path} does not hold a 64-hex-digit ed25519 secret key")]
    Malformed { path: String },
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

impl KeyError {
    /// The key file does not exist: the one case that `keygen` fixes (it never overwrites).
    pub fn is_missing(&self) -> bool {
        matches!(self, KeyError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SignatureError {
    #[error("public key is not 32 bytes")]
    KeyLength,
    #[error("public key is not a valid ed25519 point")]
    KeyInvalid,
    #[error("public key is a point of small order, under which no signature verifies strictly")]
    KeyWeak,
    #[error("signature is not 64 bytes")]
    SignatureLength,
    #[error("signature does not verify")]
    Invalid,
}

/// An ed25519 public key: the identity a miner's work is bound to, or a validator's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    pub fn from_slice(bytes: &[u8]) -> Result<Self, SignatureError> {
        bytes.try_into().map(PublicKey).map_err(|_| SignatureError::KeyLength)
    }

    pub fn from_hex(text: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut out).ok()?;
        Some(PublicKey(out))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Whether any signature can verify under this key: a valid point, not of small order (the
    /// identity and its like, which strict verification refuses). A key that fails this is no
    /// one's identity, and is refused where it is presented rather than at its first signature.
    pub fn check_usable(&self) -> Result<(), SignatureError> {
        let key = VerifyingKey::from_bytes(&self.0).map_err(|_| SignatureError::KeyInvalid)?;
        if key.is_weak() {
            return Err(SignatureError::KeyWeak);
        }
        Ok(())
    }

    /// Strict verification (no malleable or small-order keys).
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), SignatureError> {
        let key = VerifyingKey::from_bytes(&self.0).map_err(|_| SignatureError::KeyInvalid)?;
        let signature: [u8; 64] = signature.try_into().map_err(|_| SignatureError::SignatureLength)?;
        key.verify_strict(message, &Signature::from_bytes(&signature))
            .map_err(|_| SignatureError::Invalid)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

/// A secret signing key with its public half.
pub struct KeyPair {
    signing: SigningKey,
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair(public {}, secret redacted)", self.public_key())
    }
}

impl KeyPair {
    pub fn generate() -> Result<Self, KeyError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Self::from_seed(seed))
    }

    pub fn from_seed(seed: [u8; 32]) -> Self {
        KeyPair {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key().to_bytes())
    }

    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }

    /// Generates a key and writes it to `path`, owner-only; never overwrites an existing file.
    pub fn create_file(path: &Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let identity = Self::generate()?;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::AlreadyExists => KeyError::Exists { path: shown.clone() },
            _ => KeyError::Io {
                path: shown.clone(),
                source,
            },
        })?;
        writeln!(file, "{}", hex::encode(identity.signing.to_bytes()))
            .and_then(|_| file.sync_all())
            .map_err(|source| KeyError::Io { path: shown, source })?;
        Ok(identity)
    }

    /// Loads a key file, refusing one that group or others can read.
    pub fn load_file(path: &Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let io = |source| KeyError::Io {
            path: shown.clone(),
            source,
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyError::Permissions { path: shown, mode });
            }
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::from_key_text(&text).ok_or(KeyError::Malformed { path: shown })
    }

    /// A key file's contents: the 32-byte secret seed in hex, surrounding whitespace ignored.
    pub fn from_key_text(text: &str) -> Option<Self> {
        let mut seed = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut seed).ok()?;
        Some(Self::from_seed(seed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_and_verify() {
        let id = KeyPair::from_seed([5; 32]);
        let sig = id.sign(b"message");
        id.public_key().verify(b"message", &sig).unwrap();
        assert_eq!(id.public_key().verify(b"other", &sig), Err(SignatureError::Invalid));
        assert_eq!(
            id.public_key().verify(b"message", &sig[..63]),
            Err(SignatureError::SignatureLength)
        );
        assert!(!format!("{id:?}").contains(&hex::encode([5u8; 32])));
    }

    #[cfg(unix)]
    #[test]
    fn key_files_are_owner_only_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gpu-attest-key-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id.key");
        let _ = std::fs::remove_file(&path);
        let made = KeyPair::create_file(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(KeyPair::load_file(&path).unwrap().public_key(), made.public_key());
        assert!(matches!(KeyPair::create_file(&path), Err(KeyError::Exists { .. })));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            KeyPair::load_file(&path),
            Err(KeyError::Permissions { mode: 0o644, .. })
        ));
        std::fs::write(&path, "not hex\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(KeyPair::load_file(&path), Err(KeyError::Malformed { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
