//! The GGUF container: header, metadata, tensor infos, alignment, memory-mapped data.
//!
//! Written in-tree rather than with the `gguf` crate: see `docs/gguf.md` for the evaluation. The
//! parser caps string lengths, array sizes, tensor counts and ranks, and every error names the file
//! (and the tensor or key) with the bytes it needed and what the file still holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::dtype::GgmlType;
use crate::error::{Error, Result, io_at};

/// Longest string accepted (chat templates reach tens of kilobytes).
pub const MAX_STRING: u64 = 16 << 20;
/// Most elements accepted in one metadata array (vocabularies reach 262,144).
pub const MAX_ARRAY: u64 = 16 << 20;
/// Most tensors accepted.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Most metadata keys accepted.
pub const MAX_KEYS: u64 = 1 << 16;
/// Highest tensor rank accepted.
pub const MAX_DIMS: u32 = 8;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The value as an unsigned integer, when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, when numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor of a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, `ne0` first (ne0 = K, the row width).
    pub dims: Vec<u64>,
    /// Its type (possibly unknown).
    pub ty: GgmlType,
    /// Offset of its data relative to the data section.
    pub offset: u64,
    /// Bytes of data, when the type's block size is known.
    pub nbytes: Option<u64>,
}

impl GgufTensor {
    /// Elements per row (`ne0`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (the product of `ne1..`).
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Element count.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF header: everything but the tensor data. [`GgufHeader::parse`] is a pure function
/// over bytes and never panics.
#[derive(Clone, Debug)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensors in file order.
    pub tensors: Vec<GgufTensor>,
    /// `general.alignment` (default 32).
    pub alignment: u64,
    /// Start of the data section in the file.
    pub data_start: u64,
}

/// A parsed GGUF file, memory-mapped.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    header: GgufHeader,
}

impl std::ops::Deref for GgufFile {
    type Target = GgufHeader;
    fn deref(&self) -> &GgufHeader {
        &self.header
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
    file: &'a Path,
}

impl<'a> Cursor<'a> {
    fn corrupt(&self, what: String) -> Error {
        Error::Corrupt {
            file: self.file.to_path_buf(),
            tensor: None,
            what,
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let have = (self.buf.len() - self.at) as u64;
        if n > have {
            return Err(self.corrupt(format!(
                "{what} at byte {} needs {n} bytes, the file holds {have} more",
                self.at
            )));
        }
        let s = &self.buf[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return Err(self.corrupt(format!("{what}: string of {n} bytes exceeds {MAX_STRING}")));
        }
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| self.corrupt(format!("{what}: string is not UTF-8")))
    }

    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.u8(what)?),
            1 => MetaValue::I8(self.u8(what)? as i8),
            2 => MetaValue::U16(self.u16(what)?),
            3 => MetaValue::I16(self.u16(what)? as i16),
            4 => MetaValue::U32(self.u32(what)?),
            5 => MetaValue::I32(self.u32(what)? as i32),
            6 => MetaValue::F32(f32::from_bits(self.u32(what)?)),
            7 => MetaValue::Bool(self.u8(what)? != 0),
            8 => MetaValue::String(self.string(what)?),
            9 => {
                if depth > 2 {
                    return Err(self.corrupt(format!("{what}: arrays nested deeper than 2")));
                }
                let item = self.u32(what)?;
                let n = self.u64(what)?;
                if n > MAX_ARRAY {
                    return Err(
                        self.corrupt(format!("{what}: array of {n} items exceeds {MAX_ARRAY}"))
                    );
                }
                let mut v = Vec::with_capacity(n.min(1 << 16) as usize);
                for _ in 0..n {
                    v.push(self.value(item, what, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(self.u64(what)?),
            11 => MetaValue::I64(self.u64(what)? as i64),
            12 => MetaValue::F64(f64::from_bits(self.u64(what)?)),
            other => {
                return Err(self.corrupt(format!("{what}: unknown metadata value type {other}")));
            }
        })
    }
}

impl GgufHeader {
    /// Parses and validates the header of a GGUF file whose bytes are `buf` (`path` names it in
    /// errors), checking that every sized tensor lies inside the file.
    pub fn parse(path: &Path, buf: &[u8]) -> Result<GgufHeader> {
        let mut c = Cursor {
            buf,
            at: 0,
            file: path,
        };
        let magic = c.take(4, "magic")?;
        if magic != b"GGUF" {
            return Err(c.corrupt(format!("not a GGUF file (magic {magic:02x?})")));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(c.corrupt(format!("GGUF version {version} is not 2 or 3")));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        if n_tensors > MAX_TENSORS || n_kv > MAX_KEYS {
            return Err(c.corrupt(format!(
                "{n_tensors} tensors / {n_kv} keys exceed the limits"
            )));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32(&key)?;
            let v = c.value(ty, &key, 0)?;
            metadata.insert(key, v);
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let nd = c.u32(&name)?;
            if nd > MAX_DIMS {
                return Err(Error::Corrupt {
                    file: path.to_path_buf(),
                    tensor: Some(name),
                    what: format!("rank {nd} exceeds {MAX_DIMS}"),
                });
            }
            let mut dims = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                dims.push(c.u64(&name)?);
            }
            let ty = GgmlType::from_id(c.u32(&name)?);
            let offset = c.u64(&name)?;
            let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let nbytes = match (ty.block(), elements) {
                (Some((bs, ts)), Some(n)) if n % bs == 0 => (n / bs).checked_mul(ts),
                (Some((bs, _)), Some(n)) => {
                    return Err(Error::Corrupt {
                        file: path.to_path_buf(),
                        tensor: Some(name),
                        what: format!("{n} elements are not a whole number of {ty} blocks of {bs}"),
                    });
                }
                _ => None,
            };
            tensors.push(GgufTensor {
                name,
                dims,
                ty,
                offset,
                nbytes,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(c.corrupt(format!("general.alignment {v:?} is not a power of two")));
                }
            },
        };
        let data_start = (c.at as u64).div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;
        for t in &tensors {
            if let Some(n) = t.nbytes {
                let end = data_start
                    .checked_add(t.offset)
                    .and_then(|s| s.checked_add(n));
                if end.is_none_or(|e| e > file_len) {
                    return Err(Error::Corrupt {
                        file: path.to_path_buf(),
                        tensor: Some(t.name.clone()),
                        what: format!(
                            "data at offset {} needs {n} bytes, the file holds {} after the data start {data_start}",
                            t.offset,
                            file_len.saturating_sub(data_start + t.offset.min(file_len))
                        ),
                    });
                }
            }
        }
        Ok(GgufHeader {
            version,
            metadata,
            tensors,
            alignment,
            data_start,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A metadata value.
    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.meta("general.architecture")
            .and_then(MetaValue::as_str)
    }
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = fs_err::File::open(path)?;
        // SAFETY: read-only map of a file that is only ever replaced by rename (see the q4nx
        // container for the same reasoning).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_at(e, "map file", path))?;
        let header = GgufHeader::parse(path, &mmap)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            header,
        })
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw bytes of a tensor whose type has a known size.
    pub fn data(&self, t: &GgufTensor) -> Result<&[u8]> {
        let n = t.nbytes.ok_or_else(|| Error::Refused {
            file: self.path.clone(),
            tensor: t.name.clone(),
            reason: format!("{} has no known block size", t.ty),
        })?;
        let start = (self.data_start + t.offset) as usize;
        Ok(&self.mmap[start..start + n as usize])
    }

    /// Dequantizes rows `r0..r1` of `t` into `out` (`(r1 − r0) × row_len` values; rows past the
    /// tensor's end are not read, so a range starting past it yields nothing).
    pub fn rows_f32(&self, t: &GgufTensor, r0: u64, r1: u64, out: &mut Vec<f32>) -> Result<()> {
        let data = self.data(t)?;
        let (bs, ts) =
            t.ty.block()
                .ok_or_else(|| Error::Internal("sized type without block".into()))?;
        let row_bytes = (t.row_len() / bs * ts) as usize;
        let r1 = r1.min(t.rows());
        let r0 = r0.min(r1);
        let bytes = &data[r0 as usize * row_bytes..r1 as usize * row_bytes];
        out.resize(((r1 - r0) * t.row_len()) as usize, 0.0);
        super::dequant::dequantize(t.ty, bytes, out).map_err(|ty| Error::Refused {
            file: self.path.clone(),
            tensor: t.name.clone(),
            reason: format!("no dequantizer for {ty}"),
        })
    }
}
