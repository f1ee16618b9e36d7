//! The catalog: a DataFusion `SessionContext` holding every table of the store, and a blocking API
//! over it for the CLI and tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use onebit_pipeline::Store;

use crate::error::{Error, Result, from_datafusion};
use crate::tables::{Table, cache_table, packs_table, runs_table, stage_tables};
use crate::tensor_values::TensorValues;

/// The catalog over one store.
pub struct Catalog {
    ctx: SessionContext,
    runtime: tokio::runtime::Runtime,
    tables: BTreeMap<String, SchemaRef>,
}

impl Catalog {
    /// Reads the store's tables and registers them, with `tensor_values` (a shared store's are
    /// read from object storage as queries run, [`crate::shared`]). `current` maps stage
    /// names to this build's versions (for `packs.needs_run`).
    pub fn open(store: &Store, current: &BTreeMap<String, u32>) -> Result<Catalog> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
            .enable_all()
            .build()
            .map_err(|source| Error::Io {
                op: "start",
                path: "tokio runtime".into(),
                source,
            })?;
        let ctx = SessionContext::new();
        if let Some(sh) = store.shared() {
            let tables = crate::shared::register(&ctx, &runtime, store, sh, current)?;
            ctx.register_udtf("tensor_values", Arc::new(TensorValues::new(store.clone())));
            return Ok(Catalog {
                ctx,
                runtime,
                tables,
            });
        }
        let mut all: BTreeMap<String, Table> = stage_tables(store)?;
        all.insert("runs".into(), runs_table(store)?);
        all.insert("cache".into(), cache_table(store)?);
        all.insert("packs".into(), packs_table(store, current)?);
        let mut tables = BTreeMap::new();
        for (name, t) in all {
            let mem = MemTable::try_new(t.schema.clone(), vec![t.batches])
                .map_err(|e| from_datafusion(e, ""))?;
            ctx.register_table(name.as_str(), Arc::new(mem))
                .map_err(|e| from_datafusion(e, ""))?;
            tables.insert(name, t.schema);
        }
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
