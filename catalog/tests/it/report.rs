//! The verification report on a store built from the fixture packs: a refused pack's failing
//! tensors come first and red, the page loads nothing from outside and lists its queries, what
//! changed between two imports of one repository, the PNG charts, and refusals by name.

use crate::common;

use std::collections::BTreeMap;

use onebit_catalog::report::{self, Options};
use onebit_catalog::{Catalog, Error};
use onebit_pipeline::Store;

fn versions() -> BTreeMap<String, u32> {
    onebit_stages::stage_versions()
}

/// The CSS classes of the rows of the table with `id`, in order.
fn row_classes(page: &str, id: &str) -> Vec<String> {
    let start = page
        .find(&format!("<table id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no table {id}"));
    let body = &page[start..];
    let end = body.find("</table>").expect("table end");
    body[..end]
        .split("<tr")
        .skip(2) // before the header row, the header row
        .map(|r| {
            r.strip_prefix(" class=\"")
                .and_then(|c| c.split('"').next())
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

fn count(catalog: &Catalog, sql: &str) -> usize {
    let b = catalog.sql(sql).expect(sql);
    let f = report::frame::Frame::from_batches(&b).expect("frame");
    f.num(0, "n").expect("n") as usize
}

#[test]
fn a_refused_pack_shows_its_failing_tensors_first_and_red() {
    let (_home, store) = common::fixture_store();
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    let page = report::html(&catalog, &Options::new("llama-q80")).expect("report");
    let fails = count(
        &catalog,
        "SELECT count(*) AS n FROM verification WHERE pack = 'llama-q80' AND verdict = 'fail'",
    );
    assert!(fails >= 8, "the q80 fixture fails 8 tensors, got {fails}");
    let classes = row_classes(&page, "agreement");
    assert!(classes.len() > fails, "{classes:?}");
    assert!(
        classes[..fails].iter().all(|c| c == "fail"),
        "failing rows first: {classes:?}"
    );
    assert!(
        classes[fails..].iter().all(|c| c != "fail"),
        "and only there: {classes:?}"
    );
    assert!(page.contains("<b>Refused</b>"), "the verdict says refused");
    assert!(
        page.contains("tr.fail td{background:#fbe0e0"),
        "fail rows are red"
    );
    // The charts are drawn (SVG inline), the worst tensors get a histogram of decoded values.
    assert!(page.matches("<svg").count() >= 4, "charts inline");
    assert!(
        page.contains("FROM tensor_values(&#39;llama-q80&#39;"),
        "histogram query listed"
    );
}

#[test]
fn the_page_is_self_contained_and_lists_every_query_it_ran() {
    let (_home, store) = common::fixture_store();
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    let page = report::html(&catalog, &Options::new("llama-q41")).expect("report");
    // Nothing is fetched at view time: no external scripts, styles, images or fonts.
    for needle in [" src=", "<link", "url(", "@import", "<iframe"] {
        assert!(!page.contains(needle), "{needle} in the page");
    }
    assert!(page.contains("<b>Verified</b>"));
    // Every section's query is on the page and runs as it stands.
    let listed: Vec<&str> = page
        .split("<pre>")
        .skip(1)
        .filter_map(|p| p.split("</pre>").next())
        .filter(|p| p.starts_with("SELECT"))
        .collect();
    assert!(listed.len() >= 9, "{} queries listed", listed.len());
    for q in listed {
        let sql = q
            .replace("&#39;", "'")
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&");
        catalog.sql(&sql).unwrap_or_else(|e| panic!("{sql}\n{e}"));
    }
}

#[test]
fn two_imports_of_one_repository_show_what_changed() {
    let home = tempfile::tempdir().expect("tmp");
    let store = Store::open(home.path()).expect("store");
    // The same repository name imported broken, then fixed (a republished pack).
    for case in ["llama-q80", "llama-q41"] {
        common::import(
            &store,
            "org/model",
            &common::fixture(case),
            Some(common::fixture(&format!("{case}/model.gguf"))),
        );
    }
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    let page = report::html(&catalog, &Options::new("org/model")).expect("report");
    let section = &page[page.find("id=\"changes\"").expect("changes section")..];
    assert!(
        section.contains("<table id=\"changes-table\">"),
        "a diff table"
    );
    let diff = &section[..section.find("</table>").expect("end")];
    // Every tensor that failed before passes now and is listed.
    for t in [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "lm_head.weight",
    ] {
        assert!(diff.contains(t), "{t} missing from {diff}");
    }
    assert!(diff.contains(">fail<") && diff.contains(">pass<"));
    // The stage runs of both imports are drawn.
    assert!(page.contains("#2 ("), "the second import's bar");
}

#[test]
fn the_charts_come_as_png_files_too() {
    let (_home, store) = common::fixture_store();
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    let mut opts = Options::new("llama-q80");
    opts.histograms = vec!["model.layers.1.mlp.up_proj.weight".into()];
    let files = report::png(&catalog, &opts).expect("png");
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "agreement.png",
        "tiles.png",
        "runs.png",
        "values-model.layers.1.mlp.up_proj.weight.png",
        "blocks-model.layers.1.mlp.up_proj.weight.png",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    for (name, bytes) in &files {
        let info = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .info()
            .clone();
        assert!(info.width >= 700 && info.height >= 100, "{name}");
    }
}

#[test]
fn an_unknown_pack_or_tensor_is_refused_by_name() {
    let (_home, store) = common::fixture_store();
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    match report::html(&catalog, &Options::new("no/such")) {
        Err(e @ Error::UnknownPack { .. }) => {
            let m = e.to_string();
            assert!(m.contains("no/such") && m.contains("llama-q80"), "{m}");
        }
        other => panic!("{:?}", other.map(|p| p.len())),
    }
    let mut opts = Options::new("llama-q41");
    opts.histograms = vec!["nope.weight".into()];
    match report::html(&catalog, &opts) {
        Err(e @ Error::UnknownTensor { .. }) => assert!(e.to_string().contains("nope.weight")),
        other => panic!("{:?}", other.map(|p| p.len())),
    }
}
