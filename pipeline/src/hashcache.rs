//! Digests of external inputs (graph roots outside the store), memoized by (path, size, mtime,
//! inode) so an unchanged multi-gigabyte source is hashed once, not on every run.

use fs_err as fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::Result;
use crate::key::KeyHasher;
use crate::store::{LocalStore, mtime_ns, write_atomic};

#[derive(Serialize, Deserialize)]
struct Memo {
    path: String,
    size: u64,
    mtime_ns: u64,
    ino: u64,
    digest: Digest,
}

#[cfg(unix)]
fn ino(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.ino()
}

#[cfg(not(unix))]
fn ino(_meta: &std::fs::Metadata) -> u64 {
    0
}

/// The digest of one file, from the memo when (path, size, mtime, inode) are unchanged.
pub fn file_digest(store: &LocalStore, path: &Path) -> Result<Digest> {
    let abs = fs::canonicalize(path)?;
    let meta = fs::metadata(&abs)?;
    let id = abs.to_string_lossy().into_owned();
    let memo_path = store
        .root()
        .join("hashcache")
        .join(format!("{}.json", Digest::of_bytes(id.as_bytes()).to_hex()));
    if let Ok(bytes) = fs::read(&memo_path)
        && let Ok(m) = serde_json::from_slice::<Memo>(&bytes)
        && m.path == id
        && m.size == meta.len()
        && m.mtime_ns == mtime_ns(&meta)
        && m.ino == ino(&meta)
    {
        return Ok(m.digest);
    }
    let digest = Digest::of_file(&abs)?;
    let memo = Memo {
        path: id,
        size: meta.len(),
        mtime_ns: mtime_ns(&meta),
        ino: ino(&meta),
        digest,
    };
    if let Ok(bytes) = serde_json::to_vec(&memo) {
        // A memo that cannot be written costs a re-hash next time, nothing else.
        if let Err(e) = write_atomic(&memo_path, &bytes) {
            tracing::debug!(error = %e, "hash memo not written");
        }
    }
    Ok(digest)
}

/// The digest of a file, or of a directory as its sorted (relative path, size, digest) list.
/// Symbolic links are followed; the total size is returned too.
pub fn path_digest(store: &LocalStore, path: &Path) -> Result<(Digest, u64)> {
    let meta = fs::metadata(path)?;
    if !meta.is_dir() {
        return Ok((file_digest(store, path)?, meta.len()));
    }
    let mut files = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let p = e?.path();
            if fs::metadata(&p)?.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut h = KeyHasher::new("onebit-pipe/external-dir/v1");
    let mut total = 0;
    for f in files {
        let rel = f
            .strip_prefix(path)
            .unwrap_or(&f)
            .to_string_lossy()
            .into_owned();
        let size = fs::metadata(&f)?.len();
        total += size;
        h.field(b"path", rel.as_bytes());
        h.field(b"size", &size.to_le_bytes());
        h.field(b"blake3", &file_digest(store, &f)?.0);
    }
    Ok((h.finish(), total))
}
