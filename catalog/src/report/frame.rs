//! A query result as the report reads it: cells by row and column name, as text (Arrow's display
//! of the value) or as a number (numeric columns cast to f64). Report queries return at most a few
//! thousand rows, so holding them as strings costs nothing that matters.

use datafusion::arrow::array::{Array, Float64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::error::{Error, Result};

/// One query's rows.
#[derive(Debug, Default)]
pub struct Frame {
    names: Vec<String>,
    text: Vec<Vec<Option<String>>>,
    num: Vec<Option<Vec<Option<f64>>>>,
    rows: usize,
}

impl Frame {
    /// Collects `batches` (all of one schema) into a frame.
    pub fn from_batches(batches: &[RecordBatch]) -> Result<Frame> {
        let Some(first) = batches.first() else {
            return Ok(Frame::default());
        };
        let schema = first.schema();
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let mut text = vec![Vec::new(); names.len()];
        let mut num: Vec<Option<Vec<Option<f64>>>> = schema
            .fields()
            .iter()
            .map(|f| f.data_type().is_numeric().then(Vec::new))
            .collect();
        let opts = FormatOptions::default().with_null("");
        let mut rows = 0;
        for b in batches {
            rows += b.num_rows();
            for (c, col) in b.columns().iter().enumerate() {
                let fmt = ArrayFormatter::try_new(col.as_ref(), &opts)
                    .map_err(|e| Error::Execution(e.to_string()))?;
                for r in 0..col.len() {
                    text[c].push((!col.is_null(r)).then(|| fmt.value(r).to_string()));
                }
                if let Some(out) = num[c].as_mut() {
                    let f = cast(col, &DataType::Float64)
                        .map_err(|e| Error::Execution(e.to_string()))?;
                    let f = f
                        .as_any()
                        .downcast_ref::<Float64Array>()
                        .ok_or_else(|| Error::Execution("cast to f64".into()))?;
                    out.extend((0..f.len()).map(|r| (!f.is_null(r)).then(|| f.value(r))));
                }
            }
        }
        Ok(Frame {
            names,
            text,
            num,
            rows,
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Column names in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    fn col(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The cell as text (`None` for null or no such column).
    pub fn text(&self, row: usize, name: &str) -> Option<&str> {
        self.text.get(self.col(name)?)?.get(row)?.as_deref()
    }

    /// The cell by column index, as text.
    pub fn text_at(&self, row: usize, col: usize) -> Option<&str> {
        self.text.get(col)?.get(row)?.as_deref()
    }

    /// The cell as a number (`None` for null, a non-numeric column or no such column).
    pub fn num(&self, row: usize, name: &str) -> Option<f64> {
        self.num.get(self.col(name)?)?.as_ref()?.get(row).copied()?
    }

    /// Whether the column holds numbers (right-aligned in tables).
    pub fn is_numeric(&self, col: usize) -> bool {
        self.num.get(col).is_some_and(Option::is_some)
    }
}
