//! Fixtures for tests of the runtime and of the crates above it (feature `testing`): a small
//! synthetic pack, a two-layer model with a windowed and a global attention layer (and its
//! short-convolution and gated-DeltaNet variants), random tiles, the pack folder and its loading,
//! plus the comparisons the tests share (the bits of logits, a prefill against single steps, two
//! sequences interleaved against each alone).

use std::collections::BTreeMap;
use std::io::Write;

use onebit_kernels::matmul::TileLayout;
use onebit_kernels::testing::random_matrix;
use onebit_pack::spec::{Act, LayerSpec, Mixer, ModelSpec, QkNorm, RopeTable, ValueHeadOrder};

use crate::model::{Model, Session};
use crate::pack::Pack;
use onebit_pack::manifest::{HEAD_SCAN_FILE, HeadScan, Manifest, TensorEntry};

/// Hidden size of the synthetic model.
pub const H: usize = 128;

/// Head dimension.
pub const D: usize = 64;

/// Query heads.
pub const NH: usize = 2;

/// Key/value heads.
pub const NKV: usize = 1;

/// FFN width.
pub const F: usize = 256;

/// Vocabulary size.
pub const V: usize = 64;

/// A two-layer model: a windowed then a global attention layer, with `qk` norms, `act` and the
/// sandwich norms when `sandwich`.
pub fn spec(qk: QkNorm, act: Act, sandwich: bool) -> ModelSpec {
    let rope = |base: f32| RopeTable {
        inv_freq: (0..D / 2)
            .map(|i| base.powf(-(2.0 * i as f32) / D as f32))
            .collect(),
        attention_factor: 1.0,
    };
    ModelSpec {
        family: "test".into(),
        hidden: H,
        heads: NH,
        kv_heads: NKV,
        head_dim: D,
        ffn: F,
        vocab: V,
        eps: 1e-6,
        norm_add_one: false,
        act,
        layers: vec![
            LayerSpec {
                window: Some(4),
                rope: 0,
                mixer: Mixer::Attention,
            },
            LayerSpec {
                window: None,
                rope: 1,
                mixer: Mixer::Attention,
            },
        ],
        ropes: vec![rope(10_000.0), rope(1_000_000.0)],
        qk_norm: qk,
        sandwich_norms: sandwich,
        attn_scale: 1.0 / 16.0,
        qkv_bias: false,
        embed_scale: 1.0,
        tied_head_divisor: 2.0,
        tied_head: true,
        attn_output_gate: false,
        final_softcap: None,
        attn_softcap: None,
        bos: Some(1),
        add_bos: true,
        eos: vec![2],
        context: 64,
    }
}

/// Writes a pack with random weights for `spec` into `dir`.
pub fn write_pack(dir: &std::path::Path, spec: &ModelSpec) {
    write_pack_with(dir, spec, false, false);
}

/// The tensors of a synthetic pack as they are made: (name, dtype, shape, bytes), with the
/// seeds of the random bf16 values and of the tiles.
struct Tensors {
    list: Vec<(String, &'static str, Vec<u64>, Vec<u8>)>,
    layout: TileLayout,
    /// Seed of the next bf16 tensor.
    seed: u64,
    /// Seed of the next tiled matrix.
    tile_seed: u64,
}

impl Tensors {
    /// A bf16 tensor `name` of `shape`, values `base` ± `spread`/2.
    fn bf16(&mut self, name: String, shape: Vec<u64>, base: f32, spread: f32) {
        self.seed += 1;
        let mut s = self.seed * 0x9E37_79B9;
        let n = shape.iter().product::<u64>() as usize;
        let data = (0..n)
            .flat_map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let v = base + spread * ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5);
                half::bf16::from_f32(v).to_le_bytes()
            })
            .collect();
        self.list.push((name, "BF16", shape, data));
    }

    /// A random `rows × k` tiled matrix `name` (seed `seed`, else the next tile seed).
    fn tiles(&mut self, name: String, rows: usize, k: usize, seed: Option<u64>) {
        let seed = seed.unwrap_or_else(|| {
            self.tile_seed += 1;
            self.tile_seed
        });
        let data = random_matrix(self.layout, rows, k, seed);
        let tiles = data.len() / self.layout.bytes;
        let shape = vec![tiles as u64, self.layout.bytes as u64];
        self.list.push((name, "I8", shape, data));
    }

    /// Layer `l`'s tensors: norms, attention and FFN tiles, and its mixer's own.
    fn layer(&mut self, l: usize, spec: &ModelSpec) {
        let n = |x: &str| format!("model.layers.{l}.{x}");
        for norm in [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight",
        ] {
            self.bf16(n(norm), vec![H as u64], 1.0, 0.2);
        }
        for norm in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
            self.bf16(n(norm), vec![D as u64], 1.0, 0.2);
        }
        for (name, rows, k) in [
            (
                "self_attn.q_proj.weight",
                dims_of("q_proj.weight", spec).0,
                H,
            ),
            ("self_attn.k_proj.weight", NKV * D, H),
            ("self_attn.v_proj.weight", NKV * D, H),
            ("self_attn.o_proj.weight", H, NH * D),
            ("mlp.gate_proj.weight", F, H),
            ("mlp.up_proj.weight", F, H),
            ("mlp.down_proj.weight", H, F),
        ] {
            self.tiles(n(name), rows, k, None);
        }
        match spec.layers[l].mixer {
            Mixer::GatedDeltaNet { kernel, .. } => self.delta_net(l, kernel),
            Mixer::ShortConv { kernel } => {
                for (name, rows, k) in [
                    ("shortconv.in_proj.weight", 3 * H, H),
                    ("shortconv.out_proj.weight", H, H),
                ] {
                    self.tiles(n(name), rows, k, None);
                }
                let shape = vec![H as u64, kernel as u64];
                self.bf16(n("shortconv.conv.weight"), shape, 0.0, 1.5);
            }
            _ => {}
        }
    }

    /// Layer `l`'s gated-DeltaNet tensors.
    fn delta_net(&mut self, l: usize, kernel: usize) {
        let n = |x: &str| format!("model.layers.{l}.{x}");
        for (name, rows, k) in [
            ("linear_attn.qkv_proj.weight", GDN_C, H),
            ("self_attn.gate_proj.weight", GDN_VD, H),
            ("linear_attn.ssm_out_proj.weight", H, GDN_VD),
        ] {
            self.tiles(n(name), rows, k, None);
        }
        for proj in ["ssm_alpha_proj", "ssm_beta_proj"] {
            let name = n(&format!("linear_attn.{proj}.bf16.weight"));
            self.bf16(name, vec![GDN_NV as u64, H as u64], 0.0, 0.5);
        }
        let vectors = [
            (
                "linear_attn.ssm_conv1d.weight",
                vec![kernel as u64, GDN_C as u64],
                0.0,
                1.5,
            ),
            ("linear_attn.ssm_a", vec![GDN_NV as u64], -0.3, 0.4),
            ("linear_attn.ssm_dt.bias", vec![GDN_NV as u64], 0.0, 1.0),
            ("linear_attn.ssm_norm.weight", vec![GDN_DV as u64], 1.0, 0.4),
        ];
        for (name, shape, base, spread) in vectors {
            self.bf16(n(name), shape, base, spread);
        }
    }
}

/// [`write_pack`], with `lm_head.weight` stored as (random) tiles when `tiled_head`, and the
/// embedding's 2-bit scan head when `scan`.
pub fn write_pack_with(dir: &std::path::Path, spec: &ModelSpec, tiled_head: bool, scan: bool) {
    let mut t = Tensors {
        list: Vec::new(),
        layout: TileLayout::by_name("Q41_1280").expect("layout"),
        seed: 1,
        tile_seed: 100,
    };
    t.bf16(
        "model.embed_tokens.weight".into(),
        vec![V as u64, H as u64],
        0.0,
        2.0,
    );
    t.bf16("model.norm.weight".into(), vec![H as u64], 1.0, 0.2);
    for l in 0..spec.layers.len() {
        t.layer(l, spec);
    }
    if tiled_head {
        t.tiles("lm_head.weight".into(), V, H, Some(77));
    }
    let entries = write_q4nx(dir, spec, &t.list);
    let manifest = Manifest {
        head_scan: scan.then(|| {
            let emb = &t.list[0].3;
            let bytes =
                onebit_kernels::matmul::scan::encode_bf16(emb, V, H, 1.0 / spec.tied_head_divisor);
            std::fs::write(dir.join(HEAD_SCAN_FILE), &bytes).expect("scan");
            HeadScan {
                file: HEAD_SCAN_FILE.into(),
                rows: V as u64,
                k: H as u64,
                blake3: blake3::hash(&bytes).to_hex().to_string(),
            }
        }),
        ..Manifest::synthetic(spec.clone(), entries)
    };
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&manifest).expect("manifest"),
    )
    .expect("write");
}

/// Writes `tensors` as `dir/model.q4nx` (a safetensors header, then the bytes); returns the
/// manifest's entry of each.
fn write_q4nx(
    dir: &std::path::Path,
    spec: &ModelSpec,
    tensors: &[(String, &str, Vec<u64>, Vec<u8>)],
) -> BTreeMap<String, TensorEntry> {
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    let mut entries = BTreeMap::new();
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + data.len()]}),
        );
        at += data.len();
        let (rows, k) = if *dtype == "I8" {
            let (r, k) = dims_of(name, spec);
            (r as u64, k as u64)
        } else if shape.len() == 2 {
            (shape[0], shape[1])
        } else {
            (1, shape[0])
        };
        let kind = if *dtype == "I8" { "Q41_1280" } else { dtype };
        entries.insert(
            name.clone(),
            TensorEntry {
                kind: kind.into(),
                rows,
                k,
            },
        );
    }
    let mut h = serde_json::to_vec(&header).expect("header");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f = std::fs::File::create(dir.join("model.q4nx")).expect("create");
    f.write_all(&(h.len() as u64).to_le_bytes()).expect("w");
    f.write_all(&h).expect("w");
    for (_, _, _, data) in tensors {
        f.write_all(data).expect("w");
    }
    entries
}

/// The gated-DeltaNet layers' geometry in these tests: 2 key heads and 4 value heads of 32.
pub const GDN_NK: usize = 2;

/// Key dimension of a gated-DeltaNet key head.
pub const GDN_DK: usize = 32;

/// Gated-DeltaNet value heads.
pub const GDN_NV: usize = 4;

/// Value dimension of a gated-DeltaNet value head.
pub const GDN_DV: usize = 32;

/// All gated-DeltaNet value dimensions together.
pub const GDN_VD: usize = GDN_NV * GDN_DV;

/// Width of the gated-DeltaNet convolution (queries, keys and values).
pub const GDN_C: usize = 2 * GDN_NK * GDN_DK + GDN_VD;

/// The (rows, columns) of the tensor named `name` in a pack for `spec`.
pub fn dims_of(name: &str, spec: &ModelSpec) -> (usize, usize) {
    if name == "lm_head.weight" {
        (V, H)
    } else if name.ends_with("linear_attn.qkv_proj.weight") {
        (GDN_C, H)
    } else if name.ends_with("self_attn.gate_proj.weight") {
        (GDN_VD, H)
    } else if name.ends_with("linear_attn.ssm_out_proj.weight") {
        (H, GDN_VD)
    } else if name.ends_with("q_proj.weight") && spec.attn_output_gate {
        (2 * NH * D, H)
    } else if name.ends_with("shortconv.in_proj.weight") {
        (3 * H, H)
    } else if name.ends_with("shortconv.out_proj.weight") {
        (H, H)
    } else if name.ends_with("q_proj.weight") {
        (NH * D, H)
    } else if name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight") {
        (NKV * D, H)
    } else if name.ends_with("o_proj.weight") {
        (H, NH * D)
    } else if name.ends_with("down_proj.weight") {
        (H, F)
    } else {
        (F, H)
    }
}

/// A pack for `spec` in a fresh temporary folder, loaded (the folder lives as long as it).
pub fn load(spec: &ModelSpec) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_pack(dir.path(), spec);
    let pack = Pack::open(dir.path(), false).expect("open");
    (dir, Model::load(pack).expect("load"))
}

/// The f32s of `v` as bits, for exact comparisons.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `toks` run as one batched prefill and as single steps, each in a fresh 32-token session:
/// (batch session, step session, batch logits, step logits), every position's logits.
pub fn prefill_and_steps(m: &Model, toks: &[u32]) -> (Session, Session, Vec<f32>, Vec<f32>) {
    let mut batch = m.session(32);
    let all = m.forward(&mut batch, toks, true).expect("batch");
    let mut step = m.session(32);
    let mut singles = Vec::new();
    for &t in toks {
        singles.extend(m.forward(&mut step, &[t], true).expect("step"));
    }
    (batch, step, all, singles)
}

/// Two sequences run interleaved in one batch and each alone; asserts each gets its
/// single-sequence logits and returns (interleaved, alone) sessions per sequence for the caller's
/// state checks.
pub fn interleaved_and_alone(m: &Model) -> [(Session, Session); 2] {
    let (mut x, mut y) = (m.session(16), m.session(16));
    let rows = [(0, 1), (1, 2), (0, 5), (1, 40), (0, 9), (1, 41)];
    let l = m
        .forward_batch(&mut [&mut x, &mut y], &rows, &[4, 5])
        .expect("mixed");
    let mut xs = m.session(16);
    let want_x = m.forward(&mut xs, &[1, 5, 9], false).expect("x alone");
    let mut ys = m.session(16);
    let want_y = m.forward(&mut ys, &[2, 40, 41], false).expect("y alone");
    assert_eq!(bits(&l[..V]), bits(&want_x));
    assert_eq!(bits(&l[V..]), bits(&want_y));
    [(x, xs), (y, ys)]
}

/// A hybrid of short-convolution and attention layers (LFM2's shape).
pub fn conv_spec() -> ModelSpec {
    let mut sp = spec(QkNorm::BeforeRope, Act::Silu, false);
    let conv = LayerSpec {
        window: None,
        rope: 0,
        mixer: Mixer::ShortConv { kernel: 3 },
    };
    sp.layers = vec![conv.clone(), sp.layers[1].clone(), conv];
    sp
}

/// A Qwen3.5-shaped hybrid: gated-DeltaNet layers around a gated attention layer, the value heads
/// in `order`.
pub fn delta_spec(order: ValueHeadOrder) -> ModelSpec {
    let mut sp = spec(QkNorm::BeforeRope, Act::Silu, false);
    let gdn = LayerSpec {
        window: None,
        rope: 0,
        mixer: Mixer::GatedDeltaNet {
            key_heads: GDN_NK,
            key_dim: GDN_DK,
            value_heads: GDN_NV,
            value_dim: GDN_DV,
            kernel: 4,
            value_order: order,
        },
    };
    sp.layers = vec![gdn.clone(), sp.layers[1].clone(), gdn];
    sp.attn_output_gate = true;
    sp
}
