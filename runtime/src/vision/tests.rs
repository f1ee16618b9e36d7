//! The tests of the image encoder.
use super::oracle::{config, fixture, floats, reference};
use super::*;

/// The oracle's tower and projector (transformers, f32, on the weights as the tower stores
/// them) against ours on the same pixel values.
#[test]
fn the_encoder_gives_transformers_image_features_from_the_oracles_tower() {
    let reference = reference();
    let vision = GemmaVision::open(&fixture().join("vision_weight.q4nx"), config(128))
        .expect("open")
        .with_precision(Precision::F32);
    let ours = vision
        .encode(&floats(&reference, "pixel_values"))
        .expect("encode");
    let theirs = floats(&reference, "features");
    assert_eq!(ours.len(), theirs.len());
    let max_ref = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_diff = ours
        .iter()
        .zip(&theirs)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    // f32 sums in another order than torch's, on values rounded to 6 decimals.
    assert!(
        max_diff <= 1e-4 * max_ref.max(1.0) + 2e-6,
        "max |ours - transformers| = {max_diff} (largest feature {max_ref})"
    );
}

/// With bf16 operands (natively on AVX-512-BF16, emulated elsewhere), on the oracle's image and
/// the five of `sizes.json`: the features stay within 1.25× of what the same rounding costs
/// transformers (`bf16.json`, `towers.py gemma3-bf16`), in the largest difference and in
/// relative RMS, and they differ from the f32 features (the rounding happened); most images get
/// the oracle's bf16 features themselves.
#[test]
fn bf16_products_cost_what_the_same_rounding_costs_transformers() {
    let reference = reference();
    let sizes: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("sizes.json")).expect("sizes"))
            .expect("json");
    let bf16: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("bf16.json")).expect("bf16"))
            .expect("json");
    let vision = GemmaVision::open(&fixture().join("vision_weight.q4nx"), config(128))
        .expect("open")
        .with_precision(Precision::Bf16);
    let mut cases = vec![(
        "image.png".to_string(),
        floats(&reference, "pixel_values"),
        floats(&reference, "features"),
    )];
    for row in sizes["images"].as_array().expect("images") {
        cases.push((
            row["file"].as_str().expect("file").to_string(),
            floats(row, "pixel_values"),
            floats(row, "features"),
        ));
    }
    let costs = bf16["images"].as_array().expect("images");
    assert_eq!(costs.len(), cases.len());
    let mut reproduced = 0;
    for ((file, pixels, f32_features), cost) in cases.iter().zip(costs) {
        assert_eq!(cost["file"].as_str(), Some(file.as_str()));
        let ours = vision.encode(pixels).expect("encode");
        let diff: Vec<f32> = ours.iter().zip(f32_features).map(|(a, b)| a - b).collect();
        let max = diff.iter().fold(0.0f32, |m, d| m.max(d.abs()));
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let rel_rms = norm(&diff) / norm(f32_features);
        let (cost_max, cost_rms) = (
            cost["cost_max_abs"].as_f64().expect("cost") as f32,
            cost["cost_rel_rms"].as_f64().expect("cost") as f32,
        );
        let same_rounding = floats(cost, "features")
            .iter()
            .zip(&ours)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        tracing::info!(
            file,
            max,
            rel_rms,
            cost_max,
            cost_rms,
            same_rounding,
            "bf16 features"
        );
        if same_rounding <= 1e-5 {
            reproduced += 1;
        }
        assert!(
            max <= 1.25 * cost_max && rel_rms <= 1.25 * cost_rms,
            "{file}: bf16 features off the f32 ones by {max} (relative RMS {rel_rms}); the same rounding costs transformers {cost_max} ({cost_rms})"
        );
        assert!(
            rel_rms > 0.1 * cost_rms,
            "{file}: bf16 features equal the f32 ones ({rel_rms}): no rounding happened"
        );
    }
    // The same rounding in another summation order: mostly the oracle's bf16 features to the
    // last digit; where a sum lands on the other side of a rounding step, the difference
    // travels through the layers (one image of six here, 0.008), hence the bound above.
    assert!(
        2 * reproduced >= cases.len(),
        "only {reproduced} of {} images have the oracle's bf16 features",
        cases.len()
    );
}

#[test]
fn a_tower_without_its_projector_is_refused_by_name() {
    // A width the stored projector cannot be.
    let err = GemmaVision::open(&fixture().join("vision_weight.q4nx"), config(512))
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("multi_modal_projector.mm_input_projection_weight"),
        "{err}"
    );
}
