//! A client of the Hugging Face hub's HTTP API: list a repository at a revision, download a file
//! with `Range` resume, retries with backoff on 429/5xx/connection errors, and clear errors for
//! 401/403 (gated or private) and 404.
//!
//! Written on `ureq` rather than the `hf-hub` crate: hf-hub 0.5 honours a custom endpoint only
//! through its environment builder, has no `HF_HUB_OFFLINE`, and hides the resume and integrity
//! steps we must control; 1.0 pulls reqwest 0.13 with aws-lc and about 330 crates.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::paths::validate_repo_path;

/// Retry policy.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    /// Attempts in all (≥ 1).
    pub attempts: u32,
    /// First backoff; doubles each attempt (a `Retry-After` header wins, capped at 30 s).
    pub base: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 5,
            base: Duration::from_millis(500),
        }
    }
}

/// One file of a repository listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    /// Path in the repository.
    pub path: String,
    /// Size in bytes, when listed.
    pub size: Option<u64>,
    /// LFS sha256, for LFS files.
    pub sha256: Option<String>,
    /// Git blob id, when listed.
    pub blob_id: Option<String>,
}

/// A repository at a resolved revision.
#[derive(Clone, Debug)]
pub struct RepoInfo {
    /// The commit the revision resolves to.
    pub commit: String,
    /// Its files.
    pub files: Vec<RemoteFile>,
}

/// Errors of the hub client.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// 401/403.
    #[error("{url}: HTTP {status}: {repo} is gated or private; {hint}")]
    Unauthorized {
        /// The URL.
        url: String,
        /// 401 or 403.
        status: u16,
        /// The repository.
        repo: String,
        /// What to do.
        hint: String,
    },
    /// 404.
    #[error("{url}: HTTP 404: repository {repo} at revision {revision} not found on {endpoint}")]
    NotFound {
        /// The URL.
        url: String,
        /// The repository.
        repo: String,
        /// The revision.
        revision: String,
        /// The endpoint.
        endpoint: String,
    },
    /// Another HTTP status, or retries exhausted.
    #[error("{url}: {what}")]
    Http {
        /// The URL.
        url: String,
        /// What happened.
        what: String,
    },
    /// The server's listing is unusable (bad JSON, a file name that escapes the snapshot).
    #[error("{url}: {what}")]
    Listing {
        /// The URL.
        url: String,
        /// What is wrong.
        what: String,
    },
    /// Local I/O (fs-err's message: the operation and the path).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl HubError {
    /// Whether the hub said the request itself is wrong (no such repository or file, no access,
    /// an unusable listing): the input's fault, exit 1.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            HubError::NotFound { .. } | HubError::Unauthorized { .. } | HubError::Listing { .. }
        )
    }
}

#[derive(Deserialize)]
struct ApiInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    sha256: Option<String>,
    #[serde(alias = "oid")]
    oid: Option<String>,
    size: Option<u64>,
}

/// What a download returned besides the bytes.
#[derive(Clone, Debug, Default)]
pub struct DownloadMeta {
    /// `X-Linked-Etag` or `ETag`, unquoted.
    pub etag: Option<String>,
    /// Bytes received over the network by this call.
    pub transferred: u64,
}

/// The client.
pub struct HubClient {
    endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
    retry: Retry,
}

fn percent_encode_path(p: &str) -> String {
    p.split('/')
        .map(|seg| {
            seg.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    other => format!("%{other:02X}"),
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("/")
}

impl HubClient {
    /// A client of `endpoint` (e.g. `https://huggingface.co`), with an optional bearer token.
    pub fn new(endpoint: &str, token: Option<String>, retry: Retry) -> HubClient {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(60))
            .redirects(8)
            .user_agent(concat!("onebit-pipe/", env!("CARGO_PKG_VERSION")))
            .build();
        HubClient {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
            agent,
            retry,
        }
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn request(&self, method: &str, url: &str) -> ureq::Request {
        let r = self.agent.request(method, url);
        match &self.token {
            Some(t) => r.set("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    /// Sends with retries on 429/5xx and transport errors; maps 401/403/404.
    fn send(
        &self,
        url: &str,
        repo: &str,
        revision: &str,
        range_from: Option<u64>,
    ) -> Result<ureq::Response, HubError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut req = self.request("GET", url);
            if let Some(n) = range_from.filter(|n| *n > 0) {
                req = req.set("Range", &format!("bytes={n}-"));
            }
            let (wait, why) = match req.call() {
                Ok(resp) => return Ok(resp),
                Err(ureq::Error::Status(code, resp)) => match code {
                    401 | 403 => {
                        return Err(HubError::Unauthorized {
                            url: url.into(),
                            status: code,
                            repo: repo.into(),
                            hint: if self.token.is_some() {
                                "the token in HF_TOKEN has no access to it".into()
                            } else {
                                "set HF_TOKEN to a token with access".into()
                            },
                        });
                    }
                    404 => {
                        return Err(HubError::NotFound {
                            url: url.into(),
                            repo: repo.into(),
                            revision: revision.into(),
                            endpoint: self.endpoint.clone(),
                        });
                    }
                    416 => return Ok(resp),
                    429 | 500 | 502 | 503 | 504 => {
                        let after = resp
                            .header("Retry-After")
                            .and_then(|v| v.trim().parse::<u64>().ok())
                            .map(|s| Duration::from_secs(s.min(30)));
                        (after, format!("HTTP {code}"))
                    }
                    other => {
                        return Err(HubError::Http {
                            url: url.into(),
                            what: format!("HTTP {other}"),
                        });
                    }
                },
                Err(ureq::Error::Transport(t)) => (None, t.to_string()),
            };
            if attempt >= self.retry.attempts {
                return Err(HubError::Http {
                    url: url.into(),
                    what: format!("{why}, after {attempt} attempts"),
                });
            }
            let backoff = wait.unwrap_or(self.retry.base * 2u32.saturating_pow(attempt - 1));
            tracing::warn!(%url, %why, attempt, ?backoff, "retrying");
            std::thread::sleep(backoff);
        }
    }

    /// Lists `repo` at `revision` (a branch, tag or commit).
    pub fn repo_info(&self, repo: &str, revision: &str) -> Result<RepoInfo, HubError> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}?blobs=true",
            self.endpoint,
            percent_encode_path(revision)
        );
        let resp = self.send(&url, repo, revision, None)?;
        let mut text = String::new();
        resp.into_reader()
            .take(64 << 20)
            .read_to_string(&mut text)
            .map_err(|e| HubError::Http {
                url: url.clone(),
                what: format!("reading the listing: {e}"),
            })?;
        let info: ApiInfo = serde_json::from_str(&text).map_err(|e| HubError::Listing {
            url: url.clone(),
            what: format!("not a repository listing: {e}"),
        })?;
        let commit = info.sha.ok_or_else(|| HubError::Listing {
            url: url.clone(),
            what: "the listing has no commit sha".into(),
        })?;
        if commit.is_empty() || !commit.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(HubError::Listing {
                url,
                what: format!("commit {commit:?} is not a hash"),
            });
        }
        let mut files = Vec::new();
        for s in info.siblings {
            validate_repo_path(&s.rfilename).map_err(|what| HubError::Listing {
                url: url.clone(),
                what: format!("refused: {what}"),
            })?;
            let (sha256, lfs_size) = match s.lfs {
                Some(l) => (l.sha256.or(l.oid), l.size),
                None => (None, None),
            };
            files.push(RemoteFile {
                path: s.rfilename,
                size: lfs_size.or(s.size),
                sha256,
                blob_id: s.blob_id,
            });
        }
        Ok(RepoInfo { commit, files })
    }

    /// Downloads `file` of `repo` at `commit` into `partial`, resuming from its current length with
    /// `Range`. Calls `progress` with the bytes written so far. Transport errors mid-body are
    /// retried from where the file stands.
    pub fn download(
        &self,
        repo: &str,
        commit: &str,
        file: &RemoteFile,
        partial: &Path,
        progress: &dyn Fn(u64),
    ) -> Result<DownloadMeta, HubError> {
        let url = format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.endpoint,
            percent_encode_path(&file.path)
        );
        let mut meta = DownloadMeta::default();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let have = fs_err::metadata(partial).map(|m| m.len()).unwrap_or(0);
            if file.size == Some(have) && have > 0 {
                return Ok(meta);
            }
            let resp = self.send(&url, repo, commit, Some(have))?;
            meta.etag = resp
                .header("X-Linked-Etag")
                .or_else(|| resp.header("ETag"))
                .map(|e| e.trim_start_matches("W/").trim_matches('"').to_string());
            let status = resp.status();
            let mut out = fs_err::OpenOptions::new()
                .create(true)
                .append(true)
                .open(partial)?;
            let mut written = have;
            if status == 200 && have > 0 {
                // The server ignored the range: start over.
                out.set_len(0)?;
                written = 0;
            } else if status == 416 {
                return Ok(meta);
            }
            let mut reader = resp.into_reader();
            let mut buf = vec![0u8; 1 << 20];
            let result: Result<(), std::io::Error> = (|| {
                loop {
                    let n = reader.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    out.write_all(&buf[..n])?;
                    written += n as u64;
                    meta.transferred += n as u64;
                    progress(written);
                }
            })();
            out.flush()?;
            match result {
                Ok(()) if file.size.is_none_or(|s| s == written) => return Ok(meta),
                Ok(()) => {
                    if attempt >= self.retry.attempts {
                        return Err(HubError::Http {
                            url,
                            what: format!(
                                "body ended at {written} of {} bytes, after {attempt} attempts",
                                file.size.unwrap_or(0)
                            ),
                        });
                    }
                }
                Err(e) => {
                    if attempt >= self.retry.attempts {
                        return Err(HubError::Http {
                            url,
                            what: format!("{e}, after {attempt} attempts"),
                        });
                    }
                    tracing::warn!(%url, error = %e, written, "connection lost mid-body; resuming with Range");
                }
            }
            std::thread::sleep(self.retry.base * 2u32.saturating_pow(attempt - 1));
        }
    }
}
