//! Chat templates: built-in Gemma formats and Jinja rendering of a real HF Gemma 3 template.

use hayai_tokenizer::{ChatFamily, ChatMessage, ChatTemplate, TokenizerError};

fn gemma3_jinja() -> ChatTemplate {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/gemma3_chat_template.jinja"),
    )
    .unwrap();
    ChatTemplate::new(&src).unwrap()
}

fn conversations() -> Vec<Vec<ChatMessage>> {
    vec![
        vec![ChatMessage::user("What is 2+2?")],
        vec![
            ChatMessage::system("You are terse."),
            ChatMessage::user("  Hi there \n"),
        ],
        vec![
            ChatMessage::user("Hello"),
            ChatMessage::assistant("Hi! How can I help?"),
            ChatMessage::user("Tell me a joke."),
        ],
        vec![
            ChatMessage::system("Answer in French.\n"),
            ChatMessage::user("Good morning"),
            ChatMessage::assistant(" Bonjour "),
            ChatMessage::user("Thanks\n\nbye"),
            ChatMessage::assistant("De rien."),
        ],
        vec![ChatMessage::user("unicode: héllo 🦀 <b>bold</b>")],
    ]
}

#[test]
fn gemma3_builtin_exact_strings() {
    let t = ChatTemplate::builtin(ChatFamily::Gemma3);
    assert!(t.is_builtin());
    assert_eq!(
        t.render(&[ChatMessage::user("Hello")], true).unwrap(),
        "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"
    );
    assert_eq!(
        t.render(
            &[
                ChatMessage::system("Be brief."),
                ChatMessage::user("Hi"),
                ChatMessage::assistant("Hello."),
                ChatMessage::new("model", "Again."),
            ],
            false
        )
        .unwrap(),
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>model\nAgain.<end_of_turn>\n"
    );
    // A system prompt alone still reaches the model as a user turn.
    assert_eq!(
        t.render(&[ChatMessage::system("Only rules.")], true)
            .unwrap(),
        "<bos><start_of_turn>user\nOnly rules.<end_of_turn>\n<start_of_turn>model\n"
    );
    assert_eq!(t.render(&[], false).unwrap(), "<bos>");
}

#[test]
fn gemma4_builtin_exact_strings() {
    let t = ChatTemplate::builtin(ChatFamily::Gemma4);
    assert_eq!(
        t.render(&[ChatMessage::user("Hello")], true).unwrap(),
        "<bos><|turn>user\nHello<turn|>\n<|turn>model\n"
    );
    assert_eq!(
        t.render(
            &[
                ChatMessage::system("Be brief."),
                ChatMessage::user("Hi"),
                ChatMessage::assistant("Hello."),
                ChatMessage::user("Bye"),
            ],
            true
        )
        .unwrap(),
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\n<|turn>user\nBye<turn|>\n<|turn>model\n"
    );
}

#[test]
fn unsupported_roles_are_errors() {
    for fam in [ChatFamily::Gemma3, ChatFamily::Gemma4] {
        let r = ChatTemplate::builtin(fam).render(&[ChatMessage::new("tool", "x")], true);
        assert!(
            matches!(&r, Err(TokenizerError::UnsupportedRole(role)) if role == "tool"),
            "{r:?}"
        );
    }
}

#[test]
fn hf_gemma3_template_matches_builtin() {
    let jinja = gemma3_jinja();
    let builtin = ChatTemplate::builtin(ChatFamily::Gemma3);
    for conv in conversations() {
        for gen in [false, true] {
            assert_eq!(
                jinja.render(&conv, gen).unwrap(),
                builtin.render(&conv, gen).unwrap(),
                "{conv:?} gen={gen}"
            );
        }
    }
}

#[test]
fn raise_exception_becomes_template_exception() {
    let r = gemma3_jinja().render(&[ChatMessage::user("a"), ChatMessage::user("b")], true);
    match r {
        Err(TokenizerError::TemplateException(msg)) => {
            assert!(msg.contains("must alternate"), "{msg}")
        }
        other => panic!("expected TemplateException, got {other:?}"),
    }
}

#[test]
fn bad_templates_are_clear_errors() {
    assert!(matches!(
        ChatTemplate::new("{% for m in messages %}"),
        Err(TokenizerError::Template(_))
    ));
    for src in [
        "{{ messages[0].content | no_such_filter }}",
        "{{ no_such_function() }}",
        "{{ messages[0].content.no_such_method() }}",
    ] {
        let r = ChatTemplate::new(src).and_then(|t| t.render(&[ChatMessage::user("x")], false));
        assert!(
            matches!(r, Err(TokenizerError::Template(_))),
            "{src}: {r:?}"
        );
    }
}

#[test]
fn python_style_methods_and_filters() {
    let src = "{% for m in messages %}{% if m.content.strip().startswith('!') %}[cmd]{% endif %}\
               {{ m.content.strip().upper() }}|{{ m.role | tojson }}|{{ m.content | trim | length }}\n{% endfor %}\
               {{ eos_token }}{{ bos_token }}{% if add_generation_prompt %}GEN{% endif %}";
    let t = ChatTemplate::new(src)
        .unwrap()
        .with_special_tokens("<B>", "<E>");
    let out = t
        .render(
            &[ChatMessage::user("  !hi "), ChatMessage::assistant("ok")],
            true,
        )
        .unwrap();
    assert_eq!(out, "[cmd]!HI|\"user\"|3\nOK|\"assistant\"|2\n<E><B>GEN");
}

#[test]
fn hf_style_whitespace_control() {
    // trim_blocks + lstrip_blocks, as HF renders templates.
    let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}";
    let out = ChatTemplate::new(src)
        .unwrap()
        .render(&[ChatMessage::user("x"), ChatMessage::user("y")], false)
        .unwrap();
    assert_eq!(out, "U:x\nU:y\n");
}

#[test]
fn tojson_matches_python_json_dumps() {
    let src = "{{ {'b': 1, 'a': [1, 'x<y', none, true, 2.5], 'é': {}} | tojson }}\n\
               {{ messages[0] | tojson }}\n{{ messages[0] | tojson(indent=2) }}\n{{ [] | tojson(2) }}";
    let out = ChatTemplate::new(src)
        .unwrap()
        .render(&[ChatMessage::user("hi \"there\"\n")], false)
        .unwrap();
    assert_eq!(
        out,
        "{\"b\": 1, \"a\": [1, \"x<y\", null, true, 2.5], \"é\": {}}\n\
         {\"role\": \"user\", \"content\": \"hi \\\"there\\\"\\n\"}\n\
         {\n  \"role\": \"user\",\n  \"content\": \"hi \\\"there\\\"\\n\"\n}\n[]"
    );
}

#[test]
fn loop_controls_and_namespaces() {
    let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'assistant' %}{% break %}{% endif %}\
               {% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}";
    let out = ChatTemplate::new(src)
        .unwrap()
        .render(
            &[
                ChatMessage::user("a"),
                ChatMessage::user("b"),
                ChatMessage::assistant("c"),
                ChatMessage::user("d"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(out, "2");
}
