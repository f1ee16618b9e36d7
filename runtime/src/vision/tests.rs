//! The tests of the image encoder.
use super::oracle::{config, fixture, floats, reference};
use super::*;

/// The oracle's tower and projector (transformers, f32, on the weights as the tower stores
/// them) against ours on the same pixel values.
#[test]
fn the_encoder_gives_transformers_image_features_from_the_oracles_tower() {
    let reference = reference();
    let vision =
        GemmaVision::open(&fixture().join("vision_weight.q4nx"), config(128)).expect("open");
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
