//! `tensor_values('<pack>', '<tensor>')`: the decoded values of one tensor as rows
//! `(row, col, value)`, streamed from the memory-mapped pack through the tile codecs one row block
//! at a time, never materialized whole.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::{Float32Array, RecordBatch, UInt32Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{ScalarValue, plan_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use onebit_pipeline::Store;
use onebit_pipeline::refs::read_ref;
use onebit_stages::format::q4nx::Container;
use onebit_stages::layout::TensorLayout;
use onebit_stages::layout::reader::TensorRows;

/// The table function.
#[derive(Debug)]
pub struct TensorValues {
    store: Store,
}

impl TensorValues {
    /// The function over `store`.
    pub fn new(store: Store) -> Self {
        TensorValues { store }
    }
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("row", DataType::UInt64, false),
        Field::new("col", DataType::UInt32, false),
        Field::new("value", DataType::Float32, false),
    ]))
}

fn literal<'a>(e: &'a Expr, what: &str) -> Result<&'a str> {
    match e {
        Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            _,
        ) => Ok(s.as_str()),
        other => plan_err!("tensor_values: {what} must be a string literal, got {other}"),
    }
}

impl TableFunctionImpl for TensorValues {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        if exprs.len() != 2 {
            return plan_err!(
                "tensor_values takes 2 arguments ('<pack>', '<tensor>'), got {}",
                exprs.len()
            );
        }
        let pack = literal(&exprs[0], "the pack")?;
        let tensor = literal(&exprs[1], "the tensor")?;
        let ext = |e: onebit_pipeline::Error| DataFusionError::External(Box::new(e));
        let Some(r) = read_ref(&self.store, pack).map_err(ext)? else {
            return plan_err!("tensor_values: no pack named {pack:?} (see SELECT name FROM packs)");
        };
        let Some(dir) = r.source.get("dir").and_then(|d| d.as_str()) else {
            return plan_err!(
                "tensor_values: pack {pack:?} records no repository folder; re-run its import"
            );
        };
        // The language file's detect stage, then each tower file's (`detect:vision_weight.q4nx`).
        let files: Vec<(&onebit_pipeline::refs::RefStage, &str)> = r
            .stages
            .iter()
            .filter_map(|s| match s.stage.as_str() {
                "detect" => Some((s, "model.q4nx")),
                name => name.strip_prefix("detect:").map(|f| (s, f)),
            })
            .collect();
        if files.is_empty() {
            return plan_err!("tensor_values: pack {pack:?} has no detect stage");
        }
        let mut found = None;
        for (detect, file) in files {
            // Read through to the shared store: the detect entry of a pack imported elsewhere.
            if let Some(sh) = self.store.shared()
                && !matches!(
                    self.store.check(&detect.key, false).map_err(ext)?,
                    onebit_pipeline::store::Freshness::Fresh(_)
                )
            {
                sh.pull(&self.store, &detect.key).map_err(ext)?;
            }
            let layouts_path = self.store.artifact_path(&detect.key, "layouts.json");
            let layouts: Vec<TensorLayout> = std::fs::read(&layouts_path)
                .map_err(|e| DataFusionError::Execution(format!("{}: {e}", layouts_path.display())))
                .and_then(|b| {
                    serde_json::from_slice(&b)
                        .map_err(|e| DataFusionError::Execution(e.to_string()))
                })?;
            if let Some(layout) = layouts.into_iter().find(|l| l.name == tensor) {
                found = Some((layout, PathBuf::from(dir).join(file)));
                break;
            }
        }
        let Some((layout, model)) = found else {
            return plan_err!(
                "tensor_values: pack {pack:?} has no tensor {tensor:?} (see SELECT name FROM tensors WHERE pack = '{pack}')"
            );
        };
        if !model.is_file() {
            return plan_err!(
                "tensor_values: pack {pack:?} was read from {}, which is not on this machine (imported elsewhere?); import the repository here to decode its values",
                model.display()
            );
        }
        let stream = Arc::new(ValuesStream {
            schema: schema(),
            model,
            layout,
        });
        Ok(Arc::new(StreamingTable::try_new(schema(), vec![stream])?))
    }
}

/// One partition: the tensor's row blocks in order.
struct ValuesStream {
    schema: SchemaRef,
    model: PathBuf,
    layout: TensorLayout,
}

impl fmt::Debug for ValuesStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tensor_values({}, {})",
            self.model.display(),
            self.layout.name
        )
    }
}

/// Yields one batch per row block.
struct Blocks {
    container: Container,
    layout: TensorLayout,
    schema: SchemaRef,
    next: usize,
    blocks: usize,
    block_rows: usize,
}

impl Iterator for Blocks {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.blocks {
            return None;
        }
        let b = self.next;
        self.next += 1;
        let rows = match TensorRows::new(&self.container, &self.layout) {
            Ok(r) => r,
            Err(e) => return Some(Err(DataFusionError::External(Box::new(e)))),
        };
        let (mut out, mut pad, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
        let n = rows.block(b, &mut out, &mut pad, &mut scratch);
        let k = self.layout.k as usize;
        let r0 = (b * self.block_rows) as u64;
        let row: UInt64Array = (0..n * k).map(|i| r0 + (i / k) as u64).collect();
        let col: UInt32Array = (0..n * k).map(|i| (i % k) as u32).collect();
        let value = Float32Array::from(out);
        Some(
            RecordBatch::try_new(
                self.schema.clone(),
                vec![Arc::new(row), Arc::new(col), Arc::new(value)],
            )
            .map_err(DataFusionError::from),
        )
    }
}

impl PartitionStream for ValuesStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let opened = Container::open(&self.model).and_then(|c| {
            let rows = TensorRows::new(&c, &self.layout)?;
            let (blocks, block_rows) = (rows.blocks(), rows.block_rows());
            Ok((blocks, block_rows, c))
        });
        let iter: Box<dyn Iterator<Item = Result<RecordBatch>> + Send> = match opened {
            Ok((blocks, block_rows, container)) => Box::new(Blocks {
                container,
                layout: self.layout.clone(),
                schema: self.schema.clone(),
                next: 0,
                blocks,
                block_rows,
            }),
            Err(e) => Box::new(std::iter::once(Err(DataFusionError::External(Box::new(e))))),
        };
        Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::iter(iter),
        ))
    }
}
