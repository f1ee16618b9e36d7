//! The catalog: a DataFusion `SessionContext` holding every table of the store, and a blocking API
//! over it for the CLI and tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::prelude::{SessionConfig, SessionContext};
use onebit_pipeline::Store;

use crate::error::{Error, Result, from_datafusion};
use crate::tensor_values::TensorValues;

/// The catalog over one store.
pub struct Catalog {
    ctx: SessionContext,
    runtime: tokio::runtime::Runtime,
    tables: BTreeMap<String, SchemaRef>,
}

impl Catalog {
    /// Registers the store's tables, with `tensor_values`; their files are read as queries run,
    /// from disk or from object storage ([`crate::listing`]). `current` maps stage
    /// names to this build's versions (for `packs.needs_run`).
    pub fn open(store: &Store, current: &BTreeMap<String, u32>) -> Result<Catalog> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
            .enable_all()
            .build()
            .map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("failed to start the tokio runtime: {e}"),
                ))
            })?;
        // information_schema on: SHOW TABLES, SHOW COLUMNS and DESCRIBE work as in datafusion-cli.
        // Strings read from Parquet stay Utf8 (as the stages wrote them), not Utf8View.
        let config = SessionConfig::new().with_information_schema(true).set_bool(
            "datafusion.execution.parquet.schema_force_view_types",
            false,
        );
        let ctx = SessionContext::new_with_config(config);
        let tables = crate::listing::register(&ctx, &runtime, store, current)?;
        ctx.register_udtf("tensor_values", Arc::new(TensorValues::new(store.clone())));
        Ok(Catalog {
            ctx,
            runtime,
            tables,
        })
    }

    /// Runs one SQL statement and collects its result.
    pub fn sql(&self, query: &str) -> Result<Vec<RecordBatch>> {
        self.runtime.block_on(async {
            let df = self
                .ctx
                .sql(query)
                .await
                .map_err(|e| from_datafusion(e, query))?;
            df.collect().await.map_err(|e| from_datafusion(e, query))
        })
    }

    /// The registered tables and their schemas.
    pub fn tables(&self) -> &BTreeMap<String, SchemaRef> {
        &self.tables
    }
}
