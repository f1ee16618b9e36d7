//! Fetching a repository into the `huggingface_hub` cache, as the hub's own clients do: files go to
//! `blobs/` (named by LFS sha256 or ETag; partial downloads as `<blob>.incomplete`, which both
//! clients resume), `snapshots/<commit>/<path>` links to them, `refs/<revision>` names the commit.
//! Files already in the snapshot are reused: a re-fetch of an unchanged repo transfers nothing.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::client::{HubClient, HubError, RemoteFile};
use super::hf_cache::repo_dir;
use super::paths::{validate_repo_id, validate_repo_path};

/// One fetched file, as recorded in the manifest and the `files` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchedFile {
    /// Path in the repository.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// sha256 (the LFS oid for LFS files, verified; computed for the others).
    pub sha256: String,
    /// blake3.
    pub blake3: String,
    /// Whether the file is stored with LFS.
    pub lfs: bool,
}

/// A repository resolved to a commit, and where its snapshot lives.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit.
    pub commit: String,
    /// The snapshot folder in the cache.
    pub snapshot: PathBuf,
    /// The listing (from the server, or from the cached snapshot when offline).
    pub files: Vec<RemoteFile>,
    /// Whether this came from the cache alone (`HF_HUB_OFFLINE`).
    pub offline: bool,
}

/// Errors of fetching.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The hub said no.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// Offline and not cached.
    #[error("HF_HUB_OFFLINE is set and {repo} at revision {revision} is not in the cache {}: {why}", cache.display())]
    NotCached {
        /// The repository.
        repo: String,
        /// The revision.
        revision: String,
        /// The cache root.
        cache: PathBuf,
        /// What is missing.
        why: String,
    },
    /// A file failed its checks; it was deleted.
    #[error("{repo}: {path}: {what}; the download was deleted, nothing was cached")]
    Integrity {
        /// The repository.
        repo: String,
        /// The file.
        path: String,
        /// Expected and found.
        what: String,
    },
    /// Bad input names.
    #[error("refused: {0}")]
    Refused(String),
    /// Local I/O (fs-err's message: the operation and the path).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl FetchError {
    /// Whether this is the input's fault (an unknown or private repository, bad names, failed
    /// checksums, a file not in the offline cache): exit 1; network and disk failures exit 2.
    pub fn is_refusal(&self) -> bool {
        match self {
            FetchError::Refused(_)
            | FetchError::Integrity { .. }
            | FetchError::NotCached { .. } => true,
            FetchError::Hub(h) => h.is_refusal(),
            _ => false,
        }
    }
}

/// Whether `s` looks like a full commit hash.
fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Resolves `repo@revision`: from the server, or from the cache when `offline`.
pub fn resolve(
    client: Option<&HubClient>,
    cache: &Path,
    repo: &str,
    revision: &str,
) -> Result<Resolved, FetchError> {
    validate_repo_id(repo).map_err(FetchError::Refused)?;
    let dir = repo_dir(cache, repo);
    let Some(client) = client else {
        let not_cached = |why: String| FetchError::NotCached {
            repo: repo.into(),
            revision: revision.into(),
            cache: cache.to_path_buf(),
            why,
        };
        let commit = if is_commit(revision) {
            revision.to_string()
        } else {
            fs_err::read_to_string(dir.join("refs").join(revision))
                .map(|c| c.trim().to_string())
                .map_err(|_| not_cached(format!("no refs/{revision}")))?
        };
        let snapshot = dir.join("snapshots").join(&commit);
        if !snapshot.is_dir() {
            return Err(not_cached(format!("no snapshot {commit}")));
        }
        let mut files = Vec::new();
        let mut stack = vec![snapshot.clone()];
        while let Some(d) = stack.pop() {
            for e in fs_err::read_dir(&d)? {
                let p = e?.path();
                let meta = fs_err::metadata(&p)?;
                if meta.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p
                        .strip_prefix(&snapshot)
                        .unwrap_or(&p)
                        .to_string_lossy()
                        .replace('\\', "/");
                    files.push(RemoteFile {
                        path: rel,
                        size: Some(meta.len()),
                        sha256: None,
                        blob_id: None,
                    });
                }
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        return Ok(Resolved {
            repo: repo.into(),
            revision: revision.into(),
            commit,
            snapshot,
            files,
            offline: true,
        });
    };
    let info = client.repo_info(repo, revision)?;
    Ok(Resolved {
        repo: repo.into(),
        revision: revision.into(),
        snapshot: dir.join("snapshots").join(&info.commit),
        commit: info.commit,
        files: info.files,
        offline: false,
    })
}

/// One progress report of [`ensure_snapshot`].
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// The file being downloaded (or found in the cache).
    pub file: &'a str,
    /// Its bytes so far.
    pub file_done: u64,
    /// Its size, when listed.
    pub file_size: Option<u64>,
    /// Bytes of all files so far.
    pub done: u64,
    /// Bytes of all files.
    pub total: u64,
}

/// What [`ensure_snapshot`] did.
#[derive(Clone, Debug, Default)]
pub struct EnsureReport {
    /// Files downloaded (wholly or the rest of a partial).
    pub downloaded: Vec<String>,
    /// Files already in the snapshot.
    pub reused: Vec<String>,
    /// Bytes received over the network.
    pub transferred: u64,
}

fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = fs_err::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn relative_link(commit_depth: usize) -> PathBuf {
    // snapshots/<commit>/<path...> → ../../blobs/<blob>, one more `..` per directory level.
    let mut p = PathBuf::new();
    for _ in 0..commit_depth + 2 {
        p.push("..");
    }
    p.push("blobs");
    p
}

/// Makes every listed file present in the snapshot: reuses what is there (right size), downloads
/// the rest with bounded parallelism, checks sizes and LFS sha256 before a file counts, and writes
/// `refs/<revision>`. `progress` receives each file's bytes and the total over all files.
pub fn ensure_snapshot(
    client: &HubClient,
    cache: &Path,
    r: &Resolved,
    jobs: usize,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<EnsureReport, FetchError> {
    let dir = repo_dir(cache, &r.repo);
    let blobs = dir.join("blobs");
    fs_err::create_dir_all(&blobs)?;
    fs_err::create_dir_all(&r.snapshot)?;
    let total: u64 = r.files.iter().filter_map(|f| f.size).sum();
    let done = AtomicU64::new(0);
    let report = Mutex::new(EnsureReport::default());
    let todo = Mutex::new(r.files.iter().collect::<Vec<_>>());
    let first_error: Mutex<Option<FetchError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    if first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                        return;
                    }
                    let Some(f) = todo.lock().ok().and_then(|mut t| t.pop()) else {
                        return;
                    };
                    match ensure_one(client, &dir, r, f, &done, total, progress) {
                        Ok((downloaded, bytes)) => {
                            if let Ok(mut rep) = report.lock() {
                                rep.transferred += bytes;
                                if downloaded {
                                    rep.downloaded.push(f.path.clone());
                                } else {
                                    rep.reused.push(f.path.clone());
                                }
                            }
                        }
                        Err(e) => {
                            if let Ok(mut slot) = first_error.lock()
                                && slot.is_none()
                            {
                                *slot = Some(e);
                            }
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().ok().flatten() {
        return Err(e);
    }
    let refs = dir.join("refs");
    fs_err::create_dir_all(&refs)?;
    if !is_commit(&r.revision) {
        let rf = refs.join(&r.revision);
        if let Some(parent) = rf.parent() {
            fs_err::create_dir_all(parent)?;
        }
        fs_err::write(&rf, &r.commit)?;
    }
    let mut rep = report.into_inner().unwrap_or_default();
    rep.downloaded.sort();
    rep.reused.sort();
    Ok(rep)
}

fn ensure_one(
    client: &HubClient,
    dir: &Path,
    r: &Resolved,
    f: &RemoteFile,
    done: &AtomicU64,
    total: u64,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<(bool, u64), FetchError> {
    validate_repo_path(&f.path).map_err(FetchError::Refused)?;
    let target = r.snapshot.join(&f.path);
    if let Ok(meta) = fs_err::metadata(&target)
        && f.size.is_none_or(|s| s == meta.len())
    {
        let now = done.fetch_add(meta.len(), Ordering::Relaxed) + meta.len();
        progress(Progress {
            file: &f.path,
            file_done: meta.len(),
            file_size: Some(meta.len()),
            done: now,
            total,
        });
        return Ok((false, 0));
    }
    let blobs = dir.join("blobs");
    // The blob name: LFS sha256, else the git blob id; else a name from the path until the ETag.
    let provisional = f
        .sha256
        .clone()
        .or_else(|| f.blob_id.clone())
        .unwrap_or_else(|| {
            format!(
                "pending-{}",
                blake3::hash(format!("{}/{}", r.commit, f.path).as_bytes()).to_hex()
            )
        });
    let partial = blobs.join(format!("{provisional}.incomplete"));
    let before = done.load(Ordering::Relaxed);
    let meta = client.download(&r.repo, &r.commit, f, &partial, &|n| {
        progress(Progress {
            file: &f.path,
            file_done: n,
            file_size: f.size,
            done: before + n,
            total,
        })
    })?;
    let got = fs_err::metadata(&partial)?.len();
    let bad = |what: String| {
        let _ = fs_err::remove_file(&partial);
        FetchError::Integrity {
            repo: r.repo.clone(),
            path: f.path.clone(),
            what,
        }
    };
    if let Some(size) = f.size
        && size != got
    {
        return Err(bad(format!("size {got} where the listing says {size}")));
    }
    if let Some(want) = &f.sha256 {
        let have = sha256_file(&partial)?;
        if &have != want {
            return Err(bad(format!("sha256 {have} where the listing says {want}")));
        }
    }
    let blob_name = f
        .sha256
        .clone()
        .or(f.blob_id.clone())
        .or(meta.etag.clone())
        .unwrap_or(provisional);
    let blob = blobs.join(&blob_name);
    fs_err::rename(&partial, &blob)?;
    if let Some(parent) = target.parent() {
        fs_err::create_dir_all(parent)?;
    }
    let depth = f.path.matches('/').count();
    let link = relative_link(depth).join(&blob_name);
    let _ = fs_err::remove_file(&target);
    #[cfg(unix)]
    fs_err::os::unix::fs::symlink(&link, &target)?;
    #[cfg(not(unix))]
    fs_err::copy(&blob, &target)?;
    done.fetch_add(got, Ordering::Relaxed);
    Ok((true, meta.transferred))
}

/// Records every file of a snapshot: size, sha256 (the verified LFS oid, or computed), blake3.
pub fn record_files(r: &Resolved) -> Result<Vec<FetchedFile>, FetchError> {
    let listed: BTreeMap<&str, &RemoteFile> =
        r.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let mut out = Vec::new();
    for (path, f) in listed {
        let p = r.snapshot.join(path);
        let size = fs_err::metadata(&p)?.len();
        let sha256 = match &f.sha256 {
            Some(s) => s.clone(),
            None => sha256_file(&p)?,
        };
        let mut h = blake3::Hasher::new();
        h.update_mmap_rayon(&p)
            .map_err(|e| crate::error::io_at(e, "hash file", &p))?;
        out.push(FetchedFile {
            path: path.to_string(),
            size,
            sha256,
            blake3: h.finalize().to_hex().to_string(),
            lfs: f.sha256.is_some(),
        });
    }
    Ok(out)
}
