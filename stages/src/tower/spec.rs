//! How the runtime runs a vision tower ([`VisionSpec`]), read from the repository's files: the
//! family from the tower's own tensor names, the encoder's geometry from `config.json`'s `vision_config`, the tokens an image becomes from
//! `config.json` (`mm_tokens_per_image`, `image_token_index`, …) or, where the config does not
//! name them, from the tokenizer's own special tokens, and the preprocessing from
//! `preprocessor_config.json` or Gemma 3's processor defaults. Each value records its source; a
//! value that cannot be found, or two sources that disagree, is a reason the tower is not
//! served, never a guess.

use onebit_pack::manifest::VisionSpec;
use serde_json::Value;

use super::names::TowerFamily;

/// SigLIP's LayerNorm epsilon where `vision_config` does not say (transformers'
/// `SiglipVisionConfig` default, which Gemma 3's checkpoints rely on).
const SIGLIP_EPS: f64 = 1e-6;
/// Gemma 3's processor normalization (`Gemma3ImageProcessor`: SigLIP's 0.5 mean and deviation).
const GEMMA3_MEAN_STD: f32 = 0.5;

/// The files the spec is read from.
pub struct SpecSources<'a> {
    /// The tower's family by its tensor names, when they name one.
    pub family: Option<TowerFamily>,
    /// `config.json`.
    pub config: &'a Value,
    /// `tokenizer.json`.
    pub tokenizer: &'a Value,
    /// `preprocessor_config.json`, when the repository has one.
    pub preprocessor: Option<&'a Value>,
    /// The language model's width (the pack's model spec).
    pub text_hidden: usize,
}

/// The runtime's spec of a Gemma 3 vision tower, or why it cannot serve images from this
/// repository (a family whose encoder is not built, a value nowhere to be found).
pub fn vision_spec(src: &SpecSources<'_>) -> Result<VisionSpec, String> {
    let cfg = src.config;
    let vision = cfg
        .get("vision_config")
        .ok_or("config.json has no vision_config: the encoder's geometry is unknown")?;
    let mut decisions = Vec::new();
    match src.family {
        Some(TowerFamily::Gemma3) => {
            decisions.push("family=gemma3 <- the tower's tensor names (vision_tower.*, multi_modal_projector.*)".to_string());
        }
        Some(TowerFamily::Qwen35) => {
            return Err(
                "Qwen3.5's vision encoder (its ViT with 2-D rotary positions and the merger) is \
                 not built on the host yet: images are refused"
                    .into(),
            );
        }
        None => {
            return Err(
                "the tower's tensor names are no family the host encodes (Gemma 3's SigLIP): \
                 images are refused"
                    .into(),
            );
        }
    }
    let mut num = |key: &str| -> Result<usize, String> {
        let v = vision
            .get(key)
            .and_then(Value::as_u64)
            .filter(|&v| v > 0)
            .ok_or(format!("config.json vision_config has no {key}"))?;
        decisions.push(format!("{key}={v} <- config.json vision_config.{key}"));
        Ok(v as usize)
    };
    let hidden = num("hidden_size")?;
    let heads = num("num_attention_heads")?;
    let layers = num("num_hidden_layers")?;
    let image_size = num("image_size")?;
    let patch_size = num("patch_size")?;
    let eps = match vision.get("layer_norm_eps").and_then(Value::as_f64) {
        Some(e) => {
            decisions.push(format!(
                "eps={e} <- config.json vision_config.layer_norm_eps"
            ));
            e
        }
        None => {
            decisions.push(format!(
                "eps={SIGLIP_EPS} <- SigLIP's default (vision_config has no layer_norm_eps)"
            ));
            SIGLIP_EPS
        }
    };
    if hidden % heads != 0 || image_size % patch_size != 0 {
        return Err(format!(
            "vision_config is inconsistent: hidden_size {hidden} over {heads} heads, image_size \
             {image_size} over patch_size {patch_size}"
        ));
    }
    let tokens_per_image = cfg
        .get("mm_tokens_per_image")
        .and_then(Value::as_u64)
        .ok_or("config.json has no mm_tokens_per_image")? as usize;
    let side = image_size / patch_size;
    let pooled = (tokens_per_image as f64).sqrt() as usize;
    if pooled * pooled != tokens_per_image || pooled == 0 || side % pooled != 0 {
        return Err(format!(
            "mm_tokens_per_image {tokens_per_image} does not pool the {side}x{side} patch grid \
             into a square"
        ));
    }
    decisions.push(format!(
        "tokens_per_image={tokens_per_image} <- config.json mm_tokens_per_image"
    ));
    let (start_token, start_text) = token(
        cfg,
        src.tokenizer,
        "boi_token_index",
        "<start_of_image>",
        &mut decisions,
    )?;
    let (end_token, end_text) = token(
        cfg,
        src.tokenizer,
        "eoi_token_index",
        "<end_of_image>",
        &mut decisions,
    )?;
    let (image_token, image_text) = token(
        cfg,
        src.tokenizer,
        "image_token_index",
        "<image_soft_token>",
        &mut decisions,
    )?;
    let (mean, std) = normalization(src.preprocessor, &mut decisions)?;
    decisions.push(format!(
        "text_hidden={} <- the language model's hidden size",
        src.text_hidden
    ));
    Ok(VisionSpec {
        family: "gemma3".into(),
        hidden,
        heads,
        layers,
        image_size,
        patch_size,
        eps: eps as f32,
        tokens_per_image,
        text_hidden: src.text_hidden,
        mean,
        std,
        start_token,
        start_text,
        end_token,
        end_text,
        image_token,
        image_text,
        decisions,
    })
}

/// A special token's id and text: config.json's `key` where it has one (checked against the
/// tokenizer's token of that id), else the tokenizer's added token spelled `text`.
fn token(
    cfg: &Value,
    tokenizer: &Value,
    key: &str,
    text: &str,
    decisions: &mut Vec<String>,
) -> Result<(u32, String), String> {
    let added: Vec<(u64, &str)> = tokenizer
        .get("added_tokens")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|t| Some((t.get("id")?.as_u64()?, t.get("content")?.as_str()?)))
                .collect()
        })
        .unwrap_or_default();
    let by_text = added.iter().find(|(_, c)| *c == text).map(|(id, _)| *id);
    match (cfg.get(key).and_then(Value::as_u64), by_text) {
        (Some(id), Some(t)) if id != t => Err(format!(
            "config.json {key} is {id}, but the tokenizer's {text} is token {t}"
        )),
        (Some(id), found) => {
            let content = added
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, c)| c.to_string());
            let Some(content) = content.or(found.map(|_| text.to_string())) else {
                return Err(format!(
                    "config.json {key} is {id}, which the tokenizer has no special token for"
                ));
            };
            decisions.push(format!("{content}={id} <- config.json {key}"));
            Ok((id as u32, content))
        }
        (None, Some(id)) => {
            decisions.push(format!(
                "{text}={id} <- tokenizer.json added token (config.json has no {key})"
            ));
            Ok((id as u32, text.to_string()))
        }
        (None, None) => Err(format!(
            "neither config.json {key} nor a tokenizer token {text}: where images go in a prompt \
             is unknown"
        )),
    }
}

/// The processor's mean and deviation per channel.
fn normalization(
    pre: Option<&Value>,
    decisions: &mut Vec<String>,
) -> Result<([f32; 3], [f32; 3]), String> {
    let three = |v: &Value, key: &str| -> Result<[f32; 3], String> {
        let a: Vec<f32> = v
            .get(key)
            .and_then(Value::as_array)
            .ok_or(format!("preprocessor_config.json has no {key}"))?
            .iter()
            .filter_map(|x| x.as_f64().map(|x| x as f32))
            .collect();
        a.try_into()
            .map_err(|a: Vec<f32>| format!("preprocessor_config.json {key} has {} values", a.len()))
    };
    match pre {
        Some(p) => {
            let (mean, std) = (three(p, "image_mean")?, three(p, "image_std")?);
            if std.iter().any(|&s| s <= 0.0) {
                return Err(format!("preprocessor_config.json image_std {std:?}"));
            }
            decisions.push(format!(
                "mean={mean:?}, std={std:?} <- preprocessor_config.json"
            ));
            Ok((mean, std))
        }
        None => {
            let d = [GEMMA3_MEAN_STD; 3];
            decisions.push(format!(
                "mean={d:?}, std={d:?} <- Gemma 3's processor (no preprocessor_config.json)"
            ));
            Ok((d, d))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tokenizer() -> Value {
        json!({"added_tokens": [
            {"id": 255999, "content": "<start_of_image>"},
            {"id": 256000, "content": "<end_of_image>"},
            {"id": 262144, "content": "<image_soft_token>"}
        ]})
    }

    fn gemma3_4b() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/configs/gemma3/gemma-3-4b-it-reconstructed-partial/config.json"
        );
        serde_json::from_slice(&std::fs::read(path).expect("config")).expect("json")
    }

    #[test]
    fn gemma3_4bs_config_gives_the_towers_geometry_and_tokens_with_their_sources() {
        let (cfg, tok) = (gemma3_4b(), tokenizer());
        let s = vision_spec(&SpecSources {
            family: Some(TowerFamily::Gemma3),
            config: &cfg,
            tokenizer: &tok,
            preprocessor: None,
            text_hidden: 2560,
        })
        .expect("spec");
        assert_eq!(
            (s.hidden, s.heads, s.layers, s.image_size, s.patch_size),
            (1152, 16, 27, 896, 14)
        );
        assert_eq!(s.tokens_per_image, 256);
        assert_eq!(
            (s.start_token, s.end_token, s.image_token),
            (255999, 256000, 262144)
        );
        assert_eq!(s.start_text, "<start_of_image>");
        assert_eq!((s.mean, s.std), ([0.5; 3], [0.5; 3]));
        assert!(
            s.decisions
                .contains(&"<image_soft_token>=262144 <- config.json image_token_index".into()),
            "{:?}",
            s.decisions
        );
        assert!(s.decisions.iter().any(|d| d.starts_with("eps=0.000001")));
    }

    #[test]
    fn tokens_come_from_the_tokenizer_where_the_config_has_none_and_disagreement_is_refused() {
        let mut cfg = gemma3_4b();
        let obj = cfg.as_object_mut().expect("object");
        for k in ["boi_token_index", "eoi_token_index", "image_token_index"] {
            obj.remove(k);
        }
        let tok = tokenizer();
        let src = SpecSources {
            family: Some(TowerFamily::Gemma3),
            config: &cfg,
            tokenizer: &tok,
            preprocessor: None,
            text_hidden: 2560,
        };
        let s = vision_spec(&src).expect("spec");
        assert_eq!(s.image_token, 262144);
        assert!(s.decisions.iter().any(|d| d
            == "<image_soft_token>=262144 <- tokenizer.json added token (config.json has no image_token_index)"));
        let mut other = cfg.clone();
        other["image_token_index"] = json!(7);
        let err = vision_spec(&SpecSources {
            config: &other,
            ..src
        })
        .expect_err("disagreement");
        assert_eq!(
            err,
            "config.json image_token_index is 7, but the tokenizer's <image_soft_token> is token 262144"
        );
    }

    #[test]
    fn a_tower_of_another_family_is_not_served_by_name() {
        let cfg =
            json!({"model_type": "qwen3_5", "vision_config": {"model_type": "qwen3_5_vision"}});
        let tok = tokenizer();
        let err = vision_spec(&SpecSources {
            family: Some(TowerFamily::Qwen35),
            config: &cfg,
            tokenizer: &tok,
            preprocessor: None,
            text_hidden: 2048,
        })
        .expect_err("refused");
        assert!(err.starts_with("Qwen3.5's vision encoder"), "{err}");
    }
}
