//! `onebit-pipe kernels`: the kernel set of a pack — every GEMM/GEMV shape with the host variant
//! and its self-check, and the NPU kernel that provides it from a kernel directory's xclbins.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use onebit_stages::format::axlf;
use onebit_stages::kernel_set::{kernel_set, missing_refusal};

use super::Global;
use super::generate::PackSource;

/// Arguments of `kernels`.
#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// The pack.
    #[command(flatten)]
    pub source: PackSource,
    /// A directory of NPU kernel artifacts (`*.xclbin`); every shape must be provided.
    #[arg(long, value_name = "DIR")]
    pub kernel_dir: Option<PathBuf>,
    /// Prefill batch the GEMM shapes are sized for.
    #[arg(long, default_value_t = onebit_stages::graph::PREFILL_BATCH)]
    pub batch: u64,
}

/// Prints the set; exit 1 naming the shapes `--kernel-dir` does not provide.
pub fn exec(g: &Global, a: KernelsArgs) -> anyhow::Result<ExitCode> {
    let dir = a.source.resolve(g)?;
    let artifacts = match &a.kernel_dir {
        Some(k) => axlf::scan(k)?,
        None => Vec::new(),
    };
    let set = kernel_set(&dir, &artifacts, a.batch, &onebit_runtime::HostKernels)?;
    if g.json {
        println!("{}", serde_json::to_string(&set)?);
    } else {
        let check = match (set.host_self_check_max_rel, &set.host_refusal) {
            (Some(r), _) => format!(
                "self-check max rel {r:.1e} over {} matrices",
                set.host_self_check_matrices
            ),
            (None, Some(why)) => format!("host refuses: {why}"),
            (None, None) => "no self-check".into(),
        };
        println!("{}  (host: {}, {check})", set.name, set.host_variant);
        println!(
            "{:>5} {:>6} {:>7} {:>7} {:>7}  {:<9} {:<22} {:<24} npu",
            "m", "k", "n", "k_pad", "n_pad", "tile", "roles", "npu kernel"
        );
        for s in &set.shapes {
            let roles: Vec<String> = s.roles.iter().map(|(r, c)| format!("{r}×{c}")).collect();
            println!(
                "{:>5} {:>6} {:>7} {:>7} {:>7}  {:<9} {:<22} {:<24} {}",
                s.m,
                s.k,
                s.n,
                s.k_padded,
                s.n_padded,
                s.tile,
                roles.join(" "),
                s.npu_kernel,
                s.npu_provider.as_deref().unwrap_or("-")
            );
        }
        for (f, k) in &set.artifacts {
            println!("artifact {f}: {}", k.join(", "));
        }
    }
    if let Some(k) = &a.kernel_dir
        && let Some(why) = missing_refusal(k, &set.name, &set.shapes)
    {
        return Err(anyhow::Error::new(super::Refused(why)));
    }
    Ok(ExitCode::SUCCESS)
}
