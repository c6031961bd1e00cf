//! Behaviour on a small hand-made vocabulary (tests/fixtures/tiny_tokenizer.json), through both the HF
//! tokenizer.json path (ranked merges) and the score-based path.

use std::path::PathBuf;

use hayai_tokenizer::{
    hf_chat_template, ChatMessage, ChatTemplate, EncodeOptions, HfTokenizerConfig, MergeRule,
    StreamDecoder, TokenKind, Tokenizer, TokenizerError, VocabSpec,
};
use proptest::prelude::*;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn tiny() -> Tokenizer {
    let tj = std::fs::read_to_string(fixtures().join("tiny_tokenizer.json")).unwrap();
    let cfg = HfTokenizerConfig::from_json(
        &std::fs::read_to_string(fixtures().join("tiny_tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    Tokenizer::from_hf_json(&tj, Some(&cfg)).unwrap()
}

fn ids(tok: &Tokenizer, pieces: &[&str]) -> Vec<u32> {
    pieces
        .iter()
        .map(|p| {
            tok.token_to_id(p)
                .unwrap_or_else(|| panic!("{p:?} not in vocab"))
        })
        .collect()
}

#[test]
fn hf_loader_reads_vocab_and_config() {
    let tok = tiny();
    assert_eq!(tok.vocab_size(), 284);
    assert_eq!(tok.bos_id(), Some(2));
    assert_eq!(tok.eos_id(), Some(1));
    assert_eq!(tok.unk_id(), Some(3));
    assert_eq!(tok.pad_id(), Some(0));
    assert!(tok.add_bos_default());
    assert!(!tok.add_space_prefix());
    assert_eq!(tok.token_kind(4), Some(TokenKind::Control));
    assert_eq!(tok.token_kind(6), Some(TokenKind::UserDefined));
    assert_eq!(tok.token_kind(8), Some(TokenKind::Byte));
    assert_eq!(tok.id_to_token(8), Some("<0x00>"));
    assert_eq!(tok.id_to_token(284), None);
    assert_eq!(tok.stop_ids(), &[1, 5]);
    assert!(tok.is_stop(5) && !tok.is_stop(4));
    assert_eq!(tok.turn_start_id(), Some(4));
    assert_eq!(tok.turn_end_id(), Some(5));
}

#[test]
fn ranked_merges_apply_lowest_rank_first() {
    let tok = tiny();
    assert_eq!(tok.encode("hello", false), ids(&tok, &["hello"]));
    assert_eq!(
        tok.encode(" hello world!", false),
        ids(&tok, &["▁hello", "▁world", "!"])
    );
    // "wor" is only a token with the ▁ prefix, so the merges stop at w + or + ld.
    assert_eq!(
        tok.encode("hello  world", false),
        ids(&tok, &["hello", "  ", "w", "or", "ld"])
    );
}

#[test]
fn byte_fallback_for_unknown_characters() {
    let tok = tiny();
    let want = ids(&tok, &["h", "<0xC3>", "<0xA9>", "llo"]);
    assert_eq!(tok.encode("héllo", false), want);
    assert_eq!(tok.decode(&want, false).unwrap(), "héllo");
    // A 4-byte character.
    let e = tok.encode("🦀", false);
    assert_eq!(e, ids(&tok, &["<0xF0>", "<0x9F>", "<0xA6>", "<0x80>"]));
    assert_eq!(tok.decode(&e, true).unwrap(), "🦀");
}

#[test]
fn special_token_strings_are_parsed() {
    let tok = tiny();
    let text = "<start_of_turn>hello<end_of_turn>\n";
    let want = vec![4, tok.token_to_id("hello").unwrap(), 5, 6];
    assert_eq!(tok.encode(text, false), want);
    assert_eq!(tok.encode(text, true)[0], 2);
    assert_eq!(tok.encode("<bos>hello", false)[0], 2);
    // Without special parsing control tokens are plain text; user-defined ones still split.
    let plain = tok.encode_with(
        text,
        EncodeOptions {
            add_bos: false,
            parse_special: false,
        },
    );
    assert!(!plain.contains(&4) && !plain.contains(&5));
    assert_eq!(*plain.last().unwrap(), 6);
    assert_eq!(tok.decode(&plain, false).unwrap(), text);
    // Decoding: specials kept as text or skipped.
    assert_eq!(tok.decode(&want, false).unwrap(), text);
    assert_eq!(tok.decode(&want, true).unwrap(), "hello\n");
}

#[test]
fn empty_and_whitespace_inputs() {
    let tok = tiny();
    assert!(tok.encode("", false).is_empty());
    assert_eq!(tok.encode("", true), vec![2]);
    assert_eq!(tok.decode(&[], false).unwrap(), "");
    let e = tok.encode("   ", false);
    assert_eq!(tok.decode(&e, false).unwrap(), "   ");
}

#[test]
fn out_of_range_ids_are_errors() {
    let tok = tiny();
    match tok.decode(&[5, 284], false) {
        Err(TokenizerError::IdOutOfRange { id, vocab_size }) => {
            assert_eq!((id, vocab_size), (284, 284))
        }
        other => panic!("expected IdOutOfRange, got {other:?}"),
    }
    let mut sd = tok.stream_decoder(false);
    assert!(sd.push(u32::MAX).is_err());
}

#[test]
fn invalid_utf8_decodes_lossily() {
    let tok = tiny();
    // A lone continuation byte and a truncated 2-byte sequence.
    let e = ids(&tok, &["h", "<0xA9>", "<0xC3>"]);
    assert_eq!(tok.decode(&e, false).unwrap(), "h\u{FFFD}\u{FFFD}");
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let tok = tiny();
    let e = tok.encode("hé🦀!", false);
    let mut sd = tok.stream_decoder(true);
    let mut pieces = Vec::new();
    for &id in &e {
        pieces.push(sd.push(id).unwrap());
    }
    pieces.push(sd.finish());
    assert_eq!(pieces.concat(), "hé🦀!");
    // "h", then nothing until é is complete, then é, nothing x3, 🦀, "!".
    assert_eq!(pieces[0], "h");
    assert_eq!(pieces[1], "");
    assert_eq!(pieces[2], "é");
    assert_eq!(&pieces[3..6], &["", "", ""]);
    assert_eq!(pieces[6], "🦀");
    // Invalid sequences are replaced as soon as they are known to be invalid.
    let mut sd = StreamDecoder::new(&tok, false);
    assert_eq!(sd.push(tok.token_to_id("<0xC3>").unwrap()).unwrap(), "");
    assert_eq!(sd.pending_bytes(), 1);
    assert_eq!(sd.push(tok.token_to_id("h").unwrap()).unwrap(), "\u{FFFD}h");
    assert_eq!(sd.push(tok.token_to_id("<0xF0>").unwrap()).unwrap(), "");
    assert_eq!(sd.finish(), "\u{FFFD}");
    // Works with an owned Arc too.
    let arc = std::sync::Arc::new(tiny());
    let mut sd = StreamDecoder::new(arc.clone(), false);
    assert_eq!(sd.push(4).unwrap(), "<start_of_turn>");
}

/// The same vocabulary with scores instead of merges: each merged token scores by its merge rank.
fn tiny_scored() -> Tokenizer {
    let tj: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tiny_tokenizer.json")).unwrap(),
    )
    .unwrap();
    let vocab = tj["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    let mut scores = vec![-1e9f32; tokens.len()];
    for (rank, m) in tj["model"]["merges"].as_array().unwrap().iter().enumerate() {
        let merged = format!("{}{}", m[0].as_str().unwrap(), m[1].as_str().unwrap());
        scores[vocab[&merged].as_u64().unwrap() as usize] = -(rank as f32);
    }
    let kinds = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| match i {
            0..=5 => TokenKind::Control,
            6 | 7 => TokenKind::UserDefined,
            _ if t.starts_with("<0x") => TokenKind::Byte,
            _ => TokenKind::Normal,
        })
        .collect();
    Tokenizer::from_spec(VocabSpec {
        tokens,
        kinds,
        rule: MergeRule::Scores(scores),
        bos_id: Some(2),
        eos_id: Some(1),
        unk_id: Some(3),
        pad_id: Some(0),
        add_bos: true,
        add_space_prefix: false,
        ignore_merges: false,
    })
    .unwrap()
}

#[test]
fn score_rule_matches_rank_rule_on_tiny_vocab() {
    let (a, b) = (tiny(), tiny_scored());
    for text in [
        "hello world",
        " hello  world!",
        "héllo wörld",
        "<start_of_turn>hello<end_of_turn>\n",
        "",
    ] {
        assert_eq!(a.encode(text, true), b.encode(text, true), "{text:?}");
    }
}

#[test]
fn space_prefix_is_added_after_specials_and_removed_on_decode() {
    let base = tiny_scored();
    let tokens: Vec<String> = (0..base.vocab_size() as u32)
        .map(|i| base.id_to_token(i).unwrap().to_string())
        .collect();
    let kinds = (0..base.vocab_size() as u32)
        .map(|i| base.token_kind(i).unwrap())
        .collect();
    let mut scores = vec![-1e9f32; tokens.len()];
    for (t, s) in [("▁hello", 0.0f32), ("hello", -1.0), ("▁world", -2.0)] {
        scores[base.token_to_id(t).unwrap() as usize] = s;
    }
    for (t, s) in [("he", -3.0f32), ("ll", -4.0), ("llo", -5.0), ("▁h", -6.0)] {
        scores[base.token_to_id(t).unwrap() as usize] = s;
    }
    for (t, s) in [("▁w", -7.0f32), ("or", -8.0), ("▁wor", -9.0), ("ld", -10.0)] {
        scores[base.token_to_id(t).unwrap() as usize] = s;
    }
    let tok = Tokenizer::from_spec(VocabSpec {
        tokens,
        kinds,
        rule: MergeRule::Scores(scores),
        bos_id: Some(2),
        eos_id: Some(1),
        unk_id: Some(3),
        pad_id: None,
        add_bos: true,
        add_space_prefix: true,
        ignore_merges: false,
    })
    .unwrap();
    let e = tok.encode("hello world", true);
    assert_eq!(
        e,
        vec![
            2,
            tok.token_to_id("▁hello").unwrap(),
            tok.token_to_id("▁world").unwrap()
        ]
    );
    assert_eq!(tok.decode(&e, true).unwrap(), "hello world");
    let e = tok.encode("<start_of_turn>hello", false);
    assert_eq!(e, vec![4, tok.token_to_id("▁hello").unwrap()]);
}

#[test]
fn invalid_specs_are_rejected() {
    let spec = |tokens: Vec<&str>, kinds: Vec<TokenKind>, scores: Vec<f32>| VocabSpec {
        tokens: tokens.into_iter().map(String::from).collect(),
        kinds,
        rule: MergeRule::Scores(scores),
        bos_id: None,
        eos_id: None,
        unk_id: Some(0),
        pad_id: None,
        add_bos: false,
        add_space_prefix: false,
        ignore_merges: false,
    };
    use TokenKind::*;
    assert!(Tokenizer::from_spec(spec(vec![], vec![], vec![])).is_err());
    assert!(Tokenizer::from_spec(spec(vec!["<unk>", "a"], vec![Unknown], vec![0.0, 0.0])).is_err());
    assert!(
        Tokenizer::from_spec(spec(vec!["<unk>", "a"], vec![Unknown, Normal], vec![0.0])).is_err()
    );
    assert!(Tokenizer::from_spec(spec(
        vec!["<unk>", "zz"],
        vec![Unknown, Byte],
        vec![0.0, 0.0]
    ))
    .is_err());
    let mut s = spec(vec!["<unk>", "a"], vec![Unknown, Normal], vec![0.0, 0.0]);
    s.bos_id = Some(7);
    assert!(Tokenizer::from_spec(s).is_err());
    // No byte tokens and no unknown token: some text would be unencodable.
    let mut s = spec(vec!["a"], vec![Normal], vec![0.0]);
    s.unk_id = None;
    assert!(Tokenizer::from_spec(s).is_err());
    // A merge naming a token outside the vocabulary.
    let mut s = spec(vec!["<unk>", "a"], vec![Unknown, Normal], vec![0.0, 0.0]);
    s.rule = MergeRule::Merges(vec![("a".into(), "a".into())]);
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::InvalidVocab(_))
    ));
}

#[test]
fn unknown_token_used_without_byte_tokens() {
    use TokenKind::*;
    let tok = Tokenizer::from_spec(VocabSpec {
        tokens: vec!["<unk>".into(), "a".into()],
        kinds: vec![Unknown, Normal],
        rule: MergeRule::Scores(vec![0.0, 0.0]),
        bos_id: None,
        eos_id: None,
        unk_id: Some(0),
        pad_id: None,
        add_bos: false,
        add_space_prefix: false,
        ignore_merges: false,
    })
    .unwrap();
    assert_eq!(tok.encode("aé", true), vec![1, 0, 0]);
}

#[test]
fn bad_tokenizer_json_is_a_clear_error() {
    assert!(matches!(
        Tokenizer::from_hf_json("{", None),
        Err(TokenizerError::Json { .. })
    ));
    let unigram = r#"{"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},"model":{"type":"Unigram","vocab":{}}}"#;
    assert!(matches!(
        Tokenizer::from_hf_json(unigram, None),
        Err(TokenizerError::Unsupported(_))
    ));
    let nfkc =
        r#"{"normalizer":{"type":"NFKC"},"model":{"type":"BPE","vocab":{"<unk>":0},"merges":[]}}"#;
    assert!(matches!(
        Tokenizer::from_hf_json(nfkc, None),
        Err(TokenizerError::Unsupported(_))
    ));
    let gap = r#"{"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},"model":{"type":"BPE","vocab":{"<unk>":0,"a":2},"merges":[]}}"#;
    assert!(matches!(
        Tokenizer::from_hf_json(gap, None),
        Err(TokenizerError::InvalidVocab(_))
    ));
    let huge = r#"{"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},"model":{"type":"BPE","vocab":{"<unk>":0,"a":4294967295},"merges":[]}}"#;
    assert!(matches!(
        Tokenizer::from_hf_json(huge, None),
        Err(TokenizerError::InvalidVocab(_))
    ));
    // Legacy "a b" merge strings are accepted.
    let legacy = r#"{"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},"model":{"type":"BPE","unk_token":"<unk>","vocab":{"<unk>":0,"a":1,"b":2,"ab":3},"merges":["a b"]}}"#;
    let tok = Tokenizer::from_hf_json(legacy, None).unwrap();
    assert_eq!(tok.encode("ab", false), vec![3]);
    assert_eq!(tok.token_kind(0), Some(TokenKind::Unknown));
}

#[test]
fn hf_dir_loading_and_template() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures().join("tiny_tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    assert!(hf_chat_template(dir.path()).unwrap().is_none());
    std::fs::copy(
        fixtures().join("tiny_tokenizer_config.json"),
        dir.path().join("tokenizer_config.json"),
    )
    .unwrap();
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(
        Tokenizer::from_model_path(dir.path()).unwrap().vocab_size(),
        tok.vocab_size()
    );
    let src = hf_chat_template(dir.path()).unwrap().unwrap();
    let t = ChatTemplate::for_model(Some(&src), &tok).unwrap();
    let s = t.render(&[ChatMessage::user(" hello ")], true).unwrap();
    assert_eq!(
        s,
        "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n"
    );
    let e = tok.encode(&s, false);
    assert_eq!(e[0], 2);
    assert_eq!(tok.decode(&e, false).unwrap(), s);
    // chat_template.jinja wins over tokenizer_config.json.
    std::fs::write(dir.path().join("chat_template.jinja"), "X").unwrap();
    assert_eq!(hf_chat_template(dir.path()).unwrap().unwrap(), "X");
    // Missing directory: an I/O error naming the file.
    assert!(matches!(
        Tokenizer::from_hf_dir(&dir.path().join("nope")),
        Err(TokenizerError::Io { .. })
    ));
}

/// Text without control-token strings (no `<`) and without a literal `▁`, which SentencePiece
/// vocabularies use for the space and so decode as one.
fn plain_text() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[^<\u{2581}]{0,64}").unwrap()
}

proptest! {
    #[test]
    fn prop_roundtrip_text(s in plain_text()) {
        let tok = tiny();
        let e = tok.encode(&s, false);
        prop_assert_eq!(tok.decode(&e, false).unwrap(), s.clone());
        let scored = tiny_scored();
        prop_assert_eq!(scored.decode(&scored.encode(&s, false), true).unwrap(), s);
    }

    #[test]
    fn prop_arbitrary_text_never_panics(s in any::<String>()) {
        let tok = tiny();
        let e = tok.encode(&s, true);
        let _ = tok.decode(&e, false).unwrap();
    }

    #[test]
    fn prop_arbitrary_ids_never_panic(ids in proptest::collection::vec(any::<u32>(), 0..32), small in proptest::collection::vec(0u32..300, 0..32)) {
        let tok = tiny();
        for list in [&ids, &small] {
            let r = tok.decode(list, false);
            let in_range = list.iter().all(|&i| (i as usize) < tok.vocab_size());
            prop_assert_eq!(r.is_ok(), in_range);
            let mut sd = tok.stream_decoder(true);
            let mut streamed = String::new();
            let mut ok = true;
            for &id in list.iter() {
                match sd.push(id) {
                    Ok(s) => streamed.push_str(&s),
                    Err(_) => { ok = false; break; }
                }
            }
            streamed.push_str(&sd.finish());
            prop_assert_eq!(ok, in_range);
            if in_range {
                prop_assert_eq!(streamed, tok.decode(list, true).unwrap());
            }
        }
    }
}

#[test]
fn roundtrip_report_on_id_lists_and_records() {
    let tok = tiny();
    let canonical = tok.encode("<bos>hello world<end_of_turn>\n", false);
    let hello = tok.token_to_id("hello").unwrap();
    let h = tok.token_to_id("h").unwrap();
    let e = tok.token_to_id("e").unwrap();
    let llo = tok.token_to_id("llo").unwrap();
    // "h","e","llo" decodes to "hello", which re-encodes as the single token.
    let split = vec![h, e, llo];
    let rep = hayai_tokenizer::roundtrip_report(&tok, &[canonical.clone(), split]).unwrap();
    assert_eq!(rep.records, 2);
    assert_eq!(rep.records_exact, 1);
    assert_eq!(rep.tokens, canonical.len() + 3);
    assert_eq!(rep.tokens_in_exact_records, canonical.len());
    assert_eq!(rep.tokens_common_prefix, canonical.len());
    assert_eq!(rep.records_text_stable, 2);
    assert_eq!(rep.mismatches.len(), 1);
    assert_eq!(rep.mismatches[0].id, "#1");
    assert_eq!(rep.mismatches[0].got, vec![hello]);
    assert!(rep.to_string().contains("1/2 records exact"));
    assert!(serde_json::to_string(&rep)
        .unwrap()
        .contains("\"records_exact\":1"));

    let jsonl =
        format!("{{\"id\":\"a\",\"context_token_ids\":[2,{hello}],\"target_token_ids\":[1]}}\n\n");
    let recs = hayai_tokenizer::parse_ppl_records(&jsonl).unwrap();
    assert_eq!(recs[0].all_ids(), vec![2, hello, 1]);
    let rep = hayai_tokenizer::roundtrip_report(&tok, &recs).unwrap();
    assert_eq!(rep.records_exact, 1);
    assert!(hayai_tokenizer::parse_ppl_records("{\"id\":1}").is_err());
    // Out-of-range ids are an error, not a panic.
    assert!(hayai_tokenizer::roundtrip_report(&tok, &[vec![9999u32]]).is_err());
}

#[test]
fn tokenizer_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<ChatTemplate>();
}

#[test]
fn specials_are_cut_longest_token_first() {
    use TokenKind::*;
    // llama.cpp order: all matches of the longest special token first, so "bcd" wins over the
    // earlier-starting "ab" in "abcd" (a leftmost-longest matcher would pick "ab").
    let tok = Tokenizer::from_spec(VocabSpec {
        tokens: ["<unk>", "ab", "bcd", "a", "d", "x"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        kinds: vec![Unknown, UserDefined, UserDefined, Normal, Normal, Normal],
        rule: MergeRule::Scores(vec![0.0; 6]),
        bos_id: None,
        eos_id: None,
        unk_id: Some(0),
        pad_id: None,
        add_bos: false,
        add_space_prefix: false,
        ignore_merges: false,
    })
    .unwrap();
    assert_eq!(tok.encode("abcd", false), vec![3, 2]);
    assert_eq!(tok.encode("abxbcd", false), vec![1, 5, 2]);
    assert_eq!(tok.encode("ababab", false), vec![1, 1, 1]);
    assert_eq!(tok.decode(&[3, 2], false).unwrap(), "abcd");
}
