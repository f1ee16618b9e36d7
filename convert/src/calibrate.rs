//! Calibrated requantization: the mean x² of the activations entering each matrix, measured by
//! running the model on calibration text, weighs each column's quantization error (the idea of
//! llama.cpp's importance matrix). The activations come from the model itself at near-source
//! precision: the GGUF is first converted to 8-bit tiles (relative error ≈ 0.3 %), packed for
//! the host runtime, and run over the text in 512-token chunks.
//!
//! Calibrate on text other than what you evaluate on; the repository's own documentation is a
//! reasonable English default.

use std::collections::BTreeMap;
use std::path::Path;

use onebit_pack::manifest::{FORMAT, Manifest, Provenance, TensorEntry, VERSION, Verification};

use super::{ConvertOptions, TileChoice};
use onebit_stages::error::{Error, Result, io_at};

/// Per-matrix column weights and the decision line that records them.
pub struct Importance {
    /// Pack tensor name → one weight per input column.
    pub per_matrix: BTreeMap<String, Vec<f32>>,
    /// Pack tensor name → the inputs' mean second moments `E[x xᵀ]` (`k × k`), when asked for
    /// (GPTQ); shared by matrices reading the same input.
    pub second_moments: BTreeMap<String, std::sync::Arc<Vec<f64>>>,
    /// `calibration=… <- …`.
    pub decision: String,
}

/// Tokens per calibration chunk.
const CHUNK: usize = 512;

fn internal(e: impl std::fmt::Display) -> Error {
    Error::Internal(e.to_string())
}

/// Measures the importance of every matrix column of `gguf` on `opts.calibrate`.
pub fn importance(gguf: &Path, opts: &ConvertOptions) -> Result<Importance> {
    let tmp = tempfile::tempdir()
        .map_err(|e| io_at(e, "create a temporary folder in", &std::env::temp_dir()))?;
    let repo = tmp.path().join("q8");
    let eight = ConvertOptions {
        tile: TileChoice::Q8_8704,
        family: opts.family.clone(),
        calibrate: Vec::new(),
        calibrate_tokens: 0,
        tile_for: Vec::new(),
        gptq: false,
        config: opts.config.clone(),
        mmproj: None,
    };
    super::convert(gguf, &repo, &eight)?;
    // A runtime pack over the 8-bit repository: semantics from its config, tile kinds known.
    let sem = onebit_stages::stage::semantics::semantics_of_dir(&repo)?;
    let container = onebit_stages::format::q4nx::Container::open(&repo.join("model.q4nx"))?;
    let names: std::collections::BTreeSet<String> =
        container.tensors().iter().map(|t| t.name.clone()).collect();
    let (spec, _) = onebit_stages::model_spec::model_spec(
        &sem,
        |n| names.contains(n),
        &repo.join("config.json"),
    )?;
    let tensors = container
        .tensors()
        .iter()
        .map(|t| {
            let kind = if t.dtype == onebit_stages::format::q4nx::Dtype::I8 {
                "Q8C_8704".to_string()
            } else {
                t.dtype.name().to_string()
            };
            (
                t.name.clone(),
                TensorEntry {
                    kind,
                    rows: 0,
                    k: 0,
                },
            )
        })
        .collect();
    drop(container);
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        model: Some(spec),
        host_refusal: None,
        tensors,
        provenance: Provenance::default(),
        verification: Verification {
            verified: true,
            summary: "calibration pack (8-bit requantization of the source GGUF)".into(),
            repaired: Vec::new(),
        },
        chat_template: None,
        decisions: Vec::new(),
        head_scan: None,
        towers: Vec::new(),
    };
    fs_err::write(
        repo.join("manifest.json"),
        serde_json::to_vec(&manifest).map_err(internal)?,
    )?;
    let pack = onebit_runtime::Pack::open(&repo, false).map_err(internal)?;
    let model = onebit_runtime::Model::load(pack).map_err(internal)?;
    let text =
        onebit_runtime::text::Text::load(&repo.join("tokenizer.json"), None).map_err(internal)?;
    let mut ids = Vec::new();
    for f in &opts.calibrate {
        let s = fs_err::read_to_string(f)?;
        ids.extend(text.encode(&s, false).map_err(internal)?);
    }
    let limit = if opts.calibrate_tokens == 0 {
        usize::MAX
    } else {
        opts.calibrate_tokens
    };
    ids.truncate(limit);
    model.collect_stats(opts.gptq);
    let mut session = model.session(CHUNK);
    let mut seen = 0;
    for chunk in ids.chunks(CHUNK - 1) {
        let mut toks = Vec::with_capacity(chunk.len() + 1);
        toks.extend(model.spec.bos);
        toks.extend_from_slice(chunk);
        session.truncate(0);
        model.forward(&mut session, &toks, true).map_err(internal)?;
        seen += toks.len();
        tracing::info!(tokens = seen, "calibrating");
    }
    let stats = model.take_stats();
    let mut second_moments = BTreeMap::new();
    let mut means: BTreeMap<usize, std::sync::Arc<Vec<f64>>> = BTreeMap::new();
    let mut per_matrix = BTreeMap::new();
    for (name, st) in stats {
        let n = st.rows.max(1) as f64;
        per_matrix.insert(
            name.clone(),
            st.sum_sq.iter().map(|s| (s / n) as f32).collect(),
        );
        if let Some(g) = st.gram {
            // One mean per shared input.
            let mean = means
                .entry(std::sync::Arc::as_ptr(&g) as usize)
                .or_insert_with(|| std::sync::Arc::new(g.iter().map(|v| v / n).collect()))
                .clone();
            second_moments.insert(name, mean);
        }
    }
    Ok(Importance {
        per_matrix,
        second_moments,
        decision: format!(
            "calibration={seen} tokens <- {} (mean x² per column weighs requantization error{})",
            opts.calibrate
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            if opts.gptq {
                "; E[x xᵀ] per input drives GPTQ"
            } else {
                ""
            }
        ),
    })
}
