//! `model_type`s refused by name: known models whose math we do not implement, or whose packs
//! are known to answer wrong, each with the reason; anything else has no semantics table.

use serde_json::{Map, Value};

use crate::semantics::Refusal;

/// The refusal for a `model_type` no family in the registry names.
pub(super) fn refusal(mt: &str, top: &Map<String, Value>) -> Refusal {
    match mt {
        "gemma2" => Refusal::new(
            mt,
            "model_type",
            mt,
            "model_type \"gemma2\": known to answer garbage although its head fits (scale 0.992, rel 1.07x its 4-bit floor); refused until a pack verifies end to end",
        ),
        "qwen3_next" => Refusal::new(
            mt,
            "model_type",
            mt,
            "model_type \"qwen3_next\" (Qwen3NextForCausalLM) has no semantics table; it is not treated as qwen3_5",
        ),
        "granitemoehybrid" => Refusal::new(
            mt,
            "layer_types",
            "mamba",
            "model_type \"granitemoehybrid\": layer_types contains \"mamba\" (no mamba layer kind)",
        ),
        "lfm2_moe" => {
            let n = top.get("num_experts").and_then(Value::as_u64).unwrap_or(0);
            Refusal::new(
                mt,
                "model_type",
                mt,
                format!("model_type \"lfm2_moe\" (num_experts {n}): no MoE route for this family"),
            )
        }
        other => Refusal::new(
            other,
            "model_type",
            other,
            format!("model_type \"{other}\" has no semantics table"),
        ),
    }
}
