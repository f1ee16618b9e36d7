//! The verification report in a real browser: Chromium (Debian's package), headless. For each
//! golden fixture pack, `run --report` writes the page, the browser loads it with no console
//! message at all, runs its script, and takes a screenshot (kept under the test target folder);
//! the refused `llama-q80` pack shows its failing tensors first. A page with a deliberate error
//! proves the console check sees one. Marked #[ignore] for needing Chromium: scripts/test.sh
//! installs it and runs these.

use crate::support::RunOk;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::chromium;

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/q4nx")
        .join(case)
}

/// What the browser made of a page: its console lines, the DOM after scripts ran, and the
/// screenshot's PNG bytes.
struct Loaded {
    console: Vec<String>,
    dom: String,
    screenshot: Vec<u8>,
}

fn load(page: &Path, shot: &Path) -> Loaded {
    let profile = tempfile::tempdir().expect("profile");
    let url = format!("file://{}", page.display());
    let run = |extra: &[String]| {
        Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--enable-logging=stderr",
                "--v=0",
                "--window-size=1200,1800",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg(&url)
            .run_ok()
    };
    let shot_run = run(&[format!("--screenshot={}", shot.display())]);
    let dom_run = run(&["--dump-dom".to_string()]);
    let console = [&shot_run.stderr, &dom_run.stderr]
        .iter()
        .flat_map(|e| {
            String::from_utf8_lossy(e)
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|l| l.contains(":CONSOLE"))
        .collect();
    Loaded {
        console,
        dom: String::from_utf8_lossy(&dom_run.stdout).into_owned(),
        screenshot: std::fs::read(shot).expect("screenshot written"),
    }
}

/// How many distinct colors the screenshot has (a blank page has one).
fn colors(png_bytes: &[u8]) -> usize {
    let mut reader = png::Decoder::new(std::io::Cursor::new(png_bytes))
        .read_info()
        .expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("frame");
    let px = info.color_type.samples();
    let mut seen: Vec<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

#[test]
#[ignore = "needs chromium: run scripts/test.sh"]
fn the_console_check_sees_an_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let page = dir.path().join("bad.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><p>x</p><script>console.error('deliberate'); nope();</script></body></html>",
    )
    .expect("write");
    let got = load(&page, &dir.path().join("bad.png"));
    assert!(
        got.console.iter().any(|l| l.contains("deliberate")),
        "{:?}",
        got.console
    );
    assert!(
        got.console.iter().any(|l| l.contains("nope")),
        "{:?}",
        got.console
    );
}

#[test]
#[ignore = "needs chromium: run scripts/test.sh"]
fn the_reports_of_the_golden_fixtures_load_cleanly_in_chromium() {
    let home = tempfile::tempdir().expect("home");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-screenshots");
    std::fs::create_dir_all(&shots).expect("screenshots dir");
    let cases = [
        ("llama-q40", "llama-q40/model.gguf"),
        ("llama-q41", "llama-q41/model.gguf"),
        ("llama-q80", "llama-q80/model.gguf"),
        ("gemma3-q41-quarter/stock", "gemma3-q41-quarter/model.gguf"),
        ("qwen35-q80", "qwen35-q80/model.gguf"),
    ];
    for (case, gguf) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"))
            .arg("--home")
            .arg(home.path())
            .args(["-q", "run", "--report", "--path"])
            .arg(fixture(case))
            .arg("--reference")
            .arg(fixture(gguf))
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The q80 pack is refused (exit 1); its report is written all the same.
        let want = if case == "llama-q80" { 1 } else { 0 };
        assert_eq!(out.status.code(), Some(want), "{case}: {stderr}");
        let page = stderr
            .lines()
            .find_map(|l| l.strip_prefix("report: "))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{case}: run --report printed no path: {stderr}"));
        let name = case.replace('/', "-");
        let got = load(&page, &shots.join(format!("{name}.png")));
        assert!(got.console.is_empty(), "{case}: console: {:?}", got.console);
        assert!(
            got.dom.contains("data-ready=\"1\""),
            "{case}: the page's script did not finish"
        );
        assert!(
            colors(&got.screenshot) > 50,
            "{case}: the screenshot is blank"
        );
        if case == "llama-q80" {
            // In the rendered DOM: the agreement table starts with the failing tensors.
            let table = &got.dom[got.dom.find("<table id=\"agreement\">").expect("table")..];
            let rows: Vec<&str> = table.split("<tr").skip(2).take(8).collect();
            assert!(
                rows.iter().all(|r| r.starts_with(" class=\"fail\"")),
                "{:?}",
                &rows
                    .iter()
                    .map(|r| &r[..r.len().min(80)])
                    .collect::<Vec<_>>()
            );
        }
    }
}
