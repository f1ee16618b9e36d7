//! Opening a verified pack (its format is [`onebit_pack::manifest`]'s) for the forward pass.
//!
//! Opening is a memory map of `model.q4nx`. Loading a model to run it copies only what every
//! token streams into memory advised to huge pages ([`Pack::make_resident`]); the embedding's
//! scattered rows are read with positioned reads ([`Pack::read_into`]), and everything the import
//! reads stays in the mapping. A pack whose verification did not pass
//! is refused unless the caller allows it explicitly, and the refusal says why.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use onebit_pack::manifest::{FORMAT, Manifest, VERSION};

use crate::error::{Error, Result, io_at};

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
    mmap: Mmap,
    /// `model.q4nx` itself, for positioned reads of scattered rows ([`Pack::read_into`]).
    file: fs_err::File,
    /// The streamed ranges of `mmap`, copied to memory advised to huge pages.
    resident: Option<Resident>,
    stored: BTreeMap<String, Stored>,
    scan: Option<Mmap>,
}

impl Pack {
    /// Opens `dir`; refuses an unverified pack unless `allow_unverified`.
    pub fn open(dir: &Path, allow_unverified: bool) -> Result<Pack> {
        let mpath = dir.join("manifest.json");
        let text = fs_err::read(&mpath)?;
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
        let file = fs_err::File::open(&wpath)?;
        // SAFETY: read-only map of a store entry that is never written after it is published
        // (entries are replaced by rename, which leaves this mapping intact).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_at(e, "map file", &wpath))?;
        let stored = parse_header(&wpath, &mmap)?;
        let scan = match &manifest.head_scan {
            Some(h) => {
                let spath = dir.join(&h.file);
                let file = fs_err::File::open(&spath)?;
                // SAFETY: as for model.q4nx.
                let map = unsafe { Mmap::map(&file) }.map_err(|e| io_at(e, "map file", &spath))?;
                let want =
                    onebit_kernels::matmul::scan::matrix_bytes(h.rows as usize, h.k as usize);
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
            mmap,
            file,
            resident: None,
            stored,
            scan,
        })
    }

    /// Copies the byte ranges the forward pass streams at every token (`streamed`: the tiled
    /// matrices, and a bf16 head) and the scan head from the file's page-cache mapping into
    /// anonymous memory advised to transparent huge pages, then drops the file's pages of what
    /// was copied from this process, so nothing is resident twice. A decode step streams every
    /// one of those bytes once, and with 4 KiB pages every page costs a TLB walk and stops the
    /// hardware prefetcher at its edge: on the Hunyuan-1.8B shape the decode products went from
    /// 17.5 to 21.7 GB/s at 2 threads (`runtime/benches/matvec.rs`, `ONEBIT_BENCH_HUGE`).
    /// What is not streamed (the embedding, of which a token reads one row and re-scoring a
    /// few) stays in the file, read row by row ([`Pack::read_into`]). Returns the bytes copied; nothing moves where
    /// Linux has transparent huge pages off (`never`), or elsewhere, since the copy buys nothing
    /// there.
    pub fn make_resident(&mut self, streamed: &[Range<usize>]) -> Result<usize> {
        if !huge_pages_available() {
            return Ok(0);
        }
        let wpath = self.dir.join("model.q4nx");
        self.resident = Resident::copy(&self.mmap, streamed, &wpath)?;
        let mut moved = self.resident.as_ref().map_or(0, Resident::bytes);
        if let (Some(scan), Some(h)) = (self.scan.take(), &self.manifest.head_scan) {
            let spath = self.dir.join(&h.file);
            // One span from offset 0: the copy is the scan head's bytes exactly.
            self.scan = Some(
                match Resident::copy(&scan, std::slice::from_ref(&(0..scan.len())), &spath)? {
                    Some(r) => {
                        moved += r.bytes();
                        r.map
                    }
                    None => scan,
                },
            );
        }
        Ok(moved)
    }

    /// Bytes `range` of `model.q4nx` into `out` (as long as `range`): from the resident copy where
    /// it was copied, else by a positioned read of the file. For scattered reads of a large
    /// tensor (an embedding's rows, looked up and re-scored 128 a token): read through the
    /// mapping, every page touched would stay resident in this process, and the page cache maps
    /// files in large folios, so each row brought in megabytes around it (Hunyuan-1.8B, four full
    /// slots: 206 MiB of the 0.49 GB embedding resident). A read leaves the bytes in the page
    /// cache only, reclaimable and not this process's. Falls back to the mapping if the read
    /// fails.
    pub fn read_into(&self, range: Range<usize>, out: &mut [u8]) {
        if let Some(b) = self.resident.as_ref().and_then(|r| r.get(&range)) {
            out.copy_from_slice(b);
            return;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            if self
                .file
                .file()
                .read_exact_at(out, range.start as u64)
                .is_ok()
            {
                return;
            }
        }
        out.copy_from_slice(&self.mmap[range]);
    }

    /// Whether file bytes `range` are read from the resident copy (not the file's mapping).
    pub fn is_copied(&self, range: &Range<usize>) -> bool {
        self.resident
            .as_ref()
            .is_some_and(|r| r.get(range).is_some())
    }

    /// Bytes `range` of `model.q4nx`: from the resident copy where it was copied, else from the
    /// file's mapping.
    pub fn slice(&self, range: Range<usize>) -> &[u8] {
        if let Some(b) = self.resident.as_ref().and_then(|r| r.get(&range)) {
            return b;
        }
        &self.mmap[range]
    }

    /// The stored tensor `name`.
    pub fn stored(&self, name: &str) -> Option<&Stored> {
        self.stored.get(name)
    }

    /// The bytes of `name`.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.stored.get(name).map(|s| self.slice(s.range.clone()))
    }

    /// The scan head, when the pack has one.
    pub fn head_scan(&self) -> Option<onebit_kernels::matmul::scan::ScanMatrix<'_>> {
        let h = self.manifest.head_scan.as_ref()?;
        onebit_kernels::matmul::scan::ScanMatrix::new(
            h.rows as usize,
            h.k as usize,
            self.scan.as_deref()?,
        )
    }

    /// The tokenizer file.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
}

/// The tensors of a q4nx container's header: name, dtype, shape and byte range in `b`, the whole
/// file. `file` is the container (`DIR/model.q4nx`, a tower file), named in every error.
pub(crate) fn parse_header(file: &Path, b: &[u8]) -> Result<BTreeMap<String, Stored>> {
    let (dir, name) = match (file.parent(), file.file_name()) {
        (Some(d), Some(n)) => (d.to_path_buf(), n.to_string_lossy().into_owned()),
        _ => (file.to_path_buf(), String::new()),
    };
    let bad = |what: String| Error::Pack {
        pack: dir.clone(),
        what: format!("{name}: {what}"),
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

/// The page size the copies keep offsets congruent to (and release file pages by).
const PAGE: usize = 4096;

/// The largest gap between two copied ranges that one copy spans (a tensor's alignment padding),
/// small enough that no tensor worth leaving mapped fits in it.
const GAP: usize = 64;

/// Byte ranges of a mapped file copied into anonymous memory advised to transparent huge pages.
#[derive(Debug)]
struct Resident {
    map: Mmap,
    /// Sorted by file offset, disjoint: `(file range, offset of its copy)`.
    spans: Vec<(Range<usize>, usize)>,
}

impl Resident {
    /// Copies `ranges` of `src` (merged across alignment padding of up to [`GAP`] bytes), each copy at an
    /// offset congruent to its file offset modulo the page, so every alignment the file gives a
    /// tensor the copy gives it too; then drops the copied pages from the file's mapping. `None`
    /// when the ranges are empty.
    fn copy(src: &Mmap, ranges: &[Range<usize>], what: &Path) -> Result<Option<Resident>> {
        let mut rs: Vec<Range<usize>> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
        rs.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::new();
        for r in rs {
            match merged.last_mut() {
                Some(m) if r.start <= m.end + GAP => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        if merged.is_empty() {
            return Ok(None);
        }
        let mut spans = Vec::with_capacity(merged.len());
        let mut at = 0usize;
        for r in merged {
            at = at.next_multiple_of(PAGE) + r.start % PAGE;
            let len = r.len();
            spans.push((r, at));
            at += len;
        }
        let mut m = memmap2::MmapOptions::new()
            .len(at)
            .map_anon()
            .map_err(|e| io_at(e, "map anonymous memory for", what))?;
        // Advice only: a kernel that declines it still gives working memory.
        #[cfg(target_os = "linux")]
        let _ = m.advise(memmap2::Advice::HugePage);
        use rayon::prelude::*;
        for (r, at) in &spans {
            m[*at..*at + r.len()]
                .par_chunks_mut(1 << 21)
                .zip(src[r.clone()].par_chunks(1 << 21))
                .for_each(|(d, s)| d.copy_from_slice(s));
        }
        let map = m
            .make_read_only()
            .map_err(|e| io_at(e, "seal the copy of", what))?;
        let resident = Resident { map, spans };
        resident.release_file_pages(src);
        Ok(Some(resident))
    }

    /// Drops the pages wholly inside a copied span from the file's mapping: they are read from
    /// the copy from now on, so they would only be held twice. (The page cache keeps them as
    /// reclaimable cache; this process no longer maps them.)
    fn release_file_pages(&self, file: &Mmap) {
        #[cfg(unix)]
        for (r, _) in &self.spans {
            let (lo, hi) = (r.start.next_multiple_of(PAGE), r.end / PAGE * PAGE);
            if hi > lo {
                // SAFETY: a read-only shared file mapping: dropped pages read back from the file
                // on the next touch, with the same bytes (the file is never written).
                let _ = unsafe {
                    file.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
                };
            }
        }
        #[cfg(not(unix))]
        let _ = file;
    }

    /// Bytes copied.
    fn bytes(&self) -> usize {
        self.spans.iter().map(|(r, _)| r.len()).sum()
    }

    /// The copy of file bytes `range`, when one span holds all of it.
    fn get(&self, range: &Range<usize>) -> Option<&[u8]> {
        let i = self.spans.partition_point(|(r, _)| r.start <= range.start);
        let (r, at) = self.spans.get(i.checked_sub(1)?)?;
        (range.end <= r.end).then(|| {
            let o = at + (range.start - r.start);
            &self.map[o..o + range.len()]
        })
    }
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
