//! The repair stage (`--repair`): every tensor verification failed with the broken-conversion
//! signature, rebuilt from a provable source ([`crate::repair`]) into the tile kind and layout the
//! pack used for it, written into a copy of `model.q4nx` that differs from the original only in
//! those tensors' bytes; the copy is detected and verified again like any pack.
//!
//! Outputs: `model.q4nx` (the repaired container), `layouts.json` and `verification/` (detect
//! and verify of the repaired bytes), `repairs.json` (what was rebuilt, from what, with the
//! error). A pack with nothing to repair passes through unchanged (its model linked, its layouts
//! and verdict copied). A broken tensor with no provable source fails the stage naming it.

use std::io::{Seek, SeekFrom, Write};

use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};

use super::RepoInputs;
use super::detect::reference_of;
use super::verify::{verify_container, write_verification};
use crate::error::Error;
use crate::format::q4nx::Container;
use crate::layout::TensorLayout;
use crate::layout::detect::detect_pack_with;
use crate::repair::{Repaired, is_broken, plan, rebuild};
use crate::verify::{PackVerdict, reference_dims};

/// The repair stage.
pub struct RepairStage {
    pub(crate) repo: RepoInputs,
    pub(crate) tie_rows: u64,
}

impl RepairStage {
    /// The stage's name and version; the version is bumped whenever the repaired bytes or the
    /// verdict written for the same input can change.
    pub const ID: StageId<'static> = StageId::new("repair", 1);
}

impl Stage for RepairStage {
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "tie_rows": self.tie_rows })
    }
    fn inputs(&self) -> Vec<Input> {
        self.repo.inputs(&[
            Input::artifact("layouts", "detect", "layouts.json"),
            Input::artifact("verification", "verify", "verification"),
        ])
    }
    fn outputs(&self) -> Vec<String> {
        vec![
            "model.q4nx".into(),
            "layouts.json".into(),
            "verification".into(),
            "repairs.json".into(),
        ]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let model = ctx.input("model")?.to_path_buf();
        let container = Container::open(&model)?;
        let layouts: Vec<TensorLayout> =
            serde_json::from_slice(&fs_err::read(ctx.input("layouts")?)?)?;
        let geometry = self.repo.geometry(ctx)?;
        let gguf = self.repo.gguf(ctx)?;
        let config = self.repo.config(ctx)?;
        let (arch, dims) = reference_dims(geometry.as_ref(), gguf.as_ref());
        let (planned, refused) = plan(&layouts, gguf.as_ref(), &arch, dims);
        if let Some(first) = refused.first() {
            return Err(Error::Refused {
                file: model.clone(),
                tensor: first.tensor.clone(),
                reason: format!(
                    "--repair cannot rebuild it: {}{}",
                    first.why,
                    if refused.len() > 1 {
                        format!(
                            " (and {})",
                            refused[1..]
                                .iter()
                                .map(|u| format!("{}: {}", u.tensor, u.why))
                                .collect::<Vec<_>>()
                                .join("; ")
                        )
                    } else {
                        String::new()
                    }
                ),
            }
            .into());
        }
        let out_model = ctx.output("model.q4nx");
        let verification = ctx.output("verification");
        if planned.is_empty() {
            // Nothing broken: the pack passes through as it is.
            let real = fs_err::canonicalize(&model)?;
            if fs_err::hard_link(&real, &out_model).is_err() {
                fs_err::copy(&real, &out_model)?;
            }
            fs_err::copy(ctx.input("layouts")?, ctx.output("layouts.json"))?;
            let from = ctx.input("verification")?.to_path_buf();
            fs_err::create_dir_all(&verification)?;
            for f in ["verification.parquet", "verdict.json"] {
                fs_err::copy(from.join(f), verification.join(f))?;
            }
            fs_err::write(ctx.output("repairs.json"), b"[]\n")?;
            return Ok(());
        }

        // Rebuild every planned tensor, then patch a copy of the container in place: same
        // offsets, same sizes, every other byte the original's.
        let mut patches = Vec::new();
        let mut repaired: Vec<Repaired> = Vec::new();
        for p in &planned {
            let l = layouts
                .iter()
                .find(|l| l.name == p.tensor)
                .ok_or_else(|| Error::Internal(format!("no layout for {}", p.tensor)))?;
            let info = container
                .tensor(&p.tensor)
                .ok_or_else(|| Error::Internal(format!("no tensor {}", p.tensor)))?;
            let (bytes, report) = rebuild(&container, &layouts, l, p, gguf.as_ref(), &arch, dims)?;
            if bytes.len() as u64 != info.nbytes() {
                return Err(Error::Internal(format!(
                    "{}: rebuilt {} bytes for {}",
                    p.tensor,
                    bytes.len(),
                    info.nbytes()
                ))
                .into());
            }
            tracing::info!(tensor = %report.tensor, source = %report.source, rel_l2 = report.rel_l2, "repaired");
            patches.push((container.header().data_start() + info.begin, bytes));
            repaired.push(report);
        }
        fs_err::copy(&model, &out_model)?;
        {
            let mut f = fs_err::OpenOptions::new().write(true).open(&out_model)?;
            for (offset, bytes) in &patches {
                f.seek(SeekFrom::Start(*offset))?;
                f.write_all(bytes)?;
            }
            f.sync_all()?;
        }

        // The repaired bytes are judged like any pack's: detected and verified again.
        let fixed = Container::open(&out_model)?;
        let reference = gguf.as_ref().map(|g| reference_of(g, geometry.as_ref()));
        let fixed_layouts = detect_pack_with(&fixed, geometry.as_ref(), reference.as_ref())?;
        if let Some(l) = fixed_layouts
            .iter()
            .find(|l| is_broken(l) && repaired.iter().any(|r| r.tensor == l.name))
        {
            return Err(Error::Internal(format!(
                "{} still carries the broken-conversion signature after its rebuild",
                l.name
            ))
            .into());
        }
        let (rows, mut verdict): (_, PackVerdict) = verify_container(
            &fixed,
            &fixed_layouts,
            geometry.as_ref(),
            gguf.as_ref(),
            config.as_deref(),
            self.tie_rows,
        )?;
        verdict.repaired = repaired
            .iter()
            .map(|r| format!("{} <- {}", r.tensor, r.source))
            .collect();
        verdict.summary = format!(
            "repaired {} tensor{} ({}); {}",
            repaired.len(),
            if repaired.len() == 1 { "" } else { "s" },
            repaired
                .iter()
                .map(|r| r.tensor.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            verdict.summary
        );
        fs_err::write(
            ctx.output("layouts.json"),
            serde_json::to_vec_pretty(&fixed_layouts)?,
        )?;
        write_verification(&verification, &rows, &verdict)?;
        fs_err::write(
            ctx.output("repairs.json"),
            serde_json::to_vec_pretty(&repaired)?,
        )?;
        tracing::info!(verdict = %verdict.summary);
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        Self::ID
    }
}
