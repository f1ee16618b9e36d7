//! AXLF, the xclbin container (`xrt/xclbin.h`): a 496-byte head — magic `xclbin2\0`, signature
//! length, key block, unique id, a 152-byte header ending in the section count — followed by
//! 40-byte section headers (kind, name, offset, size). Kernels are listed in the `IP_LAYOUT`
//! section (kind 8): a count, then 80-byte `ip_data` entries whose type is `IP_KERNEL` (1) or
//! `IP_PS_KERNEL` (7) and whose 64-byte name is `kernel:instance`.
//!
//! Written here rather than bound from XRT: reading a header must work on machines without XRT
//! (this one), and the layout is fixed by static asserts in the header itself.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Magic at offset 0.
pub const MAGIC: &[u8; 8] = b"xclbin2\0";
/// Offset of the section count (header at 304, count at +144).
const NUM_SECTIONS_AT: usize = 448;
/// Offset of the first section header.
const SECTIONS_AT: usize = 456;
/// Bytes per section header.
const SECTION_BYTES: usize = 40;
/// `IP_LAYOUT` section kind.
pub const IP_LAYOUT: u32 = 8;
/// Bytes per `ip_data` entry.
const IP_BYTES: usize = 80;

/// What an xclbin says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xclbin {
    /// The file.
    pub file: PathBuf,
    /// `m_header.uuid`, hex.
    pub uuid: String,
    /// Header version `major.minor.patch`.
    pub version: String,
    /// Section kinds present.
    pub sections: Vec<u32>,
    /// Kernel names (`IP_KERNEL`/`IP_PS_KERNEL` entries, instance suffix removed), deduplicated.
    pub kernels: Vec<String>,
}

fn bad(file: &Path, what: String) -> Error {
    Error::Refused {
        file: file.to_path_buf(),
        tensor: "xclbin".into(),
        reason: what,
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses an xclbin image; every bound is checked and a failure names the file and the field.
pub fn parse(file: &Path, b: &[u8]) -> Result<Xclbin> {
    if b.len() < SECTIONS_AT || &b[..8] != MAGIC {
        return Err(bad(
            file,
            format!(
                "not an xclbin: magic {:?} in {} bytes (want \"xclbin2\\0\" and ≥ {SECTIONS_AT} bytes)",
                String::from_utf8_lossy(&b[..b.len().min(8)]),
                b.len()
            ),
        ));
    }
    let length = u64_at(b, 304).unwrap_or(0);
    if length > b.len() as u64 {
        return Err(bad(
            file,
            format!("header says {length} bytes, the file has {}", b.len()),
        ));
    }
    let version = format!(
        "{}.{}.{}",
        b[330],
        b[331],
        u16::from_le_bytes([b[328], b[329]])
    );
    let uuid: String = b[416..432].iter().map(|x| format!("{x:02x}")).collect();
    let n = u32_at(b, NUM_SECTIONS_AT).unwrap_or(0) as usize;
    let mut sections = Vec::new();
    let mut kernels: Vec<String> = Vec::new();
    for i in 0..n {
        let at = SECTIONS_AT + i * SECTION_BYTES;
        let (Some(kind), Some(off), Some(size)) =
            (u32_at(b, at), u64_at(b, at + 24), u64_at(b, at + 32))
        else {
            return Err(bad(
                file,
                format!("section header {i} of {n} is past the end"),
            ));
        };
        let (off, size) = (off as usize, size as usize);
        let Some(data) = b.get(off..off.saturating_add(size)) else {
            return Err(bad(
                file,
                format!(
                    "section {i} (kind {kind}) spans {off}..{} beyond {} bytes",
                    off + size,
                    b.len()
                ),
            ));
        };
        sections.push(kind);
        if kind != IP_LAYOUT {
            continue;
        }
        let count = u32_at(data, 0).unwrap_or(0) as usize;
        for j in 0..count {
            let Some(e) = data.get(8 + j * IP_BYTES..8 + (j + 1) * IP_BYTES) else {
                return Err(bad(
                    file,
                    format!("IP_LAYOUT entry {j} of {count} is past the section end"),
                ));
            };
            let ty = u32_at(e, 0).unwrap_or(0);
            if ty != 1 && ty != 7 {
                continue;
            }
            let raw = &e[16..80];
            let name =
                String::from_utf8_lossy(&raw[..raw.iter().position(|&c| c == 0).unwrap_or(64)]);
            let kernel = name.split(':').next().unwrap_or_default().to_string();
            if !kernel.is_empty() && !kernels.contains(&kernel) {
                kernels.push(kernel);
            }
        }
    }
    Ok(Xclbin {
        file: file.to_path_buf(),
        uuid,
        version,
        sections,
        kernels,
    })
}

/// Every `*.xclbin` directly under `dir`, parsed, in name order.
pub fn scan(dir: &Path) -> Result<Vec<Xclbin>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| bad(dir, format!("cannot list the kernel directory: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "xclbin"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let b = std::fs::read(f).map_err(|e| bad(f, format!("cannot read: {e}")))?;
            parse(f, &b)
        })
        .collect()
}

/// Builds an xclbin image with one `IP_LAYOUT` section listing `kernels` (as `name:instance`),
/// laid out exactly as `xrt/xclbin.h` documents; tests and fixtures use it.
pub fn build(uuid: [u8; 16], kernels: &[&str]) -> Vec<u8> {
    let mut ip = vec![0u8; 8 + kernels.len() * IP_BYTES];
    ip[..4].copy_from_slice(&(kernels.len() as u32).to_le_bytes());
    for (j, k) in kernels.iter().enumerate() {
        let e = &mut ip[8 + j * IP_BYTES..8 + (j + 1) * IP_BYTES];
        e[..4].copy_from_slice(&7u32.to_le_bytes()); // IP_PS_KERNEL, as NPU xclbins list them
        e[8..16].copy_from_slice(&(0x1000u64 * j as u64).to_le_bytes());
        let name = format!("{k}:{k}_0");
        let n = name.len().min(63);
        e[16..16 + n].copy_from_slice(&name.as_bytes()[..n]);
    }
    let mut b = vec![0u8; SECTIONS_AT + SECTION_BYTES];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&(-1i32).to_le_bytes());
    b[12..40].fill(0xff);
    b[330] = 2; // version 2.13.0
    b[331] = 13;
    b[416..432].copy_from_slice(&uuid);
    b[NUM_SECTIONS_AT..NUM_SECTIONS_AT + 4].copy_from_slice(&1u32.to_le_bytes());
    let s = SECTIONS_AT;
    b[s..s + 4].copy_from_slice(&IP_LAYOUT.to_le_bytes());
    b[s + 4..s + 13].copy_from_slice(b"IP_LAYOUT");
    let at = b.len() as u64;
    b[s + 24..s + 32].copy_from_slice(&at.to_le_bytes());
    b[s + 32..s + 40].copy_from_slice(&(ip.len() as u64).to_le_bytes());
    b.extend_from_slice(&ip);
    let total = b.len() as u64;
    b[304..312].copy_from_slice(&total.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xclbin_built_from_the_documented_layout_parses_back() {
        let img = build(
            [7; 16],
            &["gemm_1x640x1024", "gemm_1x640x1024", "gemv_1x1024x640"],
        );
        // The fixed sizes `xrt/xclbin.h` asserts: axlf 496 bytes with one section header.
        assert_eq!(&img[..8], MAGIC);
        let x = parse(Path::new("t.xclbin"), &img).expect("parse");
        assert_eq!(x.kernels, vec!["gemm_1x640x1024", "gemv_1x1024x640"]);
        assert_eq!(x.sections, vec![IP_LAYOUT]);
        assert_eq!(x.version, "2.13.0");
        assert_eq!(x.uuid, "07".repeat(16));
        // Damage is refused by name.
        let e = parse(Path::new("t.xclbin"), &img[..300]).expect_err("short");
        assert!(e.to_string().contains("not an xclbin"), "{e}");
        let mut cut = img.clone();
        cut.truncate(img.len() - 10);
        let len = cut.len() as u64;
        cut[304..312].copy_from_slice(&len.to_le_bytes());
        let e = parse(Path::new("t.xclbin"), &cut).expect_err("section past end");
        assert!(e.to_string().contains("beyond"), "{e}");
    }

    /// Cross-check with XRT's own header, when it is installed: the offsets used here are the
    /// ones `offsetof` gives (compiled by the system C compiler).
    #[test]
    fn offsets_agree_with_xrt_headers_when_installed() {
        let header = Path::new("/usr/include/xrt/xclbin.h");
        if !header.is_file() {
            eprintln!("skipped: /usr/include/xrt/xclbin.h is not installed");
            return;
        }
        let dir = tempfile::tempdir().expect("tmp");
        let src = dir.path().join("o.c");
        std::fs::write(
            &src,
            "#include <stddef.h>\n#include <stdio.h>\n#include <xrt/xclbin.h>\nint main(void){printf(\"%zu %zu %zu %zu %zu %zu %zu\\n\",\
             offsetof(struct axlf, m_header) + offsetof(struct axlf_header, m_numSections),\
             offsetof(struct axlf, m_sections), sizeof(struct axlf_section_header),\
             offsetof(struct axlf_section_header, m_sectionOffset),\
             offsetof(struct axlf, m_header) + offsetof(struct axlf_header, uuid),\
             offsetof(struct ip_layout, m_ip_data), offsetof(struct ip_data, m_name));return 0;}\n",
        )
        .expect("write");
        let exe = dir.path().join("o");
        let Ok(st) = std::process::Command::new("cc")
            .arg(&src)
            .arg("-I/usr/include/xrt")
            .arg("-o")
            .arg(&exe)
            .status()
        else {
            eprintln!("skipped: no C compiler");
            return;
        };
        assert!(st.success(), "compiling against xclbin.h failed");
        let out = std::process::Command::new(&exe).output().expect("run");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "448 456 40 24 416 8 16"
        );
    }
}
