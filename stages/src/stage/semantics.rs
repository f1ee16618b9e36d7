//! The semantics stage: derives [`crate::semantics::Semantics`] from a repository's config files,
//! checks it against the pack's tensor names, and writes the decisions as JSON plus the `semantics`
//! (one row) and `layers` (one row per layer) tables.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field};
use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};
use serde_json::Value;

use super::{batch, write_tables};
use crate::error::{Error, Result};
use crate::format::q4nx::Container;
use crate::semantics::{LayerKind, Semantics, SideFiles, derive};

/// The optional side files of a repository, by input name and file name.
pub const SIDE_FILES: [(&str, &str); 4] = [
    ("tokenizer_config", "tokenizer_config.json"),
    ("tokenizer", "tokenizer.json"),
    ("generation_config", "generation_config.json"),
    ("chat_template", "chat_template.jinja"),
];

/// Reads a repository folder's config files and derives its semantics (no pack check).
pub fn semantics_of_dir(dir: &Path) -> Result<Semantics> {
    let read = |name: &str| -> Result<Option<Value>> {
        let p = dir.join(name);
        if !p.is_file() {
            return Ok(None);
        }
        let bytes = fs_err::read(&p)?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Config {
                file: p,
                reason: format!("not JSON: {e}"),
            })
    };
    let config = read("config.json")?.ok_or_else(|| Error::Config {
        file: dir.join("config.json"),
        reason: "missing".into(),
    })?;
    let (tc, tok, generation) = (
        read("tokenizer_config.json")?,
        read("tokenizer.json")?,
        read("generation_config.json")?,
    );
    let side = SideFiles {
        tokenizer_config: tc.as_ref(),
        tokenizer: tok.as_ref(),
        generation_config: generation.as_ref(),
        chat_template_file: dir.join("chat_template.jinja").is_file(),
    };
    derive(&config, &side).map_err(|r| Error::Refused {
        file: dir.join("config.json"),
        tensor: r.key.clone(),
        reason: r.message,
    })
}

/// The stage.
pub struct SemanticsStage {
    /// The repository folder.
    pub dir: PathBuf,
    /// Inputs that only order the stage (e.g. after the fetch stage).
    pub extra: Vec<Input>,
}

impl SemanticsStage {
    /// The stage's name and version; the version is bumped whenever the decisions written for the
    /// same input can change.
    pub const ID: StageId<'static> = StageId::new("semantics", 2);
}

impl Stage for SemanticsStage {
    fn inputs(&self) -> Vec<Input> {
        let mut v = vec![
            Input::external("config", self.dir.join("config.json")),
            Input::external("model", self.dir.join("model.q4nx")),
        ];
        for (name, file) in SIDE_FILES {
            let p = self.dir.join(file);
            if p.is_file() {
                v.push(Input::external(name, p));
            }
        }
        v.extend(self.extra.iter().cloned());
        v
    }
    fn outputs(&self) -> Vec<String> {
        vec!["semantics.json".into(), "tables".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        // The inputs are the repository's own files; read them where the engine hashed them.
        let dir = ctx
            .input("config")?
            .parent()
            .ok_or("config.json has no parent folder")?
            .to_path_buf();
        let sem = semantics_of_dir(&dir)?;
        let container = Container::open(ctx.input("model")?)?;
        let names = container.tensors().iter().map(|t| t.name.clone()).collect();
        sem.check_pack(&names).map_err(|r| Error::Refused {
            file: container.path().to_path_buf(),
            tensor: r.key.clone(),
            reason: r.message,
        })?;
        for d in &sem.decisions {
            tracing::debug!(decision = %d);
        }
        fs_err::write(
            ctx.output("semantics.json"),
            serde_json::to_vec_pretty(&sem)?,
        )?;
        write_tables(
            &ctx.output("tables"),
            &[
                ("semantics", semantics_table(&sem)?),
                ("layers", layers_table(&sem)?),
            ],
        )?;
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        Self::ID
    }
}

fn name_of<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The `semantics` table: one row with the pack's derived quantities and its decision log.
pub fn semantics_table(s: &Semantics) -> Result<RecordBatch> {
    let str_col = |v: &str| -> ArrayRef {
        let mut b = StringBuilder::new();
        b.append_value(v);
        Arc::new(b.finish())
    };
    let u_col = |v: Option<u64>| -> ArrayRef {
        let mut b = UInt64Builder::new();
        b.append_option(v);
        Arc::new(b.finish())
    };
    let f_col = |v: Option<f64>| -> ArrayRef {
        let mut b = Float64Builder::new();
        b.append_option(v);
        Arc::new(b.finish())
    };
    let b_col = |v: bool| -> ArrayRef {
        let mut b = BooleanBuilder::new();
        b.append_value(v);
        Arc::new(b.finish())
    };
    let eos = s
        .eos_ids
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let flags =
        s.decisions.iter().filter(|d| d.flag.is_some()).count() as u64 + s.unknown.len() as u64;
    use DataType::*;
    let f = |n: &str, t: DataType, null: bool| Field::new(n, t, null);
    batch(
        "semantics",
        vec![
            f("family", Utf8, false),
            f("model_type", Utf8, false),
            f("hidden", UInt64, true),
            f("layers", UInt64, true),
            f("heads", UInt64, true),
            f("kv_heads", UInt64, true),
            f("head_dim", UInt64, true),
            f("intermediate", UInt64, true),
            f("vocab", UInt64, true),
            f("eps", Float64, true),
            f("activation", Utf8, false),
            f("qk_norm", Utf8, false),
            f("norm_form", Utf8, false),
            f("attn_scale", Float64, true),
            f("tied", Boolean, false),
            f("embed_scale", Float64, true),
            f("final_softcap", Float64, true),
            f("bos_id", UInt64, true),
            f("add_bos", Boolean, false),
            f("eos_ids", Utf8, false),
            f("chat_template", Utf8, false),
            f("flags", UInt64, true),
            f("decisions", Utf8, false),
        ],
        vec![
            str_col(&name_of(&s.family)),
            str_col(&s.model_type),
            u_col(Some(s.hidden)),
            u_col(Some(s.layers)),
            u_col(Some(s.heads)),
            u_col(Some(s.kv_heads)),
            u_col(Some(s.head_dim)),
            u_col(Some(s.intermediate)),
            u_col(Some(s.vocab)),
            f_col(Some(s.eps)),
            str_col(&name_of(&s.activation)),
            str_col(&name_of(&s.qk_norm)),
            str_col(&name_of(&s.norm_form)),
            f_col(Some(s.attn_scale)),
            b_col(s.tied),
            f_col(s.embed_scale),
            f_col(s.final_softcap),
            u_col(s.bos_id),
            b_col(s.add_bos),
            str_col(&eos),
            str_col(&s.chat_template),
            u_col(Some(flags)),
            str_col(&s.log()),
        ],
    )
}

/// The `layers` table: one row per layer with its kind, window and RoPE.
pub fn layers_table(s: &Semantics) -> Result<RecordBatch> {
    let mut layer = UInt64Builder::new();
    let mut kind = StringBuilder::new();
    let mut window = UInt64Builder::new();
    let mut base = Float64Builder::new();
    let mut rot = UInt64Builder::new();
    let mut scaling = StringBuilder::new();
    let mut softmax = BooleanBuilder::new();
    for (i, k) in s.layer_kinds.iter().enumerate() {
        layer.append_value(i as u64);
        kind.append_value(match k {
            LayerKind::FullAttention => "full_attention",
            LayerKind::SlidingAttention { .. } => "sliding_attention",
            LayerKind::LinearAttention => "linear_attention",
            LayerKind::Conv => "conv",
        });
        window.append_option(match k {
            LayerKind::SlidingAttention { window } => Some(*window),
            _ => None,
        });
        let rope = k.rope_key().and_then(|r| s.rope.get(r));
        base.append_option(rope.map(|r| r.base));
        rot.append_option(rope.map(|r| r.rotary_dim));
        scaling.append_option(rope.map(|r| {
            serde_json::to_value(&r.scaling)
                .ok()
                .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_default()
        }));
        softmax.append_value(k.is_softmax());
    }
    use DataType::*;
    batch(
        "layers",
        vec![
            Field::new("layer", UInt64, false),
            Field::new("kind", Utf8, false),
            Field::new("window", UInt64, true),
            Field::new("rope_base", Float64, true),
            Field::new("rotary_dim", UInt64, true),
            Field::new("rope_scaling", Utf8, true),
            Field::new("softmax_attention", Boolean, false),
        ],
        vec![
            Arc::new(layer.finish()),
            Arc::new(kind.finish()),
            Arc::new(window.finish()),
            Arc::new(base.finish()),
            Arc::new(rot.finish()),
            Arc::new(scaling.finish()),
            Arc::new(softmax.finish()),
        ],
    )
}
