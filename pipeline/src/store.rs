//! The content-addressed store under `$ONEBIT_HOME` (default `~/.cache/onebit-pipe`).
//!
//! ```text
//! $ONEBIT_HOME/store-v1/            format directory: a layout change is a new directory
//!   entries/<key>/manifest.json     written last, inside the staging dir, before the rename
//!   entries/<key>/out/<output>...   the stage's artifacts (a file or a directory each)
//!   tmp/                            staging dirs; renamed into entries/ when complete
//!   locks/root.lock                 runs hold it shared, `gc` exclusive
//!   locks/<key>.lock                held while a stage body runs for that key
//!   refs/<name>.json                the stage keys of the last successful run of each ref
//!   runs/<run-id>.parquet           run records (see `record.rs`)
//!   hashcache/                      digests of external inputs by (path, size, mtime)
//! ```
//!
//! An entry exists only if its directory was renamed in whole, so a crash leaves at most a staging
//! directory, which nothing trusts and `gc` removes. Every run checks an entry cheaply (each file's
//! size and mtime against the manifest; a changed mtime is settled by re-hashing that file);
//! `status --deep` re-hashes everything. A changed file evicts the entry, which is then rebuilt.

use fs_err as fs;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::lock::{FileLock, LockMode};

/// The name of the store's format directory under `$ONEBIT_HOME`.
pub const STORE_FORMAT_DIR: &str = "store-v1";
/// The version written into every manifest.
pub const MANIFEST_FORMAT: u32 = 1;

/// One file of an artifact, as recorded when the entry was published.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileRecord {
    /// Path relative to the entry's `out/` directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// blake3 of the content.
    pub blake3: Digest,
    /// Modification time in nanoseconds since the Unix epoch, for the cheap check.
    pub mtime_ns: u64,
}

/// One output artifact of an entry.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ArtifactRecord {
    /// The artifact digest: blake3 over its sorted (path, size, file digest) list.
    pub digest: Digest,
    /// Whether the artifact is a directory (else a single file).
    pub is_dir: bool,
    /// Its files.
    pub files: Vec<FileRecord>,
}

impl ArtifactRecord {
    /// Total bytes of the artifact.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// The manifest of a store entry: what was run, on what, and every file it wrote.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EntryManifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// The stage name.
    pub stage: String,
    /// The stage version.
    pub version: u32,
    /// The canonical params.
    pub params: Value,
    /// The key (the entry's directory name).
    pub key: Digest,
    /// The digest of each input.
    pub inputs: BTreeMap<String, Digest>,
    /// Each output artifact.
    pub outputs: BTreeMap<String, ArtifactRecord>,
    /// When the entry was published.
    pub created_unix_ms: u64,
    /// How long the stage body ran.
    pub duration_ms: f64,
}

impl EntryManifest {
    /// Total bytes of all outputs.
    pub fn bytes(&self) -> u64 {
        self.outputs.values().map(ArtifactRecord::bytes).sum()
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Freshness {
    /// A complete entry whose files match the manifest.
    Fresh(EntryManifest),
    /// No entry under this key.
    Missing,
    /// An entry whose files were changed, truncated or removed; it must not be served.
    Tampered {
        /// The file that disagrees (relative to the entry).
        file: String,
        /// How it disagrees.
        why: String,
    },
}

/// A staging directory for one stage run; dropped without [`LocalStore::publish`] it is deleted.
pub struct Staging {
    dir: PathBuf,
    key: Digest,
    published: bool,
}

impl Staging {
    /// The directory the stage writes its outputs into.
    pub fn out_dir(&self) -> PathBuf {
        self.dir.join("out")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A store entry as listed by [`LocalStore::entries`].
#[derive(Clone, Debug)]
pub struct EntryInfo {
    /// The key.
    pub key: Digest,
    /// Its directory.
    pub dir: PathBuf,
    /// Its manifest, if readable.
    pub manifest: Option<EntryManifest>,
    /// Bytes on disk (all files, manifest included).
    pub bytes: u64,
    /// Number of files on disk.
    pub files: u64,
}

/// The local content-addressed store: entries, locks, refs, run records and the hash cache under
/// one directory. It knows nothing of shared stores: [`crate::tiered::Store`] puts a shared one
/// behind it.
#[derive(Clone, Debug)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// `$ONEBIT_HOME`, else `$XDG_CACHE_HOME/onebit-pipe`, else `~/.cache/onebit-pipe`.
    pub fn default_home() -> PathBuf {
        if let Some(h) = std::env::var_os("ONEBIT_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(h);
        }
        if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(x).join("onebit-pipe");
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| ".".into());
        home.join(".cache").join("onebit-pipe")
    }

    /// Opens (creating as needed) the store under `home`.
    pub fn open(home: &Path) -> Result<LocalStore> {
        let root = home.join(STORE_FORMAT_DIR);
        for sub in ["entries", "tmp", "locks", "refs", "runs", "hashcache"] {
            let d = root.join(sub);
            fs::create_dir_all(&d)?;
        }
        Ok(LocalStore { root })
    }

    /// The store's format directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of the entry `key` (which may not exist).
    pub fn entry_dir(&self, key: &Digest) -> PathBuf {
        self.root.join("entries").join(key.to_hex())
    }

    /// The path of output `output` of entry `key`.
    pub fn artifact_path(&self, key: &Digest, output: &str) -> PathBuf {
        self.entry_dir(key).join("out").join(output)
    }

    /// Where run records go.
    pub fn runs_dir(&self) -> PathBuf {
        self.root.join("runs")
    }

    /// Where refs go.
    pub fn refs_dir(&self) -> PathBuf {
        self.root.join("refs")
    }

    /// The lock a run holds shared and `gc` holds exclusive.
    pub fn lock_root(&self, mode: LockMode) -> Result<FileLock> {
        let path = self.root.join("locks").join("root.lock");
        FileLock::acquire(&path, mode, || {
            tracing::info!(lock = %path.display(), ?mode, "waiting for the store lock held by another process");
        })
    }

    /// The path of the lock serializing runs of entry `key`.
    pub fn key_lock_path(&self, key: &Digest) -> PathBuf {
        self.root
            .join("locks")
            .join(format!("{}.lock", key.to_hex()))
    }

    /// Looks up `key`. The cheap check compares sizes and mtimes; `deep` re-hashes every file.
    pub fn check(&self, key: &Digest, deep: bool) -> Result<Freshness> {
        let dir = self.entry_dir(key);
        let manifest_path = dir.join("manifest.json");
        let text = match fs::read(&manifest_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(if dir.exists() {
                    Freshness::Tampered {
                        file: "manifest.json".into(),
                        why: "missing".into(),
                    }
                } else {
                    Freshness::Missing
                });
            }
            Err(e) => return Err(e.into()),
        };
        let manifest: EntryManifest = match serde_json::from_slice(&text) {
            Ok(m) => m,
            Err(e) => {
                return Ok(Freshness::Tampered {
                    file: "manifest.json".into(),
                    why: format!("unreadable: {e}"),
                });
            }
        };
        if manifest.key != *key || manifest.format != MANIFEST_FORMAT {
            return Ok(Freshness::Tampered {
                file: "manifest.json".into(),
                why: "names another key or format".into(),
            });
        }
        let out = dir.join("out");
        for artifact in manifest.outputs.values() {
            for f in &artifact.files {
                let path = out.join(&f.path);
                let meta = match fs::metadata(&path) {
                    Ok(m) => m,
                    Err(_) => {
                        return Ok(Freshness::Tampered {
                            file: format!("out/{}", f.path),
                            why: "missing".into(),
                        });
                    }
                };
                if meta.len() != f.size {
                    return Ok(Freshness::Tampered {
                        file: format!("out/{}", f.path),
                        why: format!("size {} where the manifest says {}", meta.len(), f.size),
                    });
                }
                let mtime_changed = mtime_ns(&meta) != f.mtime_ns;
                if deep || mtime_changed {
                    let d = Digest::of_file(&path)?;
                    if d != f.blake3 {
                        return Ok(Freshness::Tampered {
                            file: format!("out/{}", f.path),
                            why: format!(
                                "blake3 {} where the manifest says {}",
                                d.short(),
                                f.blake3.short()
                            ),
                        });
                    }
                }
            }
        }
        Ok(Freshness::Fresh(manifest))
    }

    /// Creates a staging directory for a run of `key`.
    pub fn begin(&self, key: &Digest) -> Result<Staging> {
        let dir = self.root.join("tmp").join(format!(
            "{}.{}.{}",
            key.to_hex(),
            std::process::id(),
            now_ns()
        ));
        let out = dir.join("out");
        fs::create_dir_all(&out)?;
        Ok(Staging {
            dir,
            key: *key,
            published: false,
        })
    }

    /// Records every output file, fsyncs, writes the manifest last and renames the staging
    /// directory into place, replacing any tampered entry of the same key.
    pub fn publish(
        &self,
        staging: Staging,
        manifest: EntryManifest,
        outputs: &[String],
    ) -> Result<EntryManifest> {
        self.publish_known(staging, manifest, outputs, &BTreeMap::new())
    }

    /// [`LocalStore::publish`] where the blake3 of some files is already known (by `out/`-relative
    /// path, with its size): a file fetched from the shared store was hashed as it arrived and
    /// checked against the manifest, so it is not read again. Any other file is hashed.
    pub fn publish_known(
        &self,
        mut staging: Staging,
        mut manifest: EntryManifest,
        outputs: &[String],
        known: &BTreeMap<String, (u64, Digest)>,
    ) -> Result<EntryManifest> {
        let out = staging.out_dir();
        manifest.outputs.clear();
        for name in outputs {
            let path = out.join(name);
            let record = record_artifact(&out, &path, name, known)?;
            manifest.outputs.insert(name.clone(), record);
        }
        manifest.key = staging.key;
        manifest.format = MANIFEST_FORMAT;
        let bytes = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| Error::Internal(format!("manifest serialization: {e}")))?;
        let mpath = staging.dir.join("manifest.json");
        let mut f = fs::File::create(&mpath)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        sync_dir(&staging.dir)?;
        let dest = self.entry_dir(&staging.key);
        if dest.exists() {
            self.evict(&staging.key)?;
        }
        fs::rename(&staging.dir, &dest)?;
        staging.published = true;
        sync_dir(&self.root.join("entries"))?;
        Ok(manifest)
    }

    /// Removes entry `key` (first renamed aside, so a reader never sees half of it).
    pub fn evict(&self, key: &Digest) -> Result<()> {
        let dir = self.entry_dir(key);
        if !dir.exists() {
            return Ok(());
        }
        let aside = self
            .root
            .join("tmp")
            .join(format!("evicted.{}.{}", key.to_hex(), now_ns()));
        fs::rename(&dir, &aside)?;
        fs::remove_dir_all(&aside)?;
        Ok(())
    }

    /// Every entry on disk, with its size.
    pub fn entries(&self) -> Result<Vec<EntryInfo>> {
        let dir = self.root.join("entries");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir)? {
            let e = e?;
            let name = e.file_name();
            let Some(key) = name.to_str().and_then(Digest::from_hex) else {
                continue;
            };
            let path = e.path();
            let (bytes, files) = du(&path)?;
            let manifest = fs::read(path.join("manifest.json"))
                .ok()
                .and_then(|t| serde_json::from_slice(&t).ok());
            out.push(EntryInfo {
                key,
                dir: path,
                manifest,
                bytes,
                files,
            });
        }
        out.sort_by_key(|e| e.key);
        Ok(out)
    }

    /// Removes every staging directory. Only safe while holding the root lock exclusively.
    pub(crate) fn clear_tmp(&self) -> Result<(u64, u64)> {
        let dir = self.root.join("tmp");
        let (bytes, files) = du(&dir)?;
        for e in fs::read_dir(&dir)? {
            let p = e?.path();
            if p.is_dir() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
        }
        Ok((bytes, files))
    }
}

/// Writes `bytes` to `path` atomically: a temp file in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let parent = path
        .parent()
        .ok_or_else(|| Error::Internal(format!("{} has no parent", path.display())))?;
    fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id(),
        now_ns()
    ));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    Ok(result?)
}

fn record_artifact(
    out: &Path,
    path: &Path,
    name: &str,
    known: &BTreeMap<String, (u64, Digest)>,
) -> Result<ArtifactRecord> {
    let meta = fs::symlink_metadata(path)?;
    let mut files = Vec::new();
    if meta.is_dir() {
        let mut stack = vec![path.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d)? {
                let p = e?.path();
                let m = fs::symlink_metadata(&p)?;
                if m.is_dir() {
                    stack.push(p);
                } else {
                    files.push(record_file(out, &p, known)?);
                }
            }
        }
        sync_dir(path)?;
    } else {
        files.push(record_file(out, path, known)?);
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut h = crate::key::KeyHasher::new("onebit-pipe/artifact/v1");
    h.field(b"name", name.as_bytes());
    for f in &files {
        h.field(b"path", f.path.as_bytes());
        h.field(b"size", &f.size.to_le_bytes());
        h.field(b"blake3", &f.blake3.0);
    }
    Ok(ArtifactRecord {
        digest: h.finish(),
        is_dir: meta.is_dir(),
        files,
    })
}

fn record_file(
    out: &Path,
    path: &Path,
    known: &BTreeMap<String, (u64, Digest)>,
) -> Result<FileRecord> {
    let f = fs::File::open(path)?;
    f.sync_all()?;
    let meta = f.metadata()?;
    let rel = path
        .strip_prefix(out)
        .map_err(|_| Error::Internal(format!("{} outside {}", path.display(), out.display())))?;
    let rel = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/");
    let blake3 = match known.get(&rel) {
        Some(&(size, digest)) if size == meta.len() => digest,
        _ => Digest::of_file(path)?,
    };
    Ok(FileRecord {
        path: rel,
        size: meta.len(),
        blake3,
        mtime_ns: mtime_ns(&meta),
    })
}

/// Modification time in ns since the epoch (0 when the platform has none).
pub(crate) fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Nanoseconds since the epoch, for unique temp names and timestamps.
pub(crate) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    (now_ns() / 1_000_000) as u64
}

fn sync_dir(dir: &Path) -> Result<()> {
    let f = fs::File::open(dir)?;
    Ok(f.sync_all()?)
}

/// Bytes and files under `path`.
pub(crate) fn du(path: &Path) -> Result<(u64, u64)> {
    let mut bytes = 0;
    let mut files = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(d) = stack.pop() {
        let meta = match fs::symlink_metadata(&d) {
            Ok(m) => m,
            Err(_) => continue,
        };
        if meta.is_dir() {
            for e in fs::read_dir(&d)? {
                stack.push(e?.path());
            }
        } else {
            bytes += meta.len();
            files += 1;
        }
    }
    Ok((bytes, files))
}
