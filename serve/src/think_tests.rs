use super::*;

/// Feeds `text` to a split in pieces of `n` characters; returns both sides joined.
fn streamed(opened: bool, text: &str, n: usize) -> Parts {
    let mut s = Split::new(opened);
    let chars: Vec<char> = text.chars().collect();
    let mut all = Parts::default();
    for piece in chars.chunks(n) {
        let p = s.push(&piece.iter().collect::<String>());
        all.reasoning.push_str(&p.reasoning);
        all.content.push_str(&p.content);
    }
    let p = s.finish();
    all.reasoning.push_str(&p.reasoning);
    all.content.push_str(&p.content);
    all
}

fn parts(reasoning: &str, content: &str) -> Parts {
    Parts {
        reasoning: reasoning.into(),
        content: content.into(),
    }
}

#[test]
fn a_block_is_split_from_the_answer_whatever_the_pieces() {
    let cases = [
        // Qwen 3: the answer opens the block.
        (
            false,
            "<think>\nThe user greets.\n</think>\n\nHello!",
            parts("The user greets.", "Hello!"),
        ),
        // The prompt opened it (Qwen 3.5, DeepSeek-R1).
        (
            true,
            "\nTwo lines\nof thought.\n\n</think>\n\nHi <b>",
            parts("Two lines\nof thought.", "Hi <b>"),
        ),
        // Thinking switched off: an empty block in the prompt, none in the answer.
        (false, "Hello <there>", parts("", "Hello <there>")),
        // A plain answer that starts like a tag.
        (false, "<thin ice>", parts("", "<thin ice>")),
        // Cut off inside the block.
        (false, "<think>still going  ", parts("still going", "")),
        (false, "<think>\n\n</think>\n\nok", parts("", "ok")),
        (false, "", parts("", "")),
    ];
    for (opened, text, want) in cases {
        assert_eq!(Split::whole(opened, text), want, "{text:?}");
        for n in 1..=9 {
            assert_eq!(streamed(opened, text, n), want, "{text:?} in pieces of {n}");
        }
    }
}

#[test]
fn no_piece_of_a_tag_goes_out_before_it_is_known() {
    let mut s = Split::new(false);
    assert_eq!(s.push("<thi"), Parts::default());
    assert_eq!(s.push("nk>a"), parts("a", ""));
    assert_eq!(s.push(" b</th"), parts(" b", ""));
    assert_eq!(s.push("ink>c"), parts("", "c"));
}

#[test]
fn prompts_and_templates_are_recognised() {
    assert!(prompt_opens("<|im_start|>assistant\n<think>\n"));
    assert!(!prompt_opens(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ));
    assert!(template_thinks("{{ '<think>' }}…{{ '</think>' }}"));
    assert!(!template_thinks("{{ '<start_of_turn>model' }}"));
}
