//! Config semantics on every real sample config (semantics.md §7): each parses into a decision log
//! equal to its reviewed snapshot, or is refused with a message naming the reason. Plus the
//! hand-computed checks and a no-panic property test on arbitrary JSON.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use onebit_stages::semantics::{LayerKind, QkNorm, RopeScaling, SideFiles, derive};
use onebit_stages::stage::semantics::semantics_of_dir;
use serde_json::{Value, json};

fn configs() -> Vec<std::path::PathBuf> {
    let root = common::fixtures().join("configs");
    let mut out = Vec::new();
    for fam in std::fs::read_dir(&root).expect("configs") {
        let fam = fam.expect("entry").path();
        if !fam.is_dir() {
            continue;
        }
        for case in std::fs::read_dir(&fam).expect("family") {
            let case = case.expect("entry").path();
            if case.join("config.json").is_file() {
                out.push(case);
            }
        }
    }
    out.sort();
    out
}

fn rel(p: &Path) -> String {
    let root = common::fixtures().join("configs");
    p.strip_prefix(&root)
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn every_sample_config_parses_to_its_snapshot_or_is_refused_by_name() {
    let snapshots = common::fixtures().join("semantics");
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    let mut refused = BTreeSet::new();
    let mut parsed = 0;
    for dir in configs() {
        let name = rel(&dir);
        let text = match semantics_of_dir(&dir) {
            Ok(s) => {
                parsed += 1;
                s.log()
            }
            Err(onebit_stages::Error::Refused { tensor, reason, .. }) => {
                // The snapshot leaves out the file path, which depends on the checkout.
                refused.insert(name.clone());
                format!("refuse: {tensor}: {reason}\n")
            }
            Err(e) => panic!("{name}: not a refusal: {e}"),
        };
        let snap = snapshots.join(format!("{}.txt", name.replace('/', "__")));
        if update {
            std::fs::create_dir_all(&snapshots).expect("mkdir");
            std::fs::write(&snap, &text).expect("write snapshot");
            continue;
        }
        let want = std::fs::read_to_string(&snap).unwrap_or_else(|_| {
            panic!(
                "no snapshot {} (run with UPDATE_SNAPSHOTS=1 and review it)",
                snap.display()
            )
        });
        assert_eq!(
            text,
            want,
            "{name}: decision log differs from {}",
            snap.display()
        );
    }
    let want: BTreeSet<String> = [
        "gemma2/gemma-2-2b-it-partial",
        "gemma2/unsloth-gemma-2-2b-it",
        "gemma4/gemma-4-26B-A4B",
        "granite/granite-4.0-h-1b",
        "granite/granite-4.0-h-350m",
        "granite/granite-4.0-h-micro-base",
        "lfm2/LFM2-8B-A1B",
        "qwen/Qwen3-Next-80B-A3B-Instruct",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(refused, want);
    assert_eq!(parsed, 40);
}

fn sem(rel_dir: &str) -> onebit_stages::semantics::Semantics {
    semantics_of_dir(&common::fixtures().join("configs").join(rel_dir)).expect("semantics")
}

#[test]
fn hunyuan_7b_rope_base_from_theta_and_alpha() {
    let s = sem("hunyuan/Hunyuan-7B-Instruct");
    // θ·α^(D/(D−2)) with θ = 1e4, α = 1000, D = 128.
    let want = 10000f64 * 1000f64.powf(128.0 / 126.0);
    let got = s.rope["full"].base;
    assert!((got - want).abs() / want < 1e-12, "{got} vs {want}");
    assert!((got - 11_158_839.925).abs() < 0.01);
    assert_eq!(s.qk_norm, QkNorm::AfterRope);
    assert_eq!(s.tile_order, "qkv");
    // Hunyuan-MT-7B: α = 1e5 gives 1.2005e9.
    let mt = sem("hunyuan/Hunyuan-MT-7B");
    assert!(
        (mt.rope["full"].base / 1.2005e9 - 1.0).abs() < 1e-4,
        "{}",
        mt.rope["full"].base
    );
}

#[test]
fn gemma_3_270m_layer_mix_and_local_base() {
    let s = sem("gemma3/gemma-3-270m-it");
    let full: Vec<usize> = s
        .layer_kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == LayerKind::FullAttention)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(full, [5, 11, 17]);
    let sliding = s
        .layer_kinds
        .iter()
        .filter(|k| matches!(k, LayerKind::SlidingAttention { window: 512 }))
        .count();
    assert_eq!((sliding, full.len()), (15, 3), "sliding : full = 5 : 1");
    assert_eq!(s.rope["sliding"].base, 10000.0);
    assert_eq!(s.rope["sliding"].scaling, RopeScaling::None);
    assert_eq!(s.rope["full"].base, 1_000_000.0);
    // The pattern rule without layer_types gives the same mix (1B sample: pattern 6).
    let one_b = sem("gemma3/gemma-3-1b-it-partial");
    assert!(
        one_b
            .decisions
            .iter()
            .any(|d| d.name == "layer_mix" && d.source.contains("(i+1) % 6 == 0"))
    );
    assert_eq!(one_b.layer_kinds[5], LayerKind::FullAttention);
    assert!(matches!(
        one_b.layer_kinds[4],
        LayerKind::SlidingAttention { .. }
    ));
}

#[test]
fn llama_3_2_1b_llama3_scaled_inverse_frequencies() {
    let s = sem("llama/Llama-3.2-1B-partial");
    let rope = &s.rope["full"];
    // The published formula, written out independently: θ 500000, D 64, factor 32, lf 1, hf 4, L 8192.
    let (theta, d, f, lf, hf, l) = (500000f64, 64f64, 32f64, 1f64, 4f64, 8192f64);
    let formula = |i: usize| {
        let inv = theta.powf(-(2.0 * i as f64) / d);
        let lambda = 2.0 * std::f64::consts::PI / inv;
        if lambda < l / hf {
            inv
        } else if lambda > l / lf {
            inv / f
        } else {
            let s = (l / lambda - lf) / (hf - lf);
            (1.0 - s) * inv / f + s * inv
        }
    };
    // Index 0: high frequency, unchanged; 15: inside the smooth band; 31: low frequency, ÷ factor.
    for i in [0, 15, 31] {
        let (got, want) = (rope.inv_freq(i), formula(i));
        assert!(
            (got - want).abs() <= 1e-15 * want.abs().max(1e-30),
            "i {i}: {got} vs {want}"
        );
    }
    assert_eq!(rope.inv_freq(0), 1.0);
    assert!((rope.inv_freq(31) - theta.powf(-62.0 / 64.0) / 32.0).abs() < 1e-18);
    let lambda15 = 2.0 * std::f64::consts::PI * theta.powf(30.0 / 64.0);
    assert!(
        lambda15 > l / hf && lambda15 < l / lf,
        "index 15 is in the smooth band"
    );
}

#[test]
fn qwen3_5_linear_layers_are_exempt_from_the_q_gain_refusal() {
    let s = sem("qwen/Qwen3.5-27B");
    let mut names = BTreeSet::new();
    for (i, k) in s.layer_kinds.iter().enumerate() {
        names.insert(format!("model.layers.{i}.input_layernorm.weight"));
        if k.is_softmax() {
            names.insert(format!("model.layers.{i}.self_attn.q_norm.weight"));
        }
    }
    assert_eq!(
        s.layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::LinearAttention)
            .count(),
        48
    );
    s.check_pack(&names)
        .expect("linear layers carry no q gain and that is fine");
    // Remove the gain of a full-attention layer: refused with the seed's wording.
    let first_full = s
        .layer_kinds
        .iter()
        .position(LayerKind::is_softmax)
        .expect("a full layer");
    names.remove(&format!(
        "model.layers.{first_full}.self_attn.q_norm.weight"
    ));
    let r = s.check_pack(&names).expect_err("refused");
    assert_eq!(
        r.message,
        format!(
            "config.json says q and k are normalised per head (use_qk_norm when stated, else model_type/architectures) and layer {first_full} has no self_attn.q_norm.weight: normalising with an absent gain zeroes q, so this container would answer wrong text"
        )
    );
    // A layer-count mismatch is refused too.
    names.insert("model.layers.64.input_layernorm.weight".into());
    let r = s.check_pack(&names).expect_err("refused");
    assert_eq!(
        r.message,
        "config.json num_hidden_layers (64) does not match the 65 layers in model.q4nx"
    );
}

#[test]
fn bos_falls_back_to_tokenizer_config_and_conflicts_are_flagged() {
    let cfg = json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100});
    let tc = json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true});
    let tok = json!({"added_tokens": [{"id": 1, "content": "<s>"}, {"id": 2, "content": "</s>"}]});
    let side = SideFiles {
        tokenizer_config: Some(&tc),
        tokenizer: Some(&tok),
        ..Default::default()
    };
    let s = derive(&cfg, &side).expect("semantics");
    assert_eq!(
        (s.bos_id, s.eos_ids.clone(), s.add_bos),
        (Some(1), vec![2], true)
    );
    let bos = s
        .decisions
        .iter()
        .find(|d| d.name == "bos_id")
        .expect("bos");
    assert_eq!(
        bos.to_string(),
        "bos_id=1 <- tokenizer_config:bos_token \"<s>\" -> tokenizer:1 (config.json silent) [seed #2248]"
    );
    // Both files state it, differently: config.json wins, FLAGged.
    let mut cfg2 = cfg.clone();
    cfg2["bos_token_id"] = json!(7);
    let tc2 = json!({"bos_token_id": 1});
    let side = SideFiles {
        tokenizer_config: Some(&tc2),
        ..Default::default()
    };
    let s = derive(&cfg2, &side).expect("semantics");
    assert_eq!(s.bos_id, Some(7));
    let bos = s
        .decisions
        .iter()
        .find(|d| d.name == "bos_id")
        .expect("bos");
    assert_eq!(
        bos.flag.as_deref(),
        Some("tokenizer_config:bos_token_id says 1; config.json wins (semantics.md §5.2, open 1)")
    );
}

#[test]
fn unimplemented_math_is_refused_by_name() {
    let base = json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100});
    let mut yarn = base.clone();
    yarn["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
    let r = derive(&yarn, &SideFiles::default()).expect_err("refused");
    assert_eq!(
        r.to_string(),
        "refuse: llama rope_type \"yarn\" is not implemented"
    );
    let mut gqa = base.clone();
    gqa["num_key_value_heads"] = json!(3);
    let r = derive(&gqa, &SideFiles::default()).expect_err("refused");
    assert_eq!(
        r.message,
        "config.json has 4 attention heads and 3 key/value heads; the key/value heads must divide the attention heads"
    );
    let hy = json!({"model_type": "hunyuan_v1_dense", "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
        "rope_scaling": {"type": "dynamic", "factor": 2.0}});
    let r = derive(&hy, &SideFiles::default()).expect_err("refused");
    assert_eq!(
        r.message,
        "hunyuan_v1_dense rope_scaling.type \"dynamic\" has no alpha: length-dependent dynamic NTK is not implemented"
    );
    let unknown = json!({"model_type": "mamba2"});
    assert_eq!(
        derive(&unknown, &SideFiles::default())
            .expect_err("refused")
            .message,
        "model_type \"mamba2\" has no semantics table"
    );
}

/// A tiny deterministic generator of arbitrary JSON.
struct Gen(u64);
impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn value(&mut self, depth: u32) -> Value {
        match self.next() % if depth > 3 { 6 } else { 8 } {
            0 => Value::Null,
            1 => json!(self.next().is_multiple_of(2)),
            2 => json!(self.next() % 70000),
            3 => json!(self.next()),
            4 => json!((self.next() % 2000) as f64 / 7.0 - 100.0),
            5 => json!(
                [
                    "full_attention",
                    "sliding_attention",
                    "linear_attention",
                    "conv",
                    "mamba",
                    "llama",
                    "dynamic",
                    "llama3",
                    "yarn",
                    "longrope"
                ][(self.next() % 10) as usize]
            ),
            6 => Value::Array(
                (0..self.next() % 5)
                    .map(|_| self.value(depth + 1))
                    .collect(),
            ),
            _ => {
                let keys = [
                    "model_type",
                    "hidden_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "intermediate_size",
                    "vocab_size",
                    "rope_theta",
                    "rope_scaling",
                    "rope_parameters",
                    "layer_types",
                    "text_config",
                    "sliding_window",
                    "alpha",
                    "factor",
                    "rope_type",
                    "type",
                    "partial_rotary_factor",
                    "bos_token_id",
                    "eos_token_id",
                    "full_attention",
                    "linear_num_key_heads",
                ];
                let mut m = serde_json::Map::new();
                for _ in 0..self.next() % 8 {
                    let k = keys[(self.next() % keys.len() as u64) as usize];
                    m.insert(k.to_string(), self.value(depth + 1));
                }
                Value::Object(m)
            }
        }
    }
}

#[test]
fn arbitrary_json_never_panics_the_parser() {
    let mut g = Gen(0x5eed_1234_abcd_0001);
    let samples: Vec<Value> = configs()
        .iter()
        .filter_map(|d| serde_json::from_slice(&std::fs::read(d.join("config.json")).ok()?).ok())
        .collect();
    let mut outcomes = [0usize; 2];
    for i in 0..20_000 {
        let v = if i % 2 == 0 {
            g.value(0)
        } else {
            // A real config with a few keys replaced by arbitrary values.
            let mut v = samples[i % samples.len()].clone();
            if let Some(m) = v.as_object_mut() {
                let keys: Vec<String> = m.keys().cloned().collect();
                for _ in 0..(g.next() % 4 + 1) {
                    let k = &keys[(g.next() % keys.len() as u64) as usize];
                    m.insert(k.clone(), g.value(1));
                }
            }
            v
        };
        let tc = g.value(1);
        let side = SideFiles {
            tokenizer_config: Some(&tc),
            ..Default::default()
        };
        match std::panic::catch_unwind(|| derive(&v, &side).map(|s| s.log())) {
            Ok(r) => outcomes[r.is_ok() as usize] += 1,
            Err(_) => panic!("derive panicked on {v}"),
        }
    }
    assert!(
        outcomes[1] > 100,
        "some mutated configs still parse: {outcomes:?}"
    );
    assert!(outcomes[0] > 100, "and many are refused: {outcomes:?}");
}
