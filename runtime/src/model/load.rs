//! From a verified pack to a [`Model`]: every tensor bound to its role by the spec (each mixer
//! binds its own), the head chosen (tiles, or the tied bf16 embedding), and the load-time kernel
//! self-check that refuses a pack whose tiles the kernels would misread.

use std::sync::{Arc, Mutex};

use super::attention::Attention;
use super::delta_net::{DeltaDims, DeltaNet};
use super::ffn::Ffn;
use super::mixer::{Layer, Mixing};
use super::short_conv::ShortConv;
use super::weight::{Binder, Weight};
use super::{DEFAULT_HEAD_RESCORE, Model};
use crate::backend::Host;
use crate::error::{Error, Result};
use crate::pack::Pack;
use onebit_kernels::KernelPath;
use onebit_kernels::kv::{CacheMemory, CacheType};
use onebit_kernels::matmul::{self, QMatrix};
use onebit_pack::spec::{Mixer, ModelSpec};

/// Result of the load-time kernel self-check.
#[derive(Clone, Debug)]
pub struct SelfCheck {
    /// Kernel path used.
    pub path: &'static str,
    /// Matrices checked.
    pub matrices: usize,
    /// Largest relative error against the reference decode.
    pub max_rel: f32,
}

/// Where a loaded model's streamed weights live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// Copied to memory advised to huge pages (where Linux offers them): decode reads faster.
    Copied,
    /// Read through the file's mapping: no copy (checking a pack, not running it).
    Mapped,
}

/// Largest relative error the self-check accepts (f32 accumulation over K ≤ 16k).
pub const SELF_CHECK_TOLERANCE: f32 = 1e-4;

/// The mixer of layer `i`, as the spec names it: the one line per mixer kind.
fn mixer(b: &Binder<'_>, i: usize, spec: &ModelSpec) -> Result<Box<dyn Mixing>> {
    let h = spec.hidden;
    Ok(match spec.layers[i].mixer {
        Mixer::Attention => Box::new(Attention::load(b, i, spec)?),
        Mixer::ShortConv { kernel } => Box::new(ShortConv::load(b, i, h, kernel)?),
        Mixer::GatedDeltaNet {
            key_heads,
            key_dim,
            value_heads,
            value_dim,
            kernel,
            value_order,
        } => Box::new(DeltaNet::load(
            b,
            i,
            h,
            DeltaDims {
                nk: key_heads,
                dk: key_dim,
                nv: value_heads,
                dv: value_dim,
                kernel,
                order: value_order,
            },
        )?),
    })
}

/// Layer `i`: its norms (sandwich norms where the spec has them), mixer and FFN.
fn layer(b: &Binder<'_>, i: usize, spec: &ModelSpec) -> Result<Layer> {
    let n = |s: &str| format!("model.layers.{i}.{s}");
    let add1 = spec.norm_add_one;
    let (post_attn_norm, ffn_norm, post_ffn_norm) = if spec.sandwich_norms {
        (
            Some(b.vector(&n("post_attention_layernorm.weight"), add1)?),
            b.vector(&n("pre_feedforward_layernorm.weight"), add1)?,
            Some(b.vector(&n("post_feedforward_layernorm.weight"), add1)?),
        )
    } else {
        (
            None,
            b.vector(&n("post_attention_layernorm.weight"), add1)?,
            None,
        )
    };
    let mixing = mixer(b, i, spec)?;
    Ok(Layer {
        attn_norm: b.vector(&n("input_layernorm.weight"), add1)?,
        mixing,
        post_attn_norm,
        ffn_norm,
        post_ffn_norm,
        ffn: Ffn::load(b, i, spec.hidden, spec.ffn)?,
    })
}

impl Model {
    /// Binds the pack's tensors to the spec's roles; names the missing or unreadable tensor.
    /// The weights every token streams are copied to memory advised to huge pages
    /// ([`Pack::make_resident`]): for running a model.
    pub fn load(pack: Pack) -> Result<Model> {
        Self::load_with(pack, KernelPath::detect(), Residency::Copied)
    }

    /// [`Model::load`] reading every weight through the file's mapping: for checking a pack
    /// (the import's kernels stage), where a copy would only cost time and memory.
    pub fn load_mapped(pack: Pack) -> Result<Model> {
        Self::load_with(pack, KernelPath::detect(), Residency::Mapped)
    }

    /// [`Model::load`] with an explicit kernel path and residency (benchmarks, tests).
    pub fn load_with(pack: Pack, path: KernelPath, residency: Residency) -> Result<Model> {
        let mut model = Self::bind(pack, path)?;
        if residency == Residency::Copied {
            let streamed = model.streamed();
            let moved = model.pack.make_resident(&streamed)?;
            if moved > 0 {
                tracing::debug!(
                    bytes = moved,
                    "streamed weights copied to memory advised to huge pages <- transparent huge pages on"
                );
            }
        }
        Ok(model)
    }

    fn bind(pack: Pack, path: KernelPath) -> Result<Model> {
        let spec = pack.manifest.model.clone().ok_or_else(|| Error::Refused {
            pack: pack.dir.clone(),
            reason: pack
                .manifest
                .host_refusal
                .clone()
                .unwrap_or_else(|| "no runnable model".into()),
        })?;
        let b = Binder { pack: &pack };
        let h = spec.hidden;
        let layers = (0..spec.layers.len())
            .map(|i| layer(&b, i, &spec))
            .collect::<Result<Vec<_>>>()?;
        let embed_name = onebit_pack::manifest::EMBEDDING_NAMES
            .into_iter()
            .find(|n| b.has(n))
            .unwrap_or(onebit_pack::manifest::EMBEDDING_NAMES[0]);
        let es = pack.stored(embed_name).ok_or_else(|| Error::Pack {
            pack: pack.dir.clone(),
            what: format!("tensor {embed_name} is missing"),
        })?;
        if es.dtype != "BF16" || es.range.len() != spec.vocab * h * 2 {
            return Err(b.bad(format!(
                "{embed_name}: expected {}×{h} BF16, found {} {:?}",
                spec.vocab, es.dtype, es.shape
            )));
        }
        let embed = es.range.clone();
        let head = if b.has("lm_head.weight") {
            b.weight("lm_head.weight", spec.vocab, h)?
        } else {
            Weight::Bf16 {
                rows: spec.vocab,
                k: h,
                range: embed.clone(),
                scale: 1.0 / spec.tied_head_divisor,
            }
        };
        let norm = b.vector("model.norm.weight", spec.norm_add_one)?;
        let exact_head = (spec.tied_head && matches!(head, Weight::Tiled { .. }))
            .then_some(1.0 / spec.tied_head_divisor);
        let images = pack
            .manifest
            .towers
            .iter()
            .find_map(|t| Some((t.served.then_some(t.vision.clone()?)?, &t.file)))
            .map(|(v, file)| crate::image_input::ImageEncoder::new(v, &pack.dir.join(file)));
        Ok(Model {
            images,
            pack,
            spec,
            path,
            backend: Arc::new(Host { path }),
            embed,
            layers,
            norm,
            head,
            exact_head,
            rescore: if exact_head.is_some() {
                DEFAULT_HEAD_RESCORE
            } else {
                0
            },
            stats: Mutex::new(None),
            cache_type: CacheType::default(),
            cache_memory: CacheMemory::unlimited(),
        })
    }

    /// Bytes of weights one greedy decode step reads: every layer's matrices, the head as a
    /// greedy row reads it (the 2-bit scan head where the pack has one and candidates are
    /// re-scored, plus the candidates' bf16 rows), and one embedding row. Divided into a
    /// measured read bandwidth it is the decode speed's ceiling; benchmarks print the fraction
    /// of it reached.
    pub fn decode_bytes(&self) -> usize {
        let bytes = |w: &Weight| match w {
            Weight::Tiled { range, .. } | Weight::Bf16 { range, .. } => range.len(),
        };
        let layers: usize = self
            .layers
            .iter()
            .flat_map(|l| l.mixing.weights().into_iter().chain(l.ffn.weights()))
            .map(bytes)
            .sum();
        let row = 2 * self.spec.hidden;
        let head = match self.pack.head_scan() {
            Some(scan) if self.rescore > 0 => scan.bytes() + self.rescore * row,
            _ => bytes(&self.head),
        };
        layers + head + row
    }

    /// The byte ranges of `model.q4nx` every token reads whole: each layer's matrices and the
    /// head (the embedding only where it is the head).
    pub fn streamed(&self) -> Vec<std::ops::Range<usize>> {
        self.all_weights()
            .into_iter()
            .map(|w| match w {
                Weight::Tiled { range, .. } | Weight::Bf16 { range, .. } => range.clone(),
            })
            .collect()
    }

    fn all_weights(&self) -> Vec<&Weight> {
        let mut v = vec![&self.head];
        for l in &self.layers {
            v.extend(l.mixing.weights());
            v.extend(l.ffn.weights());
        }
        v
    }

    /// Checks the kernel against the reference decode on every tiled matrix of the pack (first
    /// and last row block each); refuses to run when one disagrees.
    pub fn self_check(&self) -> Result<SelfCheck> {
        let mut worst = 0f32;
        let mut count = 0;
        let verdict = |max_rel: f32, what: String| -> Result<()> {
            if max_rel > SELF_CHECK_TOLERANCE || !max_rel.is_finite() {
                return Err(Error::Refused {
                    pack: self.pack.dir.clone(),
                    reason: format!(
                        "kernel self-check failed on {what}: relative error {max_rel} vs the reference decode"
                    ),
                });
            }
            Ok(())
        };
        for w in self.all_weights() {
            if let Weight::Tiled {
                layout,
                rows,
                k,
                range,
            } = w
            {
                let data = self.pack.slice(range.clone());
                let m = QMatrix::new(*layout, *rows, *k, data)
                    .ok_or_else(|| Error::Internal("matrix size changed".into()))?;
                let r = matmul::self_check(&m, self.path);
                verdict(r.max_rel, format!("a {} matrix ({rows}×{k})", layout.name))?;
                worst = worst.max(r.max_rel);
                count += 1;
            }
        }
        if let Some(m) = self.pack.head_scan() {
            let r = matmul::scan::self_check(&m, self.path);
            verdict(r.max_rel, format!("the scan head ({}×{})", m.rows, m.k))?;
            worst = worst.max(r.max_rel);
            count += 1;
        }
        Ok(SelfCheck {
            path: self.path.name(),
            matrices: count,
            max_rel: worst,
        })
    }
}
