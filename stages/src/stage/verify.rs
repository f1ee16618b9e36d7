//! The verify stage: every tensor against the GGUF reference and the tied head against the
//! embedding, by the rules of [`crate::verify`]; the `verification` table and the pack verdict.

use std::path::Path;

use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};

use super::RepoInputs;
use super::semantics::semantics_of_dir;
use super::write_tables;
use crate::error::{Error, Result};
use crate::format::gguf::GgufFile;
use crate::format::q4nx::Container;
use crate::layout::TensorLayout;
use crate::layout::geometry::Geometry;
use crate::verify::rope::ROPE_FREQS;
use crate::verify::{PackVerdict, VerifyRow, run_verify};

/// The verify stage: every tensor against the GGUF reference and the tied head against the
/// embedding (see [`crate::verify`]).
pub struct VerifyStage {
    pub(crate) repo: RepoInputs,
    pub(crate) tie_rows: u64,
}

impl VerifyStage {
    /// The stage's name and version; the version is bumped whenever the table or verdict written
    /// for the same input can change.
    /// v2: "same source" needs codes the tile holds natively (requantized tensors are judged
    /// against the expected correlation of the two quantization noises).
    /// v3: the tied-head fit of a head with signed codes is bounded by the symmetric 4-bit floor
    /// too (a symmetric head requantized from an asymmetric embedding failed the seed's floor);
    /// FFN-padded tensors (qwen2) are compared on their GGUF's extent, the padding required zero.
    /// v4: a pack's `rope_freqs.weight` is compared with its GGUF twin and with the divisors
    /// config.json's RoPE implies.
    /// v5: LFM2's short-convolution tensors and FastFlowLM's names for them are verified against
    /// their GGUF twins, on the family's auto-adjusted FFN width.
    /// v6: Qwen3.5's gated-DeltaNet tensors are verified against their GGUF twins; a small tensor
    /// the GGUF stores transposed (a convolution kernel) is compared column for row.
    /// v7: a tensor whose last row block holds rows past the real ones (a vocabulary off the
    /// tile's row block) says so in its reason: how many rows are stored and what they are.
    pub const ID: StageId<'static> = StageId::new("verify", 7);
}

impl Stage for VerifyStage {
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "tie_rows": self.tie_rows })
    }
    fn inputs(&self) -> Vec<Input> {
        self.repo
            .inputs(&[Input::artifact("layouts", "detect", "layouts.json")])
    }
    fn outputs(&self) -> Vec<String> {
        vec!["verification".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let container = Container::open(ctx.input("model")?)?;
        let layouts: Vec<TensorLayout> =
            serde_json::from_slice(&fs_err::read(ctx.input("layouts")?)?)?;
        let geometry = self.repo.geometry(ctx)?;
        let gguf = self.repo.gguf(ctx)?;
        let config = self.repo.config(ctx)?;
        let (rows, verdict) = verify_container(
            &container,
            &layouts,
            geometry.as_ref(),
            gguf.as_ref(),
            config.as_deref(),
            self.tie_rows,
        )?;
        write_verification(&ctx.output("verification"), &rows, &verdict)?;
        tracing::info!(verdict = %verdict.summary);
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        Self::ID
    }
}

/// Verifies `container` by [`run_verify`]; `config` is the repository's config.json, whose
/// semantics give the RoPE a pack's `rope_freqs.weight` must match (derived only for such a pack).
pub(crate) fn verify_container(
    container: &Container,
    layouts: &[TensorLayout],
    geometry: Option<&Geometry>,
    gguf: Option<&GgufFile>,
    config: Option<&Path>,
    tie_rows: u64,
) -> Result<(Vec<VerifyRow>, PackVerdict)> {
    let rope = if layouts.iter().any(|l| l.name == ROPE_FREQS) {
        match config {
            Some(config) => match config.parent().map(semantics_of_dir) {
                Some(Ok(sem)) => sem
                    .rope
                    .get("full")
                    .or_else(|| sem.rope.values().next())
                    .cloned()
                    .ok_or_else(|| "the semantics have no RoPE".to_string()),
                Some(Err(e)) => Err(format!("the semantics refused config.json: {e}")),
                None => Err("config.json has no folder".to_string()),
            },
            None => Err("no config.json".to_string()),
        }
    } else {
        Err("not needed".to_string())
    };
    run_verify(
        container,
        layouts,
        geometry,
        gguf,
        rope.as_ref().map_err(String::as_str),
        tie_rows,
    )
}

/// Writes the `verification` table and `verdict.json` into `dir`.
pub(crate) fn write_verification(
    dir: &Path,
    rows: &[VerifyRow],
    verdict: &PackVerdict,
) -> Result<()> {
    write_tables(dir, &[("verification", verification_table(rows)?)])?;
    let json = serde_json::to_vec_pretty(verdict).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(fs_err::write(dir.join("verdict.json"), json)?)
}

/// The `verification` table.
pub fn verification_table(rows: &[VerifyRow]) -> Result<arrow_array::RecordBatch> {
    use arrow_array::builder::{Float64Builder, StringBuilder, UInt64Builder};
    use arrow_schema::{DataType, Field, Schema};
    let mut tensor = StringBuilder::new();
    let mut reference = StringBuilder::new();
    let mut reading = StringBuilder::new();
    let mut compared = UInt64Builder::new();
    let mut f: Vec<Float64Builder> = (0..9).map(|_| Float64Builder::new()).collect();
    let mut verdict = StringBuilder::new();
    let mut reason = StringBuilder::new();
    for r in rows {
        tensor.append_value(&r.tensor);
        reference.append_value(&r.reference);
        reading.append_value(&r.reading);
        compared.append_value(r.compared);
        for (b, v) in f.iter_mut().zip([
            r.corr,
            r.rel_l1,
            r.rel_l2,
            r.max_err,
            r.exact_fraction,
            r.scale,
            r.rms_ratio,
            r.floor,
            r.expected,
        ]) {
            b.append_option(v);
        }
        verdict.append_value(r.verdict.as_str());
        reason.append_value(&r.reason);
    }
    let names = [
        "corr",
        "rel_l1",
        "rel_l2",
        "max_err",
        "exact_fraction",
        "scale",
        "rms_ratio",
        "floor",
        "expected",
    ];
    let mut fields = vec![
        Field::new("tensor", DataType::Utf8, false),
        Field::new("reference", DataType::Utf8, false),
        Field::new("reading", DataType::Utf8, false),
        Field::new("compared", DataType::UInt64, false),
    ];
    fields.extend(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Float64, true)),
    );
    fields.push(Field::new("verdict", DataType::Utf8, false));
    fields.push(Field::new("reason", DataType::Utf8, false));
    let mut cols: Vec<arrow_array::ArrayRef> = vec![
        std::sync::Arc::new(tensor.finish()),
        std::sync::Arc::new(reference.finish()),
        std::sync::Arc::new(reading.finish()),
        std::sync::Arc::new(compared.finish()),
    ];
    cols.extend(
        f.iter_mut()
            .map(|b| std::sync::Arc::new(b.finish()) as arrow_array::ArrayRef),
    );
    cols.push(std::sync::Arc::new(verdict.finish()));
    cols.push(std::sync::Arc::new(reason.finish()));
    arrow_array::RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), cols).map_err(|e| {
        Error::Table {
            table: "verification",
            reason: e.to_string(),
        }
    })
}
