//! [`TextModel`] for the real Gemma tokenizer and chat template.

use std::sync::Arc;

use hayai_tokenizer::{ChatTemplate, TokenKind, Tokenizer, TokenizerError, SPACE_MARK};

use crate::text::{ChatMessage, TextModel};

/// The Gemma tokenizer plus the model's chat template, as the server uses them.
pub struct HayaiText {
    tok: Arc<Tokenizer>,
    template: ChatTemplate,
}

impl HayaiText {
    pub fn new(tok: Arc<Tokenizer>, template: ChatTemplate) -> Self {
        HayaiText { tok, template }
    }

    /// The model's own template source if it has one, else the built-in Gemma format matching
    /// the vocabulary.
    pub fn for_model(
        tok: Arc<Tokenizer>,
        template_source: Option<&str>,
    ) -> Result<Self, TokenizerError> {
        let template = ChatTemplate::for_model(template_source, &tok)?;
        Ok(HayaiText { tok, template })
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }
}

impl TextModel for HayaiText {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        Ok(self.tok.encode(text, add_special_tokens))
    }

    fn decode(&self, ids: &[u32]) -> String {
        match self.tok.decode(ids, true) {
            Ok(s) => s,
            // The model's output layer may be wider than the tokenizer's vocabulary; ids
            // without a text contribute nothing.
            Err(_) => {
                let known: Vec<u32> = ids
                    .iter()
                    .copied()
                    .filter(|&i| (i as usize) < self.tok.vocab_size())
                    .collect();
                self.tok.decode(&known, true).unwrap_or_default()
            }
        }
    }

    fn token_text(&self, id: u32) -> String {
        // The piece itself (with `▁` as a space), so special and byte tokens stay visible.
        match (self.tok.id_to_token(id), self.tok.token_kind(id)) {
            (Some(s), Some(TokenKind::Normal)) => s.replace(SPACE_MARK, " "),
            (Some(s), _) => s.to_string(),
            (None, _) => String::new(),
        }
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let msgs: Vec<hayai_tokenizer::ChatMessage> = messages
            .iter()
            .map(|m| hayai_tokenizer::ChatMessage::new(m.role.clone(), m.content.clone()))
            .collect();
        self.template
            .render(&msgs, add_generation_prompt)
            .map_err(|e| e.to_string())
    }

    fn stop_token_ids(&self) -> Vec<u32> {
        self.tok.stop_ids().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hayai_tokenizer::{ChatFamily, MergeRule, VocabSpec};

    /// A tiny Gemma-like vocabulary: specials, a few pieces and byte fallback for "é".
    fn tokenizer() -> Arc<Tokenizer> {
        let mut tokens: Vec<String> = [
            "<pad>",
            "<eos>",
            "<bos>",
            "<unk>",
            "<start_of_turn>",
            "<end_of_turn>",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut kinds = vec![
            TokenKind::Control,
            TokenKind::Control,
            TokenKind::Control,
            TokenKind::Unknown,
            TokenKind::Control,
            TokenKind::Control,
        ];
        for p in [
            "▁", "h", "i", "▁hi", "user", "model", "\n", "t", "he", "▁the",
        ] {
            tokens.push(p.to_string());
            kinds.push(TokenKind::Normal);
        }
        for b in [0xC3u8, 0xA9] {
            tokens.push(format!("<0x{b:02X}>"));
            kinds.push(TokenKind::Byte);
        }
        let scores = (0..tokens.len()).map(|i| i as f32 * 0.01).collect();
        Arc::new(
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
            .unwrap(),
        )
    }

    #[test]
    fn adapter_encodes_decodes_and_renders() {
        let tok = tokenizer();
        let text = HayaiText::new(tok.clone(), ChatTemplate::builtin(ChatFamily::Gemma3));
        let ids = text.encode("hi the", true).unwrap();
        assert_eq!(ids[0], 2);
        assert_eq!(text.decode(&ids), "hi the");
        // Special markup is parsed; decoding skips specials.
        let ids = text
            .encode("<start_of_turn>hi<end_of_turn>", false)
            .unwrap();
        assert_eq!(ids.first(), Some(&4));
        assert_eq!(ids.last(), Some(&5));
        assert_eq!(text.decode(&ids), "hi");
        assert_eq!(text.token_text(4), "<start_of_turn>");
        assert_eq!(text.token_text(9), " hi");
        // Byte fallback round trip; out-of-range ids are dropped, not a panic.
        let e = text.encode("é", false).unwrap();
        assert_eq!(text.decode(&e), "é");
        assert_eq!(text.decode(&[7, 8, 10_000]), "hi");
        assert!(text.stop_token_ids().contains(&5));
        let chat = text
            .render_chat(
                &[ChatMessage {
                    role: "user".into(),
                    content: "hi".into(),
                }],
                true,
            )
            .unwrap();
        assert!(
            chat.starts_with("<bos><start_of_turn>user\nhi<end_of_turn>\n"),
            "{chat:?}"
        );
        assert!(chat.ends_with("<start_of_turn>model\n"), "{chat:?}");
        assert!(text
            .render_chat(
                &[ChatMessage {
                    role: "robot".into(),
                    content: "x".into(),
                }],
                true
            )
            .is_err());
    }
}
