//! Deterministic test doubles shared by the tests and the toy server example: a 64-token
//! "model" whose next token is a fixed function of the previous token and its position, and a
//! character-level text model for it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use hayai_model::{ModelError, Rows, Runner, RunnerInfo};
use hayai_server::{ChatMessage, TextModel};

pub const VOCAB: usize = 64;
pub const PAD: u32 = 0;
pub const EOS: u32 = 1;
pub const BOS: u32 = 2;
/// Turn marker: a special token that also ends generation (like `<end_of_turn>`).
pub const TURN: u32 = 3;
/// Ids 4..=61 are these characters, in order.
pub const ALPHABET: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,!?:\n";
/// Byte tokens: 62 = 0xC3 and 63 = 0xA9, which together spell "é".
pub const BYTE_C3: u32 = 62;
pub const BYTE_A9: u32 = 63;

pub fn char_id(c: char) -> u32 {
    4 + ALPHABET
        .chars()
        .position(|a| a == c)
        .expect("char in alphabet") as u32
}

/// The toy model's greedy rule: the token after `prev` at position `pos`.
pub fn next_token(prev: u32, pos: usize) -> u32 {
    if prev == char_id('!') {
        EOS
    } else if prev == BYTE_C3 {
        BYTE_A9
    } else {
        4 + ((prev as usize * 7 + pos * 3) % 59) as u32
    }
}

/// The logits row for token `tok` at position `pos`: a clear peak at `next_token`, and a small
/// position-dependent ripple elsewhere so log-probabilities are not trivial.
pub fn logits_row(tok: u32, pos: usize) -> Vec<f32> {
    let target = next_token(tok, pos) as usize;
    (0..VOCAB)
        .map(|j| {
            if j == target {
                8.0
            } else {
                ((j * 13 + pos) % 10) as f32 * 0.1
            }
        })
        .collect()
}

/// Log-softmax of `logits_row(tok, pos)` at `id`, in f64.
pub fn logprob(tok: u32, pos: usize, id: u32) -> f64 {
    let row = logits_row(tok, pos);
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row[id as usize] as f64 - lse
}

/// Plain greedy decoding with the toy rule: the reference the server is checked against.
pub fn greedy(prompt: &[u32], max_tokens: usize, stops: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut prev = *prompt.last().unwrap();
    let mut pos = prompt.len() - 1;
    while out.len() < max_tokens {
        let t = next_token(prev, pos);
        out.push(t);
        if stops.contains(&t) {
            break;
        }
        prev = t;
        pos += 1;
    }
    out
}

/// Knobs and observations shared between a test and its runner.
#[derive(Default)]
pub struct Controls {
    paused: Mutex<bool>,
    resume: Condvar,
    pub step_delay_us: AtomicU64,
    pub panic_next: AtomicBool,
    /// The prompt of every sequence started (the engine truncates to 0 per request).
    pub prompts: Mutex<Vec<Vec<u32>>>,
    /// Tokens fed after the prompt, in total.
    pub decode_tokens: AtomicUsize,
    /// Set by the runner while a forward call is blocked on the pause gate.
    pub waiting: AtomicBool,
}

impl Controls {
    pub fn pause(&self) {
        *self.paused.lock().unwrap() = true;
    }

    pub fn resume(&self) {
        *self.paused.lock().unwrap() = false;
        self.resume.notify_all();
    }

    fn gate(&self) {
        let mut p = self.paused.lock().unwrap();
        while *p {
            self.waiting.store(true, Ordering::SeqCst);
            p = self.resume.wait(p).unwrap();
        }
        self.waiting.store(false, Ordering::SeqCst);
    }
}

pub struct ToyRunner {
    info: RunnerInfo,
    tokens: Vec<u32>,
    pub controls: Arc<Controls>,
}

impl ToyRunner {
    pub fn new(max_context: usize) -> (Self, Arc<Controls>) {
        let controls = Arc::new(Controls::default());
        (
            ToyRunner {
                info: RunnerInfo {
                    vocab_size: VOCAB,
                    max_context,
                    eos_token_ids: vec![EOS],
                    backend: "toy".into(),
                },
                tokens: Vec::new(),
                controls: controls.clone(),
            },
            controls,
        )
    }
}

impl Runner for ToyRunner {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
    }

    fn forward(
        &mut self,
        tokens: &[u32],
        rows: Rows,
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        self.controls.gate();
        if self.controls.panic_next.swap(false, Ordering::SeqCst) {
            panic!("toy runner: injected failure");
        }
        let delay = self.controls.step_delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= VOCAB) {
            return Err(ModelError::TokenOutOfRange { id, vocab: VOCAB });
        }
        if self.tokens.len() + tokens.len() > self.info.max_context {
            return Err(ModelError::ContextOverflow {
                len: self.tokens.len() + tokens.len(),
                max: self.info.max_context,
            });
        }
        if self.tokens.is_empty() {
            self.controls.prompts.lock().unwrap().push(tokens.to_vec());
        } else {
            self.controls
                .decode_tokens
                .fetch_add(tokens.len(), Ordering::SeqCst);
        }
        let start = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        for (i, &t) in tokens.iter().enumerate() {
            if rows == Rows::All || i + 1 == tokens.len() {
                sink(i, &logits_row(t, start + i));
            }
        }
        Ok(())
    }
}

/// Character-level text model for [`ToyRunner`]. Chat template:
/// `<bos>` then `<turn>role:content\n` per message, then `<turn>assistant:`.
pub struct ToyText;

impl TextModel for ToyText {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        let mut ids = Vec::new();
        if add_special_tokens {
            ids.push(BOS);
        }
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let special = [
                ("<bos>", BOS),
                ("<eos>", EOS),
                ("<turn>", TURN),
                ("<pad>", PAD),
            ]
            .into_iter()
            .find(|(s, _)| rest.starts_with(s));
            if let Some((s, id)) = special {
                ids.push(id);
                rest = &rest[s.len()..];
                continue;
            }
            if c == 'é' {
                ids.extend([BYTE_C3, BYTE_A9]);
            } else if let Some(p) = ALPHABET.chars().position(|a| a == c) {
                ids.push(4 + p as u32);
            } else {
                return Err(format!("character {c:?} is not in the toy vocabulary"));
            }
            rest = &rest[c.len_utf8()..];
        }
        Ok(ids)
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            match id {
                0..=3 => {}
                BYTE_C3 => bytes.push(0xC3),
                BYTE_A9 => bytes.push(0xA9),
                i if (i as usize) < VOCAB => {
                    let c = ALPHABET.chars().nth(i as usize - 4).unwrap();
                    let mut buf = [0u8; 4];
                    bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                _ => {}
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn token_text(&self, id: u32) -> String {
        match id {
            PAD => "<pad>".into(),
            EOS => "<eos>".into(),
            BOS => "<bos>".into(),
            TURN => "<turn>".into(),
            _ => self.decode(&[id]),
        }
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let mut s = String::from("<bos>");
        for m in messages {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                return Err(format!("unknown role {:?}", m.role));
            }
            s.push_str(&format!("<turn>{}:{}\n", m.role, m.content));
        }
        if add_generation_prompt {
            s.push_str("<turn>assistant:");
        }
        Ok(s)
    }

    fn stop_token_ids(&self) -> Vec<u32> {
        vec![TURN]
    }
}
