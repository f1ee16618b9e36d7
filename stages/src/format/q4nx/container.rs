//! Reader of the q4nx container: a safetensors file (u64 LE header length, UTF-8 JSON header,
//! data buffer), memory-mapped.
//!
//! The header parser is ours rather than the `safetensors` crate's for two reasons: that crate
//! refuses gaps between tensors (aligned writers such as the reference engine's packer leave
//! them), and its errors name neither the file nor the tensor. This parser accepts gaps, refuses
//! overlaps, and checks every rule of q4nx-format §1 with a message naming file and tensor.
//! [`Header::parse`] is a pure function over bytes and never panics (fuzzed: `fuzz/`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value;

use crate::error::{Error, Result, io_at};

/// Headers longer than this are refused as absurd (the largest real packs use well under 1 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
/// Shapes of higher rank are refused.
pub const MAX_RANK: usize = 8;

/// Element types of the container.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Dtype {
    /// bfloat16.
    BF16,
    /// IEEE half.
    F16,
    /// IEEE single.
    F32,
    /// Signed bytes (tiles, plain int8).
    I8,
    /// Unsigned bytes (MXFP4 tiles).
    U8,
    /// Another safetensors dtype, kept by name so it can be refused by name.
    Other(String),
}

impl Dtype {
    fn parse(s: &str) -> Dtype {
        match s {
            "BF16" => Dtype::BF16,
            "F16" => Dtype::F16,
            "F32" => Dtype::F32,
            "I8" => Dtype::I8,
            "U8" => Dtype::U8,
            other => Dtype::Other(other.to_string()),
        }
    }

    /// Bytes per element, when known.
    pub fn size(&self) -> Option<u64> {
        Some(match self {
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
            Dtype::I8 | Dtype::U8 => 1,
            Dtype::Other(s) => match s.as_str() {
                "F64" | "I64" | "U64" => 8,
                "I32" | "U32" => 4,
                "I16" | "U16" => 2,
                "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
                _ => return None,
            },
        })
    }

    /// The name as written in the header.
    pub fn name(&self) -> &str {
        match self {
            Dtype::BF16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
            Dtype::I8 => "I8",
            Dtype::U8 => "U8",
            Dtype::Other(s) => s,
        }
    }
}

/// One tensor entry of the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor name.
    pub name: String,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its declared shape.
    pub shape: Vec<u64>,
    /// Start offset in the data buffer.
    pub begin: u64,
    /// End offset (exclusive).
    pub end: u64,
}

impl TensorInfo {
    /// Bytes of data.
    pub fn nbytes(&self) -> u64 {
        self.end - self.begin
    }

    /// The declared row width (last dimension), which names a tile kind.
    pub fn width(&self) -> u64 {
        self.shape.last().copied().unwrap_or(0)
    }
}

/// A parsed and validated header.
#[derive(Clone, Debug)]
pub struct Header {
    /// Length of the JSON header in bytes.
    pub header_len: u64,
    /// Tensors sorted by name.
    pub tensors: Vec<TensorInfo>,
    /// `__metadata__`, when present (the converter writes none).
    pub metadata: Option<BTreeMap<String, String>>,
}

impl Header {
    /// Offset of the data buffer in the file.
    pub fn data_start(&self) -> u64 {
        8 + self.header_len
    }

    /// Parses and validates the header of a container whose bytes are `bytes`. `file` only names
    /// the file in errors.
    pub fn parse(file: &Path, bytes: &[u8]) -> Result<Header> {
        let corrupt = |tensor: Option<&str>, what: String| Error::Corrupt {
            file: file.to_path_buf(),
            tensor: tensor.map(str::to_string),
            what,
        };
        let total = bytes.len() as u64;
        if total < 8 {
            return Err(corrupt(
                None,
                format!("file is {total} bytes, shorter than the 8-byte header length"),
            ));
        }
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(&bytes[..8]);
        let header_len = u64::from_le_bytes(len8);
        if header_len > MAX_HEADER_BYTES {
            return Err(corrupt(
                None,
                format!("header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit"),
            ));
        }
        if 8 + header_len > total {
            return Err(corrupt(
                None,
                format!("header length {header_len} runs past the end of the file ({total} bytes)"),
            ));
        }
        let raw = &bytes[8..(8 + header_len) as usize];
        let text = std::str::from_utf8(raw).map_err(|e| {
            corrupt(
                None,
                format!(
                    "header is not UTF-8 (invalid byte at header offset {})",
                    e.valid_up_to()
                ),
            )
        })?;
        let json: Value = serde_json::from_str(text.trim_end_matches([' ', '\0']))
            .map_err(|e| corrupt(None, format!("header is not JSON: {e}")))?;
        let Value::Object(map) = json else {
            return Err(corrupt(None, "header is not a JSON object".into()));
        };
        let data_len = total - 8 - header_len;
        let mut tensors = Vec::with_capacity(map.len());
        let mut metadata = None;
        for (name, entry) in map {
            if name == "__metadata__" {
                let Value::Object(m) = entry else {
                    return Err(corrupt(None, "__metadata__ is not an object".into()));
                };
                let mut md = BTreeMap::new();
                for (k, v) in m {
                    match v {
                        Value::String(s) => md.insert(k, s),
                        other => md.insert(k, other.to_string()),
                    };
                }
                metadata = Some(md);
                continue;
            }
            let t = parse_entry(&name, &entry).map_err(|what| corrupt(Some(&name), what))?;
            if t.end > data_len {
                return Err(corrupt(
                    Some(&name),
                    format!(
                        "data_offsets [{}, {}) out of range: the data buffer holds {data_len} bytes",
                        t.begin, t.end
                    ),
                ));
            }
            let elems = t
                .shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| corrupt(Some(&name), format!("shape {:?} overflows", t.shape)))?;
            if let Some(size) = t.dtype.size() {
                let need = elems.checked_mul(size).ok_or_else(|| {
                    corrupt(Some(&name), format!("shape {:?} overflows", t.shape))
                })?;
                if need != t.nbytes() {
                    return Err(corrupt(
                        Some(&name),
                        format!(
                            "holds {} bytes, but {} × {:?} needs {need}",
                            t.nbytes(),
                            t.dtype.name(),
                            t.shape
                        ),
                    ));
                }
            }
            tensors.push(t);
        }
        // Overlap check in offset order.
        let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
        by_offset.sort_by_key(|t| (t.begin, t.end));
        for pair in by_offset.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.begin < a.end && b.end > b.begin {
                return Err(corrupt(
                    Some(&b.name),
                    format!(
                        "data_offsets [{}, {}) overlap {} at [{}, {})",
                        b.begin, b.end, a.name, a.begin, a.end
                    ),
                ));
            }
        }
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Header {
            header_len,
            tensors,
            metadata,
        })
    }
}

fn parse_entry(_name: &str, entry: &Value) -> std::result::Result<TensorInfo, String> {
    let obj = entry.as_object().ok_or("entry is not an object")?;
    let dtype = obj
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or("entry has no string dtype")?;
    let shape_v = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or("entry has no shape array")?;
    if shape_v.len() > MAX_RANK {
        return Err(format!("rank {} exceeds {MAX_RANK}", shape_v.len()));
    }
    let shape = shape_v
        .iter()
        .map(|d| {
            d.as_u64()
                .ok_or_else(|| format!("shape dimension {d} is not a non-negative integer"))
        })
        .collect::<std::result::Result<Vec<u64>, String>>()?;
    let offs = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or("entry has no data_offsets array")?;
    if offs.len() != 2 {
        return Err(format!("data_offsets has {} numbers, not 2", offs.len()));
    }
    let begin = offs[0]
        .as_u64()
        .ok_or("data_offsets[0] is not a non-negative integer")?;
    let end = offs[1]
        .as_u64()
        .ok_or("data_offsets[1] is not a non-negative integer")?;
    if end < begin {
        return Err(format!(
            "data_offsets [{begin}, {end}) end before they begin"
        ));
    }
    Ok(TensorInfo {
        name: _name.to_string(),
        dtype: Dtype::parse(dtype),
        shape,
        begin,
        end,
    })
}

/// An open, memory-mapped container.
pub struct Container {
    path: PathBuf,
    mmap: Mmap,
    header: Header,
}

impl Container {
    /// Maps `path` and validates its header.
    pub fn open(path: &Path) -> Result<Container> {
        let file = fs_err::File::open(path)?;
        // SAFETY: the map is read-only; a concurrent writer truncating the file could fault
        // reads, which is the documented risk of memory-mapping, accepted for files in the store
        // and in repo snapshots that are only ever replaced by rename.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_at(e, "map file", path))?;
        let header = Header::parse(path, &mmap)?;
        Ok(Container {
            path: path.to_path_buf(),
            mmap,
            header,
        })
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The tensors, sorted by name.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.header.tensors[i])
    }

    /// The data bytes of `t` (validated in range by [`Header::parse`]).
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.header.data_start() + t.begin) as usize;
        let end = (self.header.data_start() + t.end) as usize;
        &self.mmap[start..end]
    }
}
