//! A blake3 digest with a stable hex form: the identity of every artifact and cache entry.

use std::fmt;
use std::io::Read;
use std::path::Path;

use crate::error::{Result, io_at};

/// A 32-byte blake3 digest. Serialized as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of a byte string.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    /// The digest of a file's content, streamed (memory-mapped by blake3 for large files).
    pub fn of_file(path: &Path) -> Result<Self> {
        let mut hasher = blake3::Hasher::new();
        let meta = fs_err::metadata(path)?;
        if meta.len() > 1 << 20 {
            hasher
                .update_mmap_rayon(path)
                .map_err(|e| io_at(e, "hash file", path))?;
        } else {
            let mut file = fs_err::File::open(path)?;
            let mut buf = Vec::with_capacity(meta.len() as usize);
            file.read_to_end(&mut buf)?;
            hasher.update(&buf);
        }
        Ok(Digest(*hasher.finalize().as_bytes()))
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// The first 12 hex digits, for messages.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::from_hex(&s).ok_or_else(|| serde::de::Error::custom(format!("not a digest: {s:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let d = Digest::of_bytes(b"abc");
        assert_eq!(Digest::from_hex(&d.to_hex()), Some(d));
        assert_eq!(
            d.to_hex(),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
        assert_eq!(Digest::from_hex("zz"), None);
    }
}
