//! The name map GGUF ↔ pack per family, and the transforms applied to the GGUF side before
//! comparing (verification.md §1.2–§1.3).

/// How pack rows map to GGUF rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowMap {
    /// Pack row i is GGUF row i.
    Identity,
    /// llama.cpp's RoPE interleave undone per head of `head_dim` rows: pack row `h·D + j·(D/2) + p`
    /// ← GGUF row `h·D + 2p + j` (golden).
    LlamaQk {
        /// D (`<arch>.rope.dimension_count`, else the head dim).
        head_dim: u64,
    },
    /// Qwen3.5 full-attention `q_proj`: GGUF interleaves `[q ; gate]` per head, the pack stacks all
    /// q then all gate: pack row `j·(nH·D) + h·D + t` ← GGUF row `h·2D + j·D + t` (golden).
    Qwen35QGate {
        /// nH.
        heads: u64,
        /// D.
        head_dim: u64,
    },
    /// The pack holds the GGUF tensor transposed: pack row i is GGUF column i (Qwen3.5's
    /// `ssm_conv1d`, `[kernel][channels]` in the pack, `[channels][kernel]` in the GGUF).
    Transpose,
}

impl RowMap {
    /// The GGUF row holding pack row `row`.
    /// (For [`RowMap::Transpose`], which maps a row to a column, the index itself.)
    pub fn gguf_row(self, row: u64) -> u64 {
        match self {
            RowMap::Identity | RowMap::Transpose => row,
            RowMap::LlamaQk { head_dim: d } => {
                let (h, i) = (row / d, row % d);
                let (j, p) = (i / (d / 2), i % (d / 2));
                h * d + 2 * p + j
            }
            RowMap::Qwen35QGate { heads, head_dim: d } => {
                let (j, rest) = (row / (heads * d), row % (heads * d));
                let (h, t) = (rest / d, rest % d);
                h * 2 * d + j * d + t
            }
        }
    }
}

/// The GGUF twin of a pack tensor and how to bring it to the pack's form.
#[derive(Clone, Debug, PartialEq)]
pub struct Twin {
    /// GGUF tensor name.
    pub gguf: String,
    /// Row mapping.
    pub rows: RowMap,
    /// Multiply the GGUF values by this before comparing (Gemma's √H embedding scale).
    pub scale: Option<f32>,
    /// Why this twin, for the table (e.g. "tied: lm_head quantized from token_embd").
    pub note: String,
}

/// GGUF architectures whose q/k rows llama.cpp's converter permuted (verification.md §1.3).
pub fn permutes_qk(arch: &str) -> bool {
    matches!(arch, "llama" | "granite" | "nanbeige" | "mistral" | "deci")
}

/// Whether the arch stores Gemma's pre-scaled embedding in the pack.
pub fn prescaled_embedding(arch: &str) -> bool {
    arch.starts_with("gemma3") || arch.starts_with("gemma4") || arch == "gemma"
}

fn uses_post_attention_norm(arch: &str) -> bool {
    arch.starts_with("gemma") || arch.starts_with("qwen35") || arch == "gpt-oss"
}

/// Model facts the map needs, from the GGUF metadata or config.
#[derive(Clone, Copy, Debug)]
pub struct MapDims {
    /// Hidden width H.
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Head dim for the RoPE interleave.
    pub rope_dim: u64,
    /// Head dim.
    pub head_dim: u64,
}

/// The GGUF twin of pack tensor `name` in a GGUF of architecture `arch`; `has` says whether the GGUF
/// holds a tensor (for the tied head). `None` when the map has no entry.
pub fn twin(arch: &str, name: &str, dims: MapDims, has: impl Fn(&str) -> bool) -> Option<Twin> {
    let plain = |g: String, note: &str| Twin {
        gguf: g,
        rows: RowMap::Identity,
        scale: None,
        note: note.to_string(),
    };
    if name == "model.embed_tokens.weight" || name == "model.token_embd.weight" {
        let mut t = plain("token_embd.weight".into(), "embedding");
        if prescaled_embedding(arch) {
            t.scale = Some((dims.hidden as f32).sqrt());
            t.note = format!("embedding × √{} (pre-scaled in the pack)", dims.hidden);
        }
        return Some(t);
    }
    if name == "lm_head.weight" {
        return Some(if has("output.weight") {
            plain("output.weight".into(), "head")
        } else {
            plain(
                "token_embd.weight".into(),
                "tied: the head was quantized from the unscaled token_embd",
            )
        });
    }
    if name == "model.norm.weight" {
        // LFM2's final norm is llama.cpp's token_embd_norm (transformers' embedding_norm).
        if arch == "lfm2" {
            return Some(plain(
                "token_embd_norm.weight".into(),
                "final norm (lfm2: token_embd_norm)",
            ));
        }
        return Some(plain("output_norm.weight".into(), "final norm"));
    }
    if name == "rope_freqs.weight" {
        return Some(plain(
            "rope_freqs.weight".into(),
            "RoPE frequency divisors (llama3 scaling)",
        ));
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (n, field) = rest.split_once('.')?;
    let n: u64 = n.parse().ok()?;
    let b = |s: &str| format!("blk.{n}.{s}");
    let (g, rows) = match field {
        "input_layernorm.weight" => (b("attn_norm.weight"), RowMap::Identity),
        "post_attention_layernorm.weight" if uses_post_attention_norm(arch) => {
            (b("post_attention_norm.weight"), RowMap::Identity)
        }
        "post_attention_layernorm.weight" => (b("ffn_norm.weight"), RowMap::Identity),
        "pre_feedforward_layernorm.weight" => (b("ffn_norm.weight"), RowMap::Identity),
        "post_feedforward_layernorm.weight" => (b("post_ffw_norm.weight"), RowMap::Identity),
        "self_attn.q_proj.weight" => {
            let map = if arch.starts_with("qwen35") {
                RowMap::Qwen35QGate {
                    heads: dims.heads,
                    head_dim: dims.head_dim,
                }
            } else if permutes_qk(arch) {
                RowMap::LlamaQk {
                    head_dim: dims.rope_dim,
                }
            } else {
                RowMap::Identity
            };
            (b("attn_q.weight"), map)
        }
        "self_attn.k_proj.weight" => (
            b("attn_k.weight"),
            if permutes_qk(arch) {
                RowMap::LlamaQk {
                    head_dim: dims.rope_dim,
                }
            } else {
                RowMap::Identity
            },
        ),
        "self_attn.v_proj.weight" => (b("attn_v.weight"), RowMap::Identity),
        "self_attn.o_proj.weight" => (b("attn_output.weight"), RowMap::Identity),
        "self_attn.q_proj.bias" => (b("attn_q.bias"), RowMap::Identity),
        "self_attn.k_proj.bias" => (b("attn_k.bias"), RowMap::Identity),
        "self_attn.v_proj.bias" => (b("attn_v.bias"), RowMap::Identity),
        "self_attn.q_norm.weight" => (b("attn_q_norm.weight"), RowMap::Identity),
        "self_attn.k_norm.weight" => (b("attn_k_norm.weight"), RowMap::Identity),
        "mlp.gate_proj.weight" => (b("ffn_gate.weight"), RowMap::Identity),
        "mlp.up_proj.weight" => (b("ffn_up.weight"), RowMap::Identity),
        "mlp.down_proj.weight" => (b("ffn_down.weight"), RowMap::Identity),
        "shortconv.in_proj.weight" => (b("shortconv.in_proj.weight"), RowMap::Identity),
        "shortconv.out_proj.weight" => (b("shortconv.out_proj.weight"), RowMap::Identity),
        "shortconv.conv.weight" => (b("shortconv.conv.weight"), RowMap::Identity),
        // Qwen3.5's gated DeltaNet (FastFlowLM's names, verification.md §1.2; the z gate is
        // named like an attention tensor).
        "linear_attn.qkv_proj.weight" => (b("attn_qkv.weight"), RowMap::Identity),
        "self_attn.gate_proj.weight" => (b("attn_gate.weight"), RowMap::Identity),
        "linear_attn.ssm_out_proj.weight" => (b("ssm_out.weight"), RowMap::Identity),
        "linear_attn.ssm_alpha_proj.weight" | "linear_attn.ssm_alpha_proj.bf16.weight" => {
            (b("ssm_alpha.weight"), RowMap::Identity)
        }
        "linear_attn.ssm_beta_proj.weight" | "linear_attn.ssm_beta_proj.bf16.weight" => {
            (b("ssm_beta.weight"), RowMap::Identity)
        }
        "linear_attn.ssm_conv1d.weight" => (b("ssm_conv1d.weight"), RowMap::Transpose),
        "linear_attn.ssm_norm.weight" => (b("ssm_norm.weight"), RowMap::Identity),
        "linear_attn.ssm_a" => (b("ssm_a"), RowMap::Identity),
        "linear_attn.ssm_dt.bias" => (b("ssm_dt.bias"), RowMap::Identity),
        _ => return None,
    };
    let note = match rows {
        RowMap::Identity => String::new(),
        RowMap::LlamaQk { head_dim } => format!("llama.cpp q/k permutation undone, D = {head_dim}"),
        RowMap::Qwen35QGate { heads, head_dim } => {
            format!("qwen3.5 q/gate de-interleave, {heads} heads × {head_dim}")
        }
        RowMap::Transpose => "transposed to [kernel][channels]".into(),
    };
    Some(Twin {
        gguf: g,
        rows,
        scale: None,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_permutation_matches_the_spec_examples() {
        // q4nx-format §5: pack row 1 = GGUF row 2, pack row 17 = GGUF row 34 (D = 64).
        let m = RowMap::LlamaQk { head_dim: 64 };
        assert_eq!(m.gguf_row(1), 2);
        assert_eq!(m.gguf_row(17), 34);
        assert_eq!(m.gguf_row(32), 1);
        assert_eq!(m.gguf_row(64 + 33), 64 + 3);
    }

    #[test]
    fn qwen35_q_gate_split() {
        let m = RowMap::Qwen35QGate {
            heads: 2,
            head_dim: 64,
        };
        assert_eq!(m.gguf_row(0), 0); // q of head 0
        assert_eq!(m.gguf_row(64), 128); // q of head 1
        assert_eq!(m.gguf_row(128), 64); // gate of head 0
        assert_eq!(m.gguf_row(192 + 5), 192 + 5); // gate of head 1
    }

    #[test]
    fn family_norm_names_differ() {
        let d = MapDims {
            hidden: 640,
            heads: 4,
            rope_dim: 256,
            head_dim: 256,
        };
        let t = |arch, n| twin(arch, n, d, |_| false).map(|t| t.gguf);
        assert_eq!(
            t("llama", "model.layers.3.post_attention_layernorm.weight").as_deref(),
            Some("blk.3.ffn_norm.weight")
        );
        assert_eq!(
            t("gemma3", "model.layers.3.post_attention_layernorm.weight").as_deref(),
            Some("blk.3.post_attention_norm.weight")
        );
        assert_eq!(
            t("gemma3", "model.layers.0.pre_feedforward_layernorm.weight").as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(
            t("gemma3", "lm_head.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            t("lfm2", "model.norm.weight").as_deref(),
            Some("token_embd_norm.weight")
        );
        assert_eq!(
            t("lfm2", "model.layers.0.shortconv.in_proj.weight").as_deref(),
            Some("blk.0.shortconv.in_proj.weight")
        );
        assert_eq!(
            t("lfm2", "model.token_embd.weight").as_deref(),
            Some("token_embd.weight")
        );
        let emb = twin("gemma3", "model.embed_tokens.weight", d, |_| false).expect("embedding");
        assert_eq!(emb.scale, Some(25.298222));
    }
}
