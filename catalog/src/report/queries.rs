//! The SQL behind every part of the report. Each query is run against the catalog as it is and
//! listed on the page with its section, so a reader can re-run it with `onebit-pipe sql`.

/// A SQL string literal: `'…'` with quotes doubled.
pub fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The pack's row of `packs`: verdict, freshness, source.
pub fn pack(p: &str) -> String {
    format!(
        "SELECT name, verified, verdict, source, dir, last_run, needs_run, stale_stages\nFROM packs WHERE name = {}",
        lit(p)
    )
}

/// The repository files and their digests (hub imports).
pub fn files(p: &str) -> String {
    format!(
        "SELECT repo, revision, commit, path, size, lfs, sha256\nFROM files WHERE pack = {} ORDER BY path",
        lit(p)
    )
}

/// What the config means, with the decision log.
pub fn semantics(p: &str) -> String {
    format!(
        "SELECT family, model_type, hidden, layers, heads, kv_heads, head_dim, intermediate, vocab,\n  tied, qk_norm, norm_form, activation, decisions\nFROM semantics WHERE pack = {}",
        lit(p)
    )
}

/// The comparison of every tensor with its reference (alternative readings left out), failing
/// tensors first, then repaired ones, then flagged, then the rest by correlation. With a repair
/// stage in the store, each row carries the verdict of the repaired bytes.
pub fn agreement(p: &str, with_repair: bool) -> String {
    let (repair_cols, repair_join, repaired) = if with_repair {
        (
            ",\n  r.verdict AS repaired_verdict, r.corr AS repaired_corr",
            format!(
                "\nLEFT JOIN (SELECT * FROM repair_verification WHERE pack = {} AND verdict <> 'candidate') r\n  ON r.tensor = v.tensor AND r.reference = v.reference",
                lit(p)
            ),
            "WHEN r.verdict IS NOT NULL AND r.verdict <> v.verdict THEN 1 ",
        )
    } else {
        ("", String::new(), "")
    };
    format!(
        "SELECT v.file, v.tensor, v.reference, v.reading, v.corr, v.rel_l2, v.max_err, v.verdict, v.reason{repair_cols}\nFROM verification v{repair_join}\nWHERE v.pack = {} AND v.verdict <> 'candidate'\nORDER BY CASE WHEN v.verdict = 'fail' THEN 0 {repaired}WHEN v.verdict = 'flag' THEN 2\n  WHEN v.verdict = 'skipped' THEN 3 ELSE 4 END, v.corr ASC NULLS FIRST, v.tensor, v.reference",
        lit(p)
    )
}

/// Each tower file's verdict from its verification rows (the language file's is the pack's):
/// a tower that fails or has no mmproj leaves the language model usable, served as text only.
pub fn towers(p: &str) -> String {
    let count = |v: &str| format!("sum(CASE WHEN verdict = '{v}' THEN 1 ELSE 0 END)");
    format!(
        "SELECT file, count(*) AS tensors, {} AS passed, {} AS failed, {} AS unreferenced,\n  CASE WHEN {} > 0 THEN 'refused: the pack serves text only'\n    WHEN {} > 0 THEN 'unverified: give --mmproj GGUF' ELSE 'verified' END AS verdict\nFROM verification WHERE pack = {} AND file <> 'model.q4nx' AND verdict <> 'candidate'\nGROUP BY file ORDER BY file",
        count("pass"),
        count("fail"),
        count("skipped"),
        count("fail"),
        count("skipped"),
        lit(p)
    )
}

/// Tile kinds and padding per layer.
pub fn tiles(p: &str) -> String {
    format!(
        "SELECT file, layer, kind, count(*) AS tensors, sum(bytes) AS bytes,\n  sum(rows * (padded_k - k)) AS pad_values, sum(rows * padded_k) AS stored_values\nFROM tensors WHERE pack = {}\nGROUP BY file, layer, kind ORDER BY file, layer NULLS FIRST, kind",
        lit(p)
    )
}

/// Every tensor with its detection evidence and value statistics (the picker's list).
pub fn tensors(p: &str) -> String {
    format!(
        "SELECT t.name, t.file, t.layer, t.role, t.kind, t.rows, t.k, t.padded_k, t.bytes, t.evidence,\n  s.min, s.max, s.absmax, s.rms, s.std, s.nan_count, s.inf_count, s.pad_nonzero\nFROM tensors t LEFT JOIN tensor_stats s ON s.pack = t.pack AND s.file = t.file AND s.name = t.name\nWHERE t.pack = {}\nORDER BY t.file, t.layer NULLS FIRST, t.name",
        lit(p)
    )
}

/// Statistics per row block of every tensor.
pub fn blocks(p: &str) -> String {
    format!(
        "SELECT name, block, row0, rows, absmax, rms\nFROM block_stats WHERE pack = {} ORDER BY name, block",
        lit(p)
    )
}

/// A histogram of one tensor's decoded values in `bins` equal bins over `[min, max]` (from
/// `tensor_stats`), NaN and infinities left out (they are counted in `tensor_stats`).
pub fn histogram(p: &str, tensor: &str, min: f64, max: f64, bins: usize) -> String {
    let width = ((max - min) / bins as f64).max(f64::MIN_POSITIVE);
    format!(
        "SELECT least(CAST(floor((value - ({min:e})) / {width:e}) AS BIGINT), {}) AS bin, count(*) AS n\nFROM tensor_values({}, {})\nWHERE NOT isnan(value) AND abs(value) <> 'inf'::double\nGROUP BY 1 ORDER BY 1",
        bins - 1,
        lit(p),
        lit(tensor)
    )
}

/// Every stage run of the pack's imports.
pub fn runs(p: &str) -> String {
    format!(
        "SELECT run_id, stage, status, reason, duration_ms, started_unix_ms\nFROM runs WHERE ref_name = {}\nORDER BY run_id, started_unix_ms, stage",
        lit(p)
    )
}

/// The verify-stage imports of the pack's language file, newest first (the current one flagged);
/// a tower's imports are its own and are not compared with these.
pub fn imports(p: &str) -> String {
    format!(
        "SELECT import_key, first_run, last_run, bool_or(current) AS current, count(*) AS rows\nFROM verification_history WHERE pack = {} AND file = 'model.q4nx'\nGROUP BY import_key, first_run, last_run ORDER BY current DESC, last_run DESC",
        lit(p)
    )
}

/// What changed in verification between two imports: tensors whose reading, verdict or
/// correlation differ, or that only one of them has.
pub fn diff(p: &str, before: &str, after: &str) -> String {
    let side = |key: &str| {
        format!(
            "(SELECT tensor, reference, reading, verdict, corr FROM verification_history\n   WHERE pack = {} AND import_key = {} AND verdict <> 'candidate')",
            lit(p),
            lit(key)
        )
    };
    format!(
        "SELECT coalesce(a.tensor, b.tensor) AS tensor, coalesce(a.reference, b.reference) AS reference,\n  b.reading AS reading_before, a.reading AS reading_after, b.verdict AS verdict_before,\n  a.verdict AS verdict_after, b.corr AS corr_before, a.corr AS corr_after\nFROM {} a\nFULL OUTER JOIN {} b ON a.tensor = b.tensor AND a.reference = b.reference\nWHERE a.tensor IS NULL OR b.tensor IS NULL OR a.verdict <> b.verdict OR a.reading <> b.reading\n  OR abs(a.corr - b.corr) > 1e-9\nORDER BY tensor, reference",
        side(after),
        side(before)
    )
}
