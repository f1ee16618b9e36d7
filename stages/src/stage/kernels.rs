//! The kernels stage: the kernel set of the pack repack wrote ([`crate::kernel_set`]).
//!
//! Output: `kernels.json` (the set, every shape, every artifact and its kernels) and
//! `tables/kernels.parquet` (the catalog's `kernels` table).

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use onebit_pack::host::HostRuntime;
use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};

use super::write_tables;
use crate::error::{Error, Result};
use crate::format::axlf;
use crate::kernel_set::{KernelSet, Shape, kernel_set};

/// The `kernels` table: one row per shape.
pub fn kernels_table(set: &KernelSet) -> Result<RecordBatch> {
    let s = &set.shapes;
    let strs = |f: &dyn Fn(&Shape) -> String| -> ArrayRef {
        Arc::new(StringArray::from(s.iter().map(f).collect::<Vec<_>>()))
    };
    let u64s = |f: &dyn Fn(&Shape) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from(s.iter().map(f).collect::<Vec<_>>()))
    };
    let fields = vec![
        Field::new("kernel_set", DataType::Utf8, false),
        Field::new("m", DataType::UInt64, false),
        Field::new("k", DataType::UInt64, false),
        Field::new("n", DataType::UInt64, false),
        Field::new("k_padded", DataType::UInt64, false),
        Field::new("n_padded", DataType::UInt64, false),
        Field::new("tile", DataType::Utf8, false),
        Field::new("roles", DataType::Utf8, false),
        Field::new("host_variant", DataType::Utf8, false),
        Field::new("host_self_check_max_rel", DataType::Float32, true),
        Field::new("npu_kernel", DataType::Utf8, false),
        Field::new("npu_provider", DataType::Utf8, true),
        Field::new("npu_ready", DataType::Boolean, false),
    ];
    let cols: Vec<ArrayRef> = vec![
        strs(&|_| set.name.clone()),
        u64s(&|x| x.m),
        u64s(&|x| x.k),
        u64s(&|x| x.n),
        u64s(&|x| x.k_padded),
        u64s(&|x| x.n_padded),
        strs(&|x| x.tile.clone()),
        strs(&|x| {
            x.roles
                .iter()
                .map(|(r, c)| format!("{r}×{c}"))
                .collect::<Vec<_>>()
                .join(" ")
        }),
        strs(&|_| set.host_variant.clone()),
        Arc::new(arrow_array::Float32Array::from(
            vec![set.host_self_check_max_rel; s.len()],
        )),
        strs(&|x| x.npu_kernel.clone()),
        Arc::new(StringArray::from(
            s.iter().map(|x| x.npu_provider.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(BooleanArray::from(
            s.iter()
                .map(|x| x.npu_provider.is_some())
                .collect::<Vec<_>>(),
        )),
    ];
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(|e| Error::Table {
        table: "kernels",
        reason: e.to_string(),
    })
}

/// The kernel-set stage (after repack). Inputs: the pack, and every xclbin of the repository and
/// of the kernel directory, so adding or changing a kernel file re-runs only this stage.
pub struct KernelSetStage {
    /// Inputs every import stage carries (the fetch manifest).
    pub extra: Vec<Input>,
    /// xclbins found when the graph was built.
    pub xclbins: Vec<PathBuf>,
    /// Prefill batch.
    pub batch: u64,
    /// The host runtime the self-check runs on (not part of the cache key: the stage's version
    /// and inputs are, as before the runtime was handed in).
    pub host: Arc<dyn HostRuntime>,
}

impl KernelSetStage {
    /// The stage's name and version; the version is bumped when the output changes meaning.
    pub const ID: StageId<'static> = StageId::new("kernels", 1);

    /// `*.xclbin` files directly under each of `dirs`, sorted.
    pub fn find_xclbins(dirs: &[PathBuf]) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = dirs
            .iter()
            .filter_map(|d| fs_err::read_dir(d).ok())
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "xclbin"))
            .collect();
        v.sort();
        v
    }
}

impl Stage for KernelSetStage {
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "batch": self.batch })
    }
    fn inputs(&self) -> Vec<Input> {
        let mut v = vec![Input::artifact("pack", "repack", "pack")];
        for (i, x) in self.xclbins.iter().enumerate() {
            v.push(Input::external(&format!("xclbin{i}"), x.clone()));
        }
        v.extend(self.extra.iter().cloned());
        v
    }
    fn outputs(&self) -> Vec<String> {
        vec!["kernels.json".into(), "tables".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> std::result::Result<(), StageError> {
        let pack = ctx.input("pack")?.to_path_buf();
        let mut artifacts = Vec::new();
        for i in 0..self.xclbins.len() {
            let f = ctx.input(&format!("xclbin{i}"))?.to_path_buf();
            let b = fs_err::read(&f)?;
            let mut x = axlf::parse(&self.xclbins[i], &b)?;
            x.file = self.xclbins[i].clone();
            artifacts.push(x);
        }
        let set = kernel_set(&pack, &artifacts, self.batch, self.host.as_ref())?;
        tracing::info!(set = %set.name, shapes = set.shapes.len(), missing = set.missing().len(), "kernel set");
        fs_err::write(ctx.output("kernels.json"), serde_json::to_vec_pretty(&set)?)?;
        write_tables(&ctx.output("tables"), &[("kernels", kernels_table(&set)?)])?;
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        Self::ID
    }
}
