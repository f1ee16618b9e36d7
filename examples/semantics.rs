//! Prints the semantics decision log of a repository folder (config.json and the tokenizer files):
//! `cargo run --example semantics -- tests/fixtures/configs/gemma3/gemma-3-270m-it`.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    let read = |n: &str| -> Option<serde_json::Value> {
        std::fs::read(dir.join(n))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    };
    let config = read("config.json")
        .ok_or_else(|| anyhow::anyhow!("no config.json in {}", dir.display()))?;
    let (tc, tok, generation) = (
        read("tokenizer_config.json"),
        read("tokenizer.json"),
        read("generation_config.json"),
    );
    let side = onebit_stages::semantics::SideFiles {
        tokenizer_config: tc.as_ref(),
        tokenizer: tok.as_ref(),
        generation_config: generation.as_ref(),
        chat_template_file: dir.join("chat_template.jinja").is_file(),
    };
    match onebit_stages::semantics::derive(&config, &side) {
        Ok(s) => print!("{}", s.log()),
        Err(r) => println!("{r}"),
    }
    Ok(())
}
