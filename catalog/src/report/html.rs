//! Page pieces: escaping, tables from frames, the stylesheet and the picker script. Everything is
//! inline: the file opens offline and loads nothing.

use std::fmt::Write;

use super::frame::Frame;

/// Text escaped for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number as the tables show it: up to 6 significant digits.
pub fn num(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let mag = v.abs().log10();
    if (-3.0..6.0).contains(&mag) {
        let decimals = (5 - mag.floor() as i32).clamp(0, 8) as usize;
        let s = format!("{v:.decimals$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    } else {
        format!("{v:.4e}")
    }
}

/// A cell's display text: numbers shortened, the rest as Arrow shows it.
fn cell(f: &Frame, row: usize, col: usize) -> String {
    let name = &f.names()[col];
    if f.is_numeric(col)
        && let Some(v) = f.num(row, name)
        && v.fract() != 0.0
    {
        return num(v);
    }
    f.text_at(row, col).unwrap_or("").to_string()
}

/// The frame as a table; `row_class` gives each row's CSS class (verdict colors).
pub fn table(f: &Frame, id: &str, row_class: &dyn Fn(usize) -> String) -> String {
    let mut s = String::new();
    let _ = write!(s, "<table id=\"{}\"><thead><tr>", esc(id));
    for n in f.names() {
        let _ = write!(s, "<th>{}</th>", esc(n));
    }
    s.push_str("</tr></thead><tbody>");
    for r in 0..f.rows() {
        let class = row_class(r);
        if class.is_empty() {
            s.push_str("<tr>");
        } else {
            let _ = write!(s, "<tr class=\"{}\">", esc(&class));
        }
        for c in 0..f.names().len() {
            let numeric = if f.is_numeric(c) { " class=\"n\"" } else { "" };
            let _ = write!(s, "<td{numeric}>{}</td>", esc(&cell(f, r, c)));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>");
    s
}

/// A long table in a box that scrolls (the header row stays in view).
pub fn scroll(table: &str) -> String {
    format!("<div class=\"scroll\">{table}</div>")
}

/// A collapsible block with the query behind a section.
pub fn query(sql: &str) -> String {
    format!(
        "<details class=\"sql\"><summary>SQL</summary><pre>{}</pre></details>",
        esc(sql)
    )
}

/// The stylesheet.
pub const STYLE: &str = r#"
body{font-family:"DejaVu Sans",system-ui,sans-serif;margin:0 auto;max-width:1180px;padding:0 18px 40px;color:#1d1d1f;font-size:14px}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
nav a{margin-right:12px}
.verdict{padding:10px 14px;border-radius:6px;font-size:15px;margin:10px 0}
.verdict.ok{background:#e7f4ec;border:1px solid #2e8b57}.verdict.bad{background:#fbe9e9;border:1px solid #c62828}
.verdict.none{background:#f2f2f2;border:1px solid #999}
table{border-collapse:collapse;font-size:12px;margin:6px 0}th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f5f5f5;position:sticky;top:0}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.fail td{background:#fbe0e0;color:#8e0000}tr.repaired td{background:#f3e5f5;color:#4a148c}tr.flag td{background:#fff4dc}
tr.skipped td{color:#777}
.scroll{max-height:520px;overflow:auto;border:1px solid #eee}
pre{white-space:pre-wrap;font-size:12px;background:#fafafa;padding:6px;margin:4px 0}
details.sql{margin:4px 0 10px}details.sql summary{cursor:pointer;color:#555;font-size:12px}
.muted{color:#666}.chart svg{max-width:100%;height:auto}
.tensor[hidden]{display:none}
select,input{font-size:13px;padding:2px}
.kv td:first-child{font-weight:bold;white-space:nowrap}
"#;

/// The picker: shows the chosen tensor's card; the filter narrows the agreement table.
pub const SCRIPT: &str = r#"
(function(){
  var pick=document.getElementById('pick');
  function show(){
    var v=pick.value;
    document.querySelectorAll('.tensor').forEach(function(d){d.hidden=(d.getAttribute('data-name')!==v);});
  }
  if(pick){pick.addEventListener('change',show);show();}
  var filter=document.getElementById('filter');
  if(filter){filter.addEventListener('input',function(){
    var q=filter.value.toLowerCase();
    document.querySelectorAll('#agreement tbody tr').forEach(function(tr){
      tr.hidden=q!==''&&tr.textContent.toLowerCase().indexOf(q)<0;});
  });}
  document.body.setAttribute('data-ready','1');
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(
            esc("<a href=\"x\">it's & </a>"),
            "&lt;a href=&quot;x&quot;&gt;it&#39;s &amp; &lt;/a&gt;"
        );
    }

    #[test]
    fn numbers_keep_six_significant_digits() {
        assert_eq!(num(0.99998403), "0.999984");
        assert_eq!(num(1234.5678), "1234.57");
        assert_eq!(num(0.00001234), "1.2340e-5");
        assert_eq!(num(0.0), "0");
    }
}
