//! The kernel set a verified pack needs: which matrix products it runs and what serves each one.
//!
//! From the pack's manifest (semantics and tile kinds) it derives every GEMM/GEMV shape the
//! forward pass runs — per role (q, k, v, o, gate, up, down, head), M = 1 for decode and M =
//! `batch` for prefill, K and N padded to the tile grid — and names the set from the shapes
//! (`kernels-<hidden>-<ffn>-b<batch>`). For each shape it records:
//! - on the host, the kernel variant the runtime picked (AMX, AVX-512 VNNI, AVX2 or scalar) and the load-time
//!   self-check of that variant on the pack's own weights;
//! - on the NPU, the xclbin kernel that provides it, from the repository's `*.xclbin` files and an
//!   optional kernel directory ([`axlf`] parses their headers). An NPU kernel provides a shape when
//!   its name is `<op>_<M>x<K>x<N>` with the padded sizes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use onebit_pack::TileLayout;
use onebit_pack::host::{HostRuntime, HostVerdict};
use onebit_pack::manifest::Manifest;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::axlf;

/// One matrix product the forward pass runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Rows of the activation (1 = decode GEMV, `batch` = prefill GEMM).
    pub m: u64,
    /// Inner dimension as the tensor has it.
    pub k: u64,
    /// Output features as the tensor has it.
    pub n: u64,
    /// K padded to the tile's column grid.
    pub k_padded: u64,
    /// N padded to the tile's row grid.
    pub n_padded: u64,
    /// Tile kind of the weights.
    pub tile: String,
    /// Roles served by this shape (`q`, `gate`, …) and how many tensors each.
    pub roles: BTreeMap<String, u64>,
    /// The NPU kernel name that provides it: `gemv_…` for M = 1, `gemm_…` otherwise.
    pub npu_kernel: String,
    /// The xclbin (and kernel) that provides it, if any.
    pub npu_provider: Option<String>,
}

/// The kernel set of a pack (the kernels stage's result).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelSet {
    /// `kernels-<hidden>-<ffn>-b<batch>`.
    pub name: String,
    /// Prefill batch the GEMM shapes are sized for.
    pub batch: u64,
    /// Host kernel variant (`amx-int8`, `avx512-vnni`, `avx2+fma`, `scalar`), or `none` when the
    /// host cannot run the pack.
    pub host_variant: String,
    /// Largest relative error of the host self-check on the pack's weights.
    pub host_self_check_max_rel: Option<f32>,
    /// Matrices the self-check covered.
    pub host_self_check_matrices: u64,
    /// Why the host cannot run the pack, if it cannot.
    pub host_refusal: Option<String>,
    /// Every shape.
    pub shapes: Vec<Shape>,
    /// xclbins looked at, with their kernels.
    pub artifacts: Vec<(String, Vec<String>)>,
}

impl KernelSet {
    /// Shapes no NPU artifact provides, by kernel name.
    pub fn missing(&self) -> Vec<&str> {
        missing(&self.shapes)
    }
}

/// Shapes of `shapes` no NPU artifact provides (after [`match_artifacts`]), by kernel name.
pub fn missing(shapes: &[Shape]) -> Vec<&str> {
    shapes
        .iter()
        .filter(|s| s.npu_provider.is_none())
        .map(|s| s.npu_kernel.as_str())
        .collect()
}

/// The refusal for a kernel directory `dir` that leaves shapes of the set `name` without a
/// kernel, naming them; `None` when every shape has its provider.
pub fn missing_refusal(dir: &std::path::Path, name: &str, shapes: &[Shape]) -> Option<String> {
    let missing = missing(shapes);
    (!missing.is_empty()).then(|| {
        format!(
            "{} provides no kernel for {} of {} shapes of {name}: {}",
            dir.display(),
            missing.len(),
            shapes.len(),
            missing.join(", ")
        )
    })
}

fn role_of(name: &str) -> Option<&'static str> {
    const ROLES: [(&str, &str); 10] = [
        ("shortconv.in_proj.weight", "conv_in"),
        ("shortconv.out_proj.weight", "conv_out"),
        ("q_proj.weight", "q"),
        ("k_proj.weight", "k"),
        ("v_proj.weight", "v"),
        ("o_proj.weight", "o"),
        ("gate_proj.weight", "gate"),
        ("up_proj.weight", "up"),
        ("down_proj.weight", "down"),
        ("lm_head.weight", "head"),
    ];
    ROLES
        .iter()
        .find(|(suffix, _)| name.ends_with(suffix))
        .map(|&(_, r)| r)
}

/// The shapes of `manifest`'s tiled matrices at M = 1 and M = `batch`, and the set's name.
pub fn shapes(manifest: &Manifest, batch: u64) -> Result<(String, Vec<Shape>)> {
    let mut by_key: BTreeMap<(u64, u64, u64, String), Shape> = BTreeMap::new();
    for (name, t) in &manifest.tensors {
        let (Some(role), Some(layout)) = (role_of(name), TileLayout::by_name(&t.kind)) else {
            continue;
        };
        let pad = |x: u64, g: usize| x.div_ceil(g as u64) * g as u64;
        let (kp, np) = (pad(t.k, layout.cols), pad(t.rows, layout.rows));
        for m in [1, batch] {
            let s = by_key
                .entry((m, kp, np, t.kind.clone()))
                .or_insert_with(|| Shape {
                    m,
                    k: t.k,
                    n: t.rows,
                    k_padded: kp,
                    n_padded: np,
                    tile: t.kind.clone(),
                    roles: BTreeMap::new(),
                    npu_kernel: onebit_pack::host::kernel_name(m, kp, np),
                    npu_provider: None,
                });
            *s.roles.entry(role.to_string()).or_default() += 1;
        }
    }
    // Named from the shapes themselves: hidden = K of the q projection, ffn = N of the gate.
    let dim = |suffix: &str, f: fn(&onebit_pack::TensorEntry) -> u64| {
        manifest
            .tensors
            .iter()
            .find(|(n, _)| n.ends_with(suffix))
            .map(|(_, t)| f(t))
    };
    let (Some(hidden), Some(ffn)) = (
        dim("q_proj.weight", |t| t.k),
        dim("gate_proj.weight", |t| t.rows),
    ) else {
        return Err(Error::Refused {
            file: PathBuf::from("manifest.json"),
            tensor: "q_proj/gate_proj".into(),
            reason: "the pack has no attention or MLP projections to size kernels for".into(),
        });
    };
    let name = format!("kernels-{hidden}-{ffn}-b{batch}");
    // Decode shapes first, then prefill, each by size.
    let mut v: Vec<Shape> = by_key.into_values().collect();
    v.sort_by_key(|s| (s.m, s.k_padded, s.n_padded));
    Ok((name, v))
}

/// Marks each shape with the artifact kernel that provides it.
pub fn match_artifacts(shapes: &mut [Shape], artifacts: &[axlf::Xclbin]) {
    for s in shapes {
        s.npu_provider = artifacts.iter().find_map(|x| {
            x.kernels.iter().find(|k| **k == s.npu_kernel).map(|k| {
                format!(
                    "{}:{k}",
                    x.file
                        .file_name()
                        .map(|n| n.to_string_lossy())
                        .unwrap_or_default()
                )
            })
        });
    }
}

/// Derives the kernel set of the pack in `pack_dir` with `artifacts` as the NPU's offer, running
/// the host self-check on the pack's own weights through `host` (the runtime, handed in by the
/// binary: the import does not link it).
pub fn kernel_set(
    pack_dir: &std::path::Path,
    artifacts: &[axlf::Xclbin],
    batch: u64,
    host: &dyn HostRuntime,
) -> Result<KernelSet> {
    // The kernel set describes what a pack needs whatever its verdict or host support: read the
    // manifest itself, then ask the runtime whether and how the host runs it.
    let mpath = pack_dir.join("manifest.json");
    let manifest: Manifest = fs_err::read(&mpath)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| Error::Refused {
            file: mpath.clone(),
            tensor: "manifest".into(),
            reason: e,
        })?;
    let (name, mut shapes) = shapes(&manifest, batch)?;
    match_artifacts(&mut shapes, artifacts);
    // A failed self-check is an error: the host kernels would compute wrong numbers.
    let (host_variant, max_rel, matrices, host_refusal) = match host.check(pack_dir) {
        Ok(check) => (check.path, Some(check.max_rel), check.matrices, None),
        Err(HostVerdict::CannotRun(why)) => ("none".to_string(), None, 0, Some(why)),
        Err(HostVerdict::SelfCheckFailed(reason)) => {
            return Err(Error::Refused {
                file: pack_dir.to_path_buf(),
                tensor: "pack".into(),
                reason,
            });
        }
    };
    Ok(KernelSet {
        name,
        batch,
        host_variant,
        host_self_check_max_rel: max_rel,
        host_self_check_matrices: matrices,
        host_refusal,
        shapes,
        artifacts: artifacts
            .iter()
            .map(|x| (x.file.display().to_string(), x.kernels.clone()))
            .collect(),
    })
}
