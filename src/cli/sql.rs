//! `onebit-pipe sql [QUERY]`: SQL over every table in the store; without a query, an interactive
//! prompt with line editing, history, `.tables` and `.schema NAME`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use onebit_catalog::{Catalog, Format};

use super::Global;

/// Arguments of `sql`.
#[derive(Args, Debug)]
pub struct SqlArgs {
    /// The query; without one, an interactive prompt.
    pub query: Option<String>,
    /// Output format: table, csv, json, parquet.
    #[arg(long, default_value = "table")]
    pub format: Format,
    /// Write the result to this file instead of stdout (needed for parquet).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Runs the query or the prompt.
pub fn exec(g: &Global, a: SqlArgs) -> anyhow::Result<ExitCode> {
    let store = g.store()?;
    let catalog = Catalog::open(&store, &super::versions::current_versions())?;
    let Some(query) = a.query else {
        return repl(&catalog, &store);
    };
    let batches = catalog.sql(&query)?;
    match &a.out {
        Some(path) => {
            let mut f = std::fs::File::create(path)?;
            onebit_catalog::format::write(&batches, a.format, &mut f)?;
        }
        None => {
            anyhow::ensure!(
                a.format != Format::Parquet,
                "--format parquet needs --out FILE"
            );
            let mut out = std::io::stdout().lock();
            onebit_catalog::format::write(&batches, a.format, &mut out)?;
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn repl(catalog: &Catalog, store: &onebit_pipeline::Store) -> anyhow::Result<ExitCode> {
    let mut rl = rustyline::DefaultEditor::new()?;
    let history = store.root().join("sql_history.txt");
    let _ = rl.load_history(&history);
    println!(
        "onebit-pipe sql: {} tables; .tables, .schema NAME, .quit; end statements with ;",
        catalog.tables().len()
    );
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() { "sql> " } else { "...> " };
        let line = match rl.readline(prompt) {
            Ok(l) => l,
            Err(rustyline::error::ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(rustyline::error::ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let trimmed = line.trim();
        if buffer.is_empty() && trimmed.starts_with('.') {
            let _ = rl.add_history_entry(trimmed);
            let mut words = trimmed.split_whitespace();
            match (words.next(), words.next()) {
                (Some(".quit" | ".exit"), _) => break,
                (Some(".tables"), _) => {
                    for name in catalog.tables().keys() {
                        println!("{name}");
                    }
                }
                (Some(".schema"), Some(name)) => match catalog.tables().get(name) {
                    Some(schema) => {
                        for f in schema.fields() {
                            println!(
                                "{:<28} {}{}",
                                f.name(),
                                f.data_type(),
                                if f.is_nullable() { " (nullable)" } else { "" }
                            );
                        }
                    }
                    None => println!("no table {name} (.tables lists them)"),
                },
                _ => println!(".tables | .schema NAME | .quit"),
            }
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        if !trimmed.ends_with(';') {
            continue;
        }
        let query = std::mem::take(&mut buffer);
        let _ = rl.add_history_entry(query.trim());
        match catalog.sql(query.trim().trim_end_matches(';')) {
            Ok(batches) => {
                let mut out = std::io::stdout().lock();
                onebit_catalog::format::write(&batches, Format::Table, &mut out)?;
            }
            Err(e) => println!("error: {e}"),
        }
    }
    let _ = rl.save_history(&history);
    Ok(ExitCode::SUCCESS)
}
