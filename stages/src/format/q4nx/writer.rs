//! Writer of the q4nx container in the layout FastFlowLM's converter produces (q4nx-format §1):
//! data ordered by element size (F32, then BF16/F16, then I8/U8) and by name within each group,
//! header keys in data order, compact JSON space-padded to a multiple of 8, no `__metadata__`.
//!
//! Tensors are produced one at a time by a callback that writes the tensor's bytes in order, so a
//! 300 MB embedding never has to exist next to the rest of the model in memory. The file appears
//! only when complete: it is written to a temporary file beside the destination, synced, and
//! renamed over it.

use std::io::{BufWriter, Write};
use std::path::Path;

use super::container::Dtype;
use crate::error::{Error, Result, io_at};

/// One tensor to write: its header entry. The bytes come from the producer given to
/// [`write_container`].
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Declared shape.
    pub shape: Vec<u64>,
}

impl Entry {
    /// Bytes this entry holds (shape product × element size).
    pub fn nbytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size().unwrap_or(1)
    }
}

/// Sorts `entries` into the converter's data order: larger elements first, then by name.
pub fn data_order(entries: &mut [Entry]) {
    entries.sort_by(|a, b| {
        let (sa, sb) = (a.dtype.size().unwrap_or(1), b.dtype.size().unwrap_or(1));
        sb.cmp(&sa).then_with(|| a.name.cmp(&b.name))
    });
}

/// The header bytes (length prefix excluded) for `entries` in the given order.
pub fn header_json(entries: &[Entry]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    let mut at = 0u64;
    for e in entries {
        let n = e.nbytes();
        map.insert(
            e.name.clone(),
            serde_json::json!({"dtype": e.dtype.name(), "shape": e.shape, "data_offsets": [at, at + n]}),
        );
        at += n;
    }
    // serde_json keeps insertion order only with `preserve_order`; build the text by hand so the
    // key order is the data order whatever features the build has.
    let mut out = b"{".to_vec();
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let key = serde_json::to_string(&e.name).unwrap_or_default();
        out.extend_from_slice(key.as_bytes());
        out.push(b':');
        let v = map.get(&e.name).map(|v| v.to_string()).unwrap_or_default();
        out.extend_from_slice(v.as_bytes());
    }
    out.push(b'}');
    while !out.len().is_multiple_of(8) {
        out.push(b' ');
    }
    out
}

/// Writes `entries` (already in data order) to `path`; `produce(i, w)` must write exactly
/// `entries[i].nbytes()` bytes to `w`. The file is replaced atomically.
pub fn write_container(
    path: &Path,
    entries: &[Entry],
    mut produce: impl FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| io_at(e, "create a temporary file in", dir))?;
    {
        // Written through fs-err so that a failed write names the file.
        let file = fs_err::File::from_parts(tmp.as_file().try_clone()?, tmp.path());
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let header = header_json(entries);
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        for (i, e) in entries.iter().enumerate() {
            let mut counted = Counted {
                inner: &mut w,
                n: 0,
            };
            produce(i, &mut counted)?;
            if counted.n != e.nbytes() {
                return Err(Error::Internal(format!(
                    "{}: producer wrote {} bytes, header says {}",
                    e.name,
                    counted.n,
                    e.nbytes()
                )));
            }
        }
        w.flush()?;
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| io_at(e, "sync", tmp.path()))?;
    // Temporary files are created 0600; a model file is readable like any other.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs_err::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644))?;
    }
    tmp.persist(path)
        .map_err(|e| io_at(e.error, "rename into place", path))?;
    Ok(())
}

struct Counted<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::q4nx::Container;

    #[test]
    fn written_container_reads_back_in_converter_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.q4nx");
        let mut entries = vec![
            Entry {
                name: "model.layers.0.mlp.up_proj.weight".into(),
                dtype: Dtype::I8,
                shape: vec![2, 8],
            },
            Entry {
                name: "model.norm.weight".into(),
                dtype: Dtype::BF16,
                shape: vec![4],
            },
            Entry {
                name: "lm_head.weight".into(),
                dtype: Dtype::I8,
                shape: vec![1, 8],
            },
        ];
        data_order(&mut entries);
        let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "model.norm.weight",
                "lm_head.weight",
                "model.layers.0.mlp.up_proj.weight"
            ]
        );
        write_container(&path, &entries, |i, w| {
            w.write_all(&vec![i as u8 + 1; entries[i].nbytes() as usize])
                .map_err(|e| Error::Internal(e.to_string()))
        })
        .expect("write");
        let c = Container::open(&path).expect("read back");
        let t = c.tensor("lm_head.weight").expect("lm_head");
        assert_eq!(c.data(t), &[2u8; 8]);
        assert_eq!(c.header().data_start() % 8, 0);
    }
}
