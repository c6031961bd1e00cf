//! `Tokenizer::from_gguf` on small GGUF images written with hayai-core's writer: a Gemma 4-style
//! ("gemma4", ranked merges) vocabulary, the score-based "llama" one, and malformed metadata.

use hayai_core::gguf::GgufFile;
use hayai_core::{GgufWriter, MetaArray, MetaValue};
use hayai_tokenizer::{
    gguf_chat_template, ChatFamily, ChatMessage, ChatTemplate, TokenKind, Tokenizer, TokenizerError,
};

/// Gemma 4 layout of the first ids: pad/eos/bos/unk/mask, tool markers at 46..=51, turn markers at
/// 105/106, "\n" at 107 (user-defined); then bytes and a few normal pieces.
fn gemma4_vocab() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = (0..108).map(|i| format!("<unused{i}>")).collect();
    let mut types = vec![3i32; 108];
    for (i, t) in ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
        .iter()
        .enumerate()
    {
        tokens[i] = t.to_string();
    }
    types[3] = 2;
    for (i, t) in [
        "<|tool>",
        "<tool|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        "<tool_response|>",
    ]
    .iter()
    .enumerate()
    {
        tokens[46 + i] = t.to_string();
    }
    tokens[105] = "<|turn>".into();
    tokens[106] = "<turn|>".into();
    tokens[107] = "\n".into();
    types[107] = 4;
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for t in [
        "▁", "a", "b", "c", "ab", "bc", "▁a", "▁ab", "abc", "u", "s", "e", "r", "us", "er", "user",
    ] {
        tokens.push(t.to_string());
        types.push(1);
    }
    (tokens, types)
}

fn strings(v: &[String]) -> MetaValue {
    MetaValue::Array(MetaArray::String(v.to_vec()))
}

fn gemma4_gguf(merges: &[&str], chat_template: Option<&str>) -> GgufFile {
    let (tokens, types) = gemma4_vocab();
    let mut w = GgufWriter::new()
        .meta("general.architecture", MetaValue::String("gemma4".into()))
        .meta("tokenizer.ggml.model", MetaValue::String("gemma4".into()))
        .meta("tokenizer.ggml.tokens", strings(&tokens))
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(types)),
        )
        .meta(
            "tokenizer.ggml.merges",
            strings(&merges.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
        )
        .meta("tokenizer.ggml.bos_token_id", MetaValue::U32(2))
        .meta("tokenizer.ggml.eos_token_id", MetaValue::U32(1))
        .meta("tokenizer.ggml.unknown_token_id", MetaValue::U32(3))
        .meta("tokenizer.ggml.padding_token_id", MetaValue::U32(0))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    if let Some(t) = chat_template {
        w = w.meta("tokenizer.chat_template", MetaValue::String(t.into()));
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

const MERGES: &[&str] = &["a b", "▁ a", "▁a b", "b c", "u s", "e r", "us er"];

#[test]
fn gemma4_merges_vocabulary() {
    let file = gemma4_gguf(MERGES, None);
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    assert_eq!(tok.stop_ids(), &[1, 106, 50]);
    assert_eq!(tok.turn_start_id(), Some(105));
    assert_eq!(tok.turn_end_id(), Some(106));
    assert!(!tok.add_bos_default());
    assert!(!tok.add_space_prefix());
    assert_eq!(ChatFamily::detect(&tok), Some(ChatFamily::Gemma4));
    assert_eq!(tok.token_kind(3), Some(TokenKind::Unknown));

    // "abc": a+b (rank 0) wins over b+c (rank 3); "abc" is a token but no merge builds it from ab+c.
    assert_eq!(tok.encode("abc", false), vec![id("ab"), id("c")]);
    assert_eq!(tok.encode("bc", false), vec![id("bc")]);
    // a+b (rank 0) applies before ▁+a (rank 1), and there is no ▁+ab merge.
    assert_eq!(tok.encode(" ab", false), vec![id("▁"), id("ab")]);
    assert_eq!(tok.encode(" ac", false), vec![id("▁a"), id("c")]);
    let prompt = ChatTemplate::for_model(None, &tok)
        .unwrap()
        .render(&[ChatMessage::user("ab")], true)
        .unwrap();
    assert_eq!(prompt, "<bos><|turn>user\nab<turn|>\n<|turn>model\n");
    let e = tok.encode(&prompt, false);
    assert_eq!(&e[..5], &[2, 105, id("user"), 107, id("ab")]);
    assert_eq!(&e[5..8], &[106, 107, 105]);
    assert_eq!(*e.last().unwrap(), 107);
    assert_eq!(tok.decode(&e, false).unwrap(), prompt);
    assert_eq!(tok.decode(&e, true).unwrap(), "user\nab\nmodel\n");
    // Byte fallback for characters outside the vocabulary.
    let e = tok.encode("é", false);
    assert_eq!(e, vec![id("<0xC3>"), id("<0xA9>")]);
}

#[test]
fn gguf_chat_template_is_read() {
    let file = gemma4_gguf(MERGES, Some("{{ bos_token }}{{ messages[0].content }}"));
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let src = gguf_chat_template(&file).unwrap();
    let t = ChatTemplate::for_model(Some(&src), &tok).unwrap();
    assert!(!t.is_builtin());
    assert_eq!(
        t.render(&[ChatMessage::user("x")], false).unwrap(),
        "<bos>x"
    );
}

#[test]
fn bad_gguf_metadata_is_a_clear_error() {
    // A merge naming a piece outside the vocabulary.
    let file = gemma4_gguf(&["a zz"], None);
    assert!(matches!(
        Tokenizer::from_gguf(&file),
        Err(TokenizerError::InvalidVocab(_))
    ));
    // A merge without a separator.
    let file = gemma4_gguf(&["ab"], None);
    assert!(matches!(
        Tokenizer::from_gguf(&file),
        Err(TokenizerError::Gguf(_))
    ));
    let (tokens, types) = gemma4_vocab();
    let base = || {
        GgufWriter::new()
            .meta("tokenizer.ggml.tokens", strings(&tokens))
            .meta(
                "tokenizer.ggml.token_type",
                MetaValue::Array(MetaArray::I32(types.clone())),
            )
            .meta("tokenizer.ggml.unknown_token_id", MetaValue::U32(3))
    };
    let open = |w: GgufWriter| GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    // No model key.
    assert!(matches!(
        Tokenizer::from_gguf(&open(base())),
        Err(TokenizerError::Gguf(_))
    ));
    // Unsupported model.
    let f = open(base().meta("tokenizer.ggml.model", MetaValue::String("gpt2".into())));
    assert!(matches!(
        Tokenizer::from_gguf(&f),
        Err(TokenizerError::Unsupported(_))
    ));
    // "llama" without scores.
    let f = open(base().meta("tokenizer.ggml.model", MetaValue::String("llama".into())));
    assert!(matches!(
        Tokenizer::from_gguf(&f),
        Err(TokenizerError::Gguf(_))
    ));
    // Scores of the wrong length.
    let f = open(
        base()
            .meta("tokenizer.ggml.model", MetaValue::String("llama".into()))
            .meta(
                "tokenizer.ggml.scores",
                MetaValue::Array(MetaArray::F32(vec![0.0; 3])),
            ),
    );
    assert!(matches!(
        Tokenizer::from_gguf(&f),
        Err(TokenizerError::InvalidVocab(_))
    ));
    // BOS id out of range.
    let f = open(
        base()
            .meta("tokenizer.ggml.model", MetaValue::String("llama".into()))
            .meta(
                "tokenizer.ggml.scores",
                MetaValue::Array(MetaArray::F32(vec![0.0; tokens.len()])),
            )
            .meta("tokenizer.ggml.bos_token_id", MetaValue::U32(1_000_000)),
    );
    assert!(matches!(
        Tokenizer::from_gguf(&f),
        Err(TokenizerError::InvalidVocab(_))
    ));
    // A bad token type code.
    let mut bad_types = types.clone();
    bad_types[200] = 42;
    let f = open(
        GgufWriter::new()
            .meta("tokenizer.ggml.model", MetaValue::String("gemma4".into()))
            .meta("tokenizer.ggml.tokens", strings(&tokens))
            .meta(
                "tokenizer.ggml.token_type",
                MetaValue::Array(MetaArray::I32(bad_types)),
            )
            .meta("tokenizer.ggml.merges", strings(&[])),
    );
    assert!(matches!(
        Tokenizer::from_gguf(&f),
        Err(TokenizerError::InvalidVocab(_))
    ));
    // Missing file.
    assert!(matches!(
        Tokenizer::from_gguf_path(std::path::Path::new("/nonexistent/model.gguf")),
        Err(TokenizerError::Gguf(_))
    ));
}

#[test]
fn llama_scores_vocabulary_defaults_to_space_prefix() {
    let (tokens, types) = gemma4_vocab();
    let mut scores = vec![0.0f32; tokens.len()];
    let pos = |t: &str| tokens.iter().position(|x| x == t).unwrap();
    scores[pos("▁a")] = -1.0;
    scores[pos("▁ab")] = -2.0;
    scores[pos("ab")] = -3.0;
    let w = GgufWriter::new()
        .meta("tokenizer.ggml.model", MetaValue::String("llama".into()))
        .meta("tokenizer.ggml.tokens", strings(&tokens))
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(types)),
        )
        .meta(
            "tokenizer.ggml.scores",
            MetaValue::Array(MetaArray::F32(scores)),
        )
        .meta("tokenizer.ggml.bos_token_id", MetaValue::U32(2));
    let tok = Tokenizer::from_gguf(&GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()).unwrap();
    assert!(tok.add_space_prefix());
    assert!(tok.add_bos_default());
    let e = tok.encode("ab", true);
    assert_eq!(e, vec![2, pos("▁ab") as u32]);
    assert_eq!(tok.decode(&e, true).unwrap(), "ab");
}

#[test]
fn chat_template_from_model_path() {
    let dir = tempfile::tempdir().unwrap();
    // GGUF with a template.
    let with = dir.path().join("with.gguf");
    let (tokens, types) = gemma4_vocab();
    let w = |tmpl: Option<&str>| {
        let mut w = GgufWriter::new()
            .meta("tokenizer.ggml.model", MetaValue::String("gemma4".into()))
            .meta("tokenizer.ggml.tokens", strings(&tokens))
            .meta(
                "tokenizer.ggml.token_type",
                MetaValue::Array(MetaArray::I32(types.clone())),
            )
            .meta("tokenizer.ggml.merges", strings(&[]));
        if let Some(t) = tmpl {
            w = w.meta("tokenizer.chat_template", MetaValue::String(t.into()));
        }
        w
    };
    w(Some("T:{{ messages[0].content }}")).write(&with).unwrap();
    let tok = Tokenizer::from_model_path(&with).unwrap();
    assert_eq!(tok.turn_end_id(), Some(106));
    let t = ChatTemplate::from_model_path(&with, ChatFamily::Gemma3).unwrap();
    assert_eq!(t.render(&[ChatMessage::user("x")], true).unwrap(), "T:x");
    // GGUF without one: the fallback family.
    let without = dir.path().join("without.gguf");
    w(None).write(&without).unwrap();
    let t = ChatTemplate::from_model_path(&without, ChatFamily::Gemma4).unwrap();
    assert!(t.is_builtin());
    assert_eq!(
        t.render(&[ChatMessage::user("x")], true).unwrap(),
        "<bos><|turn>user\nx<turn|>\n<|turn>model\n"
    );
    // HF directory with chat_template.jinja.
    std::fs::write(dir.path().join("chat_template.jinja"), "J{{ bos_token }}").unwrap();
    let t = ChatTemplate::from_model_path(dir.path(), ChatFamily::Gemma3).unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "J<bos>");
    // A missing file is an error.
    assert!(
        ChatTemplate::from_model_path(&dir.path().join("nope.gguf"), ChatFamily::Gemma3).is_err()
    );
}
