//! The model's next-token distributions against llama.cpp's on the same tokens: KL divergence,
//! top-1 agreement and probability differences, computed as `llama-perplexity --kl-divergence`
//! computes them, from the log-probabilities llama.cpp saved with
//! `llama-perplexity -m MODEL.gguf -f TEXT -c CTX --kl-divergence-base FILE`.
//!
//! This is the check that a pack read from a GGUF answers as llama.cpp answers on that GGUF: at a
//! model's real shape, on llama.cpp's own tokens and chunking, with no tokenizer in between.
//!
//! The file (llama.cpp `tools/perplexity/perplexity.cpp`): the 8 bytes `_logits_`, then `n_ctx`,
//! `n_vocab` and `n_chunk` as 32-bit integers, the `n_chunk·n_ctx` token ids, then for every
//! chunk the rows of positions `n_ctx/2 .. n_ctx−1` (each predicting the next token), each row
//! `nv = 2·⌈n_vocab/2⌉ + 4` little-endian u16: the f32 `scale` and `min_log_prob`, then per token
//! `q` with `log p = scale·q + min_log_prob` (0 stands for "at most `min_log_prob`", which
//! llama.cpp keeps within 16 of the best logit).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::{Error, Result, io_at};
use crate::model::Model;

/// llama.cpp's saved log-probabilities (see the module doc), read a row at a time.
#[derive(Debug)]
pub struct BaseLogits {
    file: File,
    path: PathBuf,
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// The vocabulary llama.cpp scored over.
    pub n_vocab: usize,
    /// Chunks in the file.
    pub n_chunk: usize,
    /// Every chunk's token ids, as llama.cpp tokenized the text (before its BOS substitution).
    pub tokens: Vec<u32>,
    /// Byte offset of the first row.
    rows_at: u64,
}

impl BaseLogits {
    /// Opens and checks a base file: its magic, its header, and that its length is exactly the
    /// rows the header promises.
    pub fn open(path: &Path) -> Result<BaseLogits> {
        let bad = |reason: String| Error::BaseLogits {
            path: path.to_path_buf(),
            reason,
        };
        let mut file = File::open(path).map_err(|e| io_at(e, "open", path))?;
        let mut head = [0u8; 20];
        file.read_exact(&mut head)
            .map_err(|_| bad("shorter than its 20-byte header".into()))?;
        if &head[..8] != b"_logits_" {
            return Err(bad(
                "not a llama-perplexity --kl-divergence-base file (no `_logits_` magic)".into(),
            ));
        }
        let int = |i: usize| i32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let (n_ctx, n_vocab, n_chunk) = (int(8), int(12), int(16));
        if n_ctx < 4 || n_vocab < 2 || n_chunk < 1 {
            return Err(bad(format!(
                "header n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}: nothing to compare"
            )));
        }
        let (n_ctx, n_vocab, n_chunk) = (n_ctx as usize, n_vocab as usize, n_chunk as usize);
        let mut raw = vec![0u8; 4 * n_ctx * n_chunk];
        file.read_exact(&mut raw)
            .map_err(|_| bad(format!("shorter than its {} token ids", n_ctx * n_chunk)))?;
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let rows_at = 20 + raw.len() as u64;
        let base = BaseLogits {
            file,
            path: path.to_path_buf(),
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            rows_at,
        };
        let want = rows_at + (n_chunk * base.rows_per_chunk() * base.row_bytes()) as u64;
        let len = base
            .file
            .metadata()
            .map_err(|e| io_at(e, "stat", path))?
            .len();
        if len != want {
            return Err(bad(format!(
                "{len} bytes where n_ctx {n_ctx}, n_vocab {n_vocab} and n_chunk {n_chunk} make \
                 {want}"
            )));
        }
        Ok(base)
    }

    /// Rows per chunk: positions `n_ctx/2 .. n_ctx−1`.
    pub fn rows_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.n_ctx / 2
    }

    /// Bytes of one row.
    fn row_bytes(&self) -> usize {
        2 * (2 * self.n_vocab.div_ceil(2) + 4)
    }

    /// Chunk `c`'s rows, each as (`scale`, `min_log_prob`, the codes).
    fn chunk_rows(&self, c: usize) -> Result<Vec<BaseRow>> {
        let (rows, rb) = (self.rows_per_chunk(), self.row_bytes());
        let mut raw = vec![0u8; rows * rb];
        let at = self.rows_at + (c * rows * rb) as u64;
        self.file
            .read_exact_at(&mut raw, at)
            .map_err(|e| io_at(e, "read", &self.path))?;
        Ok(raw
            .chunks_exact(rb)
            .map(|r| {
                let f = |i: usize| f32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
                BaseRow {
                    scale: f(0),
                    min_log_prob: f(4),
                    codes: r[8..8 + 2 * self.n_vocab]
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                }
            })
            .collect())
    }
}

/// One saved row.
struct BaseRow {
    scale: f32,
    min_log_prob: f32,
    codes: Vec<u16>,
}

impl BaseRow {
    fn log_p(&self, i: usize) -> f32 {
        self.scale * f32::from(self.codes[i]) + self.min_log_prob
    }
}

/// One position's comparison (llama.cpp's `log_softmax` with a base row).
#[derive(Clone, Copy, Debug)]
struct Position {
    nll: f64,
    nll_base: f64,
    kld: f64,
    same_top: bool,
    p_diff: f64,
}

/// The comparison over every scored position, as `llama-perplexity --kl-divergence` reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KlReport {
    /// Chunks compared.
    pub chunks: usize,
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Positions compared (the second half of each chunk).
    pub scored: usize,
    /// Perplexity of the model on the scored tokens.
    pub perplexity: f64,
    /// Perplexity of llama.cpp's saved distributions on the same tokens.
    pub perplexity_base: f64,
    /// Mean KL(base ‖ model) per position, in nats.
    pub kld_mean: f64,
    /// Its median.
    pub kld_median: f64,
    /// Its 99th percentile.
    pub kld_p99: f64,
    /// Its largest value.
    pub kld_max: f64,
    /// Fraction of positions whose most likely token is llama.cpp's.
    pub same_top: f64,
    /// Root mean square of p(next token) − llama.cpp's p(next token).
    pub p_diff_rms: f64,
    /// Largest |p(next token) − llama.cpp's|.
    pub p_diff_max: f64,
}

/// Compares `model` with `base` over its first `chunks` chunks (all when `None`): each chunk run
/// from an empty cache with llama.cpp's tokens, its first replaced by BOS where the model adds one
/// (llama.cpp's rule), and every saved row compared with the model's row at that position.
pub fn compare(model: &Model, base: &BaseLogits, chunks: Option<usize>) -> Result<KlReport> {
    let vocab = model.spec.vocab;
    if base.n_vocab != vocab {
        return Err(Error::BaseLogits {
            path: base.path.clone(),
            reason: format!(
                "scored over {} tokens; the pack's vocabulary has {vocab}",
                base.n_vocab
            ),
        });
    }
    if let Some(&bad) = base.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::BaseLogits {
            path: base.path.clone(),
            reason: format!("token id {bad} is outside the pack's vocabulary of {vocab}"),
        });
    }
    let n_ctx = base.n_ctx;
    let chunks = chunks.map_or(base.n_chunk, |c| c.min(base.n_chunk));
    let first = n_ctx / 2;
    let want: Vec<usize> = (first..n_ctx - 1).collect();
    let mut session = model.session(n_ctx);
    let mut all = Vec::with_capacity(chunks * want.len());
    for c in 0..chunks {
        let chunk = &base.tokens[c * n_ctx..(c + 1) * n_ctx];
        let mut toks = chunk.to_vec();
        if let (true, Some(b)) = (model.spec.add_bos, model.spec.bos) {
            toks[0] = b;
        }
        session.truncate(0);
        let rows: Vec<(usize, u32)> = toks.iter().map(|&t| (0, t)).collect();
        let logits = model.forward_batch(&mut [&mut session], &rows, &want)?;
        let saved = base.chunk_rows(c)?;
        let got: Vec<Position> = saved
            .par_iter()
            .enumerate()
            .map(|(i, row)| {
                position(
                    &logits[i * vocab..(i + 1) * vocab],
                    row,
                    chunk[first + i + 1],
                )
            })
            .collect();
        all.extend(got);
    }
    Ok(report(&all, chunks, n_ctx))
}

/// llama.cpp's per-position arithmetic: the model's log-softmax against the saved one, the
/// divergence summed over the tokens whose saved log-probability is above −16.
fn position(logits: &[f32], base: &BaseRow, next: u32) -> Position {
    let imax = crate::sample::argmax(logits) as usize;
    let max = logits[imax];
    let sum_exp: f64 = logits.iter().map(|&x| f64::from((x - max).exp())).sum();
    let lse = f64::from(max) + sum_exp.ln();
    let nll = lse - f64::from(logits[next as usize]);
    let nll_base = -f64::from(base.log_p(next as usize));
    let (mut kld, mut ibase, mut best) = (0f64, 0usize, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        let lp = base.log_p(i);
        if lp > best {
            (ibase, best) = (i, lp);
        }
        if lp > -16.0 {
            let lp = f64::from(lp);
            kld += lp.exp() * (lp - (f64::from(x) - lse));
        }
    }
    Position {
        nll,
        nll_base,
        kld,
        same_top: imax == ibase,
        p_diff: (-nll).exp() - (-nll_base).exp(),
    }
}

/// The summary of every position.
fn report(all: &[Position], chunks: usize, n_ctx: usize) -> KlReport {
    let n = all.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Position) -> f64| all.iter().map(f).sum::<f64>() / n;
    let mut klds: Vec<f64> = all.iter().map(|p| p.kld).collect();
    klds.sort_by(f64::total_cmp);
    let at = |q: f64| {
        klds.get(((klds.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    KlReport {
        chunks,
        n_ctx,
        scored: all.len(),
        perplexity: mean(&|p| p.nll).exp(),
        perplexity_base: mean(&|p| p.nll_base).exp(),
        kld_mean: mean(&|p| p.kld),
        kld_median: at(0.5),
        kld_p99: at(0.99),
        kld_max: klds.last().copied().unwrap_or(0.0),
        same_top: all.iter().filter(|p| p.same_top).count() as f64 / n,
        p_diff_rms: mean(&|p| p.p_diff * p.p_diff).sqrt(),
        p_diff_max: all.iter().map(|p| p.p_diff.abs()).fold(0.0, f64::max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A base file for `rows` rows per chunk, each the exact log-softmax of `logits`, encoded as
    /// llama.cpp encodes it.
    fn encode(n_ctx: i32, tokens: &[u32], logits: &[Vec<f32>]) -> Vec<u8> {
        let n_vocab = logits[0].len();
        let n_chunk = tokens.len() / n_ctx as usize;
        let mut out = b"_logits_".to_vec();
        for v in [n_ctx, n_vocab as i32, n_chunk as i32] {
            out.extend(v.to_le_bytes());
        }
        for t in tokens {
            out.extend(t.to_le_bytes());
        }
        for row in logits {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let min = row
                .iter()
                .copied()
                .fold(f32::INFINITY, f32::min)
                .max(max - 16.0);
            let lse = row
                .iter()
                .map(|&x| f64::from((x - max).exp()))
                .sum::<f64>()
                .ln() as f32;
            let scale = (max - min) / 65535.0;
            out.extend(scale.to_le_bytes());
            out.extend((min - max - lse).to_le_bytes());
            for &x in row {
                let q = if x > min {
                    ((x - min) / scale).round() as u16
                } else {
                    0
                };
                out.extend(q.to_le_bytes());
            }
            if n_vocab % 2 == 1 {
                out.extend([0, 0]);
            }
        }
        out
    }

    #[test]
    fn a_base_file_is_read_as_llama_cpp_writes_it() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("base.kld");
        let rows: Vec<Vec<f32>> = (0..3)
            .map(|r| (0..5).map(|i| (i * (r + 1)) as f32 * 0.5).collect())
            .collect();
        let tokens = [1, 2, 3, 4, 0, 1, 2, 3];
        // n_ctx 8, one chunk: rows for positions 4, 5, 6.
        std::fs::write(&path, encode(8, &tokens, &rows)).expect("write");
        let base = BaseLogits::open(&path).expect("open");
        assert_eq!((base.n_ctx, base.n_vocab, base.n_chunk), (8, 5, 1));
        assert_eq!(base.tokens, tokens);
        let saved = base.chunk_rows(0).expect("rows");
        assert_eq!(saved.len(), 3);
        // The same logits give no divergence and the same top; others do.
        for (row, logits) in saved.iter().zip(&rows) {
            let same = position(logits, row, 2);
            assert!(same.kld.abs() < 1e-5, "{}", same.kld);
            assert!(same.same_top);
            assert!((same.nll - same.nll_base).abs() < 1e-3);
        }
        let flat = position(&[0.0; 5], &saved[2], 2);
        assert!(flat.kld > 0.5, "{}", flat.kld);
    }

    #[test]
    fn a_file_that_is_not_a_base_file_is_refused_by_name() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("x.kld");
        std::fs::write(&path, b"GGUF and then some bytes").expect("write");
        let err = BaseLogits::open(&path).expect_err("refused").to_string();
        assert!(err.contains("x.kld") && err.contains("_logits_"), "{err}");
        let rows = vec![vec![0.0f32, 1.0]];
        let mut short = encode(4, &[0, 1, 0, 1], &rows);
        short.truncate(short.len() - 2);
        std::fs::write(&path, short).expect("write");
        let err = BaseLogits::open(&path).expect_err("refused").to_string();
        assert!(err.contains("bytes where n_ctx 4"), "{err}");
    }
}
