//! The text side of the server: what it needs from a tokenizer and chat template, and the
//! incremental detokenizer used for streaming and stop strings.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One chat turn after request parsing (content parts already joined to plain text).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Tokenizer + chat template, as the server sees them. Implemented for the real tokenizer by
/// [`crate::HayaiText`] and by small doubles in tests.
pub trait TextModel: Send + Sync + 'static {
    /// Text to ids. Special-token markup in `text` (e.g. `<start_of_turn>`) is parsed into its
    /// ids; `add_special_tokens` adds the BOS token in front.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String>;

    /// Ids to text, skipping special tokens (BOS, EOS, turn markers). Invalid UTF-8 from
    /// partial byte tokens becomes U+FFFD.
    fn decode(&self, ids: &[u32]) -> String;

    /// The text of one token for logprob listings; special tokens are shown, not skipped.
    fn token_text(&self, id: u32) -> String {
        self.decode(&[id])
    }

    /// Apply the chat template.
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, String>;

    /// Token ids that end generation besides the model's EOS set (e.g. `<end_of_turn>`).
    fn stop_token_ids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// How many prompt tokens seed the detokenizer, so the first generated token decodes with the
/// same leading-space handling it has inside a longer text.
const CONTEXT_TOKENS: usize = 5;

/// Turns a growing id sequence into text, emitting only complete UTF-8.
///
/// Decoding the whole sequence at every token is quadratic; instead two short windows are
/// decoded (`[prefix..read]` and `[prefix..]`) and the difference is the new text. A window
/// that ends in an incomplete character (U+FFFD at the end) waits for the next token.
pub struct IncrementalDecoder {
    text_model: Arc<dyn TextModel>,
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    /// Number of leading ids that belong to the prompt context.
    ctx: usize,
    text: String,
}

impl IncrementalDecoder {
    pub fn new(text_model: Arc<dyn TextModel>, prompt: &[u32]) -> Self {
        let start = prompt.len().saturating_sub(CONTEXT_TOKENS);
        let ids = prompt[start..].to_vec();
        let n = ids.len();
        IncrementalDecoder {
            text_model,
            ids,
            prefix: 0,
            read: n,
            ctx: n,
            text: String::new(),
        }
    }

    /// Generated text so far (complete characters only).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Generated ids so far.
    pub fn generated(&self) -> &[u32] {
        &self.ids[self.ctx..]
    }

    pub fn push(&mut self, id: u32) {
        self.ids.push(id);
        self.advance(false);
    }

    /// Emit whatever is still pending, incomplete characters included (end of generation).
    pub fn finish(&mut self) {
        if self.read < self.ids.len() {
            self.advance(true);
        }
    }

    fn advance(&mut self, force: bool) {
        let tm = &self.text_model;
        let before = tm.decode(&self.ids[self.prefix..self.read]);
        let after = tm.decode(&self.ids[self.prefix..]);
        if !force && after.ends_with('\u{FFFD}') {
            return;
        }
        let new = if after.len() >= before.len() && after.starts_with(&before) {
            &after[before.len()..]
        } else if after.len() > before.len() && after.is_char_boundary(before.len()) {
            // The window re-segmented (rare): keep the length-based difference.
            &after[before.len()..]
        } else {
            ""
        };
        self.text.push_str(new);
        self.prefix = self.read;
        self.read = self.ids.len();
    }
}

/// Text of `generated` as it reads after `prompt` (same rule as [`IncrementalDecoder`], in one
/// pass; used when nothing needs the text before the end).
pub fn decode_after(text_model: &Arc<dyn TextModel>, prompt: &[u32], generated: &[u32]) -> String {
    let mut d = IncrementalDecoder::new(text_model.clone(), prompt);
    d.ids.extend_from_slice(generated);
    d.finish();
    d.text
}

/// Finds stop strings in growing text and decides how much of it is safe to stream.
pub struct StopMatcher {
    stops: Vec<String>,
    longest: usize,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let longest = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        StopMatcher { stops, longest }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Earliest stop-string match in `text` that ends after byte `old_len` (text before that was
    /// already searched). Returns the byte offset where the match starts.
    pub fn find(&self, text: &str, old_len: usize) -> Option<usize> {
        if self.stops.is_empty() {
            return None;
        }
        let from = floor_boundary(text, old_len.saturating_sub(self.longest.saturating_sub(1)));
        let hay = &text[from..];
        self.stops
            .iter()
            .filter_map(|s| hay.find(s.as_str()))
            .min()
            .map(|p| from + p)
    }

    /// Length of the prefix of `text` that cannot become part of a stop string later.
    pub fn safe_len(&self, text: &str) -> usize {
        if self.stops.is_empty() {
            return text.len();
        }
        floor_boundary(text, text.len().saturating_sub(self.longest - 1))
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each id is one byte of UTF-8, so multi-byte characters span several ids.
    struct Bytes;
    impl TextModel for Bytes {
        fn encode(&self, text: &str, _: bool) -> Result<Vec<u32>, String> {
            Ok(text.bytes().map(u32::from).collect())
        }
        fn decode(&self, ids: &[u32]) -> String {
            let b: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
            String::from_utf8_lossy(&b).into_owned()
        }
        fn render_chat(&self, _: &[ChatMessage], _: bool) -> Result<String, String> {
            Err("none".into())
        }
    }

    #[test]
    fn incremental_decoder_waits_for_complete_characters() {
        let tm: Arc<dyn TextModel> = Arc::new(Bytes);
        let prompt = tm.encode("héllo ", false).unwrap();
        let gen = tm.encode("wörld €!", false).unwrap();
        let mut d = IncrementalDecoder::new(tm.clone(), &prompt);
        let mut seen = Vec::new();
        for &id in &gen {
            d.push(id);
            assert!(!d.text().contains('\u{FFFD}'), "partial char emitted");
            seen.push(d.text().to_string());
        }
        d.finish();
        assert_eq!(d.text(), "wörld €!");
        assert_eq!(decode_after(&tm, &prompt, &gen), "wörld €!");
        // The text only ever grows.
        for w in seen.windows(2) {
            assert!(w[1].starts_with(&w[0]));
        }
    }

    #[test]
    fn finish_flushes_incomplete_bytes() {
        let tm: Arc<dyn TextModel> = Arc::new(Bytes);
        let mut d = IncrementalDecoder::new(tm, &[]);
        d.push(b'a' as u32);
        d.push(0xE2);
        assert_eq!(d.text(), "a");
        d.finish();
        assert_eq!(d.text(), "a\u{FFFD}");
    }

    #[test]
    fn stop_matcher_finds_across_pushes_and_holds_back() {
        let m = StopMatcher::new(vec!["END".into(), "".into(), "xy".into()]);
        assert_eq!(m.find("abcEN", 0), None);
        assert_eq!(m.find("abcEND", 5), Some(3));
        assert_eq!(m.find("abxyzEND", 0), Some(2));
        assert_eq!(m.safe_len("abcde"), 3);
        assert_eq!(m.safe_len("a"), 0);
        assert_eq!(m.safe_len("aé"), 1);
        let none = StopMatcher::new(vec![]);
        assert!(none.is_empty());
        assert_eq!(none.safe_len("abc"), 3);
        assert_eq!(none.find("abc", 0), None);
    }
}
