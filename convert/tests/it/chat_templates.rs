//! The chat templates the converter writes, rendered by the runtime (minijinja with the
//! Python-compatible methods HF templates call), against the exact text each family expects.

use crate::common;

use onebit_convert::tokenizer::{CHATML_TEMPLATE, GEMMA_TEMPLATE, LLAMA3_TEMPLATE};
use onebit_runtime::text::{Message, Text};

fn text(template: &str) -> Text {
    Text::load(
        &common::q4nx_case("llama-q41").join("tokenizer.json"),
        Some(template.to_string()),
    )
    .expect("tokenizer")
    // ids 380/381 are this vocabulary's begin/end of text.
    .with_special(Some(380), Some(381))
}

fn m(role: &str, content: &str) -> Message {
    Message {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    }
}

#[test]
fn gemma_folds_the_system_message_and_opens_the_model_turn() {
    let out = text(GEMMA_TEMPLATE)
        .render_chat(&[m("system", "Be brief."), m("user", "  Hi there \n")])
        .expect("render");
    assert_eq!(
        out,
        "<|begin_of_text|><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"
    );
    let two = text(GEMMA_TEMPLATE)
        .render_chat(&[m("user", "a"), m("assistant", "b"), m("user", "c")])
        .expect("render");
    assert!(
        two.contains("<start_of_turn>model\nb<end_of_turn>\n<start_of_turn>user\nc"),
        "{two}"
    );
    let e = text(GEMMA_TEMPLATE)
        .render_chat(&[m("user", "a"), m("user", "b")])
        .expect_err("roles must alternate");
    assert!(e.to_string().contains("alternate"), "{e}");
}

#[test]
fn chatml_and_llama3_render_exactly() {
    let msgs = [m("system", "S"), m("user", "U")];
    assert_eq!(
        text(CHATML_TEMPLATE).render_chat(&msgs).expect("chatml"),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        text(LLAMA3_TEMPLATE).render_chat(&msgs).expect("llama3"),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn python_style_methods_used_by_hub_templates_work() {
    let tpl = "{% for m in messages %}{{ m['content'].strip().upper() }}\
{% if m['content'].startswith(' x') %}!{% endif %}{% endfor %}\
{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}";
    assert_eq!(
        text(tpl).render_chat(&[m("user", " xy ")]).expect("render"),
        "XY!a=1"
    );
}
