//! Every table of a store, local or shared, registered by one code path: the store's files are
//! read where they lie through DataFusion's object stores (the local filesystem, or the shared
//! store's client registered for its bucket). `runs` is a listing table over `runs/*.parquet`,
//! and each stage table is a view over the Parquet file of every pack's current entry with the
//! `pack` column added, so a query reads the same files the importers wrote. `*_history` views add
//! `import_key`, `first_run`, `last_run` and `current` over every import the run records name
//! (found by a query over `runs`). `packs` and `cache` come from the refs and the entries'
//! manifests.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::MemorySchemaProvider;
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use onebit_pipeline::shared::{SharedManifest, SharedStore};
use onebit_pipeline::{Digest, Store};

use crate::error::{Error, Result, from_datafusion};
use crate::tables::{CacheRow, STAGE_TABLES, cache_rows, packs_by_key, packs_table};

/// One import of a pack's stage the run records name: its key, first and last run.
struct Import {
    key: String,
    first: String,
    last: String,
}

/// The schema the store's table files are registered in, apart from the catalog's tables.
const FILES_SCHEMA: &str = "store_files";

/// A SQL string literal.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Where a store's files are, as DataFusion reads them: the only part of the catalog that differs
/// between a local and a shared store.
enum Files<'a> {
    /// The local store: files on disk, read through DataFusion's local filesystem.
    Local(&'a Store),
    /// A shared store on object storage, with the manifest of every published entry.
    Shared(&'a SharedStore, BTreeMap<Digest, SharedManifest>),
}

impl Files<'_> {
    /// The folder of the run records, as a listing-table URL.
    fn runs_url(&self) -> String {
        match self {
            Files::Local(store) => format!("{}/", store.runs_dir().display()),
            Files::Shared(sh, _) => format!("{}/", sh.object_url(&sh.path("runs"))),
        }
    }

    /// The URL of file `file` of entry `key`, when the entry holds it.
    fn entry_file_url(&self, key: &Digest, file: &str) -> Option<String> {
        match self {
            Files::Local(store) => {
                let path = store.entry_dir(key).join("out").join(file);
                path.is_file().then(|| path.display().to_string())
            }
            Files::Shared(sh, manifests) => {
                let m = manifests.get(key)?;
                let listed = m
                    .manifest
                    .outputs
                    .values()
                    .any(|a| a.files.iter().any(|f| f.path == file));
                listed.then(|| sh.object_url(&sh.entry_file_path(key, &m.upload, file)))
            }
        }
    }

    /// One row per entry of the store, for the `cache` table.
    fn cache_rows(&self) -> Result<Vec<CacheRow>> {
        Ok(match self {
            Files::Local(store) => store
                .entries()?
                .into_iter()
                .map(|e| CacheRow {
                    key: e.key.to_hex(),
                    stage: e.manifest.as_ref().map(|m| m.stage.clone()),
                    version: e.manifest.as_ref().map(|m| m.version),
                    created_unix_ms: e.manifest.as_ref().map(|m| m.created_unix_ms),
                    bytes: e.bytes,
                    files: e.files,
                })
                .collect(),
            Files::Shared(_, manifests) => manifests
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
                .collect(),
        })
    }
}

/// Registers every table of `store` in `ctx` (a shared store's read from its bucket, a local
/// store's from its folder); returns their schemas.
pub(crate) fn register(
    ctx: &SessionContext,
    runtime: &tokio::runtime::Runtime,
    store: &Store,
    current: &BTreeMap<String, u32>,
) -> Result<BTreeMap<String, SchemaRef>> {
    let files = match store.shared() {
        Some(sh) => {
            let bucket =
                url::Url::parse(&sh.bucket_url()).map_err(|e| Error::Execution(e.to_string()))?;
            ctx.register_object_store(&bucket, sh.object_store());
            let manifests = sh
                .manifests()?
                .into_iter()
                .map(|m| (m.manifest.key, m))
                .collect();
            Files::Shared(sh, manifests)
        }
        None => Files::Local(store),
    };
    let mut tables = BTreeMap::new();
    let refs = onebit_pipeline::refs::list_refs(store)?;

    // runs: every run-record file, listed by DataFusion itself.
    let runs_url = files.runs_url();
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
    // Files to register (name, url), then the views over them.
    let mut to_register: Vec<(String, String)> = Vec::new();
    // The files are tables of their own schema, so `SHOW TABLES` lists the catalog's tables only.
    let schema = MemorySchemaProvider::new();
    ctx.catalog("datafusion")
        .ok_or_else(|| Error::Execution("no default catalog".into()))?
        .register_schema(FILES_SCHEMA, Arc::new(schema))
        .map_err(|e| from_datafusion(e, ""))?;
    let mut register_file = |table: &str, url: String| -> String {
        let name = format!("{FILES_SCHEMA}.{table}_{}", to_register.len());
        to_register.push((name.clone(), url));
        name
    };
    let mut views: Vec<(String, Vec<String>)> = Vec::new();
    for (table, stage, file) in STAGE_TABLES {
        let mut current = Vec::new();
        let mut history = Vec::new();
        for r in &refs {
            let Some(s) = r.stage(stage) else { continue };
            if let Some(url) = files.entry_file_url(&s.key, file) {
                let name = register_file(table, url);
                current.push(format!("SELECT {} AS pack, * FROM {name}", lit(&r.name)));
            }
            for Import { key, first, last } in seen
                .get(&(r.name.clone(), stage.to_string()))
                .into_iter()
                .flatten()
            {
                let Some(d) = Digest::from_hex(key) else {
                    continue;
                };
                let Some(url) = files.entry_file_url(&d, file) else {
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
        .block_on(futures::future::try_join_all(to_register.iter().map(
            |(name, url)| {
                ctx.register_parquet(name.as_str(), url.as_str(), ParquetReadOptions::default())
            },
        )))
        .map_err(|e| from_datafusion(e, "registering the store's table files"))?;
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

    // cache and packs, from the entries' manifests and the refs.
    let rows = files.cache_rows()?;
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
