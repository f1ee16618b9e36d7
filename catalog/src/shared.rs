//! The catalog of a shared store, read straight from object storage: the store's client is
//! registered with DataFusion's object-store registry, `runs` is a listing table over
//! `runs/*.parquet`, and each stage table is a view over the Parquet file of every pack's current
//! entry with the `pack` column added, so a query reads the same objects the importers wrote.
//! `*_history` views add `import_key`, `first_run`, `last_run` and `current` over every import
//! the run records name (found by a query over `runs`). `packs` and `cache` come from the refs and
//! manifests.

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
use onebit_pipeline::shared::{SharedManifest, SharedStore};

use crate::error::{Error, Result, from_datafusion};
use crate::tables::{CacheRow, STAGE_TABLES, cache_rows, packs_by_key, packs_table};

/// One import of a pack's stage the run records name: its key, first and last run.
struct Import {
    key: String,
    first: String,
    last: String,
}

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

    // Every (pack, stage, key) the run records name, with its first and last run.
    let seen_sql = "SELECT ref_name, stage, key, min(run_id) AS first, max(run_id) AS last \
                    FROM runs WHERE ref_name IS NOT NULL AND status IN ('hit', 'miss') \
                    GROUP BY ref_name, stage, key ORDER BY ref_name, stage, last";
    let batches = runtime
        .block_on(async { ctx.sql(seen_sql).await?.collect().await })
        .map_err(|e| from_datafusion(e, seen_sql))?;
    let mut seen: BTreeMap<(String, String), Vec<Import>> = BTreeMap::new();
    for b in &batches {
        let col = |i: usize| {
            datafusion::arrow::compute::cast(
                b.column(i),
                &datafusion::arrow::datatypes::DataType::Utf8,
            )
            .map_err(|e| Error::Execution(e.to_string()))
        };
        let cols = [col(0)?, col(1)?, col(2)?, col(3)?, col(4)?];
        let cols: Vec<&datafusion::arrow::array::StringArray> = cols
            .iter()
            .filter_map(|c| c.as_any().downcast_ref())
            .collect();
        let [pack, stage, key, first, last] = cols.as_slice() else {
            continue;
        };
        for i in 0..b.num_rows() {
            seen.entry((pack.value(i).to_string(), stage.value(i).to_string()))
                .or_default()
                .push(Import {
                    key: key.value(i).to_string(),
                    first: first.value(i).to_string(),
                    last: last.value(i).to_string(),
                });
        }
    }

    // Stage tables: one registered file per (pack, table, import), a view adding `pack` over the
    // current imports, and a `_history` view over them all.
    let manifests: BTreeMap<onebit_pipeline::Digest, SharedManifest> = sh
        .manifests()?
        .into_iter()
        .map(|m| (m.manifest.key, m))
        .collect();
    let file_url = |key: &onebit_pipeline::Digest, file: &str| -> Option<String> {
        let m = manifests.get(key)?;
        let listed = m
            .manifest
            .outputs
            .values()
            .any(|a| a.files.iter().any(|f| f.path == file));
        listed.then(|| sh.object_url(&sh.entry_file_path(key, &m.upload, file)))
    };
    // Files to register (name, url), then the views over them.
    let mut files: Vec<(String, String)> = Vec::new();
    let mut register_file = |table: &str, url: String| -> String {
        let name = format!("shared_{table}_{}", files.len());
        files.push((name.clone(), url));
        name
    };
    let mut views: Vec<(String, Vec<String>)> = Vec::new();
    for (table, stage, file) in STAGE_TABLES {
        let mut current = Vec::new();
        let mut history = Vec::new();
        for r in &refs {
            let Some(s) = r.stage(stage) else { continue };
            if let Some(url) = file_url(&s.key, file) {
                let name = register_file(table, url);
                current.push(format!("SELECT {} AS pack, * FROM {name}", lit(&r.name)));
            }
            for Import { key, first, last } in seen
                .get(&(r.name.clone(), stage.to_string()))
                .into_iter()
                .flatten()
            {
                let Some(d) = onebit_pipeline::Digest::from_hex(key) else {
                    continue;
                };
                let Some(url) = file_url(&d, file) else {
                    continue;
                };
                let name = register_file(table, url);
                history.push(format!(
                    "SELECT {} AS pack, {} AS import_key, {} AS first_run, {} AS last_run, {} AS current, * FROM {name}",
                    lit(&r.name),
                    lit(key),
                    lit(first),
                    lit(last),
                    d == s.key
                ));
            }
        }
        views.push((table.to_string(), current));
        views.push((format!("{table}_history"), history));
    }
    // Each registration reads the file's footer: all of them at once.
    runtime
        .block_on(futures::future::try_join_all(files.iter().map(
            |(name, url)| {
                ctx.register_parquet(name.as_str(), url.as_str(), ParquetReadOptions::default())
            },
        )))
        .map_err(|e| from_datafusion(e, "registering the shared store's table files"))?;
    for (view, branches) in views {
        if branches.is_empty() {
            continue;
        }
        let sql = format!("CREATE VIEW {view} AS {}", branches.join(" UNION ALL "));
        runtime
            .block_on(async { ctx.sql(&sql).await?.collect().await })
            .map_err(|e| from_datafusion(e, &sql))?;
        let schema = runtime
            .block_on(ctx.table(view.as_str()))
            .map_err(|e| from_datafusion(e, &view))?
            .schema()
            .inner()
            .clone();
        tables.insert(view, schema);
    }

    // cache and packs, from the manifests and refs.
    let rows = manifests
        .values()
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
