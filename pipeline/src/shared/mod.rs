//! The shared store: the same content-addressed entries, refs and run records on S3-compatible
//! object storage (through `object_store`, the crate DataFusion reads with), so that a cache hit
//! holds across machines and `sql` sees every pack anyone imported. The local store stays in
//! front as a read-through cache: stages read and write local files; an entry missing locally is
//! fetched (and verified) from the shared store before it is computed.
//!
//! ```text
//! s3://bucket/prefix/store-v1/
//!   FORMAT                              "onebit-pipe store-v1"
//!   entries/<key>/manifest.json         the commit point, written create-if-absent (If-None-Match)
//!   entries/<key>/<upload>/out/<path>   the files of the upload the manifest names
//!   refs/<name>.<tag>.json              as in the local store (last writer wins)
//!   runs/<run-id>.parquet               run records, as in the local store
//!   leases/<key>.json                   a stage running somewhere: holder, expiry (renewed)
//!   leases/run-<run-id>.json            an import running somewhere (gc waits for none)
//!   leases/gc.json                      a gc running
//! ```
//!
//! Every file of an upload is written before its manifest, and the manifest is created only if
//! absent, so two importers never overwrite each other's entry and a reader never sees a partial
//! one (a killed upload leaves files no manifest names; `gc` removes them). Leases stand in for
//! the local per-key locks across machines: created if absent, renewed with If-Match while the
//! holder lives, taken over once expired.

pub mod credentials;
pub mod gc;
pub mod lease;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use fs_err as fs;
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::ref_record::RefRecord;
use crate::store::{EntryManifest, LocalStore, STORE_FORMAT_DIR, now_ns};

/// The contents of the `FORMAT` object.
const FORMAT_TEXT: &str = "onebit-pipe store-v1\n";
/// The version of the shared manifest wrapper.
pub const SHARED_MANIFEST_FORMAT: u32 = 1;
/// Files up to this size go up in one PUT; larger ones as a multipart upload of such parts.
const PART_BYTES: usize = 16 << 20;
/// Small objects (manifests, refs) fetched at once when many are wanted.
const LISTING_PARALLEL: usize = 16;
/// Parts in flight at once, up and down.
const PARALLEL: usize = 4;

/// A manifest as the shared store keeps it: the entry's manifest and the upload holding its files.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SharedManifest {
    /// [`SHARED_MANIFEST_FORMAT`].
    pub format: u32,
    /// The upload (folder under `entries/<key>/`) whose files the manifest describes.
    pub upload: String,
    /// Who published it (`host:pid`).
    pub publisher: String,
    /// The entry's manifest, as the local store writes it.
    pub manifest: EntryManifest,
}

/// One shared store: an S3 bucket and prefix, with the runtime its async client runs on.
pub struct SharedStore {
    url: String,
    bucket: String,
    root: Path,
    os: Arc<dyn ObjectStore>,
    rt: Option<tokio::runtime::Runtime>,
    holder: String,
    lease_ttl: Duration,
    credentials: credentials::Resolved,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore")
            .field("url", &self.url)
            .field("holder", &self.holder)
            .finish()
    }
}

impl Drop for SharedStore {
    fn drop(&mut self) {
        // Dropping a runtime blocks; inside another runtime that panics. Shut it down aside.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// `host:pid`, naming a holder in leases and a publisher in manifests.
fn holder_name() -> String {
    let host = fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".into());
    format!("{host}:{}", std::process::id())
}

/// The lease time-to-live: `ONEBIT_LEASE_TTL_S` seconds, default 60.
fn lease_ttl() -> Duration {
    let s = std::env::var("ONEBIT_LEASE_TTL_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .unwrap_or(60.0);
    Duration::from_secs_f64(s)
}

impl SharedStore {
    /// Opens `s3://bucket[/prefix]`, with credentials as the AWS SDKs read them
    /// ([`credentials`]), and checks access by reading (or creating) the `FORMAT` object. Wrong
    /// credentials fail here, before anything is written anywhere.
    pub fn open(url: &str) -> Result<SharedStore> {
        let config = |reason: String| Error::SharedConfig {
            url: url.to_string(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| config(format!("not a URL: {e}")))?;
        if parsed.scheme() != "s3" {
            return Err(config(format!(
                "scheme {}: is not supported; shared stores are s3://bucket/prefix",
                parsed.scheme()
            )));
        }
        let bucket = parsed
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| config("no bucket".into()))?
            .to_string();
        let prefix = parsed.path().trim_matches('/');
        let root = if prefix.is_empty() {
            Path::from(STORE_FORMAT_DIR)
        } else {
            Path::from(format!("{prefix}/{STORE_FORMAT_DIR}"))
        };
        let creds = credentials::resolve();
        let mut b = AmazonS3Builder::from_env().with_bucket_name(&bucket);
        if let Some(v) = &creds.access_key_id {
            b = b.with_access_key_id(v);
        }
        if let Some(v) = &creds.secret_access_key {
            b = b.with_secret_access_key(v);
        }
        if let Some(v) = &creds.session_token {
            b = b.with_token(v);
        }
        b = b.with_region(creds.region.as_deref().unwrap_or("us-east-1"));
        if let Some(e) = &creds.endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
        }
        let os = b
            .build()
            .map_err(|e| config(format!("{e} ({})", creds.describe())))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("onebit-shared-store")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("failed to start the tokio runtime: {e}"),
                ))
            })?;
        let store = SharedStore {
            url: url.trim_end_matches('/').to_string(),
            bucket,
            root,
            os: Arc::new(os),
            rt: Some(rt),
            holder: holder_name(),
            lease_ttl: lease_ttl(),
            credentials: creds,
        };
        store.check_format()?;
        tracing::info!(url = %store.url, settings = %store.credentials.describe(), "shared store");
        Ok(store)
    }

    /// Reads `FORMAT` (creating it in a new store): the access check of [`SharedStore::open`].
    fn check_format(&self) -> Result<()> {
        let loc = self.path("FORMAT");
        match self.get(&loc)? {
            // Creating it again must be refused: a server that ignores If-None-Match would let two
            // importers overwrite each other's entries, so it is refused by name.
            Some((bytes, _)) if bytes == FORMAT_TEXT.as_bytes() => {
                match self.put_create(&loc, FORMAT_TEXT.as_bytes().to_vec()) {
                    Err(PutCreate::Exists) => Ok(()),
                    Err(PutCreate::Failed(e)) => Err(e),
                    Ok(_) => Err(Error::SharedConfig {
                        url: self.url.clone(),
                        reason: format!(
                            "the server accepted a create-if-absent PUT (If-None-Match: *) of \
                             {loc}, which exists: it does not honour conditional writes, which a \
                             shared store needs (AWS S3, MinIO, R2 and s3s-fs do)"
                        ),
                    }),
                }
            }
            Some((bytes, _)) => Err(Error::SharedConfig {
                url: self.url.clone(),
                reason: format!(
                    "{loc} reads {:?}, not {FORMAT_TEXT:?}: another program's data or another \
                     format",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(64)])
                ),
            }),
            None => match self.put_create(&loc, FORMAT_TEXT.as_bytes().to_vec()) {
                Ok(_) | Err(PutCreate::Exists) => Ok(()),
                Err(PutCreate::Failed(e)) => Err(e),
            },
        }
    }

    /// The URL the store was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bucket's URL (`s3://bucket`), under which [`SharedStore::object_store`] is registered
    /// with a query engine.
    pub fn bucket_url(&self) -> String {
        format!("s3://{}", self.bucket)
    }

    /// The client, for a query engine to read the same objects.
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.os.clone()
    }

    /// The full URL of an object.
    pub fn object_url(&self, loc: &Path) -> String {
        format!("s3://{}/{loc}", self.bucket)
    }

    /// This process as a lease holder (`host:pid`).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The object at `rel` under the store's root.
    pub fn path(&self, rel: &str) -> Path {
        Path::from(format!("{}/{rel}", self.root))
    }

    fn entry_manifest_path(&self, key: &Digest) -> Path {
        self.path(&format!("entries/{}/manifest.json", key.to_hex()))
    }

    /// The object holding file `rel` (relative to `out/`) of `upload` of entry `key`.
    pub fn entry_file_path(&self, key: &Digest, upload: &str, rel: &str) -> Path {
        self.path(&format!("entries/{}/{upload}/out/{rel}", key.to_hex()))
    }

    /// Runs `f` on the store's runtime. From inside another runtime (a server's handler) it runs
    /// on a scoped thread, since a runtime cannot block inside another.
    pub(crate) fn block<F>(&self, f: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        let Some(rt) = self.rt.as_ref() else {
            unreachable!("the runtime lives until drop")
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| match s.spawn(|| rt.block_on(f)).join() {
                Ok(v) => v,
                Err(p) => std::panic::resume_unwind(p),
            })
        } else {
            rt.block_on(f)
        }
    }

    /// Maps a client error to ours, naming the store, the operation and the object; a refused
    /// request names where the credentials came from.
    pub(crate) fn err(&self, op: &'static str, loc: &Path, e: object_store::Error) -> Error {
        let refused = matches!(
            e,
            object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        );
        let mut reason = e.to_string();
        if refused {
            let from = self.credentials.describe();
            reason = format!(
                "the server refused the credentials ({}): {reason}",
                if from.is_empty() {
                    "none found".into()
                } else {
                    from
                }
            );
        }
        Error::Shared {
            url: self.url.clone(),
            op,
            location: loc.to_string(),
            reason,
        }
    }

    /// GETs an object: its bytes and e-tag, or `None` if absent.
    pub fn get(&self, loc: &Path) -> Result<Option<(Vec<u8>, Option<String>)>> {
        let r = self.block(async {
            let got = self.os.get(loc).await?;
            let etag = got.meta.e_tag.clone();
            let bytes = got.bytes().await?;
            Ok::<_, object_store::Error>((bytes.to_vec(), etag))
        });
        match r {
            Ok(v) => Ok(Some(v)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err("get", loc, e)),
        }
    }

    /// Whether an object exists (HEAD).
    pub fn exists(&self, loc: &Path) -> Result<bool> {
        match self.block(self.os.head(loc)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err("head", loc, e)),
        }
    }

    /// PUTs an object, replacing any.
    pub fn put(&self, loc: &Path, bytes: Vec<u8>) -> Result<()> {
        self.block(self.os.put(loc, PutPayload::from(bytes)))
            .map(|_| ())
            .map_err(|e| self.err("put", loc, e))
    }

    /// PUTs an object only if none exists (If-None-Match: *); returns its e-tag.
    pub(crate) fn put_create(
        &self,
        loc: &Path,
        bytes: Vec<u8>,
    ) -> std::result::Result<Option<String>, PutCreate> {
        // The client retries a create only while the request was not sent; one cut off mid-way
        // (a server restart) is retried here. If the cut-off one had landed, the retry is refused
        // as existing, and the caller compares what is there with what it wrote.
        let payload = PutPayload::from(bytes);
        let mut delay = Duration::from_millis(250);
        let mut tries = 0;
        loop {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            match self.block(self.os.put_opts(loc, payload.clone(), opts)) {
                Ok(r) => return Ok(r.e_tag),
                Err(object_store::Error::AlreadyExists { .. }) => return Err(PutCreate::Exists),
                Err(e @ object_store::Error::Generic { .. }) if tries < 6 => {
                    tracing::info!(object = %loc, error = %e, "create-if-absent cut off; retrying");
                    tries += 1;
                    std::thread::sleep(delay);
                    delay *= 2;
                }
                Err(e) => {
                    return Err(PutCreate::Failed(self.err(
                        "put (create if absent)",
                        loc,
                        e,
                    )));
                }
            }
        }
    }

    /// Deletes an object (absent is fine).
    pub fn delete(&self, loc: &Path) -> Result<()> {
        match self.block(self.os.delete(loc)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("delete", loc, e)),
        }
    }

    /// Every object under `rel/` (recursively), with size and last-modified time.
    pub fn list(&self, rel: &str) -> Result<Vec<object_store::ObjectMeta>> {
        let prefix = self.path(rel);
        self.block(async {
            let mut out = Vec::new();
            let mut s = self.os.list(Some(&prefix));
            while let Some(m) = s.next().await {
                out.push(m?);
            }
            Ok::<_, object_store::Error>(out)
        })
        .map_err(|e| self.err("list", &prefix, e))
    }

    /// The shared manifest of `key`, if published.
    pub fn manifest(&self, key: &Digest) -> Result<Option<SharedManifest>> {
        let loc = self.entry_manifest_path(key);
        match self.get(&loc)? {
            Some((bytes, _)) => self.parse_manifest(key, &loc, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// The shared manifests of `keys`, fetched [`LISTING_PARALLEL`] at a time.
    pub fn manifests_of(&self, keys: &[Digest]) -> Result<BTreeMap<Digest, SharedManifest>> {
        let locs: Vec<Path> = keys.iter().map(|k| self.entry_manifest_path(k)).collect();
        let mut out = BTreeMap::new();
        for ((key, loc), bytes) in keys.iter().zip(&locs).zip(self.get_many(&locs)?) {
            if let Some(bytes) = bytes {
                out.insert(*key, self.parse_manifest(key, loc, &bytes)?);
            }
        }
        Ok(out)
    }

    /// GETs many small objects concurrently, in order; `None` for an absent one.
    pub fn get_many(&self, locs: &[Path]) -> Result<Vec<Option<Vec<u8>>>> {
        let got: Vec<Fetched> = self.block({
            // Owned futures: the stream's closures borrow nothing (the runtime needs them Send).
            let futures: Vec<_> = locs
                .iter()
                .map(|loc| {
                    let (os, loc) = (self.os.clone(), loc.clone());
                    async move {
                        let r = async { os.get(&loc).await?.bytes().await }.await;
                        match r {
                            Ok(b) => Ok(Some(b.to_vec())),
                            Err(object_store::Error::NotFound { .. }) => Ok(None),
                            Err(e) => Err((loc, e)),
                        }
                    }
                })
                .collect();
            futures::stream::iter(futures)
                .buffered(LISTING_PARALLEL)
                .collect()
        });
        got.into_iter()
            .map(|r| r.map_err(|(loc, e)| self.err("get", &loc, e)))
            .collect()
    }

    fn parse_manifest(&self, key: &Digest, loc: &Path, bytes: &[u8]) -> Result<SharedManifest> {
        let m: SharedManifest = serde_json::from_slice(bytes).map_err(|e| Error::Shared {
            url: self.url.clone(),
            op: "parse",
            location: loc.to_string(),
            reason: format!("not a shared manifest: {e}"),
        })?;
        if m.manifest.key != *key || m.format != SHARED_MANIFEST_FORMAT {
            return Err(Error::Shared {
                url: self.url.clone(),
                op: "parse",
                location: loc.to_string(),
                reason: format!(
                    "names key {} (format {}), not {} (format {SHARED_MANIFEST_FORMAT})",
                    m.manifest.key.short(),
                    m.format,
                    key.short()
                ),
            });
        }
        Ok(m)
    }

    /// Whether `key` is published.
    pub fn has(&self, key: &Digest) -> Result<bool> {
        self.exists(&self.entry_manifest_path(key))
    }

    /// Fetches entry `key` into the local store, verifying every file's size and blake3 against
    /// the shared manifest; `None` if it is not published.
    pub fn pull(&self, store: &LocalStore, key: &Digest) -> Result<Option<EntryManifest>> {
        let Some(shared) = self.manifest(key)? else {
            return Ok(None);
        };
        let staging = store.begin(key)?;
        let out = staging.out_dir();
        for (name, art) in &shared.manifest.outputs {
            if art.is_dir {
                let d = out.join(name);
                fs::create_dir_all(&d)?;
            }
            for f in &art.files {
                let dest = out.join(safe_rel(&self.url, key, &f.path)?);
                let loc = self.entry_file_path(key, &shared.upload, &f.path);
                self.download(&loc, &dest, key, f)?;
            }
        }
        let outputs: Vec<String> = shared.manifest.outputs.keys().cloned().collect();
        // Every file was hashed as it arrived and matched the manifest: publish without rereading.
        let known = shared
            .manifest
            .outputs
            .values()
            .flat_map(|a| &a.files)
            .map(|f| (f.path.clone(), (f.size, f.blake3)))
            .collect();
        let local = store.publish_known(staging, shared.manifest.clone(), &outputs, &known)?;
        for (name, art) in &shared.manifest.outputs {
            let got = local.outputs.get(name).map(|a| a.digest);
            if got != Some(art.digest) {
                store.evict(key)?;
                return Err(Error::SharedCorrupt {
                    url: self.url.clone(),
                    key: key.to_hex(),
                    file: name.clone(),
                    why: format!(
                        "artifact digest {} where the manifest says {}",
                        got.map(|d| d.short()).unwrap_or_default(),
                        art.digest.short()
                    ),
                });
            }
        }
        tracing::info!(stage = %local.stage, key = %key.short(), publisher = %shared.publisher, "fetched from the shared store");
        Ok(Some(local))
    }

    /// Streams one object into `dest`, hashing as it goes; a size or digest other than the
    /// manifest's is an error naming both.
    fn download(
        &self,
        loc: &Path,
        dest: &FsPath,
        key: &Digest,
        f: &crate::store::FileRecord,
    ) -> Result<()> {
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        if f.size > PART_BYTES as u64 {
            return self.download_ranged(loc, dest, key, f);
        }
        let mut file = fs::File::create(dest)?;
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        let r = self.block(async {
            let got = self.os.get(loc).await?;
            let mut s = got.into_stream();
            while let Some(chunk) = s.next().await {
                let chunk = chunk?;
                hasher.update(&chunk);
                size += chunk.len() as u64;
                file.write_all(&chunk).map_err(local_io)?;
            }
            Ok::<_, object_store::Error>(())
        });
        self.fetched(r, "get", loc, key, f)?;
        let digest = Digest(*hasher.finalize().as_bytes());
        self.same_as_manifest(key, f, size, digest)?;
        Ok(file.sync_all()?)
    }

    /// Maps the outcome of fetching `loc`: an absent object is a damaged entry (its manifest names
    /// it), any other failure the request's error.
    fn fetched(
        &self,
        r: std::result::Result<(), object_store::Error>,
        op: &'static str,
        loc: &Path,
        key: &Digest,
        f: &crate::store::FileRecord,
    ) -> Result<()> {
        match r {
            Ok(()) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Err(Error::SharedCorrupt {
                url: self.url.clone(),
                key: key.to_hex(),
                file: f.path.clone(),
                why: format!("{loc} is missing"),
            }),
            Err(e) => Err(self.err(op, loc, e)),
        }
    }

    /// A fetched file's size and blake3 against the manifest's; a difference names both.
    fn same_as_manifest(
        &self,
        key: &Digest,
        f: &crate::store::FileRecord,
        size: u64,
        digest: Digest,
    ) -> Result<()> {
        if size == f.size && digest == f.blake3 {
            return Ok(());
        }
        Err(Error::SharedCorrupt {
            url: self.url.clone(),
            key: key.to_hex(),
            file: f.path.clone(),
            why: format!(
                "read {size} bytes, blake3 {}, where the manifest says {} bytes, blake3 {}",
                digest.short(),
                f.size,
                f.blake3.short()
            ),
        })
    }

    /// Fetches a large object as [`PARALLEL`] concurrent ranged GETs of [`PART_BYTES`], each
    /// written at its offset (one stream is bound by the server: s3s-fs serves one at 76 MB/s
    /// here, four at 190 MB/s; S3 recommends the same), then hashes the file whole.
    fn download_ranged(
        &self,
        loc: &Path,
        dest: &FsPath,
        key: &Digest,
        f: &crate::store::FileRecord,
    ) -> Result<()> {
        use fs_err::os::unix::fs::FileExt;
        let file = fs::File::create(dest)?;
        file.set_len(f.size)?;
        let part = PART_BYTES as u64;
        let ranges: Vec<std::ops::Range<u64>> = (0..f.size.div_ceil(part))
            .map(|i| i * part..((i + 1) * part).min(f.size))
            .collect();
        let r = self.block(async {
            let mut parts = futures::stream::iter(ranges)
                .map(|r| async move {
                    let bytes = self.os.get_range(loc, r.clone()).await?;
                    Ok::<_, object_store::Error>((r, bytes))
                })
                .buffer_unordered(PARALLEL);
            while let Some(got) = parts.next().await {
                let (r, bytes) = got?;
                if bytes.len() as u64 != r.end - r.start {
                    return Err(object_store::Error::Generic {
                        store: "S3",
                        source: format!(
                            "range {}..{} returned {} bytes",
                            r.start,
                            r.end,
                            bytes.len()
                        )
                        .into(),
                    });
                }
                file.write_all_at(&bytes, r.start).map_err(local_io)?;
            }
            Ok::<_, object_store::Error>(())
        });
        self.fetched(r, "get range", loc, key, f)?;
        file.sync_all()?;
        let size = fs::metadata(dest)?.len();
        let digest = Digest::of_file(dest)?;
        self.same_as_manifest(key, f, size, digest)?;
        Ok(())
    }

    /// Uploads one local file: one PUT up to [`PART_BYTES`], else a multipart upload.
    fn upload(&self, src: &FsPath, loc: &Path) -> Result<()> {
        let size = fs::metadata(src)?.len();
        if size <= PART_BYTES as u64 {
            let bytes = fs::read(src)?;
            return self.put(loc, bytes);
        }
        let mut file = fs::File::open(src)?;
        let r = self.block(async {
            let upload = self.os.put_multipart(loc).await?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let mut buf = vec![0u8; PART_BYTES];
            loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        let _ = w.abort().await;
                        return Err(local_io(e));
                    }
                };
                w.wait_for_capacity(PARALLEL).await?;
                w.write(&buf[..n]);
            }
            w.finish().await
        });
        r.map(|_| ()).map_err(|e| self.err("multipart put", loc, e))
    }

    /// Publishes the local entry `manifest` describes: every file under a new upload, then the
    /// manifest, created only if absent. When another importer published the key first, its entry
    /// wins: identical artifacts are kept as they are, different ones replace the local entry (so
    /// that every machine's downstream keys agree). Returns the manifest now in force.
    pub fn push(&self, store: &LocalStore, manifest: EntryManifest) -> Result<EntryManifest> {
        let key = manifest.key;
        let upload = Digest::of_bytes(format!("{}:{}", self.holder, now_ns()).as_bytes()).short();
        for art in manifest.outputs.values() {
            for f in &art.files {
                let src = store.entry_dir(&key).join("out").join(&f.path);
                self.upload(&src, &self.entry_file_path(&key, &upload, &f.path))?;
            }
        }
        let shared = SharedManifest {
            format: SHARED_MANIFEST_FORMAT,
            upload: upload.clone(),
            publisher: self.holder.clone(),
            manifest: manifest.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&shared)
            .map_err(|e| Error::Internal(format!("manifest serialization: {e}")))?;
        let loc = self.entry_manifest_path(&key);
        match self.put_create(&loc, bytes) {
            Ok(_) => {
                tracing::debug!(stage = %manifest.stage, key = %key.short(), %upload, "published to the shared store");
                Ok(manifest)
            }
            Err(PutCreate::Failed(e)) => Err(e),
            Err(PutCreate::Exists) => {
                self.remove_upload(&key, &upload);
                let winner = self.manifest(&key)?.ok_or_else(|| Error::Shared {
                    url: self.url.clone(),
                    op: "get",
                    location: loc.to_string(),
                    reason: "refused as existing, then absent".into(),
                })?;
                let same =
                    winner.manifest.outputs.len() == manifest.outputs.len()
                        && winner.manifest.outputs.iter().all(|(k, a)| {
                            manifest.outputs.get(k).map(|b| b.digest) == Some(a.digest)
                        });
                if same {
                    tracing::debug!(stage = %manifest.stage, key = %key.short(), publisher = %winner.publisher, "published first by another importer, same bytes");
                    return Ok(manifest);
                }
                tracing::info!(stage = %manifest.stage, key = %key.short(), publisher = %winner.publisher, "published first by another importer with other bytes; using its entry");
                store.evict(&key)?;
                self.pull(store, &key)?.ok_or_else(|| Error::Shared {
                    url: self.url.clone(),
                    op: "get",
                    location: loc.to_string(),
                    reason: "the winning manifest vanished".into(),
                })
            }
        }
    }

    /// Best effort: removes the objects of an upload no manifest names (gc removes leftovers).
    fn remove_upload(&self, key: &Digest, upload: &str) {
        if let Ok(objects) = self.list(&format!("entries/{}/{upload}", key.to_hex())) {
            for o in objects {
                let _ = self.delete(&o.location);
            }
        }
    }

    /// Writes a ref (the local file name, under `refs/`).
    pub fn write_ref(&self, file_name: &str, bytes: Vec<u8>) -> Result<()> {
        self.put(&self.path(&format!("refs/{file_name}")), bytes)
    }

    /// Deletes a ref by its file name (absent already: nothing to do).
    pub fn delete_ref(&self, file_name: &str) -> Result<()> {
        self.delete(&self.path(&format!("refs/{file_name}")))
    }

    /// Reads a ref by its file name.
    pub fn read_ref(&self, file_name: &str) -> Result<Option<RefRecord>> {
        let loc = self.path(&format!("refs/{file_name}"));
        let Some((bytes, _)) = self.get(&loc)? else {
            return Ok(None);
        };
        self.parse_ref(&loc, &bytes).map(Some)
    }

    fn parse_ref(&self, loc: &Path, bytes: &[u8]) -> Result<RefRecord> {
        serde_json::from_slice(bytes).map_err(|e| Error::Shared {
            url: self.url.clone(),
            op: "parse",
            location: loc.to_string(),
            reason: format!("not a ref: {e}"),
        })
    }

    /// Every ref, sorted by name.
    pub fn list_refs(&self) -> Result<Vec<RefRecord>> {
        let locs: Vec<Path> = self
            .list("refs")?
            .into_iter()
            .map(|o| o.location)
            .filter(|l| l.extension() == Some("json"))
            .collect();
        let mut out = Vec::new();
        for (loc, bytes) in locs.iter().zip(self.get_many(&locs)?) {
            if let Some(bytes) = bytes {
                out.push(self.parse_ref(loc, &bytes)?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Uploads a run's records.
    pub fn write_run(&self, run_id: &str, local: &FsPath) -> Result<()> {
        self.upload(local, &self.path(&format!("runs/{run_id}.parquet")))
    }

    /// The bytes of file `rel` of published entry `key`.
    pub fn entry_file_bytes(&self, key: &Digest, rel: &str) -> Result<Option<Vec<u8>>> {
        let Some(m) = self.manifest(key)? else {
            return Ok(None);
        };
        Ok(self
            .get(&self.entry_file_path(key, &m.upload, rel))?
            .map(|(b, _)| b))
    }

    /// Every published entry's manifest.
    pub fn manifests(&self) -> Result<Vec<SharedManifest>> {
        let keys: Vec<Digest> = self
            .list("entries")?
            .iter()
            .filter(|o| o.location.filename() == Some("manifest.json"))
            .filter_map(|o| {
                let key = o.location.parts().rev().nth(1)?;
                Digest::from_hex(key.as_ref())
            })
            .collect();
        Ok(self.manifests_of(&keys)?.into_values().collect())
    }
}

/// One GET of [`SharedStore::get_many`]: the bytes (`None` if absent), or the failing object.
type Fetched = std::result::Result<Option<Vec<u8>>, (Path, object_store::Error)>;

/// The outcome of a create-if-absent PUT.
pub(crate) enum PutCreate {
    /// The object exists; nothing was written.
    Exists,
    /// The request failed.
    Failed(Error),
}

/// A local file error inside a transfer, as the client's error type.
fn local_io(e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "local file",
        source: Box::new(e),
    }
}

/// A manifest's relative path, refused if it would leave the entry (absolute, `..`, empty).
fn safe_rel(url: &str, key: &Digest, rel: &str) -> Result<std::path::PathBuf> {
    let ok = !rel.is_empty()
        && !rel.starts_with('/')
        && rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(rel.split('/').collect())
    } else {
        Err(Error::SharedCorrupt {
            url: url.to_string(),
            key: key.to_hex(),
            file: rel.to_string(),
            why: "the path leaves the entry".into(),
        })
    }
}
