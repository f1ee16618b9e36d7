//! The KV cache: its element type (`--cache-type`, llama.cpp's names), its blocks allocated as a
//! sequence's context grows, and the memory all caches of a process hold, against a budget.
//!
//! A layer's cache is a list of blocks of [`BLOCK_TOKENS`] positions each, allocated when the
//! forward pass first writes a position in them, so a `--ctx-size 32768` session costs nothing
//! until its tokens arrive. Attention reads the cached vectors in their own type ([`rows`]): a
//! 16-bit cache reads half the bytes of an f32 one at every decode step.

pub mod rows;

use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use rows::{Bf16Row, F16Row, Q8_GROUP, Q8Row, Row};

/// Positions per block of a layer's cache (capped by the session's capacity).
pub const BLOCK_TOKENS: usize = 256;

/// The KV cache's element type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CacheType {
    /// 32-bit floats: what the forward pass computes, exactly.
    F32,
    /// IEEE half precision (10-bit mantissa), the default: see docs/runtime.md for the
    /// measurement that chose it over bf16.
    #[default]
    F16,
    /// bfloat16 (7-bit mantissa, f32's range).
    Bf16,
    /// 8-bit codes with an f16 scale per 32 values (llama.cpp's `q8_0`): about a quarter of
    /// f32's bytes.
    Q8_0,
}

impl CacheType {
    /// Every type, in the order the help text lists them.
    pub const ALL: [CacheType; 4] = [
        CacheType::F32,
        CacheType::F16,
        CacheType::Bf16,
        CacheType::Q8_0,
    ];

    /// The name `--cache-type` takes (llama.cpp's).
    pub fn name(self) -> &'static str {
        match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
            CacheType::Bf16 => "bf16",
            CacheType::Q8_0 => "q8_0",
        }
    }

    /// Bytes that `values` values take (a multiple of 32 for `q8_0`).
    pub fn bytes(self, values: usize) -> usize {
        match self {
            CacheType::F32 => 4 * values,
            CacheType::F16 | CacheType::Bf16 => 2 * values,
            CacheType::Q8_0 => values + 2 * values.div_ceil(Q8_GROUP),
        }
    }

    /// Why this type cannot hold heads of `head_dim` values, if it cannot (`q8_0` scales groups
    /// of 32 within one head).
    pub fn refusal(self, head_dim: usize) -> Option<String> {
        (self == CacheType::Q8_0 && !head_dim.is_multiple_of(Q8_GROUP)).then(|| {
            format!("q8_0 scales groups of {Q8_GROUP} values and the model's heads hold {head_dim}")
        })
    }
}

impl std::fmt::Display for CacheType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CacheType {
    type Err = String;

    fn from_str(s: &str) -> Result<CacheType, String> {
        CacheType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<&str> = CacheType::ALL.iter().map(|t| t.name()).collect();
                format!("unknown cache type `{s}`: one of {}", names.join(", "))
            })
    }
}

/// The bytes every KV cache of a process holds, their peak, and the budget new blocks must fit
/// in. A server sets the budget from the memory the machine has, so a request that would need
/// more is refused (503) instead of the kernel killing the process.
#[derive(Debug)]
pub struct CacheMemory {
    limit: AtomicUsize,
    used: AtomicUsize,
    peak: AtomicUsize,
}

/// A block that did not fit in the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverBudget {
    /// Bytes the block needed.
    pub need: usize,
    /// Bytes held when it was asked for.
    pub used: usize,
    /// The budget.
    pub limit: usize,
}

impl CacheMemory {
    /// No budget: blocks are refused only when the allocator has no memory.
    pub fn unlimited() -> Arc<CacheMemory> {
        CacheMemory::limited(usize::MAX)
    }

    /// At most `limit` bytes held at once.
    pub fn limited(limit: usize) -> Arc<CacheMemory> {
        Arc::new(CacheMemory {
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The most bytes held at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// The budget (`usize::MAX`: none).
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Sets the budget for blocks allocated from now on (blocks held stay).
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    fn take(&self, need: usize) -> Result<(), OverBudget> {
        let mut used = self.used.load(Ordering::Relaxed);
        let limit = self.limit();
        loop {
            let after = used.checked_add(need).filter(|&a| a <= limit);
            let Some(after) = after else {
                return Err(OverBudget { need, used, limit });
            };
            match self
                .used
                .compare_exchange_weak(used, after, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(after, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) => used = now,
            }
        }
    }

    /// Counts bytes that must be held whatever the budget (a copy of a session).
    fn force(&self, n: usize) {
        let after = self.used.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(after, Ordering::Relaxed);
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Bytes this process may still take before the machine (or its cgroup) runs out: Linux's
/// `MemAvailable`, lowered by a cgroup v2 `memory.max` above what the cgroup holds. `None` where
/// neither can be read (another system).
pub fn available_memory() -> Option<usize> {
    let kib = |text: &str, key: &str| -> Option<usize> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace()
            .nth(1)?
            .parse::<usize>()
            .ok()?
            .checked_mul(1024)
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let machine = meminfo.as_deref().and_then(|t| kib(t, "MemAvailable:"));
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok())
    };
    let cgroup =
        read("memory.max").map(|max| max.saturating_sub(read("memory.current").unwrap_or(0)));
    match (machine, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One block of keys or values: `tokens × width` values in the cache's type.
#[derive(Clone)]
enum Block {
    F32(Box<[f32]>),
    F16(Box<[u16]>),
    Bf16(Box<[u16]>),
    Q8 {
        codes: Box<[i8]>,
        scales: Box<[u16]>,
    },
}

/// Allocates `n` zeroed values without aborting when memory is short.
fn zeroed<T: Copy + Default>(n: usize) -> Option<Box<[T]>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, T::default());
    Some(v.into_boxed_slice())
}

impl Block {
    fn new(ty: CacheType, values: usize) -> Option<Block> {
        Some(match ty {
            CacheType::F32 => Block::F32(zeroed(values)?),
            CacheType::F16 => Block::F16(zeroed(values)?),
            CacheType::Bf16 => Block::Bf16(zeroed(values)?),
            CacheType::Q8_0 => Block::Q8 {
                codes: zeroed(values)?,
                scales: zeroed(values.div_ceil(Q8_GROUP))?,
            },
        })
    }

    /// Writes `x` at value offset `at`.
    fn write(&mut self, at: usize, x: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let n = x.len();
        match self {
            Block::F32(b) => b[at..at + n].copy_from_slice(x),
            Block::F16(b) => {
                let dst: &mut [half::f16] = bytemuck_u16(&mut b[at..at + n]);
                dst.convert_from_f32_slice(x);
            }
            Block::Bf16(b) => {
                for (d, &v) in b[at..at + n].iter_mut().zip(x) {
                    *d = half::bf16::from_f32(v).to_bits();
                }
            }
            Block::Q8 { codes, scales } => rows::quantize_q8(
                x,
                &mut codes[at..at + n],
                &mut scales[at / Q8_GROUP..(at + n) / Q8_GROUP],
            ),
        }
    }
}

/// `u16` bit patterns seen as `f16` (the same size and alignment, every pattern valid).
fn bytemuck_u16(b: &mut [u16]) -> &mut [half::f16] {
    // SAFETY: `half::f16` is `repr(transparent)` over `u16`.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), b.len()) }
}

/// Values `r` of an f32 block.
fn f32_of(b: &Block, r: Range<usize>) -> &[f32] {
    match b {
        Block::F32(x) => &x[r],
        _ => unreachable!("one cache holds one type"),
    }
}

/// Values `r` of an f16 block.
fn f16_of(b: &Block, r: Range<usize>) -> F16Row<'_> {
    match b {
        Block::F16(x) => F16Row(&x[r]),
        _ => unreachable!("one cache holds one type"),
    }
}

/// Values `r` of a bf16 block.
fn bf16_of(b: &Block, r: Range<usize>) -> Bf16Row<'_> {
    match b {
        Block::Bf16(x) => Bf16Row(&x[r]),
        _ => unreachable!("one cache holds one type"),
    }
}

/// Values `r` of a q8_0 block (`r` starts and ends on groups of 32).
fn q8_of(b: &Block, r: Range<usize>) -> Q8Row<'_> {
    match b {
        Block::Q8 { codes, scales } => Q8Row {
            scales: &scales[r.start / Q8_GROUP..r.end / Q8_GROUP],
            codes: &codes[r],
        },
        _ => unreachable!("one cache holds one type"),
    }
}

/// Reads rows of one type: what [`LayerCache::read`] hands the attention kernels.
pub trait ReadRows {
    /// Runs with the keys and values of positions `first..` in their own type.
    fn rows<R: Row>(self, keys: &[R], values: &[R]);
}

/// The keys and values of one attention layer of one sequence.
pub struct LayerCache {
    ty: CacheType,
    /// Values per position (K and V each).
    width: usize,
    /// Positions per block.
    block: usize,
    keys: Vec<Block>,
    values: Vec<Block>,
    memory: Arc<CacheMemory>,
}

impl LayerCache {
    /// An empty cache of `width` values per position, blocks of up to [`BLOCK_TOKENS`] positions
    /// (fewer when the whole `capacity` is smaller), counted in `memory`.
    pub fn new(
        ty: CacheType,
        width: usize,
        capacity: usize,
        memory: Arc<CacheMemory>,
    ) -> LayerCache {
        LayerCache {
            ty,
            width,
            block: BLOCK_TOKENS.min(capacity.max(1)),
            keys: Vec::new(),
            values: Vec::new(),
            memory,
        }
    }

    /// Bytes of one block (K or V).
    fn block_bytes(&self) -> usize {
        self.ty.bytes(self.block * self.width)
    }

    /// Bytes this cache holds now.
    pub fn bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * self.block_bytes()
    }

    /// Makes room for positions `..end`: allocates the blocks they fall in. Refuses, changing
    /// nothing, when the budget or the allocator has no room.
    pub fn grow(&mut self, end: usize) -> Result<(), OverBudget> {
        if self.width == 0 {
            return Ok(());
        }
        let want = end.div_ceil(self.block);
        while self.keys.len() < want {
            let need = 2 * self.block_bytes();
            self.memory.take(need)?;
            let pair = Block::new(self.ty, self.block * self.width)
                .zip(Block::new(self.ty, self.block * self.width));
            let Some((k, v)) = pair else {
                self.memory.give(need);
                return Err(OverBudget {
                    need,
                    used: self.memory.used(),
                    limit: self.memory.limit(),
                });
            };
            self.keys.push(k);
            self.values.push(v);
        }
        Ok(())
    }

    /// Frees the blocks wholly at or after position `end`.
    pub fn shrink(&mut self, end: usize) {
        let keep = end.div_ceil(self.block);
        if self.keys.len() > keep {
            let freed = (self.keys.len() - keep) * 2 * self.block_bytes();
            self.keys.truncate(keep);
            self.values.truncate(keep);
            self.memory.give(freed);
        }
    }

    /// Writes position `pos`'s key and value (its blocks allocated by [`LayerCache::grow`]).
    pub fn write(&mut self, pos: usize, key: &[f32], value: &[f32]) {
        let (b, at) = (pos / self.block, (pos % self.block) * self.width);
        self.keys[b].write(at, key);
        self.values[b].write(at, value);
    }

    /// Hands `read` the keys and values of positions `first..=last`, each cut to values
    /// `offset..offset + len` (one KV head).
    pub fn read(&self, first: usize, last: usize, offset: usize, len: usize, read: impl ReadRows) {
        if last < first || self.width == 0 {
            return;
        }
        let (k, v) = (&self.keys[..], &self.values[..]);
        let at = (first, last, offset, len);
        match self.ty {
            CacheType::F32 => read.rows(&self.gather(k, at, f32_of), &self.gather(v, at, f32_of)),
            CacheType::F16 => read.rows(&self.gather(k, at, f16_of), &self.gather(v, at, f16_of)),
            CacheType::Bf16 => {
                read.rows(&self.gather(k, at, bf16_of), &self.gather(v, at, bf16_of))
            }
            CacheType::Q8_0 => read.rows(&self.gather(k, at, q8_of), &self.gather(v, at, q8_of)),
        }
    }

    /// Row `p` of `blocks` for `p` in `first..=last`, values `offset..offset + len` of each, as
    /// `row` reads a block's range.
    fn gather<'s, T>(
        &self,
        blocks: &'s [Block],
        (first, last, offset, len): (usize, usize, usize, usize),
        row: impl Fn(&'s Block, Range<usize>) -> T,
    ) -> Vec<T> {
        let mut out = Vec::with_capacity(last + 1 - first);
        let (mut b, mut i) = (first / self.block, first % self.block);
        for _ in first..=last {
            let s = i * self.width + offset;
            out.push(row(&blocks[b], s..s + len));
            i += 1;
            if i == self.block {
                (b, i) = (b + 1, 0);
            }
        }
        out
    }

    /// The keys (`values` false) or values of positions `..end` as f32 (tests compare caches).
    pub fn to_f32(&self, end: usize, values: bool) -> Vec<f32> {
        struct Collect<'a>(&'a mut Vec<f32>, bool);
        impl ReadRows for Collect<'_> {
            fn rows<R: Row>(self, keys: &[R], values: &[R]) {
                for r in if self.1 { values } else { keys } {
                    self.0.extend((0..r.len()).map(|i| r.get(i)));
                }
            }
        }
        let mut out = Vec::new();
        if self.width > 0 && end > 0 {
            self.read(0, end - 1, 0, self.width, Collect(&mut out, values));
        }
        out
    }
}

impl Clone for LayerCache {
    fn clone(&self) -> LayerCache {
        self.memory.force(self.bytes());
        LayerCache {
            ty: self.ty,
            width: self.width,
            block: self.block,
            keys: self.keys.clone(),
            values: self.values.clone(),
            memory: self.memory.clone(),
        }
    }
}

impl Drop for LayerCache {
    fn drop(&mut self) {
        self.memory.give(self.bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_types_parse_by_llama_cpp_names_and_refuse_others_by_name() {
        for t in CacheType::ALL {
            assert_eq!(t.name().parse::<CacheType>(), Ok(t));
        }
        let e = "q3".parse::<CacheType>().expect_err("refused");
        assert!(
            e.contains("`q3`") && e.contains("f16") && e.contains("q8_0"),
            "{e}"
        );
        assert!(CacheType::Q8_0.refusal(80).is_some());
        assert!(CacheType::Q8_0.refusal(128).is_none());
        assert!(CacheType::F16.refusal(80).is_none());
    }

    #[test]
    fn blocks_are_allocated_as_positions_arrive_and_counted() {
        let mem = CacheMemory::unlimited();
        let mut c = LayerCache::new(CacheType::F16, 64, 1000, mem.clone());
        assert_eq!(mem.used(), 0);
        c.grow(1).expect("room");
        let one = 2 * 2 * BLOCK_TOKENS * 64;
        assert_eq!(mem.used(), one);
        c.grow(BLOCK_TOKENS).expect("room");
        assert_eq!(mem.used(), one, "still the first block");
        c.grow(BLOCK_TOKENS + 1).expect("room");
        assert_eq!(mem.used(), 2 * one);
        let copy = c.clone();
        assert_eq!(mem.used(), 4 * one);
        drop(copy);
        c.shrink(10);
        assert_eq!((mem.used(), mem.peak()), (one, 4 * one));
        drop(c);
        assert_eq!(mem.used(), 0);
    }

    #[test]
    fn a_block_past_the_budget_is_refused_and_nothing_changes() {
        let mem = CacheMemory::limited(2 * 4 * 16 * 8 + 100);
        let mut c = LayerCache::new(CacheType::F32, 8, 16, mem.clone());
        c.grow(16).expect("room");
        let mut d = LayerCache::new(CacheType::F32, 8, 16, mem.clone());
        let e = d.grow(1).expect_err("refused");
        assert_eq!((e.need, e.used), (2 * 4 * 16 * 8, 2 * 4 * 16 * 8));
        assert_eq!(d.bytes(), 0);
        assert_eq!(mem.used(), 2 * 4 * 16 * 8);
    }

    #[test]
    fn each_type_reads_back_what_was_written_within_its_precision() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) / 3.0)
            .collect();
        for (ty, tol) in [
            (CacheType::F32, 0.0),
            (CacheType::F16, 1e-3),
            (CacheType::Bf16, 8e-3),
            (CacheType::Q8_0, 1e-2),
        ] {
            let mut c = LayerCache::new(ty, 64, 300, CacheMemory::unlimited());
            c.grow(300).expect("room");
            c.write(0, &x, &x);
            c.write(299, &x, &x);
            let back = c.to_f32(300, true);
            for (p, want) in [(0, &x), (299, &x)] {
                for (a, b) in back[p * 64..(p + 1) * 64].iter().zip(want.iter()) {
                    // Relative to the group's largest value (q8_0's step is max/127).
                    assert!((a - b).abs() <= tol * 4.7, "{ty}: {a} vs {b}");
                }
            }
        }
    }
}
