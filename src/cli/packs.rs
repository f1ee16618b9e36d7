//! The packs in the store (local, or shared with the local one as its cache), as `list`, `rm`
//! and a `serve` with no pack see them: each ref that made a pack, with its manifest's verdict,
//! family, context and size.

use std::path::PathBuf;

use onebit_pack::manifest::Manifest;
use onebit_pipeline::Store;
use onebit_pipeline::digest::Digest;
use onebit_pipeline::refs::list_refs;

/// One pack of the store.
#[derive(Clone, Debug)]
pub struct StorePack {
    /// The ref's name: the repository id, or a local folder's name.
    pub name: String,
    /// The repack entry's key.
    pub key: Digest,
    /// Where the pack folder is (or will be, once pulled from the shared store).
    pub dir: PathBuf,
    /// Whether the folder is in the local store now.
    pub local: bool,
    /// Its manifest, where the folder is local and readable.
    pub manifest: Option<Manifest>,
    /// Bytes of the pack's files (0 where the folder is not local).
    pub bytes: u64,
    /// When the ref was last written (ms since the epoch).
    pub updated_ms: u64,
}

impl StorePack {
    /// Whether its verification passed (false where the manifest is not here to say).
    pub fn verified(&self) -> bool {
        self.manifest
            .as_ref()
            .is_some_and(|m| m.verification.verified)
    }

    /// The verdict's summary, or why there is none.
    pub fn verdict(&self) -> String {
        match &self.manifest {
            Some(m) => m.verification.summary.clone(),
            None if !self.local => "in the shared store (pulled on first use)".into(),
            None => "manifest.json unreadable".into(),
        }
    }

    /// The model family (`?` where the manifest is not here).
    pub fn family(&self) -> String {
        self.manifest
            .as_ref()
            .and_then(|m| m.model.as_ref())
            .map_or_else(|| "?".into(), |s| s.family.clone())
    }

    /// The model's context in tokens (0 where unknown).
    pub fn context(&self) -> usize {
        self.manifest
            .as_ref()
            .and_then(|m| m.model.as_ref())
            .map_or(0, |s| s.context)
    }

    /// The listing a server of the store's packs shows.
    pub fn listing(&self) -> onebit_serve::models::Listing {
        onebit_serve::models::Listing {
            id: self.name.clone(),
            aliases: Vec::new(),
            family: self.family(),
            bytes: self.bytes,
            context: self.context(),
            verified: self.verified(),
            verdict: self.verdict(),
            modified: self.updated_ms / 1000,
            digest: self.key.to_hex(),
        }
    }
}

/// Every ref of the store that made a pack, by name.
pub fn store_packs(store: &Store) -> anyhow::Result<Vec<StorePack>> {
    let mut out = Vec::new();
    for r in list_refs(store)? {
        let Some(stage) = r.stage("repack") else {
            continue;
        };
        let dir = store.artifact_path(&stage.key, "pack");
        let local = dir.join("manifest.json").is_file();
        let manifest = std::fs::read(dir.join("manifest.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok());
        let bytes = onebit_serve::models::pack_bytes(&dir);
        out.push(StorePack {
            bytes,
            name: r.name.clone(),
            key: stage.key,
            dir,
            local,
            manifest,
            updated_ms: r.updated_unix_ms,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The pack folder of `p`, pulled from the shared store first when it is not local.
pub fn local_dir(store: &Store, p: &StorePack) -> anyhow::Result<PathBuf> {
    if p.dir.join("manifest.json").is_file() {
        return Ok(p.dir.clone());
    }
    let shared = store.shared().ok_or_else(|| {
        anyhow::anyhow!(
            "{}: its pack {} is missing from the store",
            p.name,
            p.dir.display()
        )
    })?;
    shared
        .pull(store.local(), &p.key)?
        .ok_or_else(|| anyhow::anyhow!("{}: its pack is not in the shared store", p.name))?;
    Ok(p.dir.clone())
}
