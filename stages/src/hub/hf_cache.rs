//! Files of a `huggingface_hub` cache: `$HF_HOME/hub/models--ORG--NAME/refs/<revision>` holds a
//! commit hash, and `snapshots/<commit>/<path>` the file (a symlink into `blobs/` or a copy).

use std::path::{Path, PathBuf};

/// `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> PathBuf {
    if let Some(c) = std::env::var_os("HF_HUB_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(c);
    }
    let home = std::env::var_os("HF_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache")
                .join("huggingface")
        });
    home.join("hub")
}

/// The cache folder of model repo `ORG/NAME`.
pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// A reference written `ORG/NAME:FILE` (optionally `ORG/NAME@REVISION:FILE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    /// `ORG/NAME`.
    pub repo: String,
    /// Branch, tag or commit (default `main`).
    pub revision: String,
    /// Path inside the repository.
    pub file: String,
}

impl RepoFile {
    /// Parses `ORG/NAME[@REV]:FILE`; `None` when the text is not of that form.
    pub fn parse(s: &str) -> Option<RepoFile> {
        let (repo, file) = s.split_once(':')?;
        let (repo, revision) = match repo.split_once('@') {
            Some((r, rev)) => (r, rev.to_string()),
            None => (repo, "main".to_string()),
        };
        let mut parts = repo.split('/');
        let (org, name) = (parts.next()?, parts.next()?);
        if parts.next().is_some() || org.is_empty() || name.is_empty() || file.is_empty() {
            return None;
        }
        if file.split('/').any(|c| c == ".." || c.is_empty()) {
            return None;
        }
        Some(RepoFile {
            repo: repo.to_string(),
            revision,
            file: file.to_string(),
        })
    }

    /// The file in the local cache, when present: the revision's snapshot first (through
    /// `refs/<revision>`, or the revision itself when it is a commit).
    pub fn in_cache(&self, cache: &Path) -> Option<PathBuf> {
        let dir = repo_dir(cache, &self.repo);
        let commit = std::fs::read_to_string(dir.join("refs").join(&self.revision))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| self.revision.clone());
        let p = dir.join("snapshots").join(commit).join(&self.file);
        p.is_file().then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_finds_a_cached_file() {
        assert_eq!(
            RepoFile::parse("a/b:c.gguf").map(|r| r.revision),
            Some("main".into())
        );
        assert_eq!(
            RepoFile::parse("a/b@v1:d/c.gguf").map(|r| (r.revision, r.file)),
            Some(("v1".into(), "d/c.gguf".into()))
        );
        for bad in ["a:b", "a/b/c:d", "a/b:", "a/b:../x", "/b:x", "plain.gguf"] {
            assert_eq!(RepoFile::parse(bad), None, "{bad}");
        }
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = repo_dir(tmp.path(), "org/model");
        std::fs::create_dir_all(dir.join("refs")).expect("mkdir");
        std::fs::create_dir_all(dir.join("snapshots/abc123")).expect("mkdir");
        std::fs::write(dir.join("refs/main"), "abc123\n").expect("ref");
        std::fs::write(dir.join("snapshots/abc123/m.gguf"), b"GGUF").expect("file");
        let r = RepoFile::parse("org/model:m.gguf").expect("parse");
        assert_eq!(
            r.in_cache(tmp.path()),
            Some(dir.join("snapshots/abc123/m.gguf"))
        );
        let by_commit = RepoFile::parse("org/model@abc123:m.gguf").expect("parse");
        assert!(by_commit.in_cache(tmp.path()).is_some());
        assert_eq!(
            RepoFile::parse("org/model:other.gguf")
                .expect("parse")
                .in_cache(tmp.path()),
            None
        );
    }
}
