//! Images in a prompt, for a pack whose vision tower is served (`manifest.json` `towers[].vision`):
//! where an image's tokens go in the prompt's text, the image file's bytes to the embeddings the
//! language model reads (decoded, the processor's resize and normalization, the tower), cached by
//! the bytes' digest so that one image is encoded once, and where in a tokenized prompt each
//! image goes (`Session::place_images` puts it there).
//!
//! The prompt side is Gemma 3's processor (`Gemma3Processor`): each `<start_of_image>` a prompt
//! or chat template writes becomes `\n\n<start_of_image>`, `mm_tokens_per_image` image tokens,
//! `<end_of_image>\n\n`, before tokenization, so the text around it tokenizes as transformers
//! tokenizes it.

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use onebit_pack::manifest::VisionSpec;

use crate::error::{Error, Result};
use crate::image::{decode, pixel_values};
use crate::vision::{GemmaVision, GemmaVisionConfig};

/// An image as the language model reads it: the vision tower's output, one embedding row per
/// image token, which replace the token embeddings at the positions the image is placed at
/// (`Session::place_image`). The digest names the image's content (what the prefix cache keys it
/// by, so one image is encoded once).
#[derive(Debug, PartialEq)]
pub struct ImageEmbeds {
    /// blake3 of the image file's bytes.
    pub digest: [u8; 32],
    /// Image tokens (rows).
    pub tokens: usize,
    /// `tokens × hidden`, row-major.
    pub values: Vec<f32>,
}

/// Encoded images kept for reuse (an image sent again in a conversation's next turn).
const CACHED_IMAGES: usize = 16;

/// The image side of a model: its served vision tower, opened on first use.
pub struct ImageEncoder {
    spec: VisionSpec,
    file: std::path::PathBuf,
    tower: OnceLock<std::result::Result<GemmaVision, String>>,
    cache: Mutex<Vec<Arc<ImageEmbeds>>>,
}

impl ImageEncoder {
    /// The encoder of `spec`'s tower in `file` (not read until the first image).
    pub fn new(spec: VisionSpec, file: &Path) -> ImageEncoder {
        ImageEncoder {
            spec,
            file: file.to_path_buf(),
            tower: OnceLock::new(),
            cache: Mutex::new(Vec::new()),
        }
    }

    /// How the tower runs and where images go in a prompt.
    pub fn spec(&self) -> &VisionSpec {
        &self.spec
    }

    /// The embeddings of the image file `bytes` (PNG, JPEG, WebP, GIF's first frame): encoded
    /// once per content, then served from the cache.
    pub fn encode(&self, bytes: &[u8]) -> Result<Arc<ImageEmbeds>> {
        let digest = *blake3::hash(bytes).as_bytes();
        if let Some(hit) = self.cached(&digest) {
            return Ok(hit);
        }
        let tower = self
            .tower
            .get_or_init(|| {
                GemmaVision::open(&self.file, GemmaVisionConfig::from_spec(&self.spec))
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::Internal(format!("the vision tower: {e}")))?;
        let s = &self.spec;
        let started = std::time::Instant::now();
        let pixels = pixel_values(&decode(bytes)?, s.image_size, s.mean, s.std);
        let values = tower.encode(&pixels)?;
        tracing::info!(
            ms = started.elapsed().as_millis() as u64,
            tokens = s.tokens_per_image,
            precision = tower.precision().name(),
            "image encoded"
        );
        let image = Arc::new(ImageEmbeds {
            digest,
            tokens: s.tokens_per_image,
            values,
        });
        if let Ok(mut c) = self.cache.lock() {
            c.retain(|x| x.digest != digest);
            if c.len() >= CACHED_IMAGES {
                c.remove(0);
            }
            c.push(image.clone());
        }
        Ok(image)
    }

    /// An image encoded before, by its content's digest (most recent use last).
    fn cached(&self, digest: &[u8; 32]) -> Option<Arc<ImageEmbeds>> {
        let mut c = self.cache.lock().ok()?;
        let at = c.iter().position(|x| &x.digest == digest)?;
        let hit = c.remove(at);
        c.push(hit.clone());
        Some(hit)
    }

    /// The text one image becomes in a prompt, as the processor writes it.
    pub fn image_text(&self) -> String {
        let s = &self.spec;
        format!(
            "\n\n{}{}{}\n\n",
            s.start_text,
            s.image_text.repeat(s.tokens_per_image),
            s.end_text
        )
    }

    /// Where each of `images` goes in the prompt `ids`: the first position of each run of image
    /// tokens, in order. Refuses a count of runs other than the images', or a run of another
    /// length than an image's tokens.
    pub fn places<'i>(
        &self,
        ids: &[u32],
        images: &'i [Arc<ImageEmbeds>],
    ) -> Result<Vec<(usize, &'i Arc<ImageEmbeds>)>> {
        let runs = image_runs(ids, self.spec.image_token);
        if runs.len() != images.len() {
            return Err(Error::Request {
                field: "image",
                reason: format!(
                    "{} image(s) for {} place(s) in the prompt ({} marks where an image goes)",
                    images.len(),
                    runs.len(),
                    self.spec.start_text
                ),
            });
        }
        runs.into_iter()
            .zip(images)
            .map(|((at, len), image)| {
                if len == image.tokens {
                    Ok((at, image))
                } else {
                    Err(Error::Request {
                        field: "image",
                        reason: format!(
                            "a run of {len} image tokens in the prompt; an image is {} tokens",
                            image.tokens
                        ),
                    })
                }
            })
            .collect()
    }
}

/// Where a session holding `held` (its images: first position, embeddings) can resume for a
/// prompt of `shared` equal leading tokens whose images are `wanted` (first position, digest):
/// `shared`, or the first position where an image of one is not the same image in the other.
pub fn image_prefix(
    held: &[(usize, Arc<ImageEmbeds>)],
    wanted: &[(usize, [u8; 32])],
    shared: usize,
) -> usize {
    let mut cut = shared;
    for (s, im) in held {
        if *s < cut && !wanted.iter().any(|(w, d)| w == s && d == &im.digest) {
            cut = *s;
        }
    }
    for (w, d) in wanted {
        if *w < cut && !held.iter().any(|(s, im)| s == w && &im.digest == d) {
            cut = *w;
        }
    }
    cut
}

/// The runs of `token` in `tokens`: (first index, length).
pub fn image_runs(tokens: &[u32], token: u32) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        if t != token {
            continue;
        }
        match runs.last_mut() {
            Some((s, l)) if *s + *l == i => *l += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}
