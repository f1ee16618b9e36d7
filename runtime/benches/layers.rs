//! Tokens per second by layer kind: the same model shape with every layer attention, every layer
//! LFM2's gated short convolution, LFM2's own mix (layer 0 conv, attention at 2, 5, 8, 10, 12,
//! 14), every layer Qwen3.5's gated DeltaNet, and Qwen3.5's mix (every fourth layer attention),
//! on random 5120-byte tiles (Q40_5120, as LFM2 packs ship). Baseline: the attention-only
//! model of the same shape, run in the same process, alternated with the others; reported as
//! ms per token, tokens/s and the ratio to that baseline, for decode at two context lengths and
//! for a prefill chunk.
//!
//! `cargo bench -p onebit-runtime --bench layers [-- tiny|1b]` (threads: RAYON_NUM_THREADS).
//! Shapes: `tiny` (the LFM2 oracle's: hidden 128, 4 layers) and `1b` (LFM2-1.2B's: hidden 2048,
//! FFN 8192, 32 heads of 64, 8 KV heads, 16 layers, vocabulary 65,536), its DeltaNet layers with
//! Qwen3.5-2B's linear dims (16 key and 16 value heads of 128, 4 taps).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use onebit_kernels::matmul::TileLayout;
use onebit_pack::manifest::{Manifest, TensorEntry};
use onebit_pack::spec::{Act, LayerSpec, Mixer, ModelSpec, QkNorm, RopeTable, ValueHeadOrder};
use onebit_runtime::{Model, Pack};

// The helpers the kernels' benches use: one file for both crates' benches.
#[path = "../../kernels/benches/common/mod.rs"]
mod common;

use common::{median, random_tiles};

/// One model shape.
struct Shape {
    name: &'static str,
    hidden: usize,
    ffn: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    /// Which layers are attention in the model's own mix.
    attention: Vec<bool>,
    /// Gated-DeltaNet key heads, key dim, value heads, value dim.
    gdn: [usize; 4],
}

impl Shape {
    fn delta_net(&self) -> Mixer {
        let [key_heads, key_dim, value_heads, value_dim] = self.gdn;
        Mixer::GatedDeltaNet {
            key_heads,
            key_dim,
            value_heads,
            value_dim,
            kernel: 4,
            value_order: ValueHeadOrder::Tiled,
        }
    }
}

const TILE: &str = "Q40_5120";

/// One tensor to write: name, dtype, declared shape, bytes, logical (rows, K).
type Tensor = (String, &'static str, Vec<u64>, Vec<u8>, (usize, usize));

fn spec(s: &Shape, mixers: &[Mixer]) -> ModelSpec {
    let d = s.head_dim;
    ModelSpec {
        family: "bench".into(),
        hidden: s.hidden,
        heads: s.heads,
        kv_heads: s.kv_heads,
        head_dim: d,
        ffn: s.ffn,
        vocab: s.vocab,
        eps: 1e-5,
        norm_add_one: false,
        act: Act::Silu,
        layers: mixers
            .iter()
            .map(|&mixer| LayerSpec {
                window: None,
                rope: 0,
                mixer,
            })
            .collect(),
        ropes: vec![RopeTable {
            inv_freq: (0..d / 2)
                .map(|i| 1e6f32.powf(-(2.0 * i as f32) / d as f32))
                .collect(),
            attention_factor: 1.0,
        }],
        qk_norm: QkNorm::BeforeRope,
        sandwich_norms: false,
        attn_scale: 1.0 / (d as f32).sqrt(),
        qkv_bias: false,
        embed_scale: 1.0,
        tied_head_divisor: 1.0,
        tied_head: false,
        attn_output_gate: false,
        final_softcap: None,
        attn_softcap: None,
        bos: Some(1),
        add_bos: true,
        eos: vec![2],
        context: 4096,
    }
}

/// Writes one `model.q4nx` holding every tensor either kind of layer needs, for every layer.
fn write_container(dir: &Path, s: &Shape) -> BTreeMap<String, TensorEntry> {
    let layout = TileLayout::by_name(TILE).expect("layout");
    let (h, d) = (s.hidden, s.head_dim);
    let bf = |n: usize, v: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                half::bf16::from_f32(v + ((i * 7919 % 101) as f32 - 50.0) * 1e-3).to_le_bytes()
            })
            .collect()
    };
    let mut tensors: Vec<Tensor> = vec![
        (
            "model.embed_tokens.weight".into(),
            "BF16",
            vec![s.vocab as u64, h as u64],
            bf(s.vocab * h, 0.0),
            (s.vocab, h),
        ),
        (
            "model.norm.weight".into(),
            "BF16",
            vec![h as u64],
            bf(h, 1.0),
            (1, h),
        ),
    ];
    let tiled = |name: String, rows: usize, k: usize| -> Tensor {
        let data = random_tiles(layout, rows, k);
        let n = data.len() / layout.bytes;
        (
            name,
            "I8",
            vec![n as u64, layout.bytes as u64],
            data,
            (rows, k),
        )
    };
    tensors.push(tiled("lm_head.weight".into(), s.vocab, h));
    for l in 0..s.attention.len() {
        let n = |x: &str| format!("model.layers.{l}.{x}");
        for norm in ["input_layernorm.weight", "post_attention_layernorm.weight"] {
            tensors.push((n(norm), "BF16", vec![h as u64], bf(h, 1.0), (1, h)));
        }
        for norm in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
            tensors.push((n(norm), "BF16", vec![d as u64], bf(d, 1.0), (1, d)));
        }
        for (name, rows, k) in [
            ("self_attn.q_proj.weight", s.heads * d, h),
            ("self_attn.k_proj.weight", s.kv_heads * d, h),
            ("self_attn.v_proj.weight", s.kv_heads * d, h),
            ("self_attn.o_proj.weight", h, s.heads * d),
            ("shortconv.in_proj.weight", 3 * h, h),
            ("shortconv.out_proj.weight", h, h),
            ("mlp.gate_proj.weight", s.ffn, h),
            ("mlp.up_proj.weight", s.ffn, h),
            ("mlp.down_proj.weight", h, s.ffn),
        ] {
            tensors.push(tiled(n(name), rows, k));
        }
        tensors.push((
            n("shortconv.conv.weight"),
            "BF16",
            vec![h as u64, 3],
            bf(3 * h, 0.0),
            (h, 3),
        ));
        let [nk, dk, nv, dv] = s.gdn;
        let (c, vd) = (2 * nk * dk + nv * dv, nv * dv);
        for (name, rows, k) in [
            ("linear_attn.qkv_proj.weight", c, h),
            ("self_attn.gate_proj.weight", vd, h),
            ("linear_attn.ssm_out_proj.weight", h, vd),
        ] {
            tensors.push(tiled(n(name), rows, k));
        }
        for proj in ["ssm_alpha_proj", "ssm_beta_proj"] {
            let name = n(&format!("linear_attn.{proj}.bf16.weight"));
            tensors.push((
                name,
                "BF16",
                vec![nv as u64, h as u64],
                bf(nv * h, 0.0),
                (nv, h),
            ));
        }
        for (name, shape, v) in [
            ("linear_attn.ssm_conv1d.weight", vec![4, c], 0.0),
            ("linear_attn.ssm_a", vec![nv], -0.3),
            ("linear_attn.ssm_dt.bias", vec![nv], 0.0),
            ("linear_attn.ssm_norm.weight", vec![dv], 1.0),
        ] {
            let len: usize = shape.iter().product();
            let dims = (shape[0], *shape.last().unwrap_or(&1));
            let shape = shape.iter().map(|&x| x as u64).collect();
            tensors.push((n(name), "BF16", shape, bf(len, v), dims));
        }
    }
    let mut header = serde_json::Map::new();
    let mut entries = BTreeMap::new();
    let mut at = 0usize;
    for (name, dtype, shape, data, (rows, k)) in &tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + data.len()]}),
        );
        at += data.len();
        let kind = if *dtype == "I8" { TILE } else { dtype };
        entries.insert(
            name.clone(),
            TensorEntry {
                kind: kind.into(),
                rows: *rows as u64,
                k: *k as u64,
            },
        );
    }
    let mut head = serde_json::to_vec(&header).expect("header");
    while !head.len().is_multiple_of(8) {
        head.push(b' ');
    }
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(dir.join("model.q4nx")).expect("create"));
    f.write_all(&(head.len() as u64).to_le_bytes())
        .expect("write");
    f.write_all(&head).expect("write");
    for (_, _, _, data, _) in &tensors {
        f.write_all(data).expect("write");
    }
    entries
}

/// A pack folder for `spec` sharing `container`'s model.q4nx (hard link).
fn pack(
    root: &Path,
    name: &str,
    container: &Path,
    entries: &BTreeMap<String, TensorEntry>,
    spec: ModelSpec,
) -> Model {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::hard_link(container.join("model.q4nx"), dir.join("model.q4nx")).expect("link");
    let manifest = Manifest::synthetic(spec, entries.clone());
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&manifest).expect("json"),
    )
    .expect("write");
    Model::load(Pack::open(&dir, false).expect("open")).expect("load")
}

/// Seconds per token of decode at context `ctx` (8 steps from a fork of one prefilled session),
/// and of a `chunk`-token prefill, medians of `reps` runs alternated between the models.
fn measure(models: &[(&str, Model)], ctx: usize, chunk: usize, reps: usize) -> Vec<(f64, f64)> {
    let vocab = models[0].1.spec.vocab;
    let toks: Vec<u32> = (0..ctx + chunk)
        .map(|i| (i * 31 % (vocab - 3) + 3) as u32)
        .collect();
    const STEPS: usize = 8;
    let prefilled: Vec<_> = models
        .iter()
        .map(|(_, m)| {
            let mut s = m.session(ctx + STEPS);
            m.forward(&mut s, &toks[..ctx], false).expect("context");
            s
        })
        .collect();
    let mut times = vec![(Vec::new(), Vec::new()); models.len()];
    for _ in 0..reps {
        for (i, (_, m)) in models.iter().enumerate() {
            let mut s = prefilled[i].clone();
            let t0 = Instant::now();
            for &t in &toks[ctx..ctx + STEPS] {
                m.forward(&mut s, &[t], false).expect("decode");
            }
            times[i].0.push(t0.elapsed().as_secs_f64() / STEPS as f64);
            let mut s = m.session(chunk);
            let t0 = Instant::now();
            m.forward(&mut s, &toks[..chunk], false).expect("prefill");
            times[i].1.push(t0.elapsed().as_secs_f64() / chunk as f64);
        }
    }
    times
        .into_iter()
        .map(|(d, p)| (median(d), median(p)))
        .collect()
}

fn main() {
    let which: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let lfm2_1b: Vec<bool> = (0..16)
        .map(|i| [2, 5, 8, 10, 12, 14].contains(&i))
        .collect();
    let shapes = [
        Shape {
            name: "tiny",
            hidden: 128,
            ffn: 384,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            vocab: 384,
            attention: vec![false, true, false, true],
            gdn: [2, 32, 4, 32],
        },
        Shape {
            name: "1b",
            hidden: 2048,
            ffn: 8192,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            vocab: 65_536,
            attention: lfm2_1b,
            gdn: [16, 128, 16, 128],
        },
    ];
    println!("threads {}", rayon::current_num_threads());
    for s in shapes
        .iter()
        .filter(|s| which.is_empty() || which.iter().any(|w| w == s.name))
    {
        let root = tempfile::tempdir().expect("tmp");
        let entries = write_container(root.path(), s);
        let n = s.attention.len();
        let conv = Mixer::ShortConv { kernel: 3 };
        let mix: Vec<Mixer> = s
            .attention
            .iter()
            .map(|&a| if a { Mixer::Attention } else { conv })
            .collect();
        // Qwen3.5's pattern: layer i is attention iff i % 4 == 3.
        let qwen_mix: Vec<Mixer> = (0..n)
            .map(|i| {
                if i % 4 == 3 {
                    Mixer::Attention
                } else {
                    s.delta_net()
                }
            })
            .collect();
        let models = [
            (
                "attention only",
                pack(
                    root.path(),
                    "attn",
                    root.path(),
                    &entries,
                    spec(s, &vec![Mixer::Attention; n]),
                ),
            ),
            (
                "short conv only",
                pack(
                    root.path(),
                    "conv",
                    root.path(),
                    &entries,
                    spec(s, &vec![conv; n]),
                ),
            ),
            (
                "lfm2 mix",
                pack(root.path(), "mix", root.path(), &entries, spec(s, &mix)),
            ),
            (
                "deltanet only",
                pack(
                    root.path(),
                    "gdn",
                    root.path(),
                    &entries,
                    spec(s, &vec![s.delta_net(); n]),
                ),
            ),
            (
                "qwen3.5 mix",
                pack(
                    root.path(),
                    "qmix",
                    root.path(),
                    &entries,
                    spec(s, &qwen_mix),
                ),
            ),
        ];
        let reps = if s.name == "tiny" { 21 } else { 7 };
        for (ctx, chunk) in [(64, 64), (1024, 64)] {
            let t = measure(&models, ctx, chunk, reps);
            println!(
                "{} (hidden {}, {n} layers), decode at context {ctx}, prefill chunk {chunk}:",
                s.name, s.hidden
            );
            for (i, (name, _)) in models.iter().enumerate() {
                let (dec, pre) = t[i];
                println!(
                    "  {name:<16} decode {:>8.3} ms/token {:>8.1} tok/s ({:>5.2}x attention only) | prefill {:>8.1} tok/s ({:>5.2}x)",
                    dec * 1e3,
                    1.0 / dec,
                    t[0].0 / dec,
                    1.0 / pre,
                    t[0].1 / pre
                );
            }
            let per_layer = |i: usize| t[i].0 / n as f64 * 1e3;
            println!(
                "  per layer (whole model / {n}): attention {:.3} ms, short conv {:.3} ms (conv − attention {:+.3} ms), deltanet {:.3} ms ({:+.3} ms)",
                per_layer(0),
                per_layer(1),
                per_layer(1) - per_layer(0),
                per_layer(3),
                per_layer(3) - per_layer(0)
            );
        }
    }
}
