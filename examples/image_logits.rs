//! Our side of the comparison with llama.cpp's multimodal path (`scripts/mtmd-compare.py`): the
//! prompt llama.cpp's mtmd tokenized (`tokens.json` from `scripts/oracle/mtmd_logits.cpp`: the
//! text ids before and after the image and the image's token count), the image encoded by the
//! pack's tower and placed over that many image tokens, then the same files mtmd writes:
//! `features.f32` (the projected image, tokens × hidden), `logits.f32` (after the whole prompt)
//! and `ours.json` (the encode time, the greedy continuation).
//!
//! `cargo run --release --example image_logits -- PACK_DIR IMAGE MTMD_DIR OUT_DIR N_PREDICT`

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};

fn ids(v: &serde_json::Value, key: &str) -> anyhow::Result<Vec<u32>> {
    v[key]
        .as_array()
        .with_context(|| format!("tokens.json: no {key}"))?
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .with_context(|| format!("tokens.json: {key} holds {x}"))
        })
        .collect()
}

fn write_f32(path: &PathBuf, values: &[f32]) -> anyhow::Result<()> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [pack, image, mtmd, out, n] = args.as_slice() else {
        bail!("usage: image_logits PACK_DIR IMAGE MTMD_DIR OUT_DIR N_PREDICT");
    };
    let n_predict: usize = n.parse().context("N_PREDICT")?;
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let theirs: serde_json::Value = serde_json::from_slice(
        &std::fs::read(PathBuf::from(mtmd).join("tokens.json")).context("tokens.json")?,
    )?;
    let pack = onebit_runtime::Pack::open(&PathBuf::from(pack), false)?;
    let model = onebit_runtime::Model::load(pack)?;
    let images = model.image_encoder()?;
    let bytes = std::fs::read(image).with_context(|| format!("reading {image}"))?;
    let t0 = Instant::now();
    let embeds = images.encode(&bytes)?;
    let encode_ms = t0.elapsed().as_secs_f64() * 1e3;
    write_f32(&out.join("features.f32"), &embeds.values)?;

    let count = theirs["image_tokens"]
        .as_u64()
        .context("tokens.json: image_tokens")? as usize;
    if count != embeds.tokens {
        bail!(
            "mtmd made {count} image tokens, the pack's tower {}",
            embeds.tokens
        );
    }
    let mut prompt = ids(&theirs, "before")?;
    prompt.extend(std::iter::repeat_n(images.spec().image_token, count));
    prompt.extend(ids(&theirs, "after")?);
    let mut session = model.session(prompt.len() + n_predict + 1);
    onebit_runtime::generate::place_images(&model, &mut session, &prompt, &[embeds])?;
    let t1 = Instant::now();
    let mut logits = model.forward(&mut session, &prompt, false)?;
    let prefill_ms = t1.elapsed().as_secs_f64() * 1e3;
    write_f32(&out.join("logits.f32"), &logits)?;
    let mut greedy = Vec::with_capacity(n_predict);
    for _ in 0..n_predict {
        let best = onebit_runtime::sample::argmax(&logits);
        greedy.push(best);
        logits = model.forward(&mut session, &[best], false)?;
    }
    let report = serde_json::json!({
        "encode_ms": encode_ms,
        "prefill_ms": prefill_ms,
        "prompt_tokens": prompt.len(),
        "greedy": greedy,
        "threads": rayon::current_num_threads(),
    });
    std::fs::write(out.join("ours.json"), format!("{report}\n")).context("ours.json")?;
    Ok(())
}
