//! Gemma 3's image encoder on the host, from a pack's vision tower (`vision_weight.q4nx`,
//! docs/towers.md): SigLIP over the image's patches (patch embedding, learned positions,
//! pre-norm encoder layers with biases and full attention, the final LayerNorm), then Gemma 3's
//! projector (average pooling of the patch grid to `mm_tokens_per_image`, the soft-embedding RMS
//! norm, the input projection into the language model's width), as transformers'
//! `Gemma3ForConditionalGeneration.get_image_features` computes it.
//!
//! The tower's bf16 weights are read in place from the file's mapping (the MM blocks too:
//! nothing of the tower's matrices is copied or widened ahead): the projections and attention as
//! blocked products ([`onebit_kernels::gemm`]: AVX-512-BF16, AVX-512 or AVX2 register tiles, rows
//! spread over threads), softmax and GELU through the kernels' vectorized `exp`. The products'
//! operands are bf16 where the CPU multiplies bf16 (the activations rounded, as the NPU and
//! transformers' bf16 models do) and f32 elsewhere ([`Precision::for_encoders`]); norms,
//! softmax, GELU and the residual stream are f32 either way.

mod tower;

use std::path::Path;

use memmap2::Mmap;
use onebit_kernels::gemm::{F32Cols, F32Rows, Operands, Packed, Precision, gemm};
use onebit_kernels::ops::{exp_shifted, gelu_rows};
use rayon::prelude::*;

use crate::error::{Error, Result, io_at};
use crate::pack::parse_header;
use tower::{Linear, Norm, Tensors, Vector};

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

/// An encode's working buffers, reused by every layer (a 4,096-patch image's are 0.2 GB; fresh
/// ones each layer cost their page faults and zeroing again).
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    out: Vec<f32>,
    f: Vec<f32>,
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

/// Gemma 3's image encoder over a tower file's mapping.
pub struct GemmaVision {
    cfg: GemmaVisionConfig,
    map: Mmap,
    patch: Linear,
    /// The learned positions (`patches × hidden`), widened as they are added.
    positions: Vector,
    layers: Vec<Layer>,
    post: Norm,
    soft_norm: Vec<f32>,
    projection: Linear,
    precision: Precision,
}

const SIGLIP: &str = "vision_tower.vision_model";

impl GemmaVision {
    /// Maps the tower file at `path` with geometry `cfg`; refuses a tensor that is missing or
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
        let patch = Linear {
            w: t.matrix(
                &format!("{SIGLIP}.embeddings.patch_embedding.weight"),
                h,
                pp,
            )?,
            b: t.vector(&format!("{SIGLIP}.embeddings.patch_embedding.bias"), h)?,
            out: h,
            inp: pp,
        };
        let positions = t.span(
            &format!("{SIGLIP}.embeddings.position_embedding.weight"),
            side * side * h,
        )?;
        let post = t.norm(&format!("{SIGLIP}.post_layernorm"), h)?;
        let soft_norm = t.vector("multi_modal_projector.mm_soft_emb_norm.weight", h)?;
        let projection = Linear {
            w: t.matrix(
                "multi_modal_projector.mm_input_projection_weight",
                cfg.text_hidden,
                h,
            )?,
            b: Vec::new(),
            out: cfg.text_hidden,
            inp: h,
        };
        Ok(GemmaVision {
            cfg,
            map: t.map,
            patch,
            positions,
            layers,
            post,
            soft_norm,
            projection,
            precision: Precision::for_encoders(),
        })
    }

    /// The same encoder with its products at `precision` instead of
    /// [`Precision::for_encoders`]'s choice.
    pub fn with_precision(mut self, precision: Precision) -> GemmaVision {
        self.precision = precision;
        self
    }

    /// The precision its products run at.
    pub fn precision(&self) -> Precision {
        self.precision
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
        let mut h = self.patch.apply(&self.map, &patches, self.precision);
        self.positions.add_to(&self.map, &mut h);
        let mut scratch = Scratch::default();
        for layer in &self.layers {
            self.layer(layer, &mut h, &mut scratch);
        }
        let h = self.post.apply(&h, c.eps);
        Ok(self.project(&h, side))
    }

    /// One pre-norm encoder layer, in place: full (bidirectional) attention, then the MLP.
    fn layer(&self, l: &Layer, h: &mut [f32], s: &mut Scratch) {
        let (d, eps, map, pr) = (self.cfg.hidden, self.cfg.eps, &self.map[..], self.precision);
        let n = h.len() / d;
        let heads = self.cfg.heads;
        let hd = d / heads;
        l.ln1.apply_into(h, eps, &mut s.x);
        l.q.apply_into(map, &s.x, &mut s.q, pr);
        l.k.apply_into(map, &s.x, &mut s.k, pr);
        l.v.apply_into(map, &s.x, &mut s.v, pr);
        // The score scale folded into the queries (one multiply a value instead of one a score).
        let scale = 1.0 / (hd as f32).sqrt();
        s.q.par_iter_mut().for_each(|v| *v *= scale);
        s.attn.clear();
        s.attn.resize(n * d, 0.0);
        // Head by head (its keys and values packed once, 4 MB at Gemma 3 4B's shape, stay in
        // cache while every block of queries reads them), blocks of query rows in parallel:
        // scores Q·Kᵀ, e^(s − max), times V, divided by the sum; the head's columns of `q` and
        // the output read and written in place.
        let block = 96;
        // A score row's stride off a multiple of 4 KiB: a tile's six rows at a stride of 4,096
        // keys (16 KiB) would fall into one L1 set.
        let ld = n + 16;
        for head in 0..heads {
            let col = head * hd;
            let keys = Packed::new(
                &F32Rows {
                    data: &s.k[col..],
                    n,
                    k: hd,
                    stride: d,
                },
                pr,
            );
            let values = Packed::new(
                &F32Cols {
                    data: &s.v[col..],
                    n: hd,
                    k: n,
                    stride: d,
                },
                pr,
            );
            let q = &s.q;
            s.attn.par_chunks_mut(block * d).enumerate().for_each_init(
                Vec::new,
                |scores, (bi, out)| {
                    let r0 = bi * block;
                    let rows = out.len() / d;
                    scores.clear();
                    scores.resize(rows * ld, 0.0);
                    let ops = Operands {
                        x: &q[r0 * d + col..],
                        m: rows,
                        ldx: d,
                        y: scores,
                        ldy: ld,
                    };
                    gemm(&keys, ops, false, pr);
                    let sums: Vec<f32> = scores
                        .chunks_mut(ld)
                        .map(|row| exp_shifted(&mut row[..n]))
                        .collect();
                    let ops = Operands {
                        x: scores,
                        m: rows,
                        ldx: ld,
                        y: &mut out[col..],
                        ldy: d,
                    };
                    gemm(&values, ops, false, pr);
                    for (row, sum) in out.chunks_mut(d).zip(sums) {
                        let inv = 1.0 / sum;
                        for o in &mut row[col..col + hd] {
                            *o *= inv;
                        }
                    }
                },
            );
        }
        l.o.apply_into(map, &s.attn, &mut s.out, pr);
        for (a, b) in h.iter_mut().zip(&s.out) {
            *a += b;
        }
        l.ln2.apply_into(h, eps, &mut s.x);
        l.fc1.apply_into(map, &s.x, &mut s.f, pr);
        s.f.par_chunks_mut(1 << 14).for_each(gelu_rows);
        l.fc2.apply_into(map, &s.f, &mut s.out, pr);
        for (a, b) in h.iter_mut().zip(&s.out) {
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
        self.projection.apply(&self.map, &pooled, self.precision)
    }
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
mod tests;
