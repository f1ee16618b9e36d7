//! The catalog of a shared store, read straight from object storage: the store's client is
//! registered with DataFusion's object-store registry, `runs` is a listing table over
//! `runs/*.parquet`, and each stage table is a view over the Parquet file of every pack's current
//! entry with the `pack` column added, so a query reads the same objects the importers wrote.
//! `packs` and `cache` come from the refs and manifests. The `*_history` tables stay local-only
//! (they re-read every earlier import's files); docs/objstore.md.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use onebit_pipeline::Store;
use onebit_pipeline::shared::SharedStore;

use crate::error::{Error, Result, from_datafusion};
use crate::tables::{CacheRow, STAGE_TABLES, cache_rows, packs_by_key, packs_table};

/// A SQL string literal.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Registers every table of the shared store `sh` in `ctx`; returns their schemas.
pub(crate) fn register(
    ctx: &SessionContext,
    runtime: &tokio::runtime::Runtime,
    store: &Store,
    sh: &SharedStore,
    current: &BTreeMap<String, u32>,
) -> Result<BTreeMap<String, SchemaRef>> {
    let bucket = url::Url::parse(&sh.bucket_url()).map_err(|e| Error::Execution(e.to_string()))?;
    ctx.register_object_store(&bucket, sh.object_store());
    let mut tables = BTreeMap::new();
    let refs = onebit_pipeline::refs::list_refs(store)?;

    // runs: every run-record file, listed by DataFusion itself.
    let runs_url = format!("{}/", sh.object_url(&sh.path("runs")));
    let url = ListingTableUrl::parse(&runs_url).map_err(|e| from_datafusion(e, ""))?;
    let options =
        ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let schema = onebit_pipeline::record::run_schema();
    let config = ListingTableConfig::new(url)
        .with_listing_options(options)
        .with_schema(schema.clone());
    let runs = ListingTable::try_new(config).map_err(|e| from_datafusion(e, ""))?;
    ctx.register_table("runs", Arc::new(runs))
        .map_err(|e| from_datafusion(e, ""))?;
    tables.insert("runs".to_string(), schema);

    // Stage tables: one registered file per (pack, table), a view adding `pack` over them all.
    let mut manifests = BTreeMap::new();
    let mut n = 0usize;
    for (table, stage, file) in STAGE_TABLES {
        let mut branches = Vec::new();
        for r in &refs {
            let Some(s) = r.stage(stage) else { continue };
            let m = match manifests.get(&s.key) {
                Some(m) => m,
                None => {
                    let m = sh.manifest(&s.key)?;
                    manifests.entry(s.key).or_insert(m)
                }
            };
            let Some(m) = m else { continue };
            if !m
                .manifest
                .outputs
                .values()
                .any(|a| a.files.iter().any(|f| f.path == file))
            {
                continue;
            }
            let url = sh.object_url(&sh.entry_file_path(&s.key, &m.upload, file));
            let name = format!("shared_{table}_{n}");
            n += 1;
            runtime
                .block_on(ctx.register_parquet(&name, &url, ParquetReadOptions::default()))
                .map_err(|e| from_datafusion(e, &url))?;
            branches.push(format!("SELECT {} AS pack, * FROM {name}", lit(&r.name)));
        }
        if branches.is_empty() {
            continue;
        }
        let sql = format!("CREATE VIEW {table} AS {}", branches.join(" UNION ALL "));
        runtime
            .block_on(async { ctx.sql(&sql).await?.collect().await })
            .map_err(|e| from_datafusion(e, &sql))?;
        let schema = runtime
            .block_on(ctx.table(table))
            .map_err(|e| from_datafusion(e, table))?
            .schema()
            .inner()
            .clone();
        tables.insert(table.to_string(), schema);
    }

    // cache and packs, from the manifests and refs.
    let rows = sh
        .manifests()?
        .into_iter()
        .map(|m| CacheRow {
            key: m.manifest.key.to_hex(),
            stage: Some(m.manifest.stage.clone()),
            version: Some(m.manifest.version),
            created_unix_ms: Some(m.manifest.created_unix_ms),
            bytes: m.manifest.bytes(),
            files: m
                .manifest
                .outputs
                .values()
                .map(|a| a.files.len() as u64)
                .sum(),
        })
        .collect();
    let by_key = packs_by_key(&refs);
    for (name, t) in [
        ("cache", cache_rows(rows, &by_key)?),
        ("packs", packs_table(store, current)?),
    ] {
        let mem = MemTable::try_new(t.schema.clone(), vec![t.batches])
            .map_err(|e| from_datafusion(e, ""))?;
        ctx.register_table(name, Arc::new(mem))
            .map_err(|e| from_datafusion(e, ""))?;
        tables.insert(name.to_string(), t.schema);
    }
    Ok(tables)
}
