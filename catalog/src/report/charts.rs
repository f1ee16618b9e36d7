//! The report's charts, drawn by `plotters` once per backend: SVG strings for the page, PNG files
//! for a terminal (`--format png`). Each chart is a struct holding its data and implementing
//! [`Chart`]; text is set in DejaVu Sans, bundled (the `dejavu` crate) so that a bitmap renders the
//! same on a machine without fonts.

use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::colors::colormaps::ViridisRGB;

use crate::error::{Error, Result};

/// The font family every chart uses (registered once from the bundled font).
const FONT: &str = "sans-serif";

/// Colors of the verdicts, shared with the page's CSS.
pub const PASS: RGBColor = RGBColor(0x2e, 0x8b, 0x57);
/// Flagged.
pub const FLAG: RGBColor = RGBColor(0xe0, 0x8e, 0x0b);
/// Failed.
pub const FAIL: RGBColor = RGBColor(0xc6, 0x28, 0x28);
/// Repaired (failed as read, passes after the repair).
pub const REPAIRED: RGBColor = RGBColor(0x6a, 0x1b, 0x9a);
/// Skipped or without a number.
pub const MUTED: RGBColor = RGBColor(0x90, 0x90, 0x90);

/// What each chart needs to be drawn on any backend.
pub trait Chart {
    /// A short name (file name stem of its PNG, and error messages).
    fn name(&self) -> String;
    /// Width and height in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws the chart on `root`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

fn fonts() -> Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the bundled DejaVu Sans font does not parse".to_string())
        })
        .clone()
        .map_err(|reason| Error::Chart {
            chart: "fonts".into(),
            reason,
        })
}

/// The chart as an SVG document (inline in the page).
pub fn svg(chart: &impl Chart) -> Result<String> {
    fonts()?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, chart.size()).into_drawing_area();
        chart
            .draw(&root)
            .and_then(|()| root.present().map_err(|e| e.to_string()))
            .map_err(|reason| Error::Chart {
                chart: chart.name(),
                reason,
            })?;
    }
    Ok(out)
}

/// The chart as a PNG file's bytes.
pub fn png(chart: &impl Chart) -> Result<Vec<u8>> {
    fonts()?;
    let (w, h) = chart.size();
    let fail = |reason: String| Error::Chart {
        chart: chart.name(),
        reason,
    };
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let backend =
            BitMapBackend::<plotters::backend::RGBPixel>::with_buffer_and_format(&mut rgb, (w, h))
                .map_err(|e| fail(e.to_string()))?;
        let root = backend.into_drawing_area();
        chart
            .draw(&root)
            .and_then(|()| root.present().map_err(|e| e.to_string()))
            .map_err(fail)?;
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(|e| fail(e.to_string()))?;
        writer
            .write_image_data(&rgb)
            .map_err(|e| fail(e.to_string()))?;
    }
    Ok(out)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One tensor's agreement with its reference.
#[derive(Clone, Debug)]
pub struct AgreementPoint {
    /// 1 − correlation (clamped to the axis).
    pub one_minus_corr: f64,
    /// The point's color: its verdict.
    pub color: RGBColor,
}

/// 1 − correlation per compared tensor, in the table's order (failing first), on a log axis.
pub struct Agreement {
    /// The points.
    pub points: Vec<AgreementPoint>,
}

/// Smallest 1 − corr drawn: closer agreement sits on the axis floor.
const AGREEMENT_FLOOR: f64 = 1e-9;

impl Chart for Agreement {
    fn name(&self) -> String {
        "agreement".into()
    }
    fn size(&self) -> (u32, u32) {
        (900, 320)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let n = self.points.len().max(1) as f64;
        let mut chart = ChartBuilder::on(root)
            .caption(
                "Agreement with the reference: 1 - correlation per comparison (lower is better)",
                (FONT, 15),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5f64..n - 0.5, (AGREEMENT_FLOOR..1.5f64).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("comparison, in the table's order")
            .y_desc("1 - corr")
            .y_label_formatter(&|v| format!("{v:.0e}"))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .label_style((FONT, 11))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(self.points.iter().enumerate().map(|(i, p)| {
                let y = p.one_minus_corr.clamp(AGREEMENT_FLOOR, 1.0);
                Circle::new((i as f64, y), 3, p.color.filled())
            }))
            .map_err(err)?;
        Ok(())
    }
}

/// Bars stacked by series: bytes per layer by tile kind, stage time per import by stage.
pub struct StackedBars {
    /// File name stem and error label.
    pub name: &'static str,
    /// The caption.
    pub title: &'static str,
    /// The y axis' unit.
    pub unit: &'static str,
    /// One label per bar, in order.
    pub bars: Vec<String>,
    /// Series names, in legend (and stacking) order.
    pub series: Vec<String>,
    /// `values[bar][series]`, in `unit`.
    pub values: Vec<Vec<f64>>,
    /// Where in the palette the series' colors start (charts side by side differ).
    pub palette: usize,
}

impl Chart for StackedBars {
    fn name(&self) -> String {
        self.name.into()
    }
    fn size(&self) -> (u32, u32) {
        (900, 320)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let top = self
            .values
            .iter()
            .map(|b| b.iter().sum::<f64>())
            .fold(0.0, f64::max);
        let n = self.bars.len().max(1);
        let labels = &self.bars;
        let mut chart = ChartBuilder::on(root)
            .caption(self.title, (FONT, 15))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..(top * 1.15).max(1e-6))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_labels(n.min(40))
            .x_label_formatter(&|v| {
                let i = v.round();
                if (v - i).abs() > 1e-6 || i < 0.0 {
                    return String::new();
                }
                labels.get(i as usize).cloned().unwrap_or_default()
            })
            .y_desc(self.unit)
            .label_style((FONT, 11))
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        for (k, series) in self.series.iter().enumerate() {
            let color = Palette99::pick(k + self.palette).to_rgba();
            let bars: Vec<Rectangle<(f64, f64)>> = self
                .values
                .iter()
                .enumerate()
                .filter(|(_, b)| b.get(k).is_some_and(|&v| v > 0.0))
                .map(|(i, b)| {
                    let below: f64 = b[..k].iter().sum();
                    let x = i as f64;
                    Rectangle::new([(x - 0.4, below), (x + 0.4, below + b[k])], color.filled())
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(series.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 11))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

/// Most columns a block heatmap draws; more row blocks are merged into equal groups.
pub const HEATMAP_COLUMNS: usize = 96;

/// One tensor's row blocks as a heatmap: a row of cells per statistic, a column per block (or
/// group of blocks), each row colored from its own minimum to its maximum.
pub struct BlockHeatmap {
    /// The tensor.
    pub tensor: String,
    /// The rows: statistic name and one value per column.
    pub rows: Vec<(String, Vec<f64>)>,
    /// Row blocks per column (1 unless merged).
    pub blocks_per_column: usize,
    /// Row blocks in all.
    pub blocks: usize,
}

impl Chart for BlockHeatmap {
    fn name(&self) -> String {
        format!("blocks {}", self.tensor)
    }
    fn size(&self) -> (u32, u32) {
        (760, 70 + 34 * self.rows.len() as u32)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let cols = self.rows.first().map_or(0, |r| r.1.len()).max(1);
        let names: Vec<String> = self.rows.iter().map(|r| r.0.clone()).collect();
        let per = self.blocks_per_column;
        let caption = if per > 1 {
            format!(
                "{}: {} row blocks in {cols} groups of {per}; each row from its min (dark) to max (yellow)",
                self.tensor, self.blocks
            )
        } else {
            format!(
                "{}: {} row blocks; each row from its min (dark) to its max (yellow)",
                self.tensor, self.blocks
            )
        };
        let mut chart = ChartBuilder::on(root)
            .caption(caption, (FONT, 12))
            .margin(6)
            .x_label_area_size(24)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..cols as f64, 0f64..self.rows.len() as f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(8)
            .x_label_formatter(&|v| format!("{:.0}", v * per as f64))
            .y_labels(self.rows.len() * 2 + 1)
            .y_label_formatter(&|v| {
                let f = v.fract();
                if (f - 0.5).abs() > 1e-6 {
                    return String::new();
                }
                names
                    .get(names.len().saturating_sub(1 + v.floor() as usize))
                    .cloned()
                    .unwrap_or_default()
            })
            .x_desc("row block")
            .label_style((FONT, 11))
            .draw()
            .map_err(err)?;
        let n = self.rows.len();
        for (r, (_, values)) in self.rows.iter().enumerate() {
            let finite = values.iter().copied().filter(|v| v.is_finite());
            let lo = finite.clone().fold(f64::INFINITY, f64::min);
            let hi = finite.fold(f64::NEG_INFINITY, f64::max);
            let y = (n - 1 - r) as f64;
            chart
                .draw_series(values.iter().enumerate().map(|(c, &v)| {
                    let color = if !v.is_finite() {
                        FAIL
                    } else if hi > lo {
                        ViridisRGB.get_color_normalized(v, lo, hi)
                    } else {
                        ViridisRGB.get_color(0.5)
                    };
                    Rectangle::new(
                        [(c as f64, y + 0.04), (c as f64 + 1.0, y + 0.96)],
                        color.filled(),
                    )
                }))
                .map_err(err)?;
        }
        Ok(())
    }
}

/// One tensor's decoded values in equal bins.
pub struct Histogram {
    /// The tensor.
    pub tensor: String,
    /// Lower edge of the first bin and bin width.
    pub min: f64,
    /// Bin width.
    pub width: f64,
    /// Count per bin.
    pub counts: Vec<u64>,
}

impl Chart for Histogram {
    fn name(&self) -> String {
        format!("values {}", self.tensor)
    }
    fn size(&self) -> (u32, u32) {
        (760, 260)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let top = self.counts.iter().copied().max().unwrap_or(1).max(1) as f64;
        let max = self.min + self.width * self.counts.len().max(1) as f64;
        let total: u64 = self.counts.iter().sum();
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!(
                    "{}: decoded values ({total} finite, log count)",
                    self.tensor
                ),
                (FONT, 12),
            )
            .margin(6)
            .x_label_area_size(26)
            .y_label_area_size(60)
            .build_cartesian_2d(
                self.min..max.max(self.min + 1e-12),
                (0.8f64..top * 1.5).log_scale(),
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("value")
            .y_desc("count")
            .x_label_formatter(&|v| format!("{v:.3}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .label_style((FONT, 11))
            .draw()
            .map_err(err)?;
        let color = RGBColor(0x3b, 0x6e, 0xa8);
        chart
            .draw_series(
                self.counts
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| **c > 0)
                    .map(|(i, &c)| {
                        let x0 = self.min + self.width * i as f64;
                        Rectangle::new([(x0, 0.8), (x0 + self.width, c as f64)], color.filled())
                    }),
            )
            .map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heatmap() -> BlockHeatmap {
        BlockHeatmap {
            tensor: "t".into(),
            rows: vec![
                ("absmax".into(), vec![1.0, 2.0, f64::NAN, 4.0]),
                ("rms".into(), vec![0.5, 0.5, 0.5, 0.5]),
            ],
            blocks_per_column: 1,
            blocks: 4,
        }
    }

    #[test]
    fn a_chart_draws_as_svg_and_as_a_png_of_its_size() {
        let h = heatmap();
        let svg = svg(&h).expect("svg");
        assert!(
            svg.starts_with("<svg") && svg.contains("<rect"),
            "{svg:.200}"
        );
        let bytes = png(&h).expect("png");
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let reader = decoder.read_info().expect("a PNG");
        let info = reader.info();
        assert_eq!((info.width, info.height), h.size());
    }
}
