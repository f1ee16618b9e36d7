//! What a forward batch held, for the log when the model panics inside it: enough to replay the
//! failing shape.

/// What one forward batch held, for the log when it fails: its rows, the rows that needed
/// logits, and per sequence its prompt length, the prompt tokens fed before this batch, its rows
/// in this batch and the tokens it had generated.
#[derive(Debug, Default)]
pub(super) struct Shape {
    /// Rows in the batch.
    pub rows: usize,
    /// Rows whose logits were asked for.
    pub logits_rows: usize,
    /// Each running sequence.
    pub seqs: Vec<SeqShape>,
}

/// One sequence of a batch.
#[derive(Debug)]
pub(super) struct SeqShape {
    /// Its prompt's length.
    pub prompt_tokens: usize,
    /// Prompt tokens fed before this batch.
    pub fed: usize,
    /// Its rows in this batch.
    pub rows: usize,
    /// Tokens it had generated.
    pub generated: usize,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows, {} needing logits;",
            self.rows, self.logits_rows
        )?;
        for (i, s) in self.seqs.iter().enumerate() {
            write!(
                f,
                " seq {i}: prompt {} tokens, {} fed before, {} rows now, {} generated;",
                s.prompt_tokens, s.fed, s.rows, s.generated
            )?;
        }
        Ok(())
    }
}

/// The message of a caught panic.
pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
