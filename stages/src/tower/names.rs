//! A tower tensor's twin in llama.cpp's mmproj GGUF: the names FastFlowLM's converter maps
//! (its `configs/gemma3.json` and `configs/qwen3.5_*.json`, `name_map`) and how the values of the
//! two relate. Data, not code: one row per tensor kind, `{i}` standing for the layer.

/// How a tower tensor's values relate to its mmproj twin's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// The same matrix or vector (element order as the GGUF's rows are read).
    Same,
    /// The tower holds the transpose: the GGUF keeps transformers' `[in, out]` orientation
    /// (Gemma 3's `mm_input_projection_weight`), the tower the `[out, in]` of every other
    /// projection.
    Transposed,
    /// Qwen3.5's patch embedding: a 3-D convolution kernel `[out, in, 2, p, p]` whose two
    /// temporal slices the GGUF stores as two 2-D kernels (`v.patch_embd.weight` and `.weight.1`).
    StackedTime,
}

/// The tower families FastFlowLM's converter writes towers for (its `gemma3.py` and `qwen35.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TowerFamily {
    /// Gemma 3: SigLIP and the soft-embedding projector (`gemma3`).
    Gemma3,
    /// Qwen3.5: the ViT with its merger.
    Qwen35,
}

impl TowerFamily {
    /// The family of a tower by its tensor names.
    pub fn of_tensor(name: &str) -> Option<TowerFamily> {
        if name.starts_with("vision_tower.") || name.starts_with("multi_modal_projector.") {
            Some(TowerFamily::Gemma3)
        } else if name.starts_with("model.visual.") {
            Some(TowerFamily::Qwen35)
        } else {
            None
        }
    }
}

/// One row of the table.
struct Rule {
    tower: &'static str,
    gguf: &'static str,
    relation: Relation,
}

const fn same(tower: &'static str, gguf: &'static str) -> Rule {
    Rule {
        tower,
        gguf,
        relation: Relation::Same,
    }
}

/// Every tower tensor FastFlowLM's converter writes for Gemma 3 and Qwen3.5, with its twin.
const RULES: &[Rule] = &[
    // Gemma 3 (Gemma3-4B, Medgemma-4B, Translategemma-4B): SigLIP and the projector.
    same(
        "vision_tower.vision_model.embeddings.patch_embedding.weight",
        "v.patch_embd.weight",
    ),
    same(
        "vision_tower.vision_model.embeddings.patch_embedding.bias",
        "v.patch_embd.bias",
    ),
    same(
        "vision_tower.vision_model.embeddings.position_embedding.weight",
        "v.position_embd.weight",
    ),
    same(
        "vision_tower.vision_model.post_layernorm.weight",
        "v.post_ln.weight",
    ),
    same(
        "vision_tower.vision_model.post_layernorm.bias",
        "v.post_ln.bias",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.layer_norm1.weight",
        "v.blk.{i}.ln1.weight",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.layer_norm1.bias",
        "v.blk.{i}.ln1.bias",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.layer_norm2.weight",
        "v.blk.{i}.ln2.weight",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.layer_norm2.bias",
        "v.blk.{i}.ln2.bias",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.mlp.fc1.weight",
        "v.blk.{i}.ffn_up.weight",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.mlp.fc1.bias",
        "v.blk.{i}.ffn_up.bias",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.mlp.fc2.weight",
        "v.blk.{i}.ffn_down.weight",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.mlp.fc2.bias",
        "v.blk.{i}.ffn_down.bias",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.q_proj.weight",
        "v.blk.{i}.attn_q.weight",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.q_proj.bias",
        "v.blk.{i}.attn_q.bias",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.k_proj.weight",
        "v.blk.{i}.attn_k.weight",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.k_proj.bias",
        "v.blk.{i}.attn_k.bias",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.v_proj.weight",
        "v.blk.{i}.attn_v.weight",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.v_proj.bias",
        "v.blk.{i}.attn_v.bias",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.out_proj.weight",
        "v.blk.{i}.attn_out.weight",
    ),
    same(
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.out_proj.bias",
        "v.blk.{i}.attn_out.bias",
    ),
    Rule {
        tower: "multi_modal_projector.mm_input_projection_weight",
        gguf: "mm.input_projection.weight",
        relation: Relation::Transposed,
    },
    same(
        "multi_modal_projector.mm_soft_emb_norm.weight",
        "mm.soft_emb_norm.weight",
    ),
    // Qwen3.5 (0.8B–9B): the ViT, its 2-D positions and the merger.
    Rule {
        tower: "model.visual.patch_embed.proj.weight",
        gguf: "v.patch_embd.weight",
        relation: Relation::StackedTime,
    },
    same("model.visual.patch_embed.proj.bias", "v.patch_embd.bias"),
    same("model.visual.pos_embed.weight", "v.position_embd.weight"),
    same("model.visual.merger.norm.weight", "v.post_ln.weight"),
    same("model.visual.merger.norm.bias", "v.post_ln.bias"),
    same("model.visual.merger.linear_fc1.weight", "mm.0.weight"),
    same("model.visual.merger.linear_fc1.bias", "mm.0.bias"),
    same("model.visual.merger.linear_fc2.weight", "mm.2.weight"),
    same("model.visual.merger.linear_fc2.bias", "mm.2.bias"),
    same(
        "model.visual.blocks.{i}.norm1.weight",
        "v.blk.{i}.ln1.weight",
    ),
    same("model.visual.blocks.{i}.norm1.bias", "v.blk.{i}.ln1.bias"),
    same(
        "model.visual.blocks.{i}.norm2.weight",
        "v.blk.{i}.ln2.weight",
    ),
    same("model.visual.blocks.{i}.norm2.bias", "v.blk.{i}.ln2.bias"),
    same(
        "model.visual.blocks.{i}.attn.qkv.weight",
        "v.blk.{i}.attn_qkv.weight",
    ),
    same(
        "model.visual.blocks.{i}.attn.qkv.bias",
        "v.blk.{i}.attn_qkv.bias",
    ),
    same(
        "model.visual.blocks.{i}.attn.proj.weight",
        "v.blk.{i}.attn_out.weight",
    ),
    same(
        "model.visual.blocks.{i}.attn.proj.bias",
        "v.blk.{i}.attn_out.bias",
    ),
    same(
        "model.visual.blocks.{i}.mlp.linear_fc1.weight",
        "v.blk.{i}.ffn_up.weight",
    ),
    same(
        "model.visual.blocks.{i}.mlp.linear_fc1.bias",
        "v.blk.{i}.ffn_up.bias",
    ),
    same(
        "model.visual.blocks.{i}.mlp.linear_fc2.weight",
        "v.blk.{i}.ffn_down.weight",
    ),
    same(
        "model.visual.blocks.{i}.mlp.linear_fc2.bias",
        "v.blk.{i}.ffn_down.bias",
    ),
];

/// The second GGUF kernel of [`Relation::StackedTime`]: llama.cpp's name for the temporal slice 1.
pub fn second_slice(gguf: &str) -> String {
    format!("{gguf}.1")
}

/// `name` against `pattern` (`{i}` a layer number): the layer, or `Some(None)` for a pattern
/// without one.
fn matches(pattern: &str, name: &str) -> Option<Option<u32>> {
    match pattern.split_once("{i}") {
        None => (pattern == name).then_some(None),
        Some((pre, post)) => {
            let mid = name.strip_prefix(pre)?.strip_suffix(post)?;
            let i = mid
                .parse()
                .ok()
                .filter(|_| mid.bytes().all(|b| b.is_ascii_digit()))?;
            Some(Some(i))
        }
    }
}

fn fill(pattern: &str, layer: Option<u32>) -> String {
    match layer {
        Some(i) => pattern.replace("{i}", &i.to_string()),
        None => pattern.to_string(),
    }
}

/// The mmproj twin of tower tensor `name`, its layer, and the relation of the values.
pub fn twin(name: &str) -> Option<(String, Option<u32>, Relation)> {
    RULES.iter().find_map(|r| {
        let layer = matches(r.tower, name)?;
        Some((fill(r.gguf, layer), layer, r.relation))
    })
}

/// The tower tensor an mmproj tensor of `family` becomes (the converter's direction), its layer
/// and the relation; `None` for a tensor no tower holds. The second temporal slice of a stacked
/// kernel maps to the same tower tensor as the first.
pub fn tower_of(family: TowerFamily, gguf: &str) -> Option<(String, Option<u32>, Relation)> {
    let base = gguf.strip_suffix(".1").unwrap_or(gguf);
    RULES.iter().find_map(|r| {
        if TowerFamily::of_tensor(r.tower) != Some(family) {
            return None;
        }
        let layer = matches(r.gguf, base)?;
        if base != gguf && r.relation != Relation::StackedTime {
            return None;
        }
        Some((fill(r.tower, layer), layer, r.relation))
    })
}

/// Whether FastFlowLM's converter writes tower tensor `name` (2-D) in MM blocks: by its name's
/// ending, as the converter decides (`gemma3.py`: the input projection and every `q/k/v/out_proj`,
/// `fc1`, `fc2`; `qwen35.py`: `fc1`, `fc2` (the merger's too), `attn.proj`, `attn.qkv`).
pub fn blocked(family: TowerFamily, name: &str) -> bool {
    let ends = |list: &[&str]| list.iter().any(|s| name.ends_with(s));
    match family {
        TowerFamily::Gemma3 => {
            name == "multi_modal_projector.mm_input_projection_weight"
                || ends(&[
                    "fc1.weight",
                    "fc2.weight",
                    "q_proj.weight",
                    "k_proj.weight",
                    "v_proj.weight",
                    "out_proj.weight",
                ])
        }
        TowerFamily::Qwen35 => ends(&[
            "fc1.weight",
            "fc2.weight",
            "attn.proj.weight",
            "attn.qkv.weight",
        ]),
    }
}

/// The tensor's role for the tables: the name's last part without `.weight`/`.bias`
/// (`q_proj`, `fc1`, `mm_input_projection`).
pub fn role(name: &str) -> String {
    let stem = name
        .strip_suffix(".weight")
        .or_else(|| name.strip_suffix(".bias"))
        .or_else(|| name.strip_suffix("_weight"))
        .unwrap_or(name);
    stem.rsplit('.').next().unwrap_or(stem).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tower_names_map_to_llama_cpp_names_and_back() {
        let (g, layer, rel) =
            twin("vision_tower.vision_model.encoder.layers.12.self_attn.q_proj.weight")
                .expect("a rule");
        assert_eq!(
            (g.as_str(), layer, rel),
            ("v.blk.12.attn_q.weight", Some(12), Relation::Same)
        );
        let (g, _, rel) = twin("multi_modal_projector.mm_input_projection_weight").expect("a rule");
        assert_eq!(
            (g.as_str(), rel),
            ("mm.input_projection.weight", Relation::Transposed)
        );
        let gemma = TowerFamily::Gemma3;
        let qwen = TowerFamily::Qwen35;
        assert_eq!(
            tower_of(gemma, "v.blk.3.ffn_down.weight")
                .map(|t| t.0)
                .as_deref(),
            Some("vision_tower.vision_model.encoder.layers.3.mlp.fc2.weight")
        );
        assert_eq!(
            tower_of(qwen, "v.blk.3.ffn_down.weight")
                .map(|t| t.0)
                .as_deref(),
            Some("model.visual.blocks.3.mlp.linear_fc2.weight")
        );
        // The second temporal slice belongs to Qwen3.5's stacked kernel; `.1` of anything else
        // is not a tower tensor.
        let (t, _, rel) = tower_of(qwen, "v.patch_embd.weight.1").expect("a rule");
        assert_eq!(
            (t.as_str(), rel),
            (
                "model.visual.patch_embed.proj.weight",
                Relation::StackedTime
            )
        );
        assert!(tower_of(gemma, "v.patch_embd.weight.1").is_none());
        assert!(tower_of(gemma, "v.blk.3.attn_q.weight.1").is_none());
        assert!(twin("vision_tower.vision_model.encoder.layers.x.mlp.fc1.weight").is_none());
        assert_eq!(
            role("multi_modal_projector.mm_input_projection_weight"),
            "mm_input_projection"
        );
        assert_eq!(role("model.visual.blocks.0.attn.qkv.weight"), "qkv");
    }
}
