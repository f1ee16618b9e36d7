//! Opening a verified pack (its format is [`onebit_pack::manifest`]'s) for the forward pass.
//!
//! Loading is a memory map of `model.q4nx`, never a copy. A pack whose verification did not pass
//! is refused unless the caller allows it explicitly, and the refusal says why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
pub use onebit_pack::manifest::*;

use crate::error::{Error, IoContext, Result};

/// A tensor's place in the mapped file.
#[derive(Clone, Debug)]
pub struct Stored {
    /// safetensors dtype.
    pub dtype: String,
    /// Declared shape.
    pub shape: Vec<u64>,
    /// Byte range in the file.
    pub range: std::ops::Range<usize>,
}

/// An opened pack.
#[derive(Debug)]
pub struct Pack {
    /// The folder.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    mmap: Arc<Mmap>,
    stored: BTreeMap<String, Stored>,
    scan: Option<Mmap>,
}

impl Pack {
    /// Opens `dir`; refuses an unverified pack unless `allow_unverified`.
    pub fn open(dir: &Path, allow_unverified: bool) -> Result<Pack> {
        let mpath = dir.join("manifest.json");
        let text = std::fs::read(&mpath).at("read", &mpath)?;
        let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| Error::Pack {
            pack: dir.to_path_buf(),
            what: format!("manifest.json: {e}"),
        })?;
        if manifest.format != FORMAT || manifest.version != VERSION {
            return Err(Error::Pack {
                pack: dir.to_path_buf(),
                what: format!(
                    "manifest is {} v{}, this runtime reads {FORMAT} v{VERSION}",
                    manifest.format, manifest.version
                ),
            });
        }
        if manifest.model.is_none() {
            return Err(Error::Refused {
                pack: dir.to_path_buf(),
                reason: manifest
                    .host_refusal
                    .clone()
                    .unwrap_or_else(|| "the manifest describes no runnable model".into()),
            });
        }
        if !manifest.verification.verified && !allow_unverified {
            return Err(Error::Refused {
                pack: dir.to_path_buf(),
                reason: format!(
                    "it is not verified ({}); pass --allow-unverified to run it anyway",
                    manifest.verification.summary
                ),
            });
        }
        let wpath = dir.join("model.q4nx");
        let file = std::fs::File::open(&wpath).at("open", &wpath)?;
        // SAFETY: read-only map of a store entry that is never written after it is published
        // (entries are replaced by rename, which leaves this mapping intact).
        let mmap = unsafe { Mmap::map(&file) }.at("mmap", &wpath)?;
        let stored = parse_header(dir, &mmap)?;
        let scan = match &manifest.head_scan {
            Some(h) => {
                let spath = dir.join(&h.file);
                let file = std::fs::File::open(&spath).at("open", &spath)?;
                // SAFETY: as for model.q4nx.
                let map = unsafe { Mmap::map(&file) }.at("mmap", &spath)?;
                let want = crate::kernels::scan::matrix_bytes(h.rows as usize, h.k as usize);
                if map.len() != want {
                    return Err(Error::Pack {
                        pack: dir.to_path_buf(),
                        what: format!(
                            "{}: {} bytes, the manifest's {}×{} scan head needs {want}",
                            h.file,
                            map.len(),
                            h.rows,
                            h.k
                        ),
                    });
                }
                Some(map)
            }
            None => None,
        };
        Ok(Pack {
            dir: dir.to_path_buf(),
            manifest,
            mmap: Arc::new(mmap),
            stored,
            scan,
        })
    }

    /// Moves the weights (and the scan head) from the file's page-cache mapping into anonymous
    /// memory advised to transparent huge pages. A decode step streams every weight once, and
    /// with 4 KiB pages every page costs a TLB walk and stops the hardware prefetcher at its
    /// edge: on the Hunyuan-1.8B shape the decode products went from 17.5 to 21.7 GB/s at 2
    /// threads (`runtime/benches/matvec.rs`, `ONEBIT_BENCH_HUGE`). The copy takes the pack's
    /// size in anonymous memory while the file's pages become reclaimable cache. Returns the
    /// bytes moved; nothing moves where Linux has transparent huge pages off (`never`), or
    /// elsewhere, since the copy buys nothing there.
    pub fn make_resident(&mut self) -> Result<usize> {
        if !huge_pages_available() {
            return Ok(0);
        }
        let copy = |src: &[u8], what: &Path| -> Result<Mmap> {
            let mut m = memmap2::MmapOptions::new()
                .len(src.len())
                .map_anon()
                .at("map anonymous memory for", what)?;
            // Advice only: a kernel that declines it still gives working memory.
            #[cfg(target_os = "linux")]
            let _ = m.advise(memmap2::Advice::HugePage);
            use rayon::prelude::*;
            m.par_chunks_mut(1 << 21)
                .zip(src.par_chunks(1 << 21))
                .for_each(|(d, s)| d.copy_from_slice(s));
            m.make_read_only().at("seal the copy of", what)
        };
        let mut moved = 0;
        if !self.mmap.is_empty() {
            let m = copy(&self.mmap, &self.dir.join("model.q4nx"))?;
            moved += m.len();
            self.mmap = Arc::new(m);
        }
        if let Some(scan) = self.scan.take() {
            let m = if scan.is_empty() {
                scan
            } else {
                copy(&scan, &self.dir.join("head-scan.bin"))?
            };
            moved += m.len();
            self.scan = Some(m);
        }
        Ok(moved)
    }

    /// The stored tensor `name`.
    pub fn stored(&self, name: &str) -> Option<&Stored> {
        self.stored.get(name)
    }

    /// The bytes of `name`.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.stored.get(name).map(|s| &self.mmap[s.range.clone()])
    }

    /// The whole mapped file.
    pub fn map(&self) -> &Arc<Mmap> {
        &self.mmap
    }

    /// The scan head, when the pack has one.
    pub fn head_scan(&self) -> Option<crate::kernels::scan::ScanMatrix<'_>> {
        let h = self.manifest.head_scan.as_ref()?;
        crate::kernels::scan::ScanMatrix::new(h.rows as usize, h.k as usize, self.scan.as_deref()?)
    }

    /// The tokenizer file.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
}

fn parse_header(dir: &Path, b: &[u8]) -> Result<BTreeMap<String, Stored>> {
    let bad = |what: String| Error::Pack {
        pack: dir.to_path_buf(),
        what: format!("model.q4nx: {what}"),
    };
    if b.len() < 8 {
        return Err(bad("shorter than its header length".into()));
    }
    let mut n8 = [0u8; 8];
    n8.copy_from_slice(&b[..8]);
    let n = u64::from_le_bytes(n8) as usize;
    if n > b.len() - 8 {
        return Err(bad(format!("header of {n} bytes runs past the file")));
    }
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&b[8..8 + n]).map_err(|e| bad(format!("header JSON: {e}")))?;
    let start = 8 + n;
    let mut out = BTreeMap::new();
    for (name, v) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = v["dtype"].as_str().unwrap_or_default().to_string();
        let shape: Vec<u64> = v["shape"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
            .unwrap_or_default();
        let off: Vec<u64> = v["data_offsets"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
            .unwrap_or_default();
        if off.len() != 2 || off[0] > off[1] || start as u64 + off[1] > b.len() as u64 {
            return Err(bad(format!(
                "{name}: data_offsets {off:?} outside the file"
            )));
        }
        out.insert(
            name,
            Stored {
                dtype,
                shape,
                range: start + off[0] as usize..start + off[1] as usize,
            },
        );
    }
    Ok(out)
}

/// Environment variable that turns [`Pack::make_resident`] off (`0`).
pub const HUGE_PAGES_VAR: &str = "ONEBIT_HUGE_PAGES";

/// Whether Linux gives transparent huge pages to memory that asks (`always` or `madvise`), and
/// [`HUGE_PAGES_VAR`] does not say `0`.
fn huge_pages_available() -> bool {
    if std::env::var(HUGE_PAGES_VAR).is_ok_and(|v| v == "0") {
        return false;
    }
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}
