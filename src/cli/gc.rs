//! `onebit-pipe gc`: remove store entries that no pack references.

use std::process::ExitCode;

use clap::Args;

use super::Global;

/// Arguments of `gc`.
#[derive(Args, Debug)]
pub struct GcArgs {
    /// Only count what would be removed.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs gc and prints what it freed.
pub fn exec(g: &Global, a: GcArgs) -> anyhow::Result<ExitCode> {
    let store = g.store()?;
    let r = onebit_pipeline::maintenance::gc(&store, a.dry_run)?;
    if g.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let verb = if a.dry_run { "would remove" } else { "removed" };
        if let (Some(sh), Some(url)) = (&r.shared, store.shared().map(|s| s.url())) {
            println!(
                "{url}: {verb} {} entries and {} unnamed uploads ({} objects, {} bytes), {} lapsed leases; kept {} entries",
                sh.entries_removed,
                sh.uploads_removed,
                sh.objects_removed,
                sh.bytes_freed,
                sh.leases_removed,
                sh.entries_kept
            );
        }
        println!(
            "{verb} {} entries ({} files, {} bytes); kept {} referenced entries",
            r.entries_removed, r.files_removed, r.bytes_freed, r.entries_kept
        );
    }
    Ok(ExitCode::SUCCESS)
}
