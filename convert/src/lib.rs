//! GGUF → FastFlowLM NPU2 repository: `config.json`, `model.q4nx`, `tokenizer.json`,
//! `tokenizer_config.json` and, when the template is the family's standard one,
//! `chat_template.jinja`.
//!
//! The tensor map is the verifier's ([`onebit_stages::format::gguf::names::twin`]) run forwards, so the pack a
//! conversion writes is exactly what verification expects to find. Native source types keep
//! their codes (Q4_1 → Q41 tiles, Q4_0 → Q40 tiles, Q8_0 → 8-bit tiles), which makes our output
//! byte-identical to FastFlowLM's converter wherever that converter is correct; everything else
//! is requantized with the error reported per tensor, and 8-bit sources are never truncated to 4
//! bits (the reference converter's llama-path bug). The folder appears atomically: it is built
//! beside the destination and renamed into place.

pub mod calibrate;
pub mod config;
pub mod gptq;
pub mod pretokenizer;
pub mod tokenizer;
pub mod tower;
mod write;

/// The tile encoders and quantization groups (format codecs, kept in stages beside the decoders
/// so that the repair stage writes tiles the way conversion does).
pub use onebit_stages::format::encode::{self, groups};

use std::path::{Path, PathBuf};

use onebit_stages::error::{Error, Result, io_at};
use onebit_stages::format::gguf::names::{self, MapDims, RowMap};
use onebit_stages::format::gguf::{GgmlType, GgufFile, MetaValue};
use onebit_stages::format::tiles::TileKind;
use onebit_stages::layout::geometry::ffn_pad_of;

/// The `--tile` choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum TileChoice {
    /// Quarter tiles when any weight's K is off the 256-column grid, else 5120-byte tiles.
    #[default]
    Auto,
    /// 32×256 tiles (Q41_5120, or Q40_5120 for Q4_0 sources).
    Q4_5120,
    /// 16×128 quarter tiles (Q41_1280).
    Q4_1280,
    /// 32×256 symmetric tiles without a zero-point plane (Q40_4608).
    Q4s4608,
    /// 32×256 8-bit tiles, column-ordered codes (Q8C_8704).
    Q8_8704,
}

impl TileChoice {
    /// Parses the CLI spelling (`auto`, `q4-5120`, `q4-1280`, `q4s-4608`, `q8-8704`).
    pub fn parse(s: &str) -> Option<TileChoice> {
        Some(match s {
            "auto" => TileChoice::Auto,
            "q4-5120" => TileChoice::Q4_5120,
            "q4-1280" => TileChoice::Q4_1280,
            "q4s-4608" => TileChoice::Q4s4608,
            "q8-8704" => TileChoice::Q8_8704,
            _ => return None,
        })
    }
}

/// Options of one conversion.
#[derive(Clone, Debug, Default)]
pub struct ConvertOptions {
    /// Tile choice.
    pub tile: TileChoice,
    /// Overrides the family read from `general.architecture`.
    pub family: Option<String>,
    /// Text files to calibrate requantization on (activation-weighted error), if any.
    pub calibrate: Vec<PathBuf>,
    /// Calibration tokens at most.
    pub calibrate_tokens: usize,
    /// Per-tensor overrides of `tile`: tensors whose pack name contains the pattern take that
    /// choice (the last matching pattern wins).
    pub tile_for: Vec<(String, TileChoice)>,
    /// Requantize unsigned 4-bit tensors with GPTQ on the calibration inputs' second moments
    /// (needs `calibrate`).
    pub gptq: bool,
    /// The model's real `config.json`: it wins over what the GGUF implies, each difference
    /// recorded as a decision; a config whose dimensions contradict the GGUF is refused.
    pub config: Option<PathBuf>,
    /// llama.cpp's mmproj GGUF of the same model: its tower is written as `vision_weight.q4nx`
    /// ([`tower`]).
    pub mmproj: Option<PathBuf>,
}

/// What happened to one tensor.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TensorReport {
    /// Pack name.
    pub name: String,
    /// GGUF source tensor.
    pub source: String,
    /// GGUF type of the source.
    pub source_type: String,
    /// Tile kind written, or the plain dtype.
    pub stored_as: String,
    /// How the values got there.
    pub method: String,
    /// Transform applied (row map, scale), empty if none.
    pub transform: String,
    /// ‖stored − source‖₂ / ‖source‖₂ over the logical tensor.
    pub rel_l2: f64,
    /// Largest |stored − source|.
    pub max_abs: f64,
}

/// The outcome of a conversion, also written as `onebit-convert.json` in the repo.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConvertReport {
    /// Source GGUF.
    pub gguf: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// GGUF architecture.
    pub family: String,
    /// Tile choice after `auto` was resolved, with the reason.
    pub tile: String,
    /// Every derived decision with its source (`key=value <- source`).
    pub decisions: Vec<String>,
    /// Per tensor.
    pub tensors: Vec<TensorReport>,
}

/// Families the converter writes. Others are refused by name.
pub const FAMILIES: [&str; 7] = [
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "hunyuan-dense",
    "lfm2",
    "qwen35",
];

fn refuse(gguf: &Path, tensor: &str, reason: impl Into<String>) -> Error {
    Error::Refused {
        file: gguf.to_path_buf(),
        tensor: tensor.to_string(),
        reason: reason.into(),
    }
}

/// One pack tensor and where it comes from.
#[derive(Clone, Debug)]
struct Planned {
    name: String,
    src: String,
    rows: RowMap,
    scale: Option<f32>,
    note: String,
    /// `None` for plain BF16.
    tiled: Option<TileKind>,
    /// Rows and K as tiled, after the family's FFN padding (zero rows / columns past the source's).
    padded: (u64, u64),
    /// Per-column importance for requantization (calibration), if any.
    importance: Option<Vec<f32>>,
    /// The inputs' mean second moments for GPTQ (`k × k`), if asked for.
    second_moments: Option<std::sync::Arc<Vec<f64>>>,
}

/// Model facts read from the GGUF metadata.
#[derive(Clone, Debug)]
pub struct Dims {
    /// Architecture (`general.architecture`).
    pub arch: String,
    /// Hidden width.
    pub hidden: u64,
    /// Layers.
    pub layers: u64,
    /// Attention heads.
    pub heads: u64,
    /// KV heads (of the attention layers, where a hybrid lists 0 for the others).
    pub kv_heads: u64,
    /// Per layer, whether it has attention (a hybrid's per-layer `attention.head_count_kv` is 0
    /// on its convolution layers); all true for a scalar count.
    pub attention_layers: Vec<bool>,
    /// Head dim (key length).
    pub head_dim: u64,
    /// RoPE dimension count.
    pub rope_dim: u64,
}

impl Dims {
    /// Reads the dims from `g`, naming the missing key.
    pub fn read(g: &GgufFile, arch: &str) -> Result<Dims> {
        let need = |k: &str| -> Result<u64> {
            g.meta(&format!("{arch}.{k}"))
                .and_then(|v| v.as_u64())
                .ok_or_else(|| refuse(g.path(), &format!("{arch}.{k}"), "missing metadata key"))
        };
        let opt = |k: &str| g.meta(&format!("{arch}.{k}")).and_then(|v| v.as_u64());
        let hidden = need("embedding_length")?;
        let heads = need("attention.head_count")?;
        let layers = need("block_count")?;
        let head_dim = opt("attention.key_length").unwrap_or(hidden / heads.max(1));
        // A hybrid (LFM2) writes the KV head count per layer, 0 where a layer has no attention.
        let (kv_heads, attention_layers) = match g.meta(&format!("{arch}.attention.head_count_kv"))
        {
            Some(MetaValue::Array(per)) => {
                let per: Vec<u64> = per.iter().filter_map(MetaValue::as_u64).collect();
                if per.len() as u64 != layers {
                    return Err(refuse(
                        g.path(),
                        &format!("{arch}.attention.head_count_kv"),
                        format!("{} entries for {layers} layers", per.len()),
                    ));
                }
                let kv = per.iter().copied().max().unwrap_or(0);
                if per.iter().any(|&k| k != 0 && k != kv) {
                    return Err(refuse(
                        g.path(),
                        &format!("{arch}.attention.head_count_kv"),
                        format!("KV head counts differ between layers ({per:?})"),
                    ));
                }
                (kv, per.iter().map(|&k| k != 0).collect())
            }
            _ => (
                opt("attention.head_count_kv").unwrap_or(heads),
                vec![true; layers as usize],
            ),
        };
        Ok(Dims {
            arch: arch.to_string(),
            hidden,
            layers,
            heads,
            kv_heads,
            attention_layers,
            head_dim,
            rope_dim: opt("rope.dimension_count").unwrap_or(head_dim),
        })
    }
}

/// Every tensor a layer of `arch` may hold; the plan skips those a GGUF lacks (a hybrid's
/// attention layers have no `shortconv.*`, its convolution layers no `self_attn.*`).
fn layer_fields(arch: &str) -> &'static [&'static str] {
    if arch == "gemma3" {
        &[
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ]
    } else {
        &[
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_proj.bias",
            "self_attn.k_proj.bias",
            "self_attn.v_proj.bias",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
            "shortconv.in_proj.weight",
            "shortconv.conv.weight",
            "shortconv.out_proj.weight",
            "linear_attn.qkv_proj.weight",
            "self_attn.gate_proj.weight",
            "linear_attn.ssm_alpha_proj.weight",
            "linear_attn.ssm_alpha_proj.bf16.weight",
            "linear_attn.ssm_beta_proj.weight",
            "linear_attn.ssm_beta_proj.bf16.weight",
            "linear_attn.ssm_conv1d.weight",
            "linear_attn.ssm_a",
            "linear_attn.ssm_dt.bias",
            "linear_attn.ssm_norm.weight",
            "linear_attn.ssm_out_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ]
    }
}

fn plan(g: &GgufFile, d: &Dims) -> Result<Vec<Planned>> {
    let dims = MapDims {
        hidden: d.hidden,
        heads: d.heads,
        rope_dim: d.rope_dim,
        head_dim: d.head_dim,
    };
    let has = |n: &str| g.tensor(n).is_some();
    // FastFlowLM names LFM2's embedding after the GGUF (q4nx-format §5).
    let embedding = if d.arch == "lfm2" {
        "model.token_embd.weight"
    } else {
        "model.embed_tokens.weight"
    };
    let mut wanted = vec![
        embedding.to_string(),
        "lm_head.weight".to_string(),
        "model.norm.weight".to_string(),
        // llama3 frequency divisors, when the GGUF has them: kept as FastFlowLM's packs keep
        // them (plain), and verified against config.json's rope_scaling.
        "rope_freqs.weight".to_string(),
    ];
    for l in 0..d.layers {
        for f in layer_fields(&d.arch) {
            wanted.push(format!("model.layers.{l}.{f}"));
        }
    }
    let mut out = Vec::new();
    let mut used = std::collections::BTreeSet::new();
    for name in wanted {
        let Some(t) = names::twin(&d.arch, &name, dims, has) else {
            continue;
        };
        let Some(src) = g.tensor(&t.gguf) else {
            continue;
        };
        used.insert(t.gguf.clone());
        let two_d = src.dims.len() == 2;
        // Embeddings, convolution kernels and the bf16 copies stay plain (q4nx-format §2).
        let tiled = name != embedding
            && !name.ends_with("shortconv.conv.weight")
            && !name.ends_with("ssm_conv1d.weight")
            && !name.ends_with(".bf16.weight")
            && two_d;
        let padded = ffn_padded(&d.arch, &name, src.rows(), src.row_len());
        out.push(Planned {
            name,
            src: t.gguf,
            rows: t.rows,
            scale: t.scale,
            note: t.note,
            tiled: tiled.then_some(TileKind::Q41_5120),
            padded,
            importance: None,
            second_moments: None,
        });
    }
    for t in &g.tensors {
        if !used.contains(&t.name) {
            return Err(refuse(
                g.path(),
                &t.name,
                format!(
                    "the {} converter has no place for this tensor; refusing rather than dropping it",
                    d.arch
                ),
            ));
        }
    }
    Ok(out)
}

/// (rows, K) of a pack tensor after the family's FFN padding (q4nx-format §4): `gate/up_proj` rows
/// and `down_proj` columns rounded up to [`ffn_pad_of`]; other tensors as they are.
fn ffn_padded(arch: &str, name: &str, rows: u64, k: u64) -> (u64, u64) {
    let pad = ffn_pad_of(arch);
    if name.ends_with("mlp.gate_proj.weight") || name.ends_with("mlp.up_proj.weight") {
        (rows.div_ceil(pad) * pad, k)
    } else if name.ends_with("mlp.down_proj.weight") {
        (rows, k.div_ceil(pad) * pad)
    } else {
        (rows, k)
    }
}

/// Resolves `choice` for this model: `auto` takes the symmetric 4,608-byte tiles for Hunyuan
/// when every quantized source is Q4_0 (FastFlowLM ships Hy-MT2-1.8B-NPU2 in them, q4nx-format
/// §2; the codes copy natively), 5120-byte tiles for LFM2 (as every LFM2 repo), else quarter tiles when any tiled weight's K is off the
/// 256-column grid (FastFlowLM's Gemma3-270M-NPU2: K = 640, all 127 tensors quarter tiles), else
/// 5120-byte tiles.
fn resolve_tile(
    g: &GgufFile,
    arch: &str,
    plan: &[Planned],
    choice: TileChoice,
) -> (TileChoice, String) {
    let mut why = String::new();
    if choice == TileChoice::Auto && arch == "hunyuan-dense" {
        let other = plan.iter().filter(|p| p.tiled.is_some()).find_map(|p| {
            let t = g.tensor(&p.src)?;
            (t.ty != GgmlType::Q4_0).then(|| format!("{} is {}", p.src, t.ty))
        });
        match other {
            None => {
                return (
                    TileChoice::Q4s4608,
                    "tile=q4s-4608 <- auto: hunyuan-dense packs ship in Q40_4608 tiles (Hy-MT2-1.8B-NPU2, seed #2218) and every quantized source is Q4_0 (codes copied)"
                        .to_string(),
                );
            }
            Some(o) => {
                why = format!(
                    "hunyuan-dense: {o}, which Q40_4608 tiles could hold only requantized (--tile q4s-4608 forces them); "
                );
            }
        }
    }
    if choice == TileChoice::Auto && arch == "qwen35" {
        return (
            TileChoice::Q4_5120,
            "tile=q4-5120 <- auto: qwen35 packs ship in Q41_5120 tiles (Qwen3.5 main, q4nx-format §7; a Q4_0 source is exact in them with m = −8·d), K padded to the 256-column grid where it is off it"
                .to_string(),
        );
    }
    if choice == TileChoice::Auto && arch == "lfm2" {
        return (
            TileChoice::Q4_5120,
            "tile=q4-5120 <- auto: lfm2 packs ship in 5120-byte tiles (every LFM2/LFM2.5 repo, q4nx-format §7: Q40_5120 from Q4_0, Q41_5120 keeps a Q4_1 source's zero-points), K padded to the 256-column grid where it is off it"
                .to_string(),
        );
    }
    match choice {
        TileChoice::Auto => {
            let off = plan.iter().filter(|p| p.tiled.is_some()).find_map(|p| {
                let k = g.tensor(&p.src)?.row_len();
                (k % 256 != 0).then(|| format!("{} has K = {k}", p.src))
            });
            match off {
                Some(off) => (
                    TileChoice::Q4_1280,
                    format!("tile=q4-1280 <- auto: {why}{off}, off the 256-column grid"),
                ),
                None => (
                    TileChoice::Q4_5120,
                    format!("tile=q4-5120 <- auto: {why}every K is on the 256-column grid"),
                ),
            }
        }
        c => (c, format!("tile={c:?} <- --tile")),
    }
}

/// The tile kind for a source of type `ty` under `choice` in family `arch`.
fn kind_for(arch: &str, choice: TileChoice, ty: GgmlType) -> TileKind {
    match choice {
        // Qwen3.5's packs have no Q40_5120 (q4nx-format §7).
        TileChoice::Q4_5120 | TileChoice::Auto if arch == "qwen35" => TileKind::Q41_5120,
        TileChoice::Q4_5120 | TileChoice::Auto if ty == GgmlType::Q4_0 => TileKind::Q40_5120,
        TileChoice::Q4_5120 | TileChoice::Auto => TileKind::Q41_5120,
        TileChoice::Q4_1280 => TileKind::Q41_1280,
        TileChoice::Q4s4608 => TileKind::Q40_4608,
        TileChoice::Q8_8704 => TileKind::Q8C_8704,
    }
}

/// Converts `gguf` into an NPU2 repository folder at `out` (which must not exist yet, or be
/// empty).
pub fn convert(gguf: &Path, out: &Path, opts: &ConvertOptions) -> Result<ConvertReport> {
    let g = GgufFile::open(gguf)?;
    let arch = match &opts.family {
        Some(f) => f.clone(),
        None => g
            .architecture()
            .ok_or_else(|| refuse(gguf, "general.architecture", "missing metadata key"))?
            .to_string(),
    };
    if !FAMILIES.contains(&arch.as_str()) {
        return Err(refuse(
            gguf,
            "general.architecture",
            format!(
                "no converter for family {arch:?} (converted: {})",
                FAMILIES.join(", ")
            ),
        ));
    }
    if out.exists() && fs_err::read_dir(out)?.next().is_some() {
        return Err(Error::Config {
            file: out.to_path_buf(),
            reason: "output folder exists and is not empty; choose a new --out".into(),
        });
    }
    let dims = Dims::read(&g, &arch)?;
    if arch == "qwen35" {
        refuse_grouped_qwen35(&g)?;
    }
    let mut planned = plan(&g, &dims)?;
    let (tile, tile_why) = resolve_tile(&g, &arch, &planned, opts.tile);
    let mut decisions = vec![tile_why];
    for p in planned.iter_mut().filter(|p| p.tiled.is_some()) {
        let src = g
            .tensor(&p.src)
            .ok_or_else(|| Error::Internal(p.src.clone()))?;
        let choice = match opts
            .tile_for
            .iter()
            .rev()
            .find(|(pat, _)| p.name.contains(pat))
        {
            Some((pat, c)) => {
                let c = if *c == TileChoice::Auto { tile } else { *c };
                decisions.push(format!(
                    "tile[{}]={:?} <- --tile-for {pat}={c:?}",
                    p.name,
                    kind_for(&arch, c, src.ty)
                ));
                c
            }
            None => tile,
        };
        p.tiled = Some(kind_for(&arch, choice, src.ty));
    }
    if let Some((pat, _)) = opts.tile_for.iter().find(|(pat, _)| {
        !planned
            .iter()
            .any(|p| p.tiled.is_some() && p.name.contains(pat))
    }) {
        return Err(refuse(
            gguf,
            pat,
            "--tile-for names no quantized tensor of this model",
        ));
    }
    if opts.gptq && opts.calibrate.is_empty() {
        return Err(Error::Config {
            file: gguf.to_path_buf(),
            reason: "GPTQ needs calibration text: add --calibrate FILE".into(),
        });
    }
    if !opts.calibrate.is_empty() {
        let cal = calibrate::importance(gguf, opts)?;
        decisions.push(cal.decision.clone());
        for p in planned.iter_mut() {
            p.importance = cal.per_matrix.get(&p.name).cloned();
            p.second_moments = cal.second_moments.get(&p.name).cloned();
        }
    }

    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs_err::create_dir_all(&parent)?;
    let staging = tempfile::Builder::new()
        .prefix(".convert-")
        .tempdir_in(&parent)
        .map_err(|e| io_at(e, "create a staging folder in", &parent))?;

    let mut cfg = config::config_json(&g, &dims)?;
    if let Some(path) = &opts.config {
        cfg = config::with_user_config(cfg, path, &g)?;
    }
    decisions.extend(cfg.decisions.iter().cloned());
    let tensors_of_tower = match &opts.mmproj {
        Some(mmproj) => tower::write_beside(
            mmproj,
            (&arch, dims.hidden),
            staging.path(),
            &mut cfg.json,
            &mut decisions,
        )?,
        None => Vec::new(),
    };
    write_json(&staging.path().join("config.json"), &cfg.json)?;
    let tok = tokenizer::tokenizer_files(&g, &arch)?;
    decisions.extend(tok.decisions.iter().cloned());
    write_json(&staging.path().join("tokenizer.json"), &tok.tokenizer)?;
    write_json(&staging.path().join("tokenizer_config.json"), &tok.config)?;
    if let Some(t) = &tok.template_file {
        fs_err::write(staging.path().join("chat_template.jinja"), t)?;
    }

    // FastFlowLM writes Qwen3.5 tiles as [row blocks, column tiles, bytes] (keep_block_in_2D).
    let three_d = arch == "qwen35";
    let mut tensors = write::write_pack(&g, &planned, &staging.path().join("model.q4nx"), three_d)?;
    tensors.extend(tensors_of_tower);
    let report = ConvertReport {
        gguf: gguf.to_path_buf(),
        out: out.to_path_buf(),
        family: arch,
        tile: format!("{tile:?}"),
        decisions,
        tensors,
    };
    let rep = serde_json::to_value(&report).map_err(|e| Error::Internal(e.to_string()))?;
    write_json(&staging.path().join("onebit-convert.json"), &rep)?;

    let staged = staging.keep();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs_err::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))?;
    }
    if out.exists() {
        fs_err::remove_dir(out)?;
    }
    fs_err::rename(&staged, out)?;
    Ok(report)
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut s = serde_json::to_string_pretty(v).map_err(|e| Error::Internal(e.to_string()))?;
    s.push('\n');
    Ok(fs_err::write(path, s)?)
}

/// Writes the container; returns one report per tensor.
/// A Qwen3.5 whose value heads outnumber its key heads and whose FFN is wider than
/// [`onebit_stages::model_spec::QWEN35_GROUPED_ABOVE_FFN`] is read in transformers' grouped
/// value-head order (FastFlowLM reorders such packs, q4nx-format §5); this converter keeps
/// llama.cpp's tiled order, so it refuses such a model rather than write a pack read wrong.
fn refuse_grouped_qwen35(g: &GgufFile) -> Result<()> {
    let u = |k: &str| g.meta(&format!("qwen35.{k}")).and_then(|v| v.as_u64());
    let (nk, nv, ffn) = (
        u("ssm.group_count"),
        u("ssm.time_step_rank"),
        u("feed_forward_length"),
    );
    if let (Some(nk), Some(nv), Some(ffn)) = (nk, nv, ffn)
        && nk != nv
        && ffn > onebit_stages::model_spec::QWEN35_GROUPED_ABOVE_FFN
    {
        return Err(refuse(
            g.path(),
            "qwen35.ssm.time_step_rank",
            format!(
                "{nv} value heads over {nk} key heads with FFN {ffn} > {}: such packs hold the value heads in transformers' grouped order, and this converter writes llama.cpp's tiled order only",
                onebit_stages::model_spec::QWEN35_GROUPED_ABOVE_FFN
            ),
        ));
    }
    Ok(())
}
