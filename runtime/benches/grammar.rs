//! The cost of structured outputs per token, apart from the model: along a JSON answer of a
//! schema, each token's mask from the grammar engine (`Constraint::allowed`, its first
//! computation for that state), the mask applied to a logits row (`forbid_outside`), and the
//! token accepted. Compare with a decode step of the same model (Gemma 3 270M: 6–10 ms on two
//! cores).
//!
//! `cargo bench -p onebit-runtime --bench grammar` reads the demo pack's tokenizer
//! (`~/.cache/onebit-models/mirror/FastFlowLM/Gemma3-270M-NPU2/tokenizer.json`, made by
//! `scripts/demo.sh`) or the one in `ONEBIT_BENCH_TOKENIZER`; it prints the engine's build time
//! and the median and 90th percentile of each part per token.

use std::time::{Duration, Instant};

use onebit_kernels::head::forbid_outside;
use onebit_runtime::grammar::{Grammars, Spec};
use onebit_runtime::text::Text;
use serde_json::json;

fn main() {
    let path = std::env::var("ONEBIT_BENCH_TOKENIZER").unwrap_or_else(|_| {
        format!(
            "{}/.cache/onebit-models/mirror/FastFlowLM/Gemma3-270M-NPU2/tokenizer.json",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    let Ok(text) = Text::load(std::path::Path::new(&path), None) else {
        eprintln!("no tokenizer at {path} (run scripts/demo.sh or set ONEBIT_BENCH_TOKENIZER)");
        return;
    };
    let vocab = text.with_tokenizer(|t| t.get_vocab_size(true));
    let eos = text
        .with_tokenizer(|t| t.token_to_id("<eos>").or_else(|| t.token_to_id("</s>")))
        .unwrap_or(1);
    let grammars = Grammars::new(vocab, &[eos]);
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "story": {"type": "string"}},
        "required": ["name", "age", "tags", "story"], "additionalProperties": false});
    let answer = json!({"name": "Ada Lovelace", "age": 36,
        "tags": ["mathematician", "writer", "analyst"],
        "story": "She wrote the first published program, for Babbage's Analytical Engine, \
                  and saw that the machine could act on anything that can be written as symbols."});
    let answer = serde_json::to_string(&answer)
        .unwrap_or_default()
        .replace(",\"", ", \"")
        .replace("\":", "\": ")
        .replace("\",\"", "\", \"");
    let t0 = Instant::now();
    let Ok(start) = grammars.compile(&text, &Spec::JsonSchema(schema.clone()), "response_format")
    else {
        eprintln!("the schema does not compile");
        return;
    };
    println!(
        "grammar engine built and schema compiled in {:.0} ms ({vocab} tokens)",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let Ok(ids) = text.encode(&answer, false) else {
        return;
    };
    let mut row = vec![0.5f32; vocab];
    let (mut masks, mut applies, mut accepts) = (Vec::new(), Vec::new(), Vec::new());
    let mut rounds = Vec::new();
    for round in 0..5 {
        // A fresh compile each round, as every request has: the engine's caches start cold.
        let c0 = if round == 0 {
            start.clone()
        } else {
            let Ok(c) =
                grammars.compile(&text, &Spec::JsonSchema(schema.clone()), "response_format")
            else {
                return;
            };
            c
        };
        let mut c = c0;
        let r0 = Instant::now();
        for &id in &ids {
            let t = Instant::now();
            let Ok(allowed) = c.allowed() else { return };
            masks.push(t.elapsed());
            let t = Instant::now();
            forbid_outside(&allowed, &mut row);
            applies.push(t.elapsed());
            row.fill(0.5);
            let t = Instant::now();
            if c.accept(id).is_err() {
                eprintln!("the answer left the grammar at token {id}");
                return;
            }
            accepts.push(t.elapsed());
        }
        rounds.push(r0.elapsed());
    }
    let show = |name: &str, v: &mut Vec<Duration>| {
        v.sort();
        let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
        println!(
            "{name}: median {:.1} µs, p90 {:.1} µs per token",
            at(0.5),
            at(0.9)
        );
    };
    println!("{} tokens of answer, 5 rounds", ids.len());
    let per: Vec<String> = rounds
        .iter()
        .map(|r| format!("{:.0}", r.as_secs_f64() * 1e6 / ids.len() as f64))
        .collect();
    println!(
        "whole answer, per token (µs), each round on a fresh compile: {}",
        per.join(", ")
    );
    show("mask (llguidance)", &mut masks);
    show("mask applied to the logits row", &mut applies);
    show("token accepted", &mut accepts);
}
