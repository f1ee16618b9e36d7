//! The sections of the report page, in order, each drawn from the query results in [`Data`].

use std::fmt::Write;

use super::charts::{self, Chart};
use super::frame::Frame;
use super::html::{self, esc};
use super::{Catalog, Data, Options, Result};

/// The whole page of `opts.pack`.
pub fn render(catalog: &Catalog, opts: &Options) -> Result<String> {
    let d = Data::gather(catalog, opts)?;
    let mut s = String::with_capacity(1 << 20);
    let title = format!("{}: verification report", d.pack);
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body>",
        esc(&title),
        html::STYLE
    );
    let _ = write!(
        s,
        "<h1>{}</h1><nav><a href=\"#verdict\">Verdict</a><a href=\"#provenance\">Provenance</a><a href=\"#agreement-section\">Agreement</a><a href=\"#tiles\">Tiles</a><a href=\"#tensors\">Tensors</a><a href=\"#runs\">Runs</a><a href=\"#changes\">Changes</a><a href=\"#queries\">Queries</a></nav>",
        esc(&d.pack)
    );

    for section in [
        verdict, provenance, agreement, tiles, tensors, runs, changes, queries,
    ] {
        section(&d, &mut s)?;
    }
    let _ = writeln!(s, "<script>{}</script></body></html>", html::SCRIPT);
    Ok(s)
}

/// The verdict: verified, refused or not verified, and stale stages.
fn verdict(d: &Data, s: &mut String) -> Result<()> {
    let verified = d.pack_row.text(0, "verified");
    let (class, head) = match verified {
        Some("true") => ("ok", "Verified"),
        Some("false") => ("bad", "Refused"),
        _ => ("none", "Not verified (imported without a reference)"),
    };
    let verdict = d
        .pack_row
        .text(0, "verdict")
        .unwrap_or("no verify stage ran");
    // The summary starts with its own "verified:"/"refused:"; the heading says it already.
    let verdict = ["verified: ", "refused: "]
        .iter()
        .find_map(|p| verdict.strip_prefix(p))
        .unwrap_or(verdict);
    let _ = write!(
        s,
        "<h2 id=\"verdict\">Verdict</h2><div class=\"verdict {class}\"><b>{head}</b>: {}</div>",
        esc(verdict)
    );
    if d.pack_row.text(0, "needs_run") == Some("true") {
        let _ = write!(
            s,
            "<p class=\"verdict bad\">This build would re-run stages {} (made by an older version): the tables below are the old import's.</p>",
            esc(d.pack_row.text(0, "stale_stages").unwrap_or(""))
        );
    }
    s.push_str(&queries_of(d, "Verdict"));
    Ok(())
}

/// How the pack was imported, its files, what its config means and every decision.
fn provenance(d: &Data, s: &mut String) -> Result<()> {
    s.push_str("<h2 id=\"provenance\">Provenance and decisions</h2><table class=\"kv\">");
    for (k, label) in [
        ("source", "imported with"),
        ("dir", "repository folder"),
        ("last_run", "last run"),
    ] {
        let _ = write!(
            s,
            "<tr><td>{label}</td><td>{}</td></tr>",
            esc(d.pack_row.text(0, k).unwrap_or(""))
        );
    }
    s.push_str("</table>");
    match &d.files {
        Some(f) if !f.is_empty() => s.push_str(&html::table(f, "files", &|_| String::new())),
        _ => s.push_str(
            "<p class=\"muted\">Imported from a local folder: no hub files recorded.</p>",
        ),
    }
    if let Some(sem) = &d.semantics {
        let mut facts = sem_without_decisions(sem);
        facts.push_str(&format!(
            "<p>Every decision with its source:</p><pre>{}</pre>",
            esc(sem.text(0, "decisions").unwrap_or(""))
        ));
        s.push_str(&facts);
    }
    s.push_str(&queries_of(d, "Provenance"));
    Ok(())
}

/// Every comparison with its reference, failing and repaired first.
fn agreement(d: &Data, s: &mut String) -> Result<()> {
    s.push_str("<h2 id=\"agreement-section\">Agreement with the reference</h2>");
    if let Some(t) = &d.towers {
        s.push_str("<p>Towers: each file beside model.q4nx has its own verdict against the mmproj GGUF; a tower that fails leaves the language model usable, as text only.</p>");
        s.push_str(&html::scroll(&html::table(t, "towers", &|_| String::new())));
    }
    match &d.agreement {
        Some(a) => {
            let fails = (0..a.rows())
                .filter(|&r| Data::agreement_class(a, r) == "fail")
                .count();
            let repaired = (0..a.rows())
                .filter(|&r| Data::agreement_class(a, r) == "repaired")
                .count();
            let _ = write!(
                s,
                "<p>{} comparisons: <b>{fails} failing</b>, {repaired} repaired, listed first (red, then purple); then flagged, then the rest by correlation. Filter rows by any text (tensor, verdict, reading): <input id=\"filter\" aria-label=\"filter the agreement table\"></p>",
                a.rows()
            );
            if let Some(c) = d.agreement_chart() {
                s.push_str(&svg_block(&c)?);
            }
            s.push_str(&html::scroll(&html::table(a, "agreement", &|r| {
                Data::agreement_class(a, r).to_string()
            })));
        }
        None => s.push_str(&absent(
            "verification",
            "no pack in this store was verified (import with --reference)",
        )),
    }
    s.push_str(&queries_of(d, "Agreement"));
    Ok(())
}

/// Tile kinds and padding per layer.
fn tiles(d: &Data, s: &mut String) -> Result<()> {
    s.push_str("<h2 id=\"tiles\">Tile kinds and padding per layer</h2>");
    if let Some(c) = d.tiles_chart() {
        s.push_str(&svg_block(&c)?);
    }
    if let Some(t) = &d.tiles {
        s.push_str(&html::scroll(&html::table(t, "tile-kinds", &|_| {
            String::new()
        })));
    }
    s.push_str(&queries_of(d, "Tiles"));
    Ok(())
}

/// The tensor picker and one card per tensor: facts, row-block heatmap, histogram.
fn tensors(d: &Data, s: &mut String) -> Result<()> {
    s.push_str("<h2 id=\"tensors\">Tensors: row blocks and values</h2>");
    let heatmaps = d.heatmaps();
    if let Some(t) = &d.tensors {
        let first = d
            .histograms
            .keys()
            .next()
            .cloned()
            .or_else(|| t.text(0, "name").map(str::to_string))
            .unwrap_or_default();
        let failing: Vec<&str> = d
            .agreement
            .as_ref()
            .map(|a| {
                (0..a.rows())
                    .filter(|&r| Data::agreement_class(a, r) != "pass")
                    .filter_map(|r| a.text(r, "tensor"))
                    .collect()
            })
            .unwrap_or_default();
        let _ = write!(s, "<p>{} tensors; pick one: <select id=\"pick\">", t.rows());
        for r in 0..t.rows() {
            let name = t.text(r, "name").unwrap_or("");
            let mark = if failing.contains(&name) { " ✗" } else { "" };
            let hist = if d.histograms.contains_key(name) {
                " (histogram)"
            } else {
                ""
            };
            let sel = if name == first { " selected" } else { "" };
            let _ = write!(
                s,
                "<option value=\"{0}\"{sel}>{0}{mark}{hist}</option>",
                esc(name)
            );
        }
        s.push_str("</select></p><p class=\"muted\">Row blocks are the tile grid's (<code>block_stats</code>); beyond 96 of them, adjacent blocks are merged (absmax: the group's maximum; rms: pooled over the group's rows). Histograms of decoded values (<code>tensor_values</code>) are drawn for the worst-agreeing tensors and those named with <code>--tensor NAME</code>.</p>");
        for r in 0..t.rows() {
            let name = t.text(r, "name").unwrap_or("");
            let _ = write!(
                s,
                "<div class=\"tensor\" data-name=\"{}\"><h3>{}</h3><table class=\"kv\">",
                esc(name),
                esc(name)
            );
            for col in t.names().iter().filter(|c| *c != "name") {
                let v = match t.num(r, col) {
                    Some(v) if v.fract() != 0.0 => html::num(v),
                    _ => t.text(r, col).unwrap_or("").to_string(),
                };
                let _ = write!(s, "<tr><td>{}</td><td>{}</td></tr>", esc(col), esc(&v));
            }
            s.push_str("</table>");
            match heatmaps.get(name) {
                Some(h) => s.push_str(&svg_block(h)?),
                None => s.push_str("<p class=\"muted\">One row block: its statistics are the tensor's (above).</p>"),
            }
            if let Some(h) = d.histograms.get(name) {
                s.push_str(&svg_block(h)?);
            }
            s.push_str("</div>");
        }
    } else {
        s.push_str(&absent("tensors", "the dequant stage has not run"));
    }
    s.push_str(&queries_of(d, "Tensors"));
    Ok(())
}

/// Stage runs across imports.
fn runs(d: &Data, s: &mut String) -> Result<()> {
    s.push_str("<h2 id=\"runs\">Stage runs across imports</h2>");
    if let Some(c) = d.runs_chart() {
        s.push_str(&svg_block(&c)?);
    }
    if let Some(f) = &d.runs {
        s.push_str(&html::scroll(&html::table(f, "run-table", &|r| {
            if f.text(r, "status") == Some("miss") {
                String::new()
            } else {
                "skipped".into()
            }
        })));
    }
    s.push_str(&queries_of(d, "Runs"));
    Ok(())
}

/// What changed in verification between the last two imports.
fn changes(d: &Data, s: &mut String) -> Result<()> {
    s.push_str("<h2 id=\"changes\">What changed between the last two imports</h2>");
    match (&d.imports, &d.diff) {
        (_, Some((before, after, f))) => {
            let _ = write!(
                s,
                "<p>Verification of import <code>{}</code> (current) against <code>{}</code>: {} comparisons differ.</p>",
                esc(&after[..after.len().min(16)]),
                esc(&before[..before.len().min(16)]),
                f.rows()
            );
            s.push_str(&html::table(
                f,
                "changes-table",
                &|r| match f.text(r, "verdict_after") {
                    Some("fail") => "fail".into(),
                    _ => String::new(),
                },
            ));
        }
        (Some(i), None) => {
            let _ = write!(
                s,
                "<p class=\"muted\">{} import(s) of this pack in the store: nothing to compare yet (a second import after a reader fix shows what changed here).</p>",
                i.rows()
            );
        }
        (None, _) => s.push_str(&absent("verification_history", "no verified import")),
    }
    s.push_str(&queries_of(d, "Changes"));
    Ok(())
}

/// Every query the page ran, in order.
fn queries(d: &Data, s: &mut String) -> Result<()> {
    s.push_str("<h2 id=\"queries\">Queries</h2><p>Every table and chart above comes from these queries over the catalog (<code>onebit-pipe sql</code> runs them as they are):</p>");
    for q in &d.ran {
        let _ = write!(
            s,
            "<p class=\"muted\">{}</p><pre>{}</pre>",
            esc(q.section),
            esc(&q.sql)
        );
    }
    Ok(())
}

fn svg_block(chart: &impl Chart) -> Result<String> {
    Ok(format!(
        "<div class=\"chart\">{}</div>",
        charts::svg(chart)?
    ))
}

fn queries_of(d: &Data, section: &str) -> String {
    d.ran
        .iter()
        .filter(|q| q.section == section)
        .map(|q| html::query(&q.sql))
        .collect()
}

fn absent(table: &str, why: &str) -> String {
    format!(
        "<p class=\"muted\">No <code>{}</code> table in this store: {}.</p>",
        esc(table),
        esc(why)
    )
}

/// The semantics row as a key/value table, without the decision log (shown whole below it).
fn sem_without_decisions(sem: &Frame) -> String {
    let mut s = String::from("<table class=\"kv\">");
    for (c, name) in sem.names().iter().enumerate() {
        if name == "decisions" {
            continue;
        }
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td></tr>",
            esc(name),
            esc(sem.text_at(0, c).unwrap_or(""))
        );
    }
    s.push_str("</table>");
    s
}
