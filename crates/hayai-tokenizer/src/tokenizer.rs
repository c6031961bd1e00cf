//! The Gemma tokenizer: SentencePiece-style BPE over `▁`-escaped text with byte fallback.
//!
//! Two merge rules are supported, matching the two ways Gemma vocabularies ship:
//! * [`MergeRule::Scores`] — GGUF `tokenizer.ggml.model = "llama"`: no merge list; the adjacent pair whose
//!   concatenation is a vocabulary token with the highest score is merged first (ties: leftmost). This
//!   is llama.cpp's SPM algorithm, which the reference token ids come from.
//! * [`MergeRule::Merges`] — GGUF `"gemma4"` and HF `tokenizer.json`: an explicit ranked merge list
//!   (lowest rank first, ties leftmost).
//!
//! Special-token strings (control, user-defined and unknown tokens) are cut out of the text before
//! merging, longest token first, as llama.cpp does.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::{Result, TokenizerError};
use crate::fxhash::FxMap;

/// The escaped form of a space inside vocabulary pieces.
pub const SPACE_MARK: char = '\u{2581}';

/// What a vocabulary entry is; decides splitting and decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    /// Decode a GGUF `tokenizer.ggml.token_type` value (SentencePiece piece types).
    pub fn from_gguf(code: i32) -> Result<Self> {
        Ok(match code {
            // 0 is "undefined"; llama.cpp treats such pieces as normal text.
            0 | 1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            other => {
                return Err(TokenizerError::InvalidVocab(format!(
                    "unknown token type code {other}"
                )))
            }
        })
    }

    /// Tokens whose text is matched verbatim in the input before merging.
    fn is_splittable(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }

    /// Tokens dropped by `decode(.., skip_special = true)`.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused
        )
    }
}

/// How adjacent pieces are merged.
#[derive(Clone, Debug)]
pub enum MergeRule {
    /// One score per token; highest-scoring vocabulary concatenation merges first.
    Scores(Vec<f32>),
    /// Ranked merge list (first = highest priority), as pairs of token strings.
    Merges(Vec<(String, String)>),
}

/// Everything needed to build a [`Tokenizer`], independent of the file format it came from.
#[derive(Clone, Debug)]
pub struct VocabSpec {
    pub tokens: Vec<String>,
    pub kinds: Vec<TokenKind>,
    pub rule: MergeRule,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// Whether `encode(.., add_bos = true)` should prepend BOS by default for this model
    /// (reported by [`Tokenizer::add_bos_default`]).
    pub add_bos: bool,
    /// Prepend `▁` to every text fragment that follows a special token or the start of input.
    pub add_space_prefix: bool,
    /// HF BPE option: look a whole fragment up in the vocabulary before merging.
    pub ignore_merges: bool,
}

enum Algo {
    Scores(Vec<f32>),
    Merges {
        /// (left id, right id) -> (rank, merged id)
        table: FxMap<(u32, u32), (u32, u32)>,
        ignore_merges: bool,
    },
}

/// Byte trie over the special-token strings; the root is a flat table because every input byte
/// position probes it.
struct SpecialTrie {
    root: Box<[u32; 256]>,
    nodes: Vec<TrieNode>,
}

#[derive(Default)]
struct TrieNode {
    edges: Vec<(u8, u32)>,
    token: Option<u32>,
}

impl SpecialTrie {
    fn new() -> Self {
        SpecialTrie {
            root: Box::new([0; 256]),
            // Node 0 is a placeholder so that 0 in `root` means "no edge".
            nodes: vec![TrieNode::default()],
        }
    }

    fn insert(&mut self, text: &[u8], id: u32) {
        let Some((&first, rest)) = text.split_first() else {
            return;
        };
        let mut node = match self.root[first as usize] {
            0 => {
                self.nodes.push(TrieNode::default());
                let n = (self.nodes.len() - 1) as u32;
                self.root[first as usize] = n;
                n
            }
            n => n,
        };
        for &b in rest {
            let edges = &self.nodes[node as usize].edges;
            node = match edges.binary_search_by_key(&b, |e| e.0) {
                Ok(i) => edges[i].1,
                Err(i) => {
                    self.nodes.push(TrieNode::default());
                    let n = (self.nodes.len() - 1) as u32;
                    self.nodes[node as usize].edges.insert(i, (b, n));
                    n
                }
            };
        }
        self.nodes[node as usize].token = Some(id);
    }

    /// Calls `f(end, id)` for every special token that starts at `start`.
    fn matches_at(&self, text: &[u8], start: usize, mut f: impl FnMut(usize, u32)) {
        let mut node = self.root[text[start] as usize];
        if node == 0 {
            return;
        }
        let mut pos = start + 1;
        loop {
            let n = &self.nodes[node as usize];
            if let Some(id) = n.token {
                f(pos, id);
            }
            if pos >= text.len() || n.edges.is_empty() {
                return;
            }
            match n.edges.binary_search_by_key(&text[pos], |e| e.0) {
                Ok(i) => node = n.edges[i].1,
                Err(_) => return,
            }
            pos += 1;
        }
    }
}

/// A piece of input after special-token splitting.
#[derive(Debug, PartialEq, Eq)]
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Options for [`Tokenizer::encode_with`].
#[derive(Clone, Copy, Debug)]
pub struct EncodeOptions {
    pub add_bos: bool,
    /// Match control/unknown token strings (`<start_of_turn>`, `<bos>`, ...) in the text.
    /// User-defined tokens (whitespace runs, HTML tags) are always matched, as in llama.cpp.
    pub parse_special: bool,
}

/// Gemma tokenizer. Cheap to share (`Arc<Tokenizer>`); all methods take `&self`.
pub struct Tokenizer {
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    token_to_id: FxMap<String, u32>,
    algo: Algo,
    byte_ids: [Option<u32>; 256],
    specials: SpecialTrie,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    unk_id: Option<u32>,
    pad_id: Option<u32>,
    add_bos: bool,
    add_space_prefix: bool,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field(
                "rule",
                &match self.algo {
                    Algo::Scores(_) => "scores",
                    Algo::Merges { .. } => "merges",
                },
            )
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

/// Parse `<0xAB>` into its byte value.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Names of turn-end / tool tokens that stop generation when present (Gemma 3 and Gemma 4).
const STOP_TOKEN_NAMES: &[&str] = &["<end_of_turn>", "<turn|>", "<|tool_response>"];

impl Tokenizer {
    /// Build a tokenizer from a format-independent vocabulary description.
    pub fn from_spec(spec: VocabSpec) -> Result<Self> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::InvalidVocab("empty vocabulary".into()));
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::InvalidVocab("vocabulary too large".into()));
        }
        if spec.kinds.len() != n {
            return Err(TokenizerError::InvalidVocab(format!(
                "{} tokens but {} token types",
                n,
                spec.kinds.len()
            )));
        }
        for (name, id) in [
            ("bos", spec.bos_id),
            ("eos", spec.eos_id),
            ("unk", spec.unk_id),
            ("pad", spec.pad_id),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(TokenizerError::InvalidVocab(format!(
                        "{name} token id {id} out of range (vocabulary size {n})"
                    )));
                }
            }
        }

        let mut token_to_id = FxMap::with_capacity_and_hasher(n, Default::default());
        let mut byte_ids = [None; 256];
        let mut specials = SpecialTrie::new();
        for (i, (text, &kind)) in spec.tokens.iter().zip(&spec.kinds).enumerate() {
            let id = i as u32;
            if text.is_empty() {
                continue;
            }
            // Duplicate texts: the later id wins, as in llama.cpp's loader.
            token_to_id.insert(text.clone(), id);
            if kind == TokenKind::Byte {
                let b = parse_byte_token(text).ok_or_else(|| {
                    TokenizerError::InvalidVocab(format!(
                        "byte token {id} has text {text:?}, expected <0xXX>"
                    ))
                })?;
                byte_ids[b as usize] = Some(id);
            }
            if kind.is_splittable() {
                specials.insert(text.as_bytes(), id);
            }
        }
        if spec.unk_id.is_none() && byte_ids.iter().any(|b| b.is_none()) {
            return Err(TokenizerError::InvalidVocab(
                "neither a complete set of <0xXX> byte tokens nor an unknown token: some text could not be encoded".into(),
            ));
        }

        let algo = match spec.rule {
            MergeRule::Scores(scores) => {
                if scores.len() != n {
                    return Err(TokenizerError::InvalidVocab(format!(
                        "{} tokens but {} scores",
                        n,
                        scores.len()
                    )));
                }
                Algo::Scores(scores)
            }
            MergeRule::Merges(merges) => {
                let mut table = FxMap::with_capacity_and_hasher(merges.len(), Default::default());
                for (rank, (a, b)) in merges.iter().enumerate() {
                    let lookup = |s: &str| {
                        token_to_id.get(s).copied().ok_or_else(|| {
                            TokenizerError::InvalidVocab(format!(
                                "merge {rank} ({a:?} {b:?}) uses {s:?}, which is not in the vocabulary"
                            ))
                        })
                    };
                    let ia = lookup(a)?;
                    let ib = lookup(b)?;
                    let merged = lookup(&format!("{a}{b}"))?;
                    // A repeated pair keeps its first (best) rank.
                    table.entry((ia, ib)).or_insert((rank as u32, merged));
                }
                Algo::Merges {
                    table,
                    ignore_merges: spec.ignore_merges,
                }
            }
        };

        let mut stop_ids: Vec<u32> = spec.eos_id.into_iter().collect();
        for name in STOP_TOKEN_NAMES {
            if let Some(&id) = token_to_id.get(*name) {
                if spec.kinds[id as usize] != TokenKind::Normal && !stop_ids.contains(&id) {
                    stop_ids.push(id);
                }
            }
        }

        Ok(Tokenizer {
            tokens: spec.tokens,
            kinds: spec.kinds,
            token_to_id,
            algo,
            byte_ids,
            specials,
            bos_id: spec.bos_id,
            eos_id: spec.eos_id,
            unk_id: spec.unk_id,
            pad_id: spec.pad_id,
            add_bos: spec.add_bos,
            add_space_prefix: spec.add_space_prefix,
            stop_ids,
        })
    }

    // ----------------------------------------------------------------- vocabulary queries

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.token_to_id.get(token).copied()
    }

    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// The model's own `add_bos_token` setting (true for Gemma 3 GGUF, false for Gemma 4 HF, whose chat
    /// template writes `<bos>` itself).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Id of a special (non-normal) token by its text, e.g. `<start_of_turn>`.
    pub fn special_id(&self, text: &str) -> Option<u32> {
        let id = self.token_to_id(text)?;
        (self.kinds[id as usize] != TokenKind::Normal).then_some(id)
    }

    /// Turn-start marker: `<start_of_turn>` (Gemma 3) or `<|turn>` (Gemma 4).
    pub fn turn_start_id(&self) -> Option<u32> {
        self.special_id("<|turn>")
            .or_else(|| self.special_id("<start_of_turn>"))
    }

    /// Turn-end marker: `<end_of_turn>` (Gemma 3) or `<turn|>` (Gemma 4).
    pub fn turn_end_id(&self) -> Option<u32> {
        self.special_id("<turn|>")
            .or_else(|| self.special_id("<end_of_turn>"))
    }

    /// Tokens that end generation: EOS plus whichever of `<end_of_turn>`, `<turn|>`,
    /// `<|tool_response>` the vocabulary has as special tokens (Gemma 3: {1, 106}; Gemma 4: {1, 106, 50}).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.contains(&id)
    }

    // ----------------------------------------------------------------- encoding

    /// Encode text; special-token strings in it become their tokens. `add_bos` prepends BOS (if the
    /// vocabulary has one).
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_with(
            text,
            EncodeOptions {
                add_bos,
                parse_special: true,
            },
        )
    }

    pub fn encode_with(&self, text: &str, opts: EncodeOptions) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if opts.add_bos {
            if let Some(bos) = self.bos_id {
                out.push(bos);
            }
        }
        let mut prev_special = true;
        let mut scratch = String::new();
        for frag in self.split_specials(text, opts.parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    scratch.clear();
                    if self.add_space_prefix && prev_special {
                        scratch.push(SPACE_MARK);
                    }
                    for c in t.chars() {
                        scratch.push(if c == ' ' { SPACE_MARK } else { c });
                    }
                    match &self.algo {
                        Algo::Scores(scores) => self.merge_by_score(&scratch, scores, &mut out),
                        Algo::Merges {
                            table,
                            ignore_merges,
                        } => self.merge_by_rank(&scratch, table, *ignore_merges, &mut out),
                    }
                    prev_special = false;
                }
            }
        }
        out
    }

    /// Cut special-token strings out of `text`. Longest token first over the whole text, each
    /// token's occurrences left to right (llama.cpp's partitioning order).
    fn split_specials<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let bytes = text.as_bytes();
        // Start offsets of every occurrence, per eligible special token (ascending by construction).
        let mut starts: FxMap<u32, Vec<usize>> = FxMap::default();
        for start in 0..bytes.len() {
            self.specials.matches_at(bytes, start, |_, id| {
                let kind = self.kinds[id as usize];
                if parse_special || kind == TokenKind::UserDefined {
                    starts.entry(id).or_default().push(start);
                }
            });
        }
        if starts.is_empty() {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Fragment::Text(text)]
            };
        }
        let mut order: Vec<u32> = starts.keys().copied().collect();
        order.sort_unstable_by(|&a, &b| {
            self.tokens[b as usize]
                .len()
                .cmp(&self.tokens[a as usize].len())
                .then(a.cmp(&b))
        });
        let mut covered = vec![false; bytes.len()];
        let mut accepted: Vec<(usize, usize, u32)> = Vec::new();
        for id in order {
            let len = self.tokens[id as usize].len();
            let mut next_free = 0;
            for &s in &starts[&id] {
                // Same-token matches do not overlap (the scan resumes after each match).
                if s < next_free || covered[s..s + len].iter().any(|&c| c) {
                    continue;
                }
                covered[s..s + len].iter_mut().for_each(|c| *c = true);
                accepted.push((s, s + len, id));
                next_free = s + len;
            }
        }
        accepted.sort_unstable_by_key(|a| a.0);
        let mut frags = Vec::with_capacity(accepted.len() * 2 + 1);
        let mut pos = 0;
        for (s, e, id) in accepted {
            if s > pos {
                frags.push(Fragment::Text(&text[pos..s]));
            }
            frags.push(Fragment::Token(id));
            pos = e;
        }
        if pos < text.len() {
            frags.push(Fragment::Text(&text[pos..]));
        }
        frags
    }

    fn push_bytes(&self, piece: &str, out: &mut Vec<u32>) {
        for b in piece.bytes() {
            if let Some(id) = self.byte_ids[b as usize].or(self.unk_id) {
                out.push(id);
            }
        }
    }

    /// llama.cpp's SPM merge: repeatedly merge the adjacent pair whose concatenation is a token with
    /// the highest score (ties: leftmost); pieces left outside the vocabulary fall back to bytes.
    fn merge_by_score(&self, text: &str, scores: &[f32], out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let i = syms.len();
            syms.push(Sym {
                start,
                len: c.len_utf8(),
                prev: i.wrapping_sub(1),
                next: i + 1,
            });
        }
        let last = syms.len() - 1;
        syms[last].next = NONE;
        syms[0].prev = NONE;

        let mut heap: BinaryHeap<ScoredPair> = BinaryHeap::with_capacity(syms.len());
        let try_add =
            |heap: &mut BinaryHeap<ScoredPair>, syms: &[Sym], left: usize, right: usize| {
                if left == NONE || right == NONE {
                    return;
                }
                let (l, r) = (&syms[left], &syms[right]);
                let piece = &text[l.start..r.start + r.len];
                if let Some(&id) = self.token_to_id.get(piece) {
                    heap.push(ScoredPair {
                        score: scores[id as usize],
                        left,
                        right,
                        size: piece.len(),
                    });
                }
            };
        for i in 1..syms.len() {
            try_add(&mut heap, &syms, i - 1, i);
        }
        while let Some(p) = heap.pop() {
            let (ll, rl) = (syms[p.left].len, syms[p.right].len);
            // Stale entry: one side was merged away or grew since the pair was queued.
            if ll == 0 || rl == 0 || ll + rl != p.size {
                continue;
            }
            syms[p.left].len += rl;
            syms[p.right].len = 0;
            let next = syms[p.right].next;
            syms[p.left].next = next;
            if next != NONE {
                syms[next].prev = p.left;
            }
            let prev = syms[p.left].prev;
            try_add(&mut heap, &syms, prev, p.left);
            try_add(&mut heap, &syms, p.left, next);
        }
        let mut i = 0;
        while i != NONE {
            let s = &syms[i];
            let piece = &text[s.start..s.start + s.len];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => self.push_bytes(piece, out),
            }
            i = s.next;
        }
    }

    /// Ranked-merge BPE (HF `tokenizers` semantics with byte fallback).
    fn merge_by_rank(
        &self,
        text: &str,
        table: &FxMap<(u32, u32), (u32, u32)>,
        ignore_merges: bool,
        out: &mut Vec<u32>,
    ) {
        if text.is_empty() {
            return;
        }
        if ignore_merges {
            if let Some(&id) = self.token_to_id.get(text) {
                out.push(id);
                return;
            }
        }
        let mut ids: Vec<u32> = Vec::with_capacity(text.len());
        let mut buf = [0u8; 4];
        for c in text.chars() {
            match self.token_to_id.get(&*c.encode_utf8(&mut buf)) {
                Some(&id) => ids.push(id),
                None => self.push_bytes(c.encode_utf8(&mut buf), &mut ids),
            }
        }
        let n = ids.len();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        if n > 0 {
            prev[0] = NONE;
            next[n - 1] = NONE;
        }
        let mut alive = vec![true; n];
        let mut heap: BinaryHeap<RankedPair> = BinaryHeap::with_capacity(n);
        for i in 1..n {
            if let Some(&(rank, new_id)) = table.get(&(ids[i - 1], ids[i])) {
                heap.push(RankedPair {
                    rank,
                    pos: i - 1,
                    new_id,
                });
            }
        }
        while let Some(m) = heap.pop() {
            if !alive[m.pos] || next[m.pos] == NONE {
                continue;
            }
            let r = next[m.pos];
            match table.get(&(ids[m.pos], ids[r])) {
                Some(&(_, new_id)) if new_id == m.new_id => {}
                _ => continue,
            }
            ids[m.pos] = m.new_id;
            alive[r] = false;
            let rn = next[r];
            next[m.pos] = rn;
            if rn != NONE {
                prev[rn] = m.pos;
            }
            let p = prev[m.pos];
            if p != NONE {
                if let Some(&(rank, new_id)) = table.get(&(ids[p], ids[m.pos])) {
                    heap.push(RankedPair {
                        rank,
                        pos: p,
                        new_id,
                    });
                }
            }
            if rn != NONE {
                if let Some(&(rank, new_id)) = table.get(&(ids[m.pos], ids[rn])) {
                    heap.push(RankedPair {
                        rank,
                        pos: m.pos,
                        new_id,
                    });
                }
            }
        }
        out.extend((0..n).filter(|&i| alive[i]).map(|i| ids[i]));
    }

    // ----------------------------------------------------------------- decoding

    /// Append the bytes token `id` decodes to. `at_start`: the token is the first text-producing one
    /// of a sequence (the space added by `add_space_prefix` is removed there).
    pub(crate) fn token_bytes(
        &self,
        id: u32,
        skip_special: bool,
        at_start: bool,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let text = self
            .tokens
            .get(id as usize)
            .ok_or(TokenizerError::IdOutOfRange {
                id,
                vocab_size: self.tokens.len(),
            })?;
        match self.kinds[id as usize] {
            TokenKind::Byte => match parse_byte_token(text) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.as_bytes()),
            },
            TokenKind::Normal => {
                let mut rest = text.as_str();
                if at_start && self.add_space_prefix {
                    rest = rest.strip_prefix(SPACE_MARK).unwrap_or(rest);
                }
                for c in rest.chars() {
                    if c == SPACE_MARK {
                        out.push(b' ');
                    } else {
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
            TokenKind::UserDefined => out.extend_from_slice(text.as_bytes()),
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused => {
                if !skip_special {
                    out.extend_from_slice(text.as_bytes());
                }
            }
        }
        Ok(())
    }

    /// Raw bytes of a token sequence (byte-fallback tokens reassembled, `▁` → space).
    pub fn decode_bytes(&self, ids: &[u32], skip_special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        let mut at_start = true;
        for &id in ids {
            self.token_bytes(id, skip_special, at_start, &mut out)?;
            if at_start && !self.is_bos(id) {
                at_start = false;
            }
        }
        Ok(out)
    }

    /// Decode ids to text. Invalid UTF-8 (e.g. a lone byte-fallback token) becomes U+FFFD.
    /// Out-of-range ids are an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let bytes = self.decode_bytes(ids, skip_special)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn is_bos(&self, id: u32) -> bool {
        Some(id) == self.bos_id
    }

    /// An incremental decoder borrowing this tokenizer.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<&Tokenizer> {
        StreamDecoder::new(self, skip_special)
    }
}

const NONE: usize = usize::MAX;

struct Sym {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

struct ScoredPair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for ScoredPair {
    fn cmp(&self, o: &Self) -> Ordering {
        // Max-heap on score; equal scores prefer the leftmost pair.
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| o.left.cmp(&self.left))
    }
}
impl PartialOrd for ScoredPair {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for ScoredPair {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for ScoredPair {}

#[derive(PartialEq, Eq)]
struct RankedPair {
    rank: u32,
    pos: usize,
    new_id: u32,
}

impl Ord for RankedPair {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on (rank, pos).
        o.rank.cmp(&self.rank).then_with(|| o.pos.cmp(&self.pos))
    }
}
impl PartialOrd for RankedPair {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Incremental detokenizer for streaming output: `push` returns only complete UTF-8 text, holding back
/// a partial multi-byte character (from byte-fallback tokens) until its remaining bytes arrive.
/// Invalid sequences are emitted as U+FFFD. `T` is `&Tokenizer`, `Arc<Tokenizer>`, or `Tokenizer`.
pub struct StreamDecoder<T: Borrow<Tokenizer>> {
    tok: T,
    skip_special: bool,
    pending: Vec<u8>,
    at_start: bool,
}

impl<T: Borrow<Tokenizer>> StreamDecoder<T> {
    pub fn new(tok: T, skip_special: bool) -> Self {
        StreamDecoder {
            tok,
            skip_special,
            pending: Vec::new(),
            at_start: true,
        }
    }

    /// Feed one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let tok = self.tok.borrow();
        tok.token_bytes(id, self.skip_special, self.at_start, &mut self.pending)?;
        if self.at_start && !tok.is_bos(id) {
            self.at_start = false;
        }
        Ok(self.drain_complete())
    }

    /// Flush whatever is held back (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    fn drain_complete(&mut self) -> String {
        let mut out = String::new();
        let mut pos = 0;
        loop {
            match std::str::from_utf8(&self.pending[pos..]) {
                Ok(s) => {
                    out.push_str(s);
                    pos = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Already validated by the from_utf8 call above.
                    out.push_str(
                        std::str::from_utf8(&self.pending[pos..pos + valid]).unwrap_or_default(),
                    );
                    pos += valid;
                    match e.error_len() {
                        // Truncated character at the end: wait for more bytes.
                        None => break,
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            pos += bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..pos);
        out
    }
}
