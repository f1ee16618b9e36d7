//! An image file to the pixel values a vision tower takes, as transformers' Gemma 3 processor
//! (`Gemma3ImageProcessor`, the PIL path) makes them: decoded to 8-bit RGB, resized to the
//! tower's square with Pillow's bilinear filter (its two 8-bit passes, horizontal then vertical,
//! with its fixed-point coefficients, so the bytes are Pillow's), rescaled by 1/255, normalized by
//! the processor's mean and deviation, channels first.
//!
//! PNG is decoded here (the `png` crate); other formats are refused by name until they are.

use crate::error::{Error, Result};

/// An 8-bit RGB image, row-major, three bytes a pixel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb8 {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `height × width × 3` bytes.
    pub data: Vec<u8>,
}

fn refuse(reason: String) -> Error {
    Error::Request {
        field: "image",
        reason,
    }
}

/// Decodes a PNG (8-bit or 16-bit; gray, gray with alpha, RGB, RGBA, palette) to RGB, alpha
/// dropped as Pillow's `convert("RGB")` drops it.
pub fn decode_png(bytes: &[u8]) -> Result<Rgb8> {
    let mut decoder = png::Decoder::new(bytes);
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder
        .read_info()
        .map_err(|e| refuse(format!("not a readable PNG: {e}")))?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut buf)
        .map_err(|e| refuse(format!("PNG frame: {e}")))?;
    let (w, h) = (info.width as usize, info.height as usize);
    let px = &buf[..info.buffer_size()];
    let data: Vec<u8> = match info.color_type {
        png::ColorType::Rgb => px.to_vec(),
        png::ColorType::Rgba => px
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        png::ColorType::Grayscale => px.iter().flat_map(|&g| [g, g, g]).collect(),
        png::ColorType::GrayscaleAlpha => px
            .chunks_exact(2)
            .flat_map(|p| [p[0], p[0], p[0]])
            .collect(),
        other => return Err(refuse(format!("PNG colour type {other:?} after expansion"))),
    };
    if data.len() != w * h * 3 {
        return Err(refuse(format!(
            "PNG of {w}x{h} decoded to {} bytes",
            data.len()
        )));
    }
    Ok(Rgb8 {
        width: w,
        height: h,
        data,
    })
}

/// Pillow's fixed-point precision for 8-bit resampling (`PRECISION_BITS = 32 - 8 - 2`).
const PRECISION_BITS: u32 = 22;

/// Pillow's bilinear (triangle) filter, support 1.
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

/// Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc` for resizing `input` samples to
/// `output`: for each output sample, the first input sample and the fixed-point weights.
fn coefficients(input: usize, output: usize) -> Vec<(usize, Vec<i32>)> {
    let scale = input as f64 / output as f64;
    let filterscale = scale.max(1.0);
    let support = filterscale; // the triangle's support (1) times the filter scale
    (0..output)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C's `(int)` truncates toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax =
                (((center + support + 0.5) as i64).min(input as i64) as usize).saturating_sub(xmin);
            let mut k: Vec<f64> = (0..xmax)
                .map(|x| triangle((x as f64 + xmin as f64 - center + 0.5) * ss))
                .collect();
            let total: f64 = k.iter().sum();
            if total != 0.0 {
                for w in k.iter_mut() {
                    *w /= total;
                }
            }
            let fixed = k
                .iter()
                .map(|&w| {
                    let v = w * f64::from(1u32 << PRECISION_BITS);
                    if w < 0.0 {
                        (v - 0.5) as i32
                    } else {
                        (v + 0.5) as i32
                    }
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

/// One weighted sum, rounded and clipped to a byte as Pillow does.
fn clip8(acc: i64) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes to `width × height` as Pillow's `Image.resize(..., BILINEAR)`: the horizontal pass
/// first (when the width changes), then the vertical one, each rounding to bytes.
pub fn resize_bilinear(img: &Rgb8, width: usize, height: usize) -> Rgb8 {
    let mut cur = img.clone();
    if width != cur.width {
        let coeffs = coefficients(cur.width, width);
        let mut data = vec![0u8; cur.height * width * 3];
        for y in 0..cur.height {
            let row = &cur.data[y * cur.width * 3..(y + 1) * cur.width * 3];
            for (x, (x0, k)) in coeffs.iter().enumerate() {
                for c in 0..3 {
                    let mut acc: i64 = 1 << (PRECISION_BITS - 1);
                    for (i, w) in k.iter().enumerate() {
                        acc += i64::from(row[(x0 + i) * 3 + c]) * i64::from(*w);
                    }
                    data[(y * width + x) * 3 + c] = clip8(acc);
                }
            }
        }
        cur = Rgb8 {
            width,
            height: cur.height,
            data,
        };
    }
    if height != cur.height {
        let coeffs = coefficients(cur.height, height);
        let w = cur.width;
        let mut data = vec![0u8; height * w * 3];
        for (y, (y0, k)) in coeffs.iter().enumerate() {
            for x in 0..w * 3 {
                let mut acc: i64 = 1 << (PRECISION_BITS - 1);
                for (i, wt) in k.iter().enumerate() {
                    acc += i64::from(cur.data[(y0 + i) * w * 3 + x]) * i64::from(*wt);
                }
                data[y * w * 3 + x] = clip8(acc);
            }
        }
        cur = Rgb8 {
            width: w,
            height,
            data,
        };
    }
    cur
}

/// The pixel values of `img` for a tower taking `size × size` images: resized, rescaled by
/// 1/255 (in f64, then f32, as transformers' `rescale`), normalized `(x − mean) / std` in f32,
/// channels first.
pub fn pixel_values(img: &Rgb8, size: usize, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let r = resize_bilinear(img, size, size);
    let mut out = vec![0.0f32; 3 * size * size];
    for (i, px) in r.data.chunks_exact(3).enumerate() {
        for c in 0..3 {
            let v = (f64::from(px[c]) * 0.003_921_568_627_450_98) as f32;
            out[c * size * size + i] = (v - mean[c]) / std[c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vision::GemmaVision;
    use crate::vision::oracle::{config, fixture, floats, reference};

    /// The oracle's PNG through our decoder, Pillow's resize and transformers' rescale and
    /// normalization gives the processor's pixel values; through the encoder, its features.
    #[test]
    fn a_png_becomes_the_gemma3_processors_pixel_values_and_the_towers_features() {
        let reference = reference();
        let img =
            decode_png(&std::fs::read(fixture().join("image.png")).expect("png")).expect("decode");
        assert_eq!((img.width, img.height), (80, 60));
        let ours = pixel_values(&img, 56, [0.5; 3], [0.5; 3]);
        let theirs = floats(&reference, "pixel_values");
        assert_eq!(ours.len(), theirs.len());
        let worst = ours
            .iter()
            .zip(&theirs)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        // The reference is rounded to 6 decimals; one byte of difference would be 0.0078.
        assert!(worst <= 1e-6, "max |ours - processor| = {worst}");
        let vision =
            GemmaVision::open(&fixture().join("vision_weight.q4nx"), config(128)).expect("open");
        let features = vision.encode(&ours).expect("encode");
        let want = floats(&reference, "features");
        let worst = features
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-4, "max |features - transformers| = {worst}");
    }

    #[test]
    fn bytes_that_are_no_png_are_refused_as_an_image() {
        let err = decode_png(b"GIF89a....").expect_err("refused");
        assert!(
            err.to_string().starts_with("image: not a readable PNG"),
            "{err}"
        );
    }

    #[test]
    fn resizing_to_the_same_size_keeps_the_bytes_and_a_flat_image_stays_flat() {
        let img = Rgb8 {
            width: 7,
            height: 5,
            data: (0..105).map(|i| (i * 7 % 256) as u8).collect(),
        };
        assert_eq!(resize_bilinear(&img, 7, 5), img);
        let flat = Rgb8 {
            width: 9,
            height: 4,
            data: vec![77; 108],
        };
        let small = resize_bilinear(&flat, 4, 3);
        assert!(small.data.iter().all(|&b| b == 77));
    }
}
