//! The host forward pass: a decoder-only transformer driven by [`ModelSpec`] flags, on the pack's
//! own tiles, with a KV cache and batched prefill.

use std::sync::Arc;

use rayon::prelude::*;

use crate::backend::{Backend, Host};
use crate::error::{Error, Result};
use crate::kernels::{self, Path as KPath, QMatrix, TileLayout};
use crate::ops;
use crate::pack::Pack;
use crate::spec::{Act, LayerSpec, Mixer, ModelSpec, QkNorm, ValueHeadOrder};

/// A weight matrix of the pack: tiles, or plain bf16 rows (embedding, a bf16 head).
#[derive(Clone, Debug)]
enum Weight {
    Tiled {
        layout: TileLayout,
        rows: usize,
        k: usize,
        range: std::ops::Range<usize>,
    },
    Bf16 {
        rows: usize,
        k: usize,
        range: std::ops::Range<usize>,
        scale: f32,
    },
}

/// The attention weights of one layer.
struct Attention {
    q: Weight,
    k: Weight,
    v: Weight,
    o: Weight,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
}

/// The gated short convolution of one layer (LFM2, [`Mixer::ShortConv`]).
struct ShortConv {
    /// `3H × H`: B, C and x, H rows each.
    in_proj: Weight,
    /// `H × H`.
    out_proj: Weight,
    /// `[kernel][H]` (transposed from the pack's `[H][kernel]` at load, so every step below runs
    /// over contiguous channels): tap j of channel c at `j·H + c`, tap `kernel − 1` on the
    /// current position.
    taps: Vec<f32>,
    kernel: usize,
}

/// The gated DeltaNet of one layer (Qwen3.5, [`Mixer::GatedDeltaNet`]).
struct DeltaNet {
    /// `(2·KD + VD) × H`: q, k, v.
    qkv: Weight,
    /// `VD × H`: the output gate z.
    z: Weight,
    /// `nV × H` each: the decay input α and the step input β.
    alpha: Weight,
    beta: Weight,
    /// `H × VD`.
    out: Weight,
    /// `[kernel][2·KD + VD]` (the pack stores them so), tap `kernel − 1` on the current position.
    taps: Vec<f32>,
    /// `−exp(A_log)` per value head.
    ssm_a: Vec<f32>,
    /// Per value head, added to α before the softplus.
    dt_bias: Vec<f32>,
    /// `value_dim` gains of the gated output norm.
    norm: Vec<f32>,
    dims: DeltaDims,
}

/// A gated-DeltaNet layer's geometry.
#[derive(Clone, Copy, Debug)]
struct DeltaDims {
    nk: usize,
    dk: usize,
    nv: usize,
    dv: usize,
    kernel: usize,
    order: ValueHeadOrder,
}

impl DeltaDims {
    /// Convolution channels: q, k and v.
    fn channels(&self) -> usize {
        2 * self.nk * self.dk + self.nv * self.dv
    }
    /// Floats of one sequence's delta-rule state.
    fn state(&self) -> usize {
        self.nv * self.dk * self.dv
    }
}

/// What mixes positions in a layer.
enum Mixing {
    Attention(Box<Attention>),
    ShortConv(Box<ShortConv>),
    DeltaNet(Box<DeltaNet>),
}

impl Mixing {
    /// Floats of one sequence's convolution state (0 for attention).
    fn conv_state(&self, hidden: usize) -> usize {
        match self {
            Mixing::Attention(_) => 0,
            Mixing::ShortConv(c) => (c.kernel - 1) * hidden,
            Mixing::DeltaNet(d) => (d.dims.kernel - 1) * d.dims.channels(),
        }
    }
    /// Floats of one sequence's delta-rule state (0 but for a gated DeltaNet).
    fn ssm_state(&self) -> usize {
        match self {
            Mixing::DeltaNet(d) => d.dims.state(),
            _ => 0,
        }
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    mixing: Mixing,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    post_ffn_norm: Option<Vec<f32>>,
    gate: Weight,
    up: Weight,
    down: Weight,
}

/// The residual update `x += norm(branch)`, the norm only where the model has it (Gemma's
/// sandwich norms).
fn add_branch(x: &mut [f32], branch: &mut [f32], post_norm: Option<&[f32]>, eps: f32) {
    if let Some(w) = post_norm {
        ops::rmsnorm_inplace(branch, w, eps);
    }
    for (a, &b) in x.iter_mut().zip(branch.iter()) {
        *a += b;
    }
}

/// A loaded model: the pack, its bound weights and the kernel path.
pub struct Model {
    /// The pack.
    pub pack: Pack,
    /// The model description.
    pub spec: ModelSpec,
    path: KPath,
    backend: Arc<dyn Backend>,
    embed: std::ops::Range<usize>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    head: Weight,
    /// The exact head when the stored head is tiles of a tied embedding (see [`crate::head`]).
    exact_head: Option<f32>,
    /// Candidates per token re-scored against the exact head (0 = none).
    rescore: usize,
    stats: std::sync::Mutex<Option<Collecting>>,
}

/// Rows in a batch from which the element-wise steps (RoPE, the gate activation) run in parallel:
/// below it the hand-over costs more than the work.
const PARALLEL_ROWS: usize = 4;

/// Candidates per token that [`Model::load`] re-scores against the exact head by default. On
/// Gemma 3 270M's 4-bit pack top-1 agreement is the same from 8 candidates up and perplexity keeps
/// improving to 128 (23.26 at 8, 22.88 at 128); the 2-bit scan head's worst rank of the exact
/// choice on the essay is 105 (docs/runtime.md).
pub const DEFAULT_HEAD_RESCORE: usize = 128;

/// Input statistics of one matrix product, collected over calibration text.
#[derive(Clone, Debug, Default)]
pub struct InputStats {
    /// Σ x² per input column: calibrated quantization weighs each column's error by its mean
    /// (as llama.cpp's importance matrix does).
    pub sum_sq: Vec<f64>,
    /// Rows (tokens) seen.
    pub rows: u64,
    /// Σ x xᵀ (`k × k`, row-major, symmetric) when second moments were asked for (GPTQ); one
    /// allocation shared by the matrices that read the same input (q/k/v, gate/up).
    pub gram: Option<Arc<Vec<f64>>>,
}

/// Input statistics per matrix (pack tensor name).
pub type ActStats = std::collections::BTreeMap<String, InputStats>;

/// What is being collected.
#[derive(Default)]
struct Collecting {
    per: ActStats,
    /// Second moments wanted.
    gram: bool,
    /// Σ x xᵀ (upper triangle) by the first name of each input group, and that group.
    grams: std::collections::BTreeMap<String, (Vec<f64>, Vec<String>)>,
}

/// `g[i][j] += Σ_t x[t][i]·x[t][j]` for `j ≥ i` (`x` is `n × k`): eight rows of `g` at a time
/// against every column, so each transposed input row is read `k/8` times, not `k`.
fn add_gram(g: &mut [f64], x: &[f32], n: usize, k: usize) {
    let mut xt = vec![0f32; k * n];
    for t in 0..n {
        for i in 0..k {
            xt[i * n + t] = x[t * k + i];
        }
    }
    g.par_chunks_mut(8 * k).enumerate().for_each(|(b, rows)| {
        let i0 = b * 8;
        let n_i = rows.len() / k;
        for j in i0..k {
            let xj = &xt[j * n..(j + 1) * n];
            for di in 0..n_i.min(j + 1 - i0) {
                let i = i0 + di;
                rows[di * k + j] += ops::dot(&xt[i * n..(i + 1) * n], xj) as f64;
            }
        }
    });
}

/// The KV cache, recurrent state and position of one sequence. A clone is an independent copy
/// that continues from the same point (a fork of the sequence).
#[derive(Clone)]
pub struct Session {
    /// Tokens processed so far.
    pub pos: usize,
    /// Capacity in tokens.
    pub capacity: usize,
    /// Per layer: cached keys and values (empty for layers without attention).
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Per layer: a short-convolution layer's last `kernel − 1` inputs, oldest first, `[tap][H]`
    /// (empty for other layers). Zero at position 0, as the convolution's causal padding is.
    conv: Vec<Vec<f32>>,
    /// Per layer: a gated-DeltaNet layer's state, `[value head][key dim][value dim]` (empty for
    /// other layers).
    ssm: Vec<Vec<f32>>,
    /// How many of the best logits the sampler reading this session uses (0 = all of them).
    reads_top: usize,
}

impl Session {
    /// A session without a cache: what stays in a finished slot once its cache is back in the pool.
    #[cfg(feature = "server")]
    pub(crate) fn empty() -> Session {
        Session {
            pos: 0,
            capacity: 0,
            k: Vec::new(),
            v: Vec::new(),
            conv: Vec::new(),
            ssm: Vec::new(),
            reads_top: 0,
        }
    }

    /// Says that whatever reads this session's logits uses only the `k` best of each row (greedy:
    /// 1; top-k sampling: k); 0 (the default) means the whole distribution (perplexity, full
    /// sampling). A row whose reader uses at most the re-scored candidates is ranked with the
    /// pack's scan head (if it has one) instead of the tiled head, and its other logits are −∞;
    /// the choice is per row, never by the other rows of a batch.
    pub fn read_top(&mut self, k: usize) {
        self.reads_top = k;
    }

    /// Forgets everything after position `pos` (keeps a shared prompt prefix) and returns the
    /// position kept. Recurrent state (a convolution's last inputs, a delta-rule state) holds no history
    /// to rewind to: a session with such layers goes back to position 0, its state cleared,
    /// whenever `pos` is before its current position. Truncating to 0 always starts afresh.
    pub fn truncate(&mut self, pos: usize) -> usize {
        if pos >= self.pos {
            return self.pos;
        }
        if pos == 0 || self.has_recurrent_state() {
            for c in self.conv.iter_mut().chain(self.ssm.iter_mut()) {
                c.fill(0.0);
            }
            self.pos = 0;
        } else {
            self.pos = pos;
        }
        self.pos
    }

    /// Whether any layer keeps recurrent state (which cannot be rewound; see
    /// [`Session::truncate`]).
    pub fn has_recurrent_state(&self) -> bool {
        self.conv.iter().chain(&self.ssm).any(|c| !c.is_empty())
    }

    /// A gated-DeltaNet layer's state, `[value head][key dim][value dim]` (empty for other
    /// layers; tests compare states).
    pub fn ssm_state(&self, layer: usize) -> &[f32] {
        &self.ssm[layer]
    }

    /// A convolution's state: its last `kernel − 1` inputs, oldest first, `[tap][channel]`
    /// (hidden channels for a short convolution, q/k/v for a gated DeltaNet; empty for
    /// attention layers; tests compare states).
    pub fn conv_state(&self, layer: usize) -> &[f32] {
        &self.conv[layer]
    }

    /// The cached keys of `layer` for positions `< pos` (tests compare caches).
    pub fn keys(&self, layer: usize) -> &[f32] {
        let w = self.k[layer].len() / self.capacity.max(1);
        &self.k[layer][..self.pos * w]
    }

    /// The cached values of `layer` for positions `< pos`.
    pub fn values(&self, layer: usize) -> &[f32] {
        let w = self.v[layer].len() / self.capacity.max(1);
        &self.v[layer][..self.pos * w]
    }
}

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

/// Largest relative error the self-check accepts (f32 accumulation over K ≤ 16k).
pub const SELF_CHECK_TOLERANCE: f32 = 1e-4;

impl Model {
    /// Binds the pack's tensors to the spec's roles; names the missing or unreadable tensor.
    pub fn load(pack: Pack) -> Result<Model> {
        Self::load_with(pack, KPath::detect())
    }

    /// [`Model::load`] with an explicit kernel path (benchmarks, tests).
    pub fn load_with(pack: Pack, path: KPath) -> Result<Model> {
        let dir = pack.dir.clone();
        let spec = pack.manifest.model.clone().ok_or_else(|| Error::Refused {
            pack: dir.clone(),
            reason: pack
                .manifest
                .host_refusal
                .clone()
                .unwrap_or_else(|| "no runnable model".into()),
        })?;
        let missing = |name: &str| Error::Pack {
            pack: dir.clone(),
            what: format!("tensor {name} is missing"),
        };
        let vector = |name: &str, add_one: bool| -> Result<Vec<f32>> {
            let s = pack.stored(name).ok_or_else(|| missing(name))?;
            let b = &pack.map()[s.range.clone()];
            let v: Vec<f32> = match s.dtype.as_str() {
                "BF16" => b
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                "F32" => b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                other => {
                    return Err(Error::Pack {
                        pack: dir.clone(),
                        what: format!("{name}: vector of dtype {other}"),
                    });
                }
            };
            Ok(if add_one {
                v.into_iter().map(|x| x + 1.0).collect()
            } else {
                v
            })
        };
        let opt_vector = |name: &str, add_one: bool| -> Result<Option<Vec<f32>>> {
            if pack.stored(name).is_some() {
                vector(name, add_one).map(Some)
            } else {
                Ok(None)
            }
        };
        let weight = |name: &str, rows: usize, k: usize| -> Result<Weight> {
            let s = pack.stored(name).ok_or_else(|| missing(name))?;
            let e = pack.manifest.tensors.get(name);
            let kind = e.map(|e| e.kind.as_str()).unwrap_or(s.dtype.as_str());
            if kind == "BF16" {
                if s.range.len() != rows * k * 2 {
                    return Err(Error::Pack {
                        pack: dir.clone(),
                        what: format!("{name}: {} bytes, expected {rows}×{k} bf16", s.range.len()),
                    });
                }
                return Ok(Weight::Bf16 {
                    rows,
                    k,
                    range: s.range.clone(),
                    scale: 1.0,
                });
            }
            let layout = TileLayout::by_name(kind).ok_or_else(|| Error::Refused {
                pack: dir.clone(),
                reason: format!("{name}: no host kernel for tile kind {kind}"),
            })?;
            QMatrix::new(layout, rows, k, &pack.map()[s.range.clone()]).ok_or_else(|| {
                Error::Pack {
                    pack: dir.clone(),
                    what: format!(
                        "{name}: {} bytes do not hold {rows}×{k} in {kind} tiles",
                        s.range.len()
                    ),
                }
            })?;
            Ok(Weight::Tiled {
                layout,
                rows,
                k,
                range: s.range.clone(),
            })
        };
        let (h, qr, kvr, f) = (spec.hidden, spec.q_rows(), spec.kv_rows(), spec.ffn);
        let add1 = spec.norm_add_one;
        let mut layers = Vec::with_capacity(spec.layers.len());
        for i in 0..spec.layers.len() {
            let n = |s: &str| format!("model.layers.{i}.{s}");
            let (post_attn_norm, ffn_norm, post_ffn_norm) = if spec.sandwich_norms {
                (
                    Some(vector(&n("post_attention_layernorm.weight"), add1)?),
                    vector(&n("pre_feedforward_layernorm.weight"), add1)?,
                    Some(vector(&n("post_feedforward_layernorm.weight"), add1)?),
                )
            } else {
                (
                    None,
                    vector(&n("post_attention_layernorm.weight"), add1)?,
                    None,
                )
            };
            let qk = spec.qk_norm != QkNorm::Off;
            let mixing = match spec.layers[i].mixer {
                Mixer::Attention => Mixing::Attention(Box::new(Attention {
                    q: weight(
                        &n("self_attn.q_proj.weight"),
                        if spec.attn_output_gate { 2 * qr } else { qr },
                        h,
                    )?,
                    k: weight(&n("self_attn.k_proj.weight"), kvr, h)?,
                    v: weight(&n("self_attn.v_proj.weight"), kvr, h)?,
                    o: weight(&n("self_attn.o_proj.weight"), h, qr)?,
                    q_bias: opt_vector(&n("self_attn.q_proj.bias"), false)?,
                    k_bias: opt_vector(&n("self_attn.k_proj.bias"), false)?,
                    v_bias: opt_vector(&n("self_attn.v_proj.bias"), false)?,
                    q_norm: if qk {
                        Some(vector(&n("self_attn.q_norm.weight"), add1)?)
                    } else {
                        None
                    },
                    k_norm: if qk {
                        Some(vector(&n("self_attn.k_norm.weight"), add1)?)
                    } else {
                        None
                    },
                })),
                Mixer::ShortConv { kernel } => {
                    let name = n("shortconv.conv.weight");
                    let taps = vector(&name, false)?;
                    if kernel == 0 || taps.len() != h * kernel {
                        return Err(Error::Pack {
                            pack: dir.clone(),
                            what: format!(
                                "{name}: {} values, expected {h} channels × {kernel} taps",
                                taps.len()
                            ),
                        });
                    }
                    let mut by_tap = vec![0f32; h * kernel];
                    for (c, row) in taps.chunks_exact(kernel).enumerate() {
                        for (j, &w) in row.iter().enumerate() {
                            by_tap[j * h + c] = w;
                        }
                    }
                    Mixing::ShortConv(Box::new(ShortConv {
                        in_proj: weight(&n("shortconv.in_proj.weight"), 3 * h, h)?,
                        out_proj: weight(&n("shortconv.out_proj.weight"), h, h)?,
                        taps: by_tap,
                        kernel,
                    }))
                }
                Mixer::GatedDeltaNet {
                    key_heads,
                    key_dim,
                    value_heads,
                    value_dim,
                    kernel,
                    value_order,
                } => {
                    let dims = DeltaDims {
                        nk: key_heads,
                        dk: key_dim,
                        nv: value_heads,
                        dv: value_dim,
                        kernel,
                        order: value_order,
                    };
                    let bad = |what: String| Error::Pack {
                        pack: dir.clone(),
                        what,
                    };
                    if key_heads == 0 || value_heads % key_heads != 0 || kernel == 0 {
                        return Err(bad(format!(
                            "layer {i}: {value_heads} value heads over {key_heads} key heads, {kernel} taps"
                        )));
                    }
                    let (c, vd) = (dims.channels(), value_heads * value_dim);
                    let sized = |name: String, len: usize| -> Result<Vec<f32>> {
                        let v = vector(&name, false)?;
                        if v.len() != len {
                            return Err(bad(format!("{name}: {} values, expected {len}", v.len())));
                        }
                        Ok(v)
                    };
                    // α and β: the exact bf16 copy where the pack has one (FastFlowLM writes
                    // both), else the tiles.
                    let small = |proj: &str| -> Result<Weight> {
                        let copy = n(&format!("linear_attn.{proj}.bf16.weight"));
                        if pack.stored(&copy).is_some() {
                            weight(&copy, value_heads, h)
                        } else {
                            weight(&n(&format!("linear_attn.{proj}.weight")), value_heads, h)
                        }
                    };
                    Mixing::DeltaNet(Box::new(DeltaNet {
                        qkv: weight(&n("linear_attn.qkv_proj.weight"), c, h)?,
                        z: weight(&n("self_attn.gate_proj.weight"), vd, h)?,
                        alpha: small("ssm_alpha_proj")?,
                        beta: small("ssm_beta_proj")?,
                        out: weight(&n("linear_attn.ssm_out_proj.weight"), h, vd)?,
                        taps: sized(n("linear_attn.ssm_conv1d.weight"), kernel * c)?,
                        ssm_a: sized(n("linear_attn.ssm_a"), value_heads)?,
                        dt_bias: sized(n("linear_attn.ssm_dt.bias"), value_heads)?,
                        norm: sized(n("linear_attn.ssm_norm.weight"), value_dim)?,
                        dims,
                    }))
                }
            };
            layers.push(Layer {
                attn_norm: vector(&n("input_layernorm.weight"), add1)?,
                mixing,
                post_attn_norm,
                ffn_norm,
                post_ffn_norm,
                gate: weight(&n("mlp.gate_proj.weight"), f, h)?,
                up: weight(&n("mlp.up_proj.weight"), f, h)?,
                down: weight(&n("mlp.down_proj.weight"), h, f)?,
            });
        }
        let embed_name = crate::pack::EMBEDDING_NAMES
            .into_iter()
            .find(|n| pack.stored(n).is_some())
            .unwrap_or(crate::pack::EMBEDDING_NAMES[0]);
        let es = pack.stored(embed_name).ok_or_else(|| missing(embed_name))?;
        if es.dtype != "BF16" || es.range.len() != spec.vocab * h * 2 {
            return Err(Error::Pack {
                pack: dir.clone(),
                what: format!(
                    "{embed_name}: expected {}×{h} BF16, found {} {:?}",
                    spec.vocab, es.dtype, es.shape
                ),
            });
        }
        let embed = es.range.clone();
        let head = if pack.stored("lm_head.weight").is_some() {
            weight("lm_head.weight", spec.vocab, h)?
        } else {
            Weight::Bf16 {
                rows: spec.vocab,
                k: h,
                range: embed.clone(),
                scale: 1.0 / spec.tied_head_divisor,
            }
        };
        let norm = vector("model.norm.weight", add1)?;
        let exact_head = (spec.tied_head && matches!(head, Weight::Tiled { .. }))
            .then_some(1.0 / spec.tied_head_divisor);
        Ok(Model {
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
            stats: std::sync::Mutex::new(None),
        })
    }

    /// Starts collecting input statistics of every matrix product (see [`InputStats`]), with
    /// second moments when `gram`. While collecting, [`Model::forward`] records the head's
    /// inputs and returns no logits.
    pub fn collect_stats(&self, gram: bool) {
        if let Ok(mut s) = self.stats.lock() {
            *s = Some(Collecting {
                gram,
                ..Collecting::default()
            });
        }
    }

    /// The statistics collected since [`Model::collect_stats`], ending the collection.
    pub fn take_stats(&self) -> ActStats {
        let Some(c) = self.stats.lock().ok().and_then(|mut s| s.take()) else {
            return ActStats::new();
        };
        let mut per = c.per;
        for (_, (mut g, names)) in c.grams {
            let k = (g.len() as f64).sqrt() as usize;
            for i in 0..k {
                for j in 0..i {
                    g[i * k + j] = g[j * k + i];
                }
            }
            let g = Arc::new(g);
            for name in names {
                if let Some(e) = per.get_mut(&name) {
                    e.gram = Some(g.clone());
                }
            }
        }
        per
    }

    fn record(&self, names: &[String], x: &[f32], n: usize) {
        let Ok(mut guard) = self.stats.lock() else {
            return;
        };
        let Some(c) = guard.as_mut() else {
            return;
        };
        let k = x.len() / n.max(1);
        for name in names {
            let e = c.per.entry(name.clone()).or_insert_with(|| InputStats {
                sum_sq: vec![0f64; k],
                ..InputStats::default()
            });
            for row in x.chunks_exact(k) {
                for (s, &v) in e.sum_sq.iter_mut().zip(row) {
                    *s += (v as f64) * (v as f64);
                }
            }
            e.rows += n as u64;
        }
        if c.gram
            && let Some(first) = names.first()
        {
            let (g, _) = c
                .grams
                .entry(first.clone())
                .or_insert_with(|| (vec![0f64; k * k], names.to_vec()));
            add_gram(g, x, n, k);
        }
    }

    fn recording(&self) -> bool {
        self.stats.lock().map(|s| s.is_some()).unwrap_or(false)
    }

    /// Re-scores the `k` best candidates of each token's tiled head against the exact head (the
    /// bf16 embedding of a tied model; see [`crate::head`]); 0 turns it off. Returns the count in
    /// effect: 0 when the head is not tiles of a tied embedding, where nothing is approximate or
    /// nothing exact is in the pack.
    pub fn set_head_rescore(&mut self, k: usize) -> usize {
        self.rescore = if self.exact_head.is_some() {
            k.min(self.spec.vocab)
        } else {
            0
        };
        self.rescore
    }

    /// Candidates per token re-scored against the exact head (0 = none).
    pub fn head_rescore(&self) -> usize {
        self.rescore
    }

    /// The host kernel path in use (embedding-sized bf16 products and the self-check).
    pub fn kernel_path(&self) -> KPath {
        self.path
    }

    /// Runs the tiled products on `backend` from now on (the NPU backend, or its emulation).
    pub fn set_backend(&mut self, backend: Arc<dyn Backend>) {
        self.backend = backend;
    }

    /// The backend running the tiled products.
    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    fn all_weights(&self) -> Vec<&Weight> {
        let mut v = vec![&self.head];
        for l in &self.layers {
            match &l.mixing {
                Mixing::Attention(a) => v.extend([&a.q, &a.k, &a.v, &a.o]),
                Mixing::ShortConv(c) => v.extend([&c.in_proj, &c.out_proj]),
                Mixing::DeltaNet(d) => v.extend([&d.qkv, &d.z, &d.alpha, &d.beta, &d.out]),
            }
            v.extend([&l.gate, &l.up, &l.down]);
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
                let data = &self.pack.map()[range.clone()];
                let m = QMatrix::new(*layout, *rows, *k, data)
                    .ok_or_else(|| Error::Internal("matrix size changed".into()))?;
                let r = kernels::self_check(&m, self.path);
                verdict(r.max_rel, format!("a {} matrix ({rows}×{k})", layout.name))?;
                worst = worst.max(r.max_rel);
                count += 1;
            }
        }
        if let Some(m) = self.pack.head_scan() {
            let r = kernels::scan::self_check(&m, self.path);
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

    /// Bytes of KV cache and recurrent state a `capacity`-token session holds.
    pub fn session_bytes(&self, capacity: usize) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .map(|l| match &l.mixing {
                Mixing::Attention(_) => 2 * capacity * self.spec.kv_rows(),
                m => m.conv_state(self.spec.hidden) + m.ssm_state(),
            })
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// A session whose cache pages are all resident now: a server's memory is then fixed when
    /// it starts, not creeping up as sequences grow into untouched pages.
    pub fn resident_session(&self, capacity: usize) -> Session {
        let mut s = self.session(capacity);
        for buf in s.k.iter_mut().chain(s.v.iter_mut()) {
            // One write per 4 KiB page; black_box keeps the zero stores from being elided.
            for i in (0..buf.len()).step_by(1024) {
                buf[i] = std::hint::black_box(0.0);
            }
        }
        s
    }

    /// A fresh sequence with room for `capacity` tokens.
    pub fn session(&self, capacity: usize) -> Session {
        let kvr = self.spec.kv_rows();
        let cache = |l: &Layer| match &l.mixing {
            Mixing::Attention(_) => vec![0f32; capacity * kvr],
            _ => Vec::new(),
        };
        Session {
            pos: 0,
            capacity,
            k: self.layers.iter().map(cache).collect(),
            v: self.layers.iter().map(cache).collect(),
            conv: self
                .layers
                .iter()
                .map(|l| vec![0f32; l.mixing.conv_state(self.spec.hidden)])
                .collect(),
            ssm: self
                .layers
                .iter()
                .map(|l| vec![0f32; l.mixing.ssm_state()])
                .collect(),
            reads_top: 0,
        }
    }

    fn matmul(&self, w: &Weight, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        match w {
            Weight::Tiled {
                layout,
                rows,
                k,
                range,
            } => {
                let data = &self.pack.map()[range.clone()];
                let m = QMatrix::new(*layout, *rows, *k, data)
                    .ok_or_else(|| Error::Internal("matrix size changed".into()))?;
                self.backend.matmul_many(&[m], x, n, &mut [y])
            }
            Weight::Bf16 {
                rows,
                k,
                range,
                scale,
            } => {
                let data = &self.pack.map()[range.clone()];
                let (rows, k, scale) = (*rows, *k, *scale);
                // Rows in parallel, each converted once into a per-thread scratch row and
                // multiplied with every token; results land row-major, then transpose.
                let mut by_row = vec![0f32; rows * n];
                by_row
                    .par_chunks_mut(n)
                    .enumerate()
                    .with_min_len(256)
                    .for_each_init(
                        || vec![0f32; k],
                        |row, (r, out)| {
                            for (v, c) in row
                                .iter_mut()
                                .zip(data[r * k * 2..(r + 1) * k * 2].chunks_exact(2))
                            {
                                *v = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
                            }
                            for (t, o) in out.iter_mut().enumerate() {
                                *o = ops::dot(row, &x[t * k..(t + 1) * k]) * scale;
                            }
                        },
                    );
                for (r, vals) in by_row.chunks_exact(n).enumerate() {
                    for (t, &v) in vals.iter().enumerate() {
                        y[t * rows + r] = v;
                    }
                }
                Ok(())
            }
        }
    }

    /// `ys[i] = ws[i]·x` for weights sharing K: one backend call when all are tiled.
    fn matmul_many(
        &self,
        ws: &[&Weight],
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<()> {
        let mats: Vec<QMatrix<'_>> = ws
            .iter()
            .filter_map(|w| match w {
                Weight::Tiled {
                    layout,
                    rows,
                    k,
                    range,
                } => QMatrix::new(*layout, *rows, *k, &self.pack.map()[range.clone()]),
                Weight::Bf16 { .. } => None,
            })
            .collect();
        if mats.len() == ws.len() {
            return self.backend.matmul_many(&mats, x, n, ys);
        }
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            self.matmul(w, x, n, y)?;
        }
        Ok(())
    }

    /// Runs `tokens` at positions `s.pos..`, appending to the cache. Returns the logits of every
    /// token (`all`) or of the last one, row-major `[tokens][vocab]`.
    pub fn forward(&self, s: &mut Session, tokens: &[u32], all: bool) -> Result<Vec<f32>> {
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let rows: Vec<(usize, u32)> = tokens.iter().map(|&t| (0, t)).collect();
        let want: Vec<usize> = if all { (0..n).collect() } else { vec![n - 1] };
        self.forward_batch(&mut [s], &rows, &want)
    }

    /// Runs one batch of rows from several sequences at once: row `(i, token)` appends `token`
    /// to `sessions[i]` at its next position (rows of one sequence in order). Every matrix is read
    /// once for the whole batch, so decoding many sequences together costs little more than one
    /// (continuous batching), and a prompt chunk can ride along with other sequences' decode rows.
    /// Returns the logits of the rows in `want`, row-major `[want][vocab]`; each row's numbers are
    /// exactly what a single-sequence [`Model::forward`] gives it.
    pub fn forward_batch(
        &self,
        sessions: &mut [&mut Session],
        rows: &[(usize, u32)],
        want: &[usize],
    ) -> Result<Vec<f32>> {
        if rayon::current_thread_index().is_some() {
            return self.forward_batch_here(sessions, rows, want);
        }
        // Run the whole pass on a worker of the pool: the ~4 parallel products per layer then
        // start there instead of each handing work over from this thread and waking it again.
        let mut out = None;
        rayon::scope(|s| s.spawn(|_| out = Some(self.forward_batch_here(sessions, rows, want))));
        out.unwrap_or_else(|| Err(Error::Internal("the forward pass did not run".into())))
    }

    /// One attention layer's mixing for the rows at `seq_pos` (sequence, position): q/k/v from
    /// the normed input `hbuf`, biases, q/k norms and RoPE, this pass's keys and values written
    /// into each session's cache, and the attention over it into `sc.att`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        li: usize,
        l: &Attention,
        ls: &LayerSpec,
        hbuf: &[f32],
        sessions: &mut [&mut Session],
        seq_pos: &[(usize, usize)],
        sc: &mut AttnScratch,
    ) -> Result<()> {
        let sp = &self.spec;
        let n = seq_pos.len();
        let (d, nh, nkv) = (sp.head_dim, sp.heads, sp.kv_heads);
        let (qr, kvr) = (sp.q_rows(), sp.kv_rows());
        let rope = &sp.ropes[ls.rope];
        let AttnScratch {
            q,
            k,
            v,
            att,
            gate,
            angles,
        } = sc;
        if sp.attn_output_gate {
            // q_proj's rows are all q, then all gates (the pack's stacked order).
            let mut qg = vec![0f32; n * 2 * qr];
            self.matmul_many(
                &[&l.q, &l.k, &l.v],
                hbuf,
                n,
                &mut [&mut qg[..], &mut k[..], &mut v[..]],
            )?;
            gate.resize(n * qr, 0.0);
            for ((row, qt), gt) in qg
                .chunks_exact(2 * qr)
                .zip(q.chunks_exact_mut(qr))
                .zip(gate.chunks_exact_mut(qr))
            {
                qt.copy_from_slice(&row[..qr]);
                gt.copy_from_slice(&row[qr..]);
            }
        } else {
            self.matmul_many(
                &[&l.q, &l.k, &l.v],
                hbuf,
                n,
                &mut [&mut q[..], &mut k[..], &mut v[..]],
            )?;
        }
        for (buf, bias) in [
            (&mut *q, &l.q_bias),
            (&mut *k, &l.k_bias),
            (&mut *v, &l.v_bias),
        ] {
            if let Some(b) = bias {
                for row in buf.chunks_exact_mut(b.len()) {
                    for (a, &bb) in row.iter_mut().zip(b) {
                        *a += bb;
                    }
                }
            }
        }
        let norm_heads = |buf: &mut [f32], w: &Option<Vec<f32>>| {
            if let Some(w) = w {
                ops::rmsnorm_inplace(buf, w, sp.eps);
            }
        };
        if sp.qk_norm == QkNorm::BeforeRope {
            norm_heads(q, &l.q_norm);
            norm_heads(k, &l.k_norm);
        }
        let angles = angles[ls.rope].get_or_insert_with(|| {
            seq_pos
                .iter()
                .map(|&(_, p)| ops::rope_angles(p, &rope.inv_freq, rope.attention_factor))
                .collect()
        });
        let rotate = |((qt, kt), a): ((&mut [f32], &mut [f32]), &ops::RopeAngles)| {
            for head in qt.chunks_exact_mut(d).chain(kt.chunks_exact_mut(d)) {
                a.rotate(head);
            }
        };
        if n >= PARALLEL_ROWS {
            q.par_chunks_exact_mut(qr)
                .zip(k.par_chunks_exact_mut(kvr))
                .zip(angles.par_iter())
                .for_each(rotate);
        } else {
            q.chunks_exact_mut(qr)
                .zip(k.chunks_exact_mut(kvr))
                .zip(angles.iter())
                .for_each(rotate);
        }
        if sp.qk_norm == QkNorm::AfterRope {
            norm_heads(q, &l.q_norm);
            norm_heads(k, &l.k_norm);
        }
        for (t, &(i, p)) in seq_pos.iter().enumerate() {
            let s = &mut sessions[i];
            s.k[li][p * kvr..(p + 1) * kvr].copy_from_slice(&k[t * kvr..(t + 1) * kvr]);
            s.v[li][p * kvr..(p + 1) * kvr].copy_from_slice(&v[t * kvr..(t + 1) * kvr]);
        }
        let caches: Vec<(&[f32], &[f32])> = sessions
            .iter()
            .map(|s| (&s.k[li][..], &s.v[li][..]))
            .collect();
        let group = (nh / nkv.max(1)).max(1);
        let q = &*q;
        // One task per (row, KV head) reads each cached key and value once for the whole GQA
        // group of query heads; with fewer such tasks than threads (one KV head, one token) the
        // heads run as separate tasks. Both orders do exactly the same arithmetic per head.
        let grouped = group > 1 && n * nkv >= rayon::current_num_threads();
        let heads_per_task = if grouped { group } else { 1 };
        att.par_chunks_mut(heads_per_task * d)
            .enumerate()
            .for_each(|(idx, out)| {
                let first = idx * heads_per_task;
                let (t, h0) = (first / nh, first % nh);
                let (i, p) = seq_pos[t];
                let (kc, vc) = caches[i];
                let lo = ls.window.map(|w| (p + 1).saturating_sub(w)).unwrap_or(0);
                let kvh = h0 / group;
                let span = p + 1 - lo;
                let mut sc = vec![0f32; heads_per_task * span];
                for (jj, j) in (lo..=p).enumerate() {
                    let kj = &kc[j * kvr + kvh * d..j * kvr + kvh * d + d];
                    for g in 0..heads_per_task {
                        let hh = h0 + g;
                        let qv = &q[t * qr + hh * d..t * qr + hh * d + d];
                        let mut s = ops::dot(qv, kj) * sp.attn_scale;
                        if let Some(cap) = sp.attn_softcap {
                            s = cap * (s / cap).tanh();
                        }
                        sc[g * span + jj] = s;
                    }
                }
                for row in sc.chunks_exact_mut(span) {
                    ops::softmax(row);
                }
                out.fill(0.0);
                for (jj, j) in (lo..=p).enumerate() {
                    let vj = &vc[j * kvr + kvh * d..j * kvr + kvh * d + d];
                    for (g, o) in out.chunks_exact_mut(d).enumerate() {
                        ops::axpy(o, sc[g * span + jj], vj);
                    }
                }
            });
        if sp.attn_output_gate {
            for (a, &g) in att.iter_mut().zip(gate.iter()) {
                *a *= ops::sigmoid(g);
            }
        }
        Ok(())
    }

    fn forward_batch_here(
        &self,
        sessions: &mut [&mut Session],
        rows: &[(usize, u32)],
        want: &[usize],
    ) -> Result<Vec<f32>> {
        let sp = &self.spec;
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        // Each row's sequence and position; refuse before touching any cache.
        let mut next: Vec<usize> = sessions.iter().map(|s| s.pos).collect();
        let mut seq_pos = Vec::with_capacity(n);
        for &(i, _) in rows {
            let p = next.get_mut(i).ok_or_else(|| Error::Request {
                field: "batch",
                reason: format!("row names sequence {i} of {}", sessions.len()),
            })?;
            seq_pos.push((i, *p));
            *p += 1;
        }
        for (s, &end) in sessions.iter().zip(&next) {
            if end > s.capacity {
                return Err(Error::Request {
                    field: "context",
                    reason: format!(
                        "{} tokens in context plus {} new exceed the {}-token context",
                        s.pos,
                        end - s.pos,
                        s.capacity
                    ),
                });
            }
        }
        if let Some(&w) = want.iter().find(|&&w| w >= n) {
            return Err(Error::Request {
                field: "batch",
                reason: format!("logits asked for row {w} of {n}"),
            });
        }
        let h = sp.hidden;
        let (qr, kvr) = (sp.q_rows(), sp.kv_rows());
        let emb = &self.pack.map()[self.embed.clone()];
        let mut x = vec![0f32; n * h];
        for (t, &(_, tok)) in rows.iter().enumerate() {
            let id = tok as usize;
            if id >= sp.vocab {
                return Err(Error::Request {
                    field: "tokens",
                    reason: format!("token id {id} is outside the {}-token vocabulary", sp.vocab),
                });
            }
            for (j, c) in emb[id * h * 2..(id + 1) * h * 2]
                .chunks_exact(2)
                .enumerate()
            {
                x[t * h + j] = half::bf16::from_le_bytes([c[0], c[1]]).to_f32() * sp.embed_scale;
            }
        }
        let mut hbuf = vec![0f32; n * h];
        let mut scratch = AttnScratch {
            q: vec![0f32; n * qr],
            k: vec![0f32; n * kvr],
            v: vec![0f32; n * kvr],
            att: vec![0f32; n * qr],
            gate: Vec::new(),
            angles: vec![None; sp.ropes.len()],
        };
        let mut o = vec![0f32; n * h];
        let mut g = vec![0f32; n * sp.ffn];
        let mut u = vec![0f32; n * sp.ffn];
        // Short-convolution states as this pass leaves them, written back only when the whole
        // pass succeeds (a refused pass leaves every session as it was).
        let mut conv_states: Vec<(usize, Vec<Vec<f32>>)> = Vec::new();
        let mut ssm_states: Vec<(usize, Vec<Vec<f32>>)> = Vec::new();
        for (li, (l, ls)) in self.layers.iter().zip(&sp.layers).enumerate() {
            ops::rmsnorm(&x, &l.attn_norm, sp.eps, &mut hbuf);
            let rec = self.recording();
            let lname = |s: &str| format!("model.layers.{li}.{s}");
            match &l.mixing {
                Mixing::Attention(a) => {
                    if rec {
                        self.record(
                            &[
                                lname("self_attn.q_proj.weight"),
                                lname("self_attn.k_proj.weight"),
                                lname("self_attn.v_proj.weight"),
                            ],
                            &hbuf,
                            n,
                        );
                    }
                    self.attend(li, a, ls, &hbuf, sessions, &seq_pos, &mut scratch)?;
                    if rec {
                        self.record(&[lname("self_attn.o_proj.weight")], &scratch.att, n);
                    }
                    self.matmul(&a.o, &scratch.att, n, &mut o)?;
                }
                Mixing::ShortConv(c) => {
                    if rec {
                        self.record(&[lname("shortconv.in_proj.weight")], &hbuf, n);
                    }
                    let mut bcx = vec![0f32; n * 3 * h];
                    self.matmul(&c.in_proj, &hbuf, n, &mut bcx)?;
                    let mut states: Vec<Vec<f32>> =
                        sessions.iter().map(|s| s.conv[li].clone()).collect();
                    let mut y = vec![0f32; n * h];
                    short_conv(c, h, &bcx, &seq_pos, &mut states, &mut y);
                    conv_states.push((li, states));
                    if rec {
                        self.record(&[lname("shortconv.out_proj.weight")], &y, n);
                    }
                    self.matmul(&c.out_proj, &y, n, &mut o)?;
                }
                Mixing::DeltaNet(d) => {
                    let dd = d.dims;
                    if rec {
                        self.record(
                            &[
                                lname("linear_attn.qkv_proj.weight"),
                                lname("self_attn.gate_proj.weight"),
                                lname("linear_attn.ssm_alpha_proj.weight"),
                                lname("linear_attn.ssm_beta_proj.weight"),
                            ],
                            &hbuf,
                            n,
                        );
                    }
                    let vd = dd.nv * dd.dv;
                    let mut qkv = vec![0f32; n * dd.channels()];
                    let mut z = vec![0f32; n * vd];
                    let mut alpha = vec![0f32; n * dd.nv];
                    let mut beta = vec![0f32; n * dd.nv];
                    self.matmul_many(&[&d.qkv, &d.z], &hbuf, n, &mut [&mut qkv[..], &mut z[..]])?;
                    self.matmul_many(
                        &[&d.alpha, &d.beta],
                        &hbuf,
                        n,
                        &mut [&mut alpha[..], &mut beta[..]],
                    )?;
                    let mut conv: Vec<Vec<f32>> =
                        sessions.iter().map(|s| s.conv[li].clone()).collect();
                    let mut ssm: Vec<Vec<f32>> =
                        sessions.iter().map(|s| s.ssm[li].clone()).collect();
                    let mut y = vec![0f32; n * vd];
                    let inputs = DeltaInputs {
                        qkv: &qkv,
                        z: &z,
                        alpha: &alpha,
                        beta: &beta,
                    };
                    delta_net(d, inputs, &seq_pos, &mut conv, &mut ssm, &mut y, sp.eps);
                    conv_states.push((li, conv));
                    ssm_states.push((li, ssm));
                    if rec {
                        self.record(&[lname("linear_attn.ssm_out_proj.weight")], &y, n);
                    }
                    self.matmul(&d.out, &y, n, &mut o)?;
                }
            }
            add_branch(&mut x, &mut o, l.post_attn_norm.as_deref(), sp.eps);
            ops::rmsnorm(&x, &l.ffn_norm, sp.eps, &mut hbuf);
            if rec {
                self.record(
                    &[lname("mlp.gate_proj.weight"), lname("mlp.up_proj.weight")],
                    &hbuf,
                    n,
                );
            }
            self.matmul_many(&[&l.gate, &l.up], &hbuf, n, &mut [&mut g[..], &mut u[..]])?;
            let gate = |(g, u): (&mut [f32], &[f32])| {
                for (a, &b) in g.iter_mut().zip(u) {
                    *a = match sp.act {
                        Act::Silu => ops::silu(*a),
                        Act::GeluTanh => ops::gelu_tanh(*a),
                    } * b;
                }
            };
            if n >= PARALLEL_ROWS {
                g.par_chunks_mut(sp.ffn)
                    .zip(u.par_chunks(sp.ffn))
                    .for_each(gate);
            } else {
                gate((&mut g[..], &u[..]));
            }
            if rec {
                self.record(&[lname("mlp.down_proj.weight")], &g, n);
            }
            self.matmul(&l.down, &g, n, &mut o)?;
            add_branch(&mut x, &mut o, l.post_ffn_norm.as_deref(), sp.eps);
        }
        for (li, states) in conv_states {
            for (s, st) in sessions.iter_mut().zip(states) {
                s.conv[li] = st;
            }
        }
        for (li, states) in ssm_states {
            for (s, st) in sessions.iter_mut().zip(states) {
                s.ssm[li] = st;
            }
        }
        for (s, &end) in sessions.iter_mut().zip(&next) {
            s.pos = end;
        }
        if want.is_empty() {
            // A prompt chunk that needs no logits (its prompt goes on in a later pass): the
            // caches and states above are all it produces.
            return Ok(Vec::new());
        }
        let mut xs = Vec::with_capacity(want.len() * h);
        for &t in want {
            xs.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        ops::rmsnorm_inplace(&mut xs, &self.norm, sp.eps);
        if self.recording() {
            // Collecting statistics needs the head's inputs, not its outputs: skip the product.
            self.record(&["lm_head.weight".to_string()], &xs, want.len());
            return Ok(Vec::new());
        }
        let reads: Vec<usize> = want
            .iter()
            .map(|&w| sessions[rows[w].0].reads_top)
            .collect();
        self.head_logits(&reads, &xs)
    }

    /// The head's logits for `reads.len()` final hidden states `xs`, row-major `[row][vocab]`.
    /// Each row is ranked by what its own reader needs: a reader that only uses the `reads[i]`
    /// best candidates (at most the re-scored count) gets the scan head's ranking with exact
    /// candidates, every other row the full head. The rows of each kind run as one product, and
    /// a row's numbers never depend on the other rows of the batch.
    fn head_logits(&self, reads: &[usize], xs: &[f32]) -> Result<Vec<f32>> {
        let (h, vocab) = (self.spec.hidden, self.spec.vocab);
        let n = reads.len();
        let mut logits = vec![0f32; n * vocab];
        let scan = self.pack.head_scan();
        let by_scan: Vec<bool> = reads
            .iter()
            .map(|&k| scan.is_some() && k > 0 && k <= self.rescore)
            .collect();
        for kind in [true, false] {
            let idx: Vec<usize> = (0..n).filter(|&i| by_scan[i] == kind).collect();
            if idx.is_empty() {
                continue;
            }
            // The common case, every row of one kind, runs in place; a mix gathers each kind.
            let whole = idx.len() == n;
            let gathered: Vec<f32>;
            let gx = if whole {
                xs
            } else {
                gathered = idx
                    .iter()
                    .flat_map(|&i| &xs[i * h..(i + 1) * h])
                    .copied()
                    .collect();
                &gathered[..]
            };
            let mut part = if whole {
                std::mem::take(&mut logits)
            } else {
                vec![0f32; idx.len() * vocab]
            };
            match scan.filter(|_| kind) {
                Some(scan) => scan.matmul(self.path, gx, idx.len(), &mut part),
                None => self.matmul(&self.head, gx, idx.len(), &mut part)?,
            }
            if let (Some(scale), k) = (self.exact_head, self.rescore) {
                let exact = crate::head::ExactHead {
                    rows: &self.pack.map()[self.embed.clone()],
                    k: h,
                    scale,
                };
                crate::head::rescore(&mut part, gx, idx.len(), exact, k, kind);
            }
            if whole {
                logits = part;
            } else {
                for (j, &i) in idx.iter().enumerate() {
                    logits[i * vocab..(i + 1) * vocab]
                        .copy_from_slice(&part[j * vocab..(j + 1) * vocab]);
                }
            }
        }
        if let Some(cap) = self.spec.final_softcap {
            for v in logits.iter_mut() {
                *v = cap * (*v / cap).tanh();
            }
        }
        Ok(logits)
    }
}

/// Per-pass buffers of the attention layers (sized for the pass's rows).
struct AttnScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    /// The output gates (models with a gated attention output; sized when first used).
    gate: Vec<f32>,
    /// RoPE angles per table and row, made when a layer first needs them.
    angles: Vec<Option<Vec<ops::RopeAngles>>>,
}

/// The gated short convolution over the rows at `seq_pos` (rows of one sequence in order):
/// `bcx` holds each row's `in_proj` output (B, C, x; `h` each), `states[i]` sequence i's last
/// `kernel − 1` convolution inputs, advanced here row by row, and `y` receives C ⊙ conv(B ⊙ x).
/// Prefill and token-by-token steps run this same loop, so they leave the same state.
fn short_conv(
    c: &ShortConv,
    h: usize,
    bcx: &[f32],
    seq_pos: &[(usize, usize)],
    states: &mut [Vec<f32>],
    y: &mut [f32],
) {
    let kern = c.kernel;
    let mut bx = vec![0f32; h];
    for (t, &(i, _)) in seq_pos.iter().enumerate() {
        let row = &bcx[t * 3 * h..(t + 1) * 3 * h];
        let (b, rest) = row.split_at(h);
        let (gate, xs) = rest.split_at(h);
        let st = &mut states[i];
        let yt = &mut y[t * h..(t + 1) * h];
        // Every step over contiguous channels (vectorized by the compiler).
        for ((o, &bb), &xx) in bx.iter_mut().zip(b).zip(xs) {
            *o = bb * xx;
        }
        let last = &c.taps[(kern - 1) * h..kern * h];
        for ((o, &w), &v) in yt.iter_mut().zip(last).zip(&bx) {
            *o = w * v;
        }
        for j in 0..kern - 1 {
            let (w, past) = (&c.taps[j * h..(j + 1) * h], &st[j * h..(j + 1) * h]);
            for ((o, &w), &v) in yt.iter_mut().zip(w).zip(past) {
                *o += w * v;
            }
        }
        for (o, &g) in yt.iter_mut().zip(gate) {
            *o *= g;
        }
        if kern > 1 {
            st.copy_within(h.., 0);
            st[(kern - 2) * h..].copy_from_slice(&bx);
        }
    }
}

/// A gated-DeltaNet layer's projections of this pass's rows.
#[derive(Clone, Copy)]
struct DeltaInputs<'a> {
    /// `[rows][2·KD + VD]`: q, k, v before the convolution.
    qkv: &'a [f32],
    /// `[rows][VD]`: the output gate.
    z: &'a [f32],
    /// `[rows][nV]` each.
    alpha: &'a [f32],
    beta: &'a [f32],
}

/// `ln(1 + eˣ)`, linear above 20 as torch's softplus.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// The gated DeltaNet over the rows at `seq_pos` (rows of one sequence in order): the causal
/// convolution + SiLU over q, k, v (advancing `conv[i]`), L2-normalised q and k, the delta rule
/// per value head on `ssm[i]` (one task per sequence and head, each over its sequence's rows in
/// order), and the gated RMSNorm into `y` (`[rows][VD]`). Prefill and token-by-token steps run
/// the same arithmetic per row, so they leave the same state.
fn delta_net(
    d: &DeltaNet,
    x: DeltaInputs<'_>,
    seq_pos: &[(usize, usize)],
    conv: &mut [Vec<f32>],
    ssm: &mut [Vec<f32>],
    y: &mut [f32],
    eps: f32,
) {
    let dd = d.dims;
    let (c, kern) = (dd.channels(), dd.kernel);
    let (nk, dk, nv, dv) = (dd.nk, dd.dk, dd.nv, dd.dv);
    let n = seq_pos.len();
    let mut xc = vec![0f32; n * c];
    for (t, &(i, _)) in seq_pos.iter().enumerate() {
        let input = &x.qkv[t * c..(t + 1) * c];
        let st = &mut conv[i];
        let out = &mut xc[t * c..(t + 1) * c];
        let last = &d.taps[(kern - 1) * c..kern * c];
        for ((o, &w), &v) in out.iter_mut().zip(last).zip(input) {
            *o = w * v;
        }
        for j in 0..kern - 1 {
            let (w, past) = (&d.taps[j * c..(j + 1) * c], &st[j * c..(j + 1) * c]);
            for ((o, &w), &v) in out.iter_mut().zip(w).zip(past) {
                *o += w * v;
            }
        }
        for o in out.iter_mut() {
            *o = ops::silu(*o);
        }
        if kern > 1 {
            st.copy_within(c.., 0);
            st[(kern - 2) * c..].copy_from_slice(input);
        }
    }
    // q and k heads to unit length (eps 1e-6 inside the root, as transformers' l2norm); q also
    // × 1/√dk.
    let q_scale = 1.0 / (dk as f32).sqrt();
    let unit = |row: &mut [f32]| {
        for (hd, head) in row[..2 * nk * dk].chunks_exact_mut(dk).enumerate() {
            let inv = 1.0 / (ops::dot(head, head) + 1e-6).sqrt();
            let s = if hd < nk { inv * q_scale } else { inv };
            for v in head.iter_mut() {
                *v *= s;
            }
        }
    };
    if n >= PARALLEL_ROWS {
        xc.par_chunks_exact_mut(c).for_each(unit);
    } else {
        xc.chunks_exact_mut(c).for_each(unit);
    }
    let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); conv.len()];
    for (t, &(i, _)) in seq_pos.iter().enumerate() {
        rows_of[i].push(t);
    }
    let tasks: Vec<(usize, usize, &mut [f32])> = ssm
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| !rows_of[*i].is_empty())
        .flat_map(|(i, st)| {
            st.chunks_exact_mut(dk * dv)
                .enumerate()
                .map(move |(h, s)| (i, h, s))
        })
        .collect();
    let xc = &xc;
    let outs: Vec<(usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(i, h, s)| {
            let kh = dd.order.key_head(h, nk, nv);
            let rows = &rows_of[i];
            let mut out = vec![0f32; rows.len() * dv];
            let mut kv = vec![0f32; dv];
            for (r, &t) in rows.iter().enumerate() {
                let row = &xc[t * c..(t + 1) * c];
                let q = &row[kh * dk..(kh + 1) * dk];
                let k = &row[nk * dk + kh * dk..nk * dk + (kh + 1) * dk];
                let v = &row[2 * nk * dk + h * dv..2 * nk * dk + (h + 1) * dv];
                let decay = (d.ssm_a[h] * softplus(x.alpha[t * nv + h] + d.dt_bias[h])).exp();
                let beta = ops::sigmoid(x.beta[t * nv + h]);
                // S ← decay·S; kv = Sᵀk; δ = β(v − kv); S += k δᵀ; o = Sᵀq.
                kv.fill(0.0);
                for (srow, &kk) in s.chunks_exact_mut(dv).zip(k) {
                    for e in srow.iter_mut() {
                        *e *= decay;
                    }
                    ops::axpy(&mut kv, kk, srow);
                }
                for (e, &vv) in kv.iter_mut().zip(v) {
                    *e = (vv - *e) * beta;
                }
                let o = &mut out[r * dv..(r + 1) * dv];
                for ((srow, &kk), &qq) in s.chunks_exact_mut(dv).zip(k).zip(q) {
                    ops::axpy(srow, kk, &kv);
                    ops::axpy(o, qq, srow);
                }
            }
            (i, h, out)
        })
        .collect();
    let vd = nv * dv;
    for (i, h, out) in outs {
        for (&t, o) in rows_of[i].iter().zip(out.chunks_exact(dv)) {
            y[t * vd + h * dv..t * vd + (h + 1) * dv].copy_from_slice(o);
        }
    }
    // RMSNorm per head (no mean), × ssm_norm × SiLU(z).
    for (yt, zt) in y.chunks_exact_mut(vd).zip(x.z.chunks_exact(vd)) {
        for (head, zh) in yt.chunks_exact_mut(dv).zip(zt.chunks_exact(dv)) {
            let inv = 1.0 / (ops::dot(head, head) / dv as f32 + eps).sqrt();
            for ((e, &w), &g) in head.iter_mut().zip(&d.norm).zip(zh) {
                *e = *e * inv * w * ops::silu(g);
            }
        }
    }
}

#[cfg(test)]
mod gram_tests {
    use super::{ShortConv, Weight, add_gram, short_conv};

    /// The loop against LFM2's definition over a whole sequence: a causal depthwise conv1d
    /// (padding kernel − 1, the first `len` outputs) of B ⊙ x, times C.
    #[test]
    fn short_conv_is_a_causal_depthwise_convolution() {
        let (h, kern, n) = (5, 3, 7);
        let val = |i: usize| ((i * 7919 % 97) as f32 - 48.0) / 17.0;
        // `[H][kernel]` as the pack stores them; the layer holds them `[kernel][H]`.
        let taps: Vec<f32> = (0..h * kern).map(|i| val(i + 1000)).collect();
        let mut by_tap = vec![0f32; h * kern];
        for ch in 0..h {
            for j in 0..kern {
                by_tap[j * h + ch] = taps[ch * kern + j];
            }
        }
        let bcx: Vec<f32> = (0..n * 3 * h).map(val).collect();
        let unused = Weight::Bf16 {
            rows: 0,
            k: 0,
            range: 0..0,
            scale: 1.0,
        };
        let c = ShortConv {
            in_proj: unused.clone(),
            out_proj: unused,
            taps: by_tap,
            kernel: kern,
        };
        let seq: Vec<(usize, usize)> = (0..n).map(|p| (0, p)).collect();
        let mut states = vec![vec![0f32; (kern - 1) * h]];
        let mut y = vec![0f32; n * h];
        short_conv(&c, h, &bcx, &seq, &mut states, &mut y);
        let bx = |t: usize, ch: usize| (bcx[t * 3 * h + ch] * bcx[t * 3 * h + 2 * h + ch]) as f64;
        for t in 0..n {
            for ch in 0..h {
                let conv: f64 = (0..kern)
                    .filter(|&j| t + j >= kern - 1)
                    .map(|j| taps[ch * kern + j] as f64 * bx(t + j + 1 - kern, ch))
                    .sum();
                let want = bcx[t * 3 * h + h + ch] as f64 * conv;
                assert!((y[t * h + ch] as f64 - want).abs() < 1e-4, "[{t}][{ch}]");
            }
        }
        // The state is the last kernel − 1 inputs, oldest first.
        for j in 0..kern - 1 {
            for ch in 0..h {
                let want = bx(n - (kern - 1) + j, ch) as f32;
                assert!((states[0][j * h + ch] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn the_blocked_gram_is_the_plain_sum_of_outer_products() {
        let (n, k) = (37, 21);
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 113) as f32 - 56.0) / 31.0)
            .collect();
        let mut g = vec![0f64; k * k];
        add_gram(&mut g, &x, n, k);
        add_gram(&mut g, &x[..5 * k], 5, k);
        for i in 0..k {
            for j in 0..k {
                let want: f64 = (0..n)
                    .chain(0..5)
                    .map(|t| x[t * k + i] as f64 * x[t * k + j] as f64)
                    .sum();
                if j >= i {
                    assert!(
                        (g[i * k + j] - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "[{i}][{j}]"
                    );
                } else {
                    assert_eq!(g[i * k + j], 0.0, "lower triangle is filled at take");
                }
            }
        }
    }
}
