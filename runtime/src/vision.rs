//! Gemma 3's image encoder on the host, from a pack's vision tower (`vision_weight.q4nx`,
//! docs/towers.md): SigLIP over the image's patches (patch embedding, learned positions,
//! pre-norm encoder layers with biases and full attention, the final LayerNorm), then Gemma 3's
//! projector (average pooling of the patch grid to `mm_tokens_per_image`, the soft-embedding RMS
//! norm, the input projection into the language model's width), as transformers'
//! `Gemma3ForConditionalGeneration.get_image_features` computes it.
//!
//! f32 arithmetic on the tower's bf16 weights (unblocked once from their MM blocks): the
//! projections and attention as sgemm products ([`crate::sgemm`]), rows spread over threads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::bf16;
use memmap2::Mmap;
use onebit_pack::mm_block::MmBlock;
use rayon::prelude::*;

use crate::error::{Error, Result, io_at};
use crate::pack::{Stored, parse_header};
use crate::sgemm::{Rows, matmul, matmul_t};

/// A Gemma 3 vision tower's geometry: SigLIP's, and what the projector pools to and projects
/// into.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmaVisionConfig {
    /// SigLIP's width.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Image side in pixels (square).
    pub image: usize,
    /// Patch side in pixels.
    pub patch: usize,
    /// LayerNorm and soft-embedding norm epsilon.
    pub eps: f32,
    /// Tokens an image becomes (a square number).
    pub tokens_per_image: usize,
    /// The language model's width.
    pub text_hidden: usize,
}

impl GemmaVisionConfig {
    /// The geometry a pack's manifest gives its served vision tower.
    pub fn from_spec(s: &onebit_pack::manifest::VisionSpec) -> GemmaVisionConfig {
        GemmaVisionConfig {
            hidden: s.hidden,
            heads: s.heads,
            layers: s.layers,
            image: s.image_size,
            patch: s.patch_size,
            eps: s.eps,
            tokens_per_image: s.tokens_per_image,
            text_hidden: s.text_hidden,
        }
    }
}

/// A linear layer `y = W x + b`, `W` row-major `[out][in]`.
struct Linear {
    w: Vec<f32>,
    b: Vec<f32>,
    out: usize,
    inp: usize,
}

impl Linear {
    /// `x` is `n × inp`; returns `n × out`.
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = x.len() / self.inp;
        let mut y = vec![0.0f32; n * self.out];
        let rows = |data, rows, cols| Rows {
            data,
            rows,
            cols,
            stride: cols,
        };
        matmul_t(
            rows(x, n, self.inp),
            rows(&self.w, self.out, self.inp),
            &mut y,
            self.out,
        );
        if !self.b.is_empty() {
            y.par_chunks_mut(self.out).for_each(|yr| {
                for (v, b) in yr.iter_mut().zip(&self.b) {
                    *v += b;
                }
            });
        }
        y
    }
}

/// A LayerNorm's weight and bias.
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl Norm {
    fn apply(&self, x: &[f32], eps: f32) -> Vec<f32> {
        let d = self.w.len();
        let mut y = x.to_vec();
        for row in y.chunks_mut(d) {
            let mean = row.iter().sum::<f32>() / d as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&self.w).zip(&self.b) {
                *v = (*v - mean) * inv * w + b;
            }
        }
        y
    }
}

/// One SigLIP encoder layer.
struct Layer {
    ln1: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: Norm,
    fc1: Linear,
    fc2: Linear,
}

/// Gemma 3's image encoder, loaded from a tower file.
pub struct GemmaVision {
    cfg: GemmaVisionConfig,
    patch: Linear,
    positions: Vec<f32>,
    layers: Vec<Layer>,
    post: Norm,
    soft_norm: Vec<f32>,
    projection: Linear,
}

/// The tower file's tensors, read as f32.
struct Tensors {
    path: PathBuf,
    map: Mmap,
    stored: BTreeMap<String, Stored>,
}

impl Tensors {
    fn bad(&self, what: String) -> Error {
        Error::Pack {
            pack: self.path.clone(),
            what,
        }
    }

    fn raw(&self, name: &str) -> Result<(&Stored, Vec<f32>)> {
        let s = self
            .stored
            .get(name)
            .ok_or_else(|| self.bad(format!("no tensor {name}")))?;
        let bytes = &self.map[s.range.clone()];
        let v = match s.dtype.as_str() {
            "BF16" => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            "F32" => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            other => return Err(self.bad(format!("{name}: dtype {other} in a vision tower"))),
        };
        Ok((s, v))
    }

    /// A plain tensor of `len` values.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let (_, v) = self.raw(name)?;
        if v.len() != len {
            return Err(self.bad(format!(
                "{name}: {} values, the config needs {len}",
                v.len()
            )));
        }
        Ok(v)
    }

    /// An `n × k` projection, unblocked from its MM blocks (or plain when stored so).
    fn matrix(&self, name: &str, n: usize, k: usize) -> Result<Vec<f32>> {
        let (s, v) = self.raw(name)?;
        if s.shape.len() != 3 {
            if v.len() != n * k {
                return Err(self.bad(format!("{name}: {:?}, the config needs {n}x{k}", s.shape)));
            }
            return Ok(v);
        }
        let shape = [s.shape[0], s.shape[1], s.shape[2]];
        let block = MmBlock::KNOWN
            .into_iter()
            .find(|b| b.declared_shape(n as u64, k as u64) == shape)
            .ok_or_else(|| {
                self.bad(format!(
                    "{name}: declared {shape:?} is no known MM-block layout of {n}x{k}"
                ))
            })?;
        let bytes = &self.map[s.range.clone()];
        let mut out = Vec::with_capacity(n * k);
        let mut row = Vec::new();
        for r in 0..n {
            block.read_row(bytes, shape[1], r as u64, &mut row);
            out.extend_from_slice(&row[..k]);
        }
        Ok(out)
    }

    fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            w: self.matrix(&format!("{prefix}.weight"), out, inp)?,
            b: self.vector(&format!("{prefix}.bias"), out)?,
            out,
            inp,
        })
    }

    fn norm(&self, prefix: &str, d: usize) -> Result<Norm> {
        Ok(Norm {
            w: self.vector(&format!("{prefix}.weight"), d)?,
            b: self.vector(&format!("{prefix}.bias"), d)?,
        })
    }
}

const SIGLIP: &str = "vision_tower.vision_model";

impl GemmaVision {
    /// Loads the tower file at `path` with geometry `cfg`; refuses a tensor that is missing or
    /// shaped otherwise, by name.
    pub fn open(path: &Path, cfg: GemmaVisionConfig) -> Result<GemmaVision> {
        let file = fs_err::File::open(path)?;
        // SAFETY: read-only map of a pack file, never written after the pack is published.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io_at(e, "map file", path))?;
        let stored = parse_header(path, &map)?;
        let t = Tensors {
            path: path.to_path_buf(),
            map,
            stored,
        };
        let h = cfg.hidden;
        let side = cfg.image / cfg.patch.max(1);
        let pp = 3 * cfg.patch * cfg.patch;
        let inter = t
            .stored
            .get(&format!("{SIGLIP}.encoder.layers.0.mlp.fc1.bias"))
            .map(|s| s.shape.iter().product::<u64>() as usize)
            .ok_or_else(|| t.bad("no encoder layer 0".into()))?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let p = format!("{SIGLIP}.encoder.layers.{i}");
            layers.push(Layer {
                ln1: t.norm(&format!("{p}.layer_norm1"), h)?,
                q: t.linear(&format!("{p}.self_attn.q_proj"), h, h)?,
                k: t.linear(&format!("{p}.self_attn.k_proj"), h, h)?,
                v: t.linear(&format!("{p}.self_attn.v_proj"), h, h)?,
                o: t.linear(&format!("{p}.self_attn.out_proj"), h, h)?,
                ln2: t.norm(&format!("{p}.layer_norm2"), h)?,
                fc1: t.linear(&format!("{p}.mlp.fc1"), inter, h)?,
                fc2: t.linear(&format!("{p}.mlp.fc2"), h, inter)?,
            });
        }
        Ok(GemmaVision {
            cfg,
            patch: Linear {
                w: t.vector(
                    &format!("{SIGLIP}.embeddings.patch_embedding.weight"),
                    h * pp,
                )?,
                b: t.vector(&format!("{SIGLIP}.embeddings.patch_embedding.bias"), h)?,
                out: h,
                inp: pp,
            },
            positions: t.vector(
                &format!("{SIGLIP}.embeddings.position_embedding.weight"),
                side * side * h,
            )?,
            layers,
            post: t.norm(&format!("{SIGLIP}.post_layernorm"), h)?,
            soft_norm: t.vector("multi_modal_projector.mm_soft_emb_norm.weight", h)?,
            projection: Linear {
                w: t.matrix(
                    "multi_modal_projector.mm_input_projection_weight",
                    cfg.text_hidden,
                    h,
                )?,
                b: Vec::new(),
                out: cfg.text_hidden,
                inp: h,
            },
        })
    }

    /// The image's embeddings for the language model, `tokens_per_image × text_hidden`, from its
    /// pixel values (`3 × image × image`, channels first, normalized as the processor does).
    pub fn encode(&self, pixels: &[f32]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let (p, side) = (c.patch, c.image / c.patch.max(1));
        if pixels.len() != 3 * c.image * c.image {
            return Err(Error::Request {
                field: "image",
                reason: format!(
                    "{} pixel values, the tower takes 3x{}x{}",
                    pixels.len(),
                    c.image,
                    c.image
                ),
            });
        }
        // The patch convolution as a product: each patch's (channel, y, x) values in a row.
        let mut patches = Vec::with_capacity(side * side * 3 * p * p);
        for py in 0..side {
            for px in 0..side {
                for ch in 0..3 {
                    for dy in 0..p {
                        let at = ch * c.image * c.image + (py * p + dy) * c.image + px * p;
                        patches.extend_from_slice(&pixels[at..at + p]);
                    }
                }
            }
        }
        let mut h = self.patch.apply(&patches);
        for (v, pos) in h.iter_mut().zip(&self.positions) {
            *v += pos;
        }
        for layer in &self.layers {
            self.layer(layer, &mut h);
        }
        let h = self.post.apply(&h, c.eps);
        Ok(self.project(&h, side))
    }

    /// One pre-norm encoder layer, in place: full (bidirectional) attention, then the MLP.
    fn layer(&self, l: &Layer, h: &mut [f32]) {
        let (d, eps) = (self.cfg.hidden, self.cfg.eps);
        let n = h.len() / d;
        let x = l.ln1.apply(h, eps);
        let (q, k, v) = (l.q.apply(&x), l.k.apply(&x), l.v.apply(&x));
        let hd = d / self.cfg.heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut attn = vec![0.0f32; n * d];
        // Blocks of query rows, each through every head: scores Q·Kᵀ, softmax, times V, all
        // reading and writing the head's columns in place.
        let block = 64;
        attn.par_chunks_mut(block * d)
            .enumerate()
            .for_each(|(bi, out)| {
                let r0 = bi * block;
                let rows = out.len() / d;
                let mut scores = vec![0.0f32; rows * n];
                for head in 0..self.cfg.heads {
                    let col = head * hd;
                    let queries = Rows {
                        data: &q[r0 * d + col..],
                        rows,
                        cols: hd,
                        stride: d,
                    };
                    let keys = Rows {
                        data: &k[col..],
                        rows: n,
                        cols: hd,
                        stride: d,
                    };
                    matmul_t(queries, keys, &mut scores, n);
                    for row in scores.chunks_mut(n) {
                        let max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s * scale));
                        let mut total = 0.0f32;
                        for s in row.iter_mut() {
                            *s = (*s * scale - max).exp();
                            total += *s;
                        }
                        for s in row.iter_mut() {
                            *s /= total;
                        }
                    }
                    let probs = Rows {
                        data: &scores,
                        rows,
                        cols: n,
                        stride: n,
                    };
                    let values = Rows {
                        data: &v[col..],
                        rows: n,
                        cols: hd,
                        stride: d,
                    };
                    matmul(probs, values, &mut out[col..], d);
                }
            });
        for (a, b) in h.iter_mut().zip(l.o.apply(&attn)) {
            *a += b;
        }
        let x = l.ln2.apply(h, eps);
        let mut f = l.fc1.apply(&x);
        for v in f.iter_mut() {
            *v = gelu_tanh(*v);
        }
        for (a, b) in h.iter_mut().zip(l.fc2.apply(&f)) {
            *a += b;
        }
    }

    /// Gemma 3's projector: average pooling of the `side × side` patch grid to the image's
    /// tokens, the soft-embedding RMS norm (its stored weight is already `1 + w`, as llama.cpp's
    /// mmproj and the tower keep it), the input projection.
    fn project(&self, h: &[f32], side: usize) -> Vec<f32> {
        let c = &self.cfg;
        let d = c.hidden;
        let per_side = (c.tokens_per_image as f64).sqrt() as usize;
        let k = side / per_side.max(1);
        let mut pooled = vec![0.0f32; per_side * per_side * d];
        for ty in 0..per_side {
            for tx in 0..per_side {
                let out = &mut pooled[(ty * per_side + tx) * d..(ty * per_side + tx + 1) * d];
                for dy in 0..k {
                    for dx in 0..k {
                        let cell = (ty * k + dy) * side + tx * k + dx;
                        for (o, v) in out.iter_mut().zip(&h[cell * d..(cell + 1) * d]) {
                            *o += v;
                        }
                    }
                }
                for o in out.iter_mut() {
                    *o /= (k * k) as f32;
                }
            }
        }
        for row in pooled.chunks_mut(d) {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + c.eps).sqrt();
            for (v, w) in row.iter_mut().zip(&self.soft_norm) {
                *v *= inv * w;
            }
        }
        self.projection.apply(&pooled)
    }
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`).
fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/π)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

/// The Gemma 3 tower oracle (`tests/fixtures/towers/gemma3`) for the image tests.
#[cfg(test)]
pub(crate) mod oracle {
    use std::path::PathBuf;

    use super::GemmaVisionConfig;

    /// The oracle's folder.
    pub fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/towers/gemma3")
    }

    /// Its reference.json.
    pub fn reference() -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(fixture().join("reference.json")).expect("reference"))
            .expect("json")
    }

    /// The numbers of array `key` of the reference.
    pub fn floats(reference: &serde_json::Value, key: &str) -> Vec<f32> {
        reference[key]
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|v| v.as_f64())
            .map(|v| v as f32)
            .collect()
    }

    /// Its tower's geometry, projecting into a text model of `text_hidden`.
    pub fn config(text_hidden: usize) -> GemmaVisionConfig {
        GemmaVisionConfig {
            hidden: 192,
            heads: 3,
            layers: 2,
            image: 56,
            patch: 14,
            eps: 1e-6,
            tokens_per_image: 4,
            text_hidden,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::oracle::{config, fixture, floats, reference};
    use super::*;

    /// The oracle's tower and projector (transformers, f32, on the weights as the tower stores
    /// them) against ours on the same pixel values.
    #[test]
    fn the_encoder_gives_transformers_image_features_from_the_oracles_tower() {
        let reference = reference();
        let vision =
            GemmaVision::open(&fixture().join("vision_weight.q4nx"), config(128)).expect("open");
        let ours = vision
            .encode(&floats(&reference, "pixel_values"))
            .expect("encode");
        let theirs = floats(&reference, "features");
        assert_eq!(ours.len(), theirs.len());
        let max_ref = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let max_diff = ours
            .iter()
            .zip(&theirs)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        // f32 sums in another order than torch's, on values rounded to 6 decimals.
        assert!(
            max_diff <= 1e-4 * max_ref.max(1.0) + 2e-6,
            "max |ours - transformers| = {max_diff} (largest feature {max_ref})"
        );
    }

    #[test]
    fn a_tower_without_its_projector_is_refused_by_name() {
        // A width the stored projector cannot be.
        let err = GemmaVision::open(&fixture().join("vision_weight.q4nx"), config(512))
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("multi_modal_projector.mm_input_projection_weight"),
            "{err}"
        );
    }
}
