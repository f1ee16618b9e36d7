//! An image file to the pixel values a vision tower takes, as transformers' Gemma 3 processor
//! (`Gemma3ImageProcessor`, the PIL path) makes them: decoded to 8-bit RGB, resized to the
//! tower's square with Pillow's bilinear filter (its two 8-bit passes, horizontal then vertical,
//! with its fixed-point coefficients, so the bytes are Pillow's), rescaled by 1/255, normalized by
//! the processor's mean and deviation, channels first.
//!
//! Files are told apart by their first bytes and decoded by the image-rs project's decoders: PNG
//! (`png`), JPEG (`jpeg-decoder`: libjpeg's fancy chroma upsampling, as Pillow's libjpeg-turbo
//! does; `zune-jpeg` was 71 steps off at the edges of a subsampled block), WebP (`image-webp`),
//! GIF's first frame (`gif`). PNG, GIF and WebP give Pillow's bytes exactly; JPEG within 3 steps
//! of libjpeg-turbo's integer transform (tests/fixtures/images, docs/towers.md).

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

/// Decodes an image file to RGB by its signature (PNG, JPEG, WebP, GIF's first frame), alpha
/// dropped as Pillow's `convert("RGB")` drops it.
pub fn decode(bytes: &[u8]) -> Result<Rgb8> {
    match Format::sniff(bytes) {
        Some(Format::Png) => decode_png(bytes),
        Some(Format::Jpeg) => decode_jpeg(bytes),
        Some(Format::Webp) => decode_webp(bytes),
        Some(Format::Gif) => decode_gif(bytes),
        None => Err(refuse(
            "not an image this server reads (PNG, JPEG, WebP or GIF, by their first bytes)".into(),
        )),
    }
}

/// An RGB image of `width × height` from `px`, `channels` bytes a pixel (3: RGB, 4: RGBA).
fn rgb(width: usize, height: usize, px: &[u8], channels: usize, what: &str) -> Result<Rgb8> {
    if px.len() != width * height * channels {
        return Err(refuse(format!(
            "{what} of {width}x{height} decoded to {} bytes",
            px.len()
        )));
    }
    let data = match channels {
        3 => px.to_vec(),
        _ => px
            .chunks_exact(channels)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
    };
    Ok(Rgb8 {
        width,
        height,
        data,
    })
}

/// Decodes a baseline or progressive JPEG (grey, YCbCr, CMYK) to RGB.
pub fn decode_jpeg(bytes: &[u8]) -> Result<Rgb8> {
    let mut d = jpeg_decoder::Decoder::new(bytes);
    let px = d
        .decode()
        .map_err(|e| refuse(format!("not a readable JPEG: {e}")))?;
    let info = d
        .info()
        .ok_or_else(|| refuse("JPEG without a frame header".into()))?;
    let (w, h) = (usize::from(info.width), usize::from(info.height));
    match info.pixel_format {
        jpeg_decoder::PixelFormat::RGB24 => rgb(w, h, &px, 3, "JPEG"),
        jpeg_decoder::PixelFormat::L8 => {
            let grey: Vec<u8> = px.iter().flat_map(|&g| [g, g, g]).collect();
            rgb(w, h, &grey, 3, "JPEG")
        }
        other => Err(refuse(format!(
            "JPEG pixel format {other:?} (CMYK and 16-bit JPEGs are not read)"
        ))),
    }
}

/// Decodes a WebP (lossy or lossless, with or without alpha; an animation's first frame) to RGB.
pub fn decode_webp(bytes: &[u8]) -> Result<Rgb8> {
    let mut d = image_webp::WebPDecoder::new(std::io::Cursor::new(bytes))
        .map_err(|e| refuse(format!("not a readable WebP: {e}")))?;
    let (w, h) = d.dimensions();
    let channels = if d.has_alpha() { 4 } else { 3 };
    let size = d
        .output_buffer_size()
        .ok_or_else(|| refuse(format!("a WebP of {w}x{h} is too large")))?;
    let mut buf = vec![0u8; size];
    d.read_image(&mut buf)
        .map_err(|e| refuse(format!("WebP image: {e}")))?;
    rgb(w as usize, h as usize, &buf, channels, "WebP")
}

/// Decodes a GIF's first frame to RGB, on its logical screen (where the frame does not cover
/// it, black).
pub fn decode_gif(bytes: &[u8]) -> Result<Rgb8> {
    let mut opts = gif::DecodeOptions::new();
    opts.set_color_output(gif::ColorOutput::RGBA);
    let mut d = opts
        .read_info(bytes)
        .map_err(|e| refuse(format!("not a readable GIF: {e}")))?;
    let (w, h) = (usize::from(d.width()), usize::from(d.height()));
    let frame = d
        .read_next_frame()
        .map_err(|e| refuse(format!("GIF frame: {e}")))?
        .ok_or_else(|| refuse("a GIF without frames".into()))?;
    let (fl, ft) = (usize::from(frame.left), usize::from(frame.top));
    let (fw, fh) = (usize::from(frame.width), usize::from(frame.height));
    if frame.buffer.len() != fw * fh * 4 {
        return Err(refuse(format!(
            "GIF frame of {fw}x{fh} decoded to {} bytes",
            frame.buffer.len()
        )));
    }
    let mut data = vec![0u8; w * h * 3];
    for y in 0..fh.min(h.saturating_sub(ft)) {
        for x in 0..fw.min(w.saturating_sub(fl)) {
            let src = &frame.buffer[(y * fw + x) * 4..][..3];
            data[((ft + y) * w + fl + x) * 3..][..3].copy_from_slice(src);
        }
    }
    Ok(Rgb8 {
        width: w,
        height: h,
        data,
    })
}

/// An image file format, told by its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `\x89PNG\r\n\x1a\n`.
    Png,
    /// `FF D8 FF`.
    Jpeg,
    /// `RIFF····WEBP`.
    Webp,
    /// `GIF87a` or `GIF89a`.
    Gif,
}

impl Format {
    /// The format of a file starting with `b`.
    pub fn sniff(b: &[u8]) -> Option<Format> {
        if b.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Format::Png)
        } else if b.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Format::Jpeg)
        } else if b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP" {
            Some(Format::Webp)
        } else if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
            Some(Format::Gif)
        } else {
            None
        }
    }

    /// Its name, as messages write it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "PNG",
            Format::Jpeg => "JPEG",
            Format::Webp => "WebP",
            Format::Gif => "GIF",
        }
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

#[cfg(test)]
mod format_tests {
    use base64::Engine as _;

    use super::*;

    /// tests/fixtures/images: the tower oracle's image as Pillow writes each format, and the RGB
    /// bytes Pillow decodes it to (`scripts/oracle/images.py`).
    fn pillow(name: &str) -> (Vec<u8>, Rgb8) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/images");
        let refs: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("decoded.json")).expect("decoded.json"))
                .expect("json");
        let f = &refs["files"][name];
        let data = base64::engine::general_purpose::STANDARD
            .decode(f["rgb"].as_str().expect("rgb"))
            .expect("base64");
        let size = |k: &str| f[k].as_u64().expect("size") as usize;
        (
            std::fs::read(dir.join(name)).expect("file"),
            Rgb8 {
                width: size("width"),
                height: size("height"),
                data,
            },
        )
    }

    /// The largest difference of one byte between `ours` and Pillow's.
    fn max_diff(ours: &Rgb8, theirs: &Rgb8) -> u8 {
        assert_eq!((ours.width, ours.height), (theirs.width, theirs.height));
        ours.data
            .iter()
            .zip(&theirs.data)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn lossless_formats_decode_to_pillows_bytes_exactly() {
        for name in ["image-lossless.webp", "image.gif"] {
            let (file, theirs) = pillow(name);
            let ours = decode(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(max_diff(&ours, &theirs), 0, "{name}");
        }
    }

    #[test]
    fn lossy_formats_decode_within_a_few_steps_of_pillows_libraries() {
        // libjpeg-turbo's and libwebp's integer transforms against the decoders here: measured 3
        // (JPEG, 2 bytes of 14,400 over 2) and 0 (WebP).
        for (name, bound) in [("image.jpg", 3), ("image-lossy.webp", 0)] {
            let (file, theirs) = pillow(name);
            let ours = decode(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
            let d = max_diff(&ours, &theirs);
            eprintln!("{name}: max |ours - Pillow| = {d}");
            assert!(d <= bound, "{name}: {d}");
        }
    }

    #[test]
    fn formats_are_told_by_their_first_bytes_and_others_refused_by_name() {
        assert_eq!(Format::sniff(b"GIF89a..."), Some(Format::Gif));
        assert_eq!(Format::sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some(Format::Webp));
        assert_eq!(Format::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(Format::Jpeg));
        let err = decode(b"BM bitmap").expect_err("refused");
        assert!(err.to_string().contains("PNG, JPEG, WebP or GIF"), "{err}");
        let err = decode(&[0xFF, 0xD8, 0xFF, 0x00]).expect_err("truncated");
        assert!(err.to_string().contains("JPEG"), "{err}");
    }
}
