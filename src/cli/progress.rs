//! Draws pipeline events: indicatif bars on a terminal, JSON lines with `--json`, nothing with
//! `--quiet`.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use onebit_pipeline::{Event, Reporter, Status};

use super::Global;

/// The reporter `--quiet` / `--json` / the default choose.
pub fn reporter(g: &Global) -> Box<dyn Reporter> {
    if g.json {
        Box::new(JsonLines)
    } else if g.quiet {
        Box::new(onebit_pipeline::NullReporter)
    } else if std::io::stderr().is_terminal() {
        Box::new(Bars::new())
    } else {
        Box::new(PlainLines)
    }
}

/// One JSON object per event on stdout.
pub struct JsonLines;

impl Reporter for JsonLines {
    fn event(&self, event: &Event) {
        if let Ok(line) = serde_json::to_string(event) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

/// A line per finished stage on stderr, for logs and pipes (no bars, no cursor movement).
pub struct PlainLines;

impl Reporter for PlainLines {
    fn event(&self, event: &Event) {
        if let Some(line) = finished_line(event) {
            eprintln!("{line}");
        }
    }
}

/// The line printed for a finished stage or run.
fn finished_line(event: &Event) -> Option<String> {
    match event {
        Event::StageFinished(ev) => {
            let mark = match ev.status {
                Status::Hit => "cached",
                Status::Miss => "ran",
                Status::Failed => "FAILED",
                Status::Skipped => "skipped",
            };
            Some(format!(
                "  {:<12} {:<7} {:>9.1} ms  {}",
                ev.stage, mark, ev.duration_ms, ev.reason
            ))
        }
        Event::RunFinished {
            hits,
            misses,
            failed,
            duration_ms,
            ..
        } => Some(format!(
            "done in {duration_ms:.1} ms: {misses} ran, {hits} cached, {failed} failed or skipped"
        )),
        _ => None,
    }
}

/// A bar per running stage with bytes/s and ETA, and a line per finished stage, on stderr.
pub struct Bars {
    multi: MultiProgress,
    bars: Mutex<HashMap<String, ProgressBar>>,
}

impl Bars {
    fn new() -> Self {
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: Mutex::new(HashMap::new()),
        }
    }

    fn bar(&self, stage: &str) -> ProgressBar {
        let mut bars = self.bars.lock().unwrap_or_else(|p| p.into_inner());
        bars.entry(stage.to_string())
            .or_insert_with(|| {
                let pb = self.multi.add(ProgressBar::new(0));
                let style = ProgressStyle::with_template(
                    "{spinner} {prefix:<12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
                pb.set_style(style);
                pb.set_prefix(stage.to_string());
                pb.enable_steady_tick(Duration::from_millis(200));
                pb
            })
            .clone()
    }
}

impl Reporter for Bars {
    fn event(&self, event: &Event) {
        match event {
            Event::StageStarted { stage, reason, .. } => {
                self.bar(stage).set_message(reason.clone());
            }
            Event::StageWaiting { stage, key } => {
                let _ = self.multi.println(format!(
                    "  {stage}: waiting for another process running key {}",
                    &key[..12.min(key.len())]
                ));
            }
            Event::StageProgress { stage, done, total } => {
                let pb = self.bar(stage);
                if pb.length() != Some(*total) {
                    pb.set_length(*total);
                }
                pb.set_position(*done);
            }
            Event::StageFinished(ev) => {
                if let Some(pb) = self
                    .bars
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&ev.stage)
                {
                    pb.finish_and_clear();
                    self.multi.remove(&pb);
                }
                if let Some(line) = finished_line(event) {
                    let _ = self.multi.println(line);
                }
            }
            Event::RunFinished { .. } => {
                if let Some(line) = finished_line(event) {
                    let _ = self.multi.println(line);
                }
            }
            Event::RunStarted { .. } => {}
        }
    }
}
