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
use datafusion::common::{Column, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::prelude::{DataFrame, Expr, ParquetReadOptions, SessionContext, lit};
use onebit_pipeline::shared::{SharedManifest, SharedStore};
use onebit_pipeline::{Digest, Store};

use crate::error::{Error, Result, from_datafusion};
use crate::tables::{
    CacheRow, MODEL_FILE, PER_FILE_TABLES, STAGE_TABLES, cache_rows, packs_by_key, packs_table,
};

/// One import of a pack's stage the run records name: its key, first and last run.
struct Import {
    key: String,
    first: String,
    last: String,
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
/// store's from its folder); returns their schemas. Only the tables and views people query are
/// registered: the stage files behind the views are read into the views' plans, never named, so
/// `SHOW TABLES` and `information_schema` list exactly what [`crate::Catalog::tables`] does.
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
    tables.insert("runs".to_string(), register_runs(ctx, &files)?);
    let seen = seen_imports(ctx, runtime)?;
    let views = stage_views(&files, &refs, &seen);
    tables.extend(register_views(ctx, runtime, views)?);

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

/// `runs`: every run-record file, listed by DataFusion itself; returns its schema.
fn register_runs(ctx: &SessionContext, files: &Files<'_>) -> Result<SchemaRef> {
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
    Ok(schema)
}

/// Every (pack, stage) the run records name, with each import's key and its first and last run.
fn seen_imports(
    ctx: &SessionContext,
    runtime: &tokio::runtime::Runtime,
) -> Result<BTreeMap<(String, String), Vec<Import>>> {
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
    Ok(seen)
}

/// One file of a view: its URL and the constant columns put before the file's own.
struct Branch {
    url: String,
    constants: Vec<(&'static str, ScalarValue)>,
}

/// The stage views: per stage table, one over the Parquet file of every pack's current entry
/// with the `pack` column added, and a `_history` view over every import the run records name.
fn stage_views(
    files: &Files<'_>,
    refs: &[onebit_pipeline::refs::RefRecord],
    seen: &BTreeMap<(String, String), Vec<Import>>,
) -> Vec<(String, Vec<Branch>)> {
    let text = |s: &str| ScalarValue::Utf8(Some(s.to_string()));
    let mut views = Vec::new();
    for (table, stage, file) in STAGE_TABLES {
        let mut current = Vec::new();
        let mut history = Vec::new();
        let per_file = PER_FILE_TABLES.contains(&table);
        for r in refs {
            // The language file's stage, then each tower file's (`dequant:vision_weight.q4nx`):
            // the tables of every file of the pack in one view, with the file they came from.
            let sources = r.stages.iter().filter_map(|s| {
                if s.stage == stage {
                    Some((s, MODEL_FILE))
                } else if per_file {
                    s.stage
                        .strip_prefix(stage)
                        .and_then(|rest| rest.strip_prefix(':'))
                        .map(|f| (s, f))
                } else {
                    None
                }
            });
            for (s, source_file) in sources {
                let mut first_columns = vec![("pack", text(&r.name))];
                if per_file {
                    first_columns.push(("file", text(source_file)));
                }
                if let Some(url) = files.entry_file_url(&s.key, file) {
                    current.push(Branch {
                        url,
                        constants: first_columns.clone(),
                    });
                }
                for Import { key, first, last } in seen
                    .get(&(r.name.clone(), s.stage.clone()))
                    .into_iter()
                    .flatten()
                {
                    let Some(d) = Digest::from_hex(key) else {
                        continue;
                    };
                    let Some(url) = files.entry_file_url(&d, file) else {
                        continue;
                    };
                    let mut constants = first_columns.clone();
                    constants.extend([
                        ("import_key", text(key)),
                        ("first_run", text(first)),
                        ("last_run", text(last)),
                        ("current", ScalarValue::Boolean(Some(d == s.key))),
                    ]);
                    history.push(Branch { url, constants });
                }
            }
        }
        views.push((table.to_string(), current));
        views.push((format!("{table}_history"), history));
    }
    views
}

/// Registers each view with at least one file as the union of its files, each with its constant
/// columns first; returns the views' schemas. Each file's footer is read once, all at once.
fn register_views(
    ctx: &SessionContext,
    runtime: &tokio::runtime::Runtime,
    views: Vec<(String, Vec<Branch>)>,
) -> Result<BTreeMap<String, SchemaRef>> {
    let urls: Vec<&str> = views
        .iter()
        .flat_map(|(_, bs)| bs.iter().map(|b| b.url.as_str()))
        .collect();
    let frames = runtime
        .block_on(futures::future::try_join_all(
            urls.iter()
                .map(|url| ctx.read_parquet(*url, ParquetReadOptions::default())),
        ))
        .map_err(|e| from_datafusion(e, "reading the store's table files"))?;
    let mut frames = frames.into_iter();
    let mut schemas = BTreeMap::new();
    for (view, branches) in views {
        let mut union: Option<DataFrame> = None;
        for (branch, frame) in branches.into_iter().zip(frames.by_ref()) {
            let mut exprs: Vec<Expr> = branch
                .constants
                .into_iter()
                .map(|(name, v)| lit(v).alias(name))
                .collect();
            exprs.extend(
                frame
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| Expr::Column(Column::new_unqualified(f.name()))),
            );
            let frame = frame.select(exprs).map_err(|e| from_datafusion(e, &view))?;
            union = Some(match union {
                None => frame,
                Some(u) => u.union(frame).map_err(|e| from_datafusion(e, &view))?,
            });
        }
        let Some(union) = union else { continue };
        schemas.insert(view.clone(), union.schema().inner().clone());
        ctx.register_table(view.as_str(), union.into_view())
            .map_err(|e| from_datafusion(e, &view))?;
    }
    Ok(schemas)
}
