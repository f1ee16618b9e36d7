//! `convert --mmproj`: llama.cpp's mmproj GGUF → the tower file FastFlowLM's repositories ship
//! (`vision_weight.q4nx`), as its converter writes it (`convert.py -t vision`): every tensor bf16
//! (rounded to nearest even from F32/F16), renamed by the table of
//! [`onebit_stages::tower::names`], the projections in MM blocks
//! ([`onebit_stages::layout::mm_block`]), Gemma 3's input projection transposed to `[out, in]`
//! first, Qwen3.5's two temporal patch kernels stacked back into one; the container in the
//! converter's data order. Its `config.json` keys (`vision_model_weight`, `vision_config`) are
//! written beside.

use std::io::Write;
use std::path::Path;

use half::bf16;
use onebit_stages::error::{Error, Result};
use onebit_stages::format::gguf::{GgufFile, GgufTensor};
use onebit_stages::format::q4nx::Dtype;
use onebit_stages::format::q4nx::writer::{Entry, data_order, write_container};
use onebit_stages::layout::mm_block::MmBlock;
use onebit_stages::tower::names::{Relation, TowerFamily, blocked, second_slice, tower_of};

use crate::TensorReport;

/// The tower file's name in the repository.
pub const VISION_FILE: &str = "vision_weight.q4nx";

/// The tower family and block geometry for a language model of `arch` with hidden size
/// `hidden`, with the decision: FastFlowLM's per-model configurations (`configs/gemma3.json`:
/// 256×64; `configs/qwen3.5_{0.8b,2b,4b,9b}.json`: 256×64, 512×64, 512×64, 256×64), the Qwen3.5
/// size told by its hidden width.
pub fn tower_geometry(
    gguf: &Path,
    arch: &str,
    hidden: u64,
) -> Result<(TowerFamily, MmBlock, String)> {
    let narrow = MmBlock {
        mm_k: 256,
        mm_n: 64,
    };
    let wide = MmBlock {
        mm_k: 512,
        mm_n: 64,
    };
    let (family, block, why) = match (arch, hidden) {
        ("gemma3", _) => (TowerFamily::Gemma3, narrow, "gemma3".to_string()),
        ("qwen35", 1024) => (
            TowerFamily::Qwen35,
            narrow,
            "qwen3.5 0.8B (hidden 1024)".into(),
        ),
        ("qwen35", 2048) => (TowerFamily::Qwen35, wide, "qwen3.5 2B (hidden 2048)".into()),
        ("qwen35", 2560) => (TowerFamily::Qwen35, wide, "qwen3.5 4B (hidden 2560)".into()),
        ("qwen35", 4096) => (
            TowerFamily::Qwen35,
            narrow,
            "qwen3.5 9B (hidden 4096)".into(),
        ),
        _ => {
            return Err(Error::Refused {
                file: gguf.to_path_buf(),
                tensor: "--mmproj".into(),
                reason: format!(
                    "no tower layout is known for {arch} with hidden size {hidden}: FastFlowLM's \
                     towers exist for gemma3 and for qwen35 with hidden 1024, 2048, 2560 or 4096"
                ),
            });
        }
    };
    let decision = format!(
        "vision_MM_K={}, vision_MM_N={} <- FastFlowLM's configuration for {why}",
        block.mm_k, block.mm_n
    );
    Ok((family, block, decision))
}

/// One tower tensor to write.
struct Planned {
    entry: Entry,
    /// The GGUF tensors it is made of (two for a stacked kernel).
    sources: Vec<String>,
    relation: Relation,
    block: Option<MmBlock>,
    /// Logical rows and columns before blocking.
    dims: (u64, u64),
}

fn refuse(file: &Path, tensor: &str, reason: String) -> Error {
    Error::Refused {
        file: file.to_path_buf(),
        tensor: tensor.to_string(),
        reason,
    }
}

/// The GGUF tensor's values as f32 (any dequantizable type), numpy order.
fn values(g: &GgufFile, t: &GgufTensor) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    g.rows_f32(t, 0, t.rows(), &mut v)?;
    Ok(v)
}

fn plan(g: &GgufFile, family: TowerFamily, block: MmBlock) -> Result<Vec<Planned>> {
    let file = g.path();
    let mut planned: Vec<Planned> = Vec::new();
    for t in g.tensors.iter() {
        let Some((name, _, relation)) = tower_of(family, &t.name) else {
            return Err(refuse(
                file,
                &t.name,
                format!("no {family:?} tower tensor is made from this mmproj tensor"),
            ));
        };
        if !t.ty.dequantizable() {
            return Err(refuse(
                file,
                &t.name,
                format!("type {:?} cannot be read", t.ty),
            ));
        }
        if relation == Relation::StackedTime && t.name.ends_with(".1") {
            continue;
        }
        // numpy order: the GGUF's dimensions reversed.
        let mut shape: Vec<u64> = t.dims.iter().rev().copied().collect();
        let mut sources = vec![t.name.clone()];
        if relation == Relation::StackedTime {
            let second = second_slice(&t.name);
            let Some(t1) = g.tensor(&second) else {
                return Err(refuse(
                    file,
                    &second,
                    "the stacked kernel's second slice is missing".into(),
                ));
            };
            if t1.dims != t.dims || shape.len() != 4 {
                return Err(refuse(
                    file,
                    &second,
                    format!(
                        "slices of shapes {:?} and {:?} do not stack",
                        t.dims, t1.dims
                    ),
                ));
            }
            shape.insert(2, 2);
            sources.push(second);
        }
        let (rows, k) = match relation {
            Relation::Transposed => (t.row_len(), t.rows()),
            _ => (t.rows(), t.row_len()),
        };
        let mm = (shape.len() == 2 && blocked(family, &name)).then_some(block);
        if let Some(b) = mm {
            shape = b.declared_shape(rows, k).to_vec();
        } else if relation == Relation::Transposed {
            shape = vec![rows, k];
        }
        planned.push(Planned {
            entry: Entry {
                name,
                dtype: Dtype::BF16,
                shape,
            },
            sources,
            relation,
            block: mm,
            dims: (rows, k),
        });
    }
    Ok(planned)
}

/// The bf16 values of one planned tensor, in the tower's order, as raw bits.
fn tower_bits(g: &GgufFile, p: &Planned) -> Result<(Vec<u16>, Vec<f32>)> {
    let t = g
        .tensor(&p.sources[0])
        .ok_or_else(|| Error::Internal(p.sources[0].clone()))?;
    let v = values(g, t)?;
    let logical = match p.relation {
        Relation::Same => v,
        Relation::Transposed => {
            let (rows, k) = (t.rows() as usize, t.row_len() as usize);
            let mut out = vec![0.0; v.len()];
            for r in 0..rows {
                for c in 0..k {
                    out[c * rows + r] = v[r * k + c];
                }
            }
            out
        }
        Relation::StackedTime => {
            let t1 = g
                .tensor(&p.sources[1])
                .ok_or_else(|| Error::Internal(p.sources[1].clone()))?;
            let v1 = values(g, t1)?;
            let plane = (t.dims[0] * t.dims[1]) as usize;
            let mut out = Vec::with_capacity(v.len() * 2);
            for (a, b) in v.chunks(plane).zip(v1.chunks(plane)) {
                out.extend_from_slice(a);
                out.extend_from_slice(b);
            }
            out
        }
    };
    let bits = logical
        .iter()
        .map(|&x| bf16::from_f32(x).to_bits())
        .collect();
    Ok((bits, logical))
}

/// Writes the tower file of `mmproj` at `path`; one report per tensor.
pub fn write_tower(
    mmproj: &Path,
    family: TowerFamily,
    block: MmBlock,
    path: &Path,
) -> Result<Vec<TensorReport>> {
    let g = GgufFile::open(mmproj)?;
    let mut planned = plan(&g, family, block)?;
    let mut entries: Vec<Entry> = planned.iter().map(|p| p.entry.clone()).collect();
    data_order(&mut entries);
    planned.sort_by_key(|p| entries.iter().position(|e| e.name == p.entry.name));
    let mut reports = Vec::with_capacity(planned.len());
    write_container(path, &entries, |i, w: &mut dyn Write| {
        let p = &planned[i];
        let (bits, logical) = tower_bits(&g, p)?;
        let bytes: Vec<u8> = match p.block {
            Some(b) => b.encode(p.dims.0, p.dims.1, &bits),
            None => bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
        };
        w.write_all(&bytes)?;
        let (mut num, mut den, mut max_abs) = (0f64, 0f64, 0f64);
        for (&b, &x) in bits.iter().zip(&logical) {
            let d = (bf16::from_bits(b).to_f32() - x) as f64;
            num += d * d;
            den += (x as f64) * (x as f64);
            max_abs = max_abs.max(d.abs());
        }
        let src = g.tensor(&p.sources[0]);
        reports.push(TensorReport {
            name: p.entry.name.clone(),
            source: p.sources.join(" + "),
            source_type: src.map(|t| format!("{:?}", t.ty)).unwrap_or_default(),
            stored_as: match p.block {
                Some(b) => format!("BF16 mm_block_{}", b.name()),
                None => "BF16".into(),
            },
            method: "bf16, round to nearest even".into(),
            transform: match p.relation {
                Relation::Same => String::new(),
                Relation::Transposed => "transposed to [out, in]".into(),
                Relation::StackedTime => "two temporal kernels stacked at dim 2".into(),
            },
            rel_l2: (num / den.max(f64::MIN_POSITIVE)).sqrt(),
            max_abs,
        });
        Ok(())
    })?;
    Ok(reports)
}

/// `convert --mmproj`: the tower of `mmproj` for a language model of `(arch, hidden)` written as
/// [`VISION_FILE`] into `dir`, its keys added to `config`, the decisions recorded.
pub fn write_beside(
    mmproj: &Path,
    (arch, hidden): (&str, u64),
    dir: &Path,
    config: &mut serde_json::Value,
    decisions: &mut Vec<String>,
) -> Result<Vec<TensorReport>> {
    let (family, block, decision) = tower_geometry(mmproj, arch, hidden)?;
    decisions.push(decision);
    let reports = write_tower(mmproj, family, block, &dir.join(VISION_FILE))?;
    if let Some(o) = config.as_object_mut() {
        o.extend(config_keys(mmproj, block)?);
    }
    decisions.push(format!(
        "{VISION_FILE}: {} tensors <- --mmproj {}",
        reports.len(),
        mmproj.display()
    ));
    Ok(reports)
}

/// The config.json keys FastFlowLM's runtime reads for the tower (q4nx-format §7): the file,
/// and `vision_config` with the encoder's geometry from the mmproj's metadata and the block
/// geometry; `mm_tokens_per_image` for Gemma 3 from the projector's pooling.
pub fn config_keys(
    mmproj: &Path,
    block: MmBlock,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let g = GgufFile::open(mmproj)?;
    let u = |k: &str| g.meta(&format!("clip.vision.{k}")).and_then(|v| v.as_u64());
    let mut vision = serde_json::Map::new();
    for (key, meta) in [
        ("hidden_size", "embedding_length"),
        ("intermediate_size", "feed_forward_length"),
        ("num_hidden_layers", "block_count"),
        ("num_attention_heads", "attention.head_count"),
        ("image_size", "image_size"),
        ("patch_size", "patch_size"),
    ] {
        if let Some(v) = u(meta) {
            vision.insert(key.into(), v.into());
        }
    }
    if let Some(eps) = g
        .meta("clip.vision.attention.layer_norm_epsilon")
        .and_then(|v| v.as_f64())
    {
        vision.insert("layer_norm_eps".into(), eps.into());
    }
    vision.insert("vision_MM_K".into(), block.mm_k.into());
    vision.insert("vision_MM_N".into(), block.mm_n.into());
    let mut keys = serde_json::Map::new();
    keys.insert("vision_model_weight".into(), VISION_FILE.into());
    let projector = g.meta("clip.projector_type").and_then(|v| v.as_str());
    if projector == Some("gemma3")
        && let (Some(image), Some(patch)) = (u("image_size"), u("patch_size"))
    {
        let scale = u("projector.scale_factor").unwrap_or(4);
        let side = image / patch.max(1) / scale.max(1);
        keys.insert("mm_tokens_per_image".into(), (side * side).into());
    }
    keys.insert("vision_config".into(), serde_json::Value::Object(vision));
    Ok(keys)
}
