//! GPT-2 byte-level BPE tokenizer built from GGUF metadata (`tokenizer.ggml.*`).
//!
//! Owns text ↔ token ids: special (control / user-defined) tokens matched whole in the text, GPT-2-style
//! pre-tokenization (hand-written equivalent of the GPT-2 regex with `\p{L}` / `\p{N}` classes; digits split
//! individually for the `smollm` pre-tokenizer as llama.cpp does), byte → unicode mapping, merges by rank.
//! Decoding exposes the raw bytes of each token ([`Tokenizer::token_bytes`]) so streaming detokenization can
//! hold back UTF-8 sequences split across tokens. Never looks at the model weights.

use std::collections::HashMap;

use crate::gguf::{GgufFile, Value};

/// Token types of `tokenizer.ggml.token_type` (llama.cpp `enum llama_token_type`).
mod token_type {
    /// LLAMA_TOKEN_TYPE_CONTROL
    pub const CONTROL: i64 = 3;
    /// LLAMA_TOKEN_TYPE_USER_DEFINED
    pub const USER_DEFINED: i64 = 4;
}

/// Errors building a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required metadata key is missing or has the wrong type.
    #[error("GGUF tokenizer metadata: {0}")]
    Metadata(String),
    /// The tokenizer model is not GPT-2 byte-level BPE.
    #[error("unsupported tokenizer model {0:?} (supported: gpt2 byte-level BPE)")]
    Unsupported(String),
}

/// Marks a byte without a token in the vocabulary (never merges).
const NO_TOKEN: u32 = u32::MAX;

/// How text is split before BPE (`tokenizer.ggml.pre`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreTokenizer {
    /// The GPT-2 regex.
    Gpt2,
    /// Every digit on its own, then the GPT-2 regex (llama.cpp `LLAMA_VOCAB_PRE_TYPE_SMOLLM`).
    DigitsThenGpt2,
}

/// A byte-level BPE tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    /// Token strings as stored in the vocabulary (byte-level unicode form).
    tokens: Vec<String>,
    /// Raw bytes of each token.
    bytes: Vec<Vec<u8>>,
    /// Whether each token is special (control or user-defined: matched whole, never produced by BPE).
    special: Vec<bool>,
    /// Vocabulary lookup.
    ids: HashMap<String, u32>,
    /// (left, right) → (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Special token strings, longest first.
    specials: Vec<(String, u32)>,
    /// Token id of each byte's unicode form ([`NO_TOKEN`] for bytes the vocabulary lacks: vocabularies
    /// trained on UTF-8 text often lack bytes that never occur in it, e.g. 0xC0, 0xF5-0xFF).
    byte_ids: [u32; 256],
    /// `tokenizer.ggml.unknown_token_id`: stands for bytes without a token.
    unk: Option<u32>,
    pre: PreTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tokenizer({} tokens, {} merges, {:?})",
            self.tokens.len(),
            self.merges.len(),
            self.pre
        )
    }
}

/// GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the others to U+0100 and up.
pub fn byte_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    table
}

fn str_array<'a>(f: &'a GgufFile, key: &str) -> Result<Vec<&'a str>, TokenizerError> {
    let arr = f
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| TokenizerError::Metadata(format!("{key} missing or not an array")))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| TokenizerError::Metadata(format!("{key} has a non-string element")))
        })
        .collect()
}

fn token_id(f: &GgufFile, key: &str, n: usize) -> Option<u32> {
    f.get(key)
        .and_then(Value::as_u64)
        .filter(|&v| (v as usize) < n)
        .map(|v| v as u32)
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, TokenizerError> {
        let model = f
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .unwrap_or("gpt2");
        if model != "gpt2" {
            return Err(TokenizerError::Unsupported(model.to_string()));
        }
        let tokens: Vec<String> = str_array(f, "tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        let merges = str_array(f, "tokenizer.ggml.merges")?;
        let types: Vec<i64> = match f.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        };
        let pre = match f.get("tokenizer.ggml.pre").and_then(Value::as_str) {
            Some("smollm") => PreTokenizer::DigitsThenGpt2,
            _ => PreTokenizer::Gpt2,
        };
        let n = tokens.len();
        let bos = token_id(f, "tokenizer.ggml.bos_token_id", n);
        let eos = token_id(f, "tokenizer.ggml.eos_token_id", n);
        // llama.cpp's default for BPE vocabularies is not to add BOS unless the file says so.
        let add_bos = matches!(f.get("tokenizer.ggml.add_bos_token"), Some(Value::Bool(true)));
        let unk = token_id(f, "tokenizer.ggml.unknown_token_id", n);
        Self::build(tokens, &merges, &types, pre, [bos, eos, unk], add_bos)
    }

    fn build(
        tokens: Vec<String>,
        merges: &[&str],
        types: &[i64],
        pre: PreTokenizer,
        [bos, eos, unk]: [Option<u32>; 3],
        add_bos: bool,
    ) -> Result<Self, TokenizerError> {
        let b2u = byte_to_unicode();
        let mut u2b: HashMap<char, u8> = HashMap::new();
        for (b, c) in b2u.iter().enumerate() {
            u2b.insert(*c, b as u8);
        }
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let special: Vec<bool> = (0..tokens.len())
            .map(|i| {
                matches!(
                    types.get(i),
                    Some(&token_type::CONTROL) | Some(&token_type::USER_DEFINED)
                )
            })
            .collect();
        let bytes = tokens
            .iter()
            .zip(&special)
            .map(|(t, &s)| {
                if s {
                    t.as_bytes().to_vec()
                } else {
                    let mut v = Vec::with_capacity(t.len());
                    for c in t.chars() {
                        match u2b.get(&c) {
                            Some(&b) => v.push(b),
                            None => v.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    v
                }
            })
            .collect();
        let mut byte_ids = [NO_TOKEN; 256];
        for (b, c) in b2u.iter().enumerate() {
            if let Some(&id) = ids.get(&c.to_string()) {
                byte_ids[b] = id;
            }
        }
        if byte_ids.iter().filter(|&&id| id != NO_TOKEN).count() < 128 {
            return Err(TokenizerError::Metadata(
                "the vocabulary is not byte-level (too few byte tokens)".into(),
            ));
        }
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let Some((l, r)) = m.split_once(' ') else { continue };
            let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) else {
                continue;
            };
            let Some(&mi) = ids.get(&format!("{l}{r}")) else {
                continue;
            };
            merge_map.entry((li, ri)).or_insert((rank as u32, mi));
        }
        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .enumerate()
            .filter(|(i, t)| special[*i] && !t.is_empty())
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Ok(Tokenizer {
            tokens,
            bytes,
            special,
            ids,
            merges: merge_map,
            specials,
            byte_ids,
            unk,
            pre,
            bos,
            eos,
            add_bos,
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// BOS token id, if the vocabulary has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// EOS token id, if the vocabulary has one.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether the file asks for BOS to be prepended to prompts (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The id of a token given its vocabulary string, e.g. `<|im_end|>`.
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    /// The vocabulary string of a token (byte-level unicode form for normal tokens).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Raw bytes of a token (the text of a special token); empty for an unknown id.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The token of a single byte, if the vocabulary has one.
    pub fn byte_token(&self, b: u8) -> Option<u32> {
        Some(self.byte_ids[b as usize]).filter(|&id| id != NO_TOKEN)
    }

    /// Whether the token is special (control or user-defined).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Encodes text; special token strings in the text become their ids. Does not add BOS.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // Earliest special token occurrence (longest on ties: `specials` is sorted longest first).
            let mut best: Option<(usize, &str, u32)> = None;
            for (s, id) in &self.specials {
                if let Some(p) = rest.find(s.as_str())
                    && best.is_none_or(|(bp, _, _)| p < bp)
                {
                    best = Some((p, s, *id));
                }
            }
            match best {
                Some((p, s, id)) => {
                    self.encode_plain(&rest[..p], &mut out);
                    out.push(id);
                    rest = &rest[p + s.len()..];
                }
                None => {
                    self.encode_plain(rest, &mut out);
                    rest = "";
                }
            }
        }
        out
    }

    /// Encodes text without special tokens.
    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        match self.pre {
            PreTokenizer::Gpt2 => {
                for piece in gpt2_split(text) {
                    self.bpe(piece, out);
                }
            }
            PreTokenizer::DigitsThenGpt2 => {
                let mut start = 0;
                for (i, c) in text.char_indices() {
                    if c.is_numeric() {
                        for piece in gpt2_split(&text[start..i]) {
                            self.bpe(piece, out);
                        }
                        self.bpe(&text[i..i + c.len_utf8()], out);
                        start = i + c.len_utf8();
                    }
                }
                for piece in gpt2_split(&text[start..]) {
                    self.bpe(piece, out);
                }
            }
        }
    }

    /// BPE of one pre-token: start from byte tokens, repeatedly apply the lowest-ranked merge (leftmost on
    /// ties). A heap of candidate pairs over a linked list of symbols makes this O(n log n) in the piece's
    /// length, so a long run without spaces cannot tie up a CPU (the naive rescan is quadratic).
    fn bpe(&self, piece: &str, out: &mut Vec<u32>) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        const NONE: usize = usize::MAX;
        let mut syms: Vec<u32> = piece.bytes().map(|b| self.byte_ids[b as usize]).collect();
        let n = syms.len();
        let mut next: Vec<usize> = (1..=n).map(|j| if j < n { j } else { NONE }).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { NONE } else { i - 1 }).collect();
        let mut alive = vec![true; n];
        // (rank, left position, left id, right id); stale entries are skipped when popped.
        let mut heap = BinaryHeap::new();
        let rank_of = |a: u32, b: u32| self.merges.get(&(a, b)).copied();
        for i in 0..n.saturating_sub(1) {
            if let Some((rank, _)) = rank_of(syms[i], syms[i + 1]) {
                heap.push(Reverse((rank, i, syms[i], syms[i + 1])));
            }
        }
        while let Some(Reverse((_, i, a, b))) = heap.pop() {
            let j = next[i];
            if !alive[i] || j == NONE || syms[i] != a || syms[j] != b {
                continue;
            }
            let Some((_, merged)) = rank_of(a, b) else {
                continue;
            };
            syms[i] = merged;
            alive[j] = false;
            let k = next[j];
            next[i] = k;
            if k != NONE {
                prev[k] = i;
                if let Some((rank, _)) = rank_of(merged, syms[k]) {
                    heap.push(Reverse((rank, i, merged, syms[k])));
                }
            }
            let p = prev[i];
            if p != NONE
                && let Some((rank, _)) = rank_of(syms[p], merged)
            {
                heap.push(Reverse((rank, p, syms[p], merged)));
            }
        }
        let mut i = if n == 0 { NONE } else { 0 };
        while i != NONE {
            match (syms[i], self.unk) {
                (NO_TOKEN, Some(unk)) => out.push(unk),
                (NO_TOKEN, None) => {}
                (id, _) => out.push(id),
            }
            i = next[i];
        }
    }

    /// Decodes ids to text (invalid UTF-8 replaced); special tokens decode to their text.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Character classes of the GPT-2 regex.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_alphabetic() {
        Class::Letter
    } else if c.is_numeric() {
        Class::Number
    } else if c.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// Splits like the GPT-2 regex
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
pub fn gpt2_split(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let n = chars.len();
    let at = |i: usize| if i < n { chars[i].0 } else { text.len() };
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let c = chars[i].1;
        // Contractions.
        if c == '\'' && i + 1 < n {
            let c1 = chars[i + 1].1;
            let c2 = chars.get(i + 2).map(|x| x.1);
            let len = match (c1, c2) {
                ('s' | 't' | 'm' | 'd', _) => 2,
                ('r', Some('e')) | ('v', Some('e')) | ('l', Some('l')) => 3,
                _ => 0,
            };
            if len > 0 {
                out.push(&text[at(i)..at(i + len)]);
                i += len;
                continue;
            }
        }
        // ` ?X+` for letters, numbers and others.
        let (start, j) = if c == ' ' && i + 1 < n && class(chars[i + 1].1) != Class::Space {
            (i, i + 1)
        } else {
            (i, i)
        };
        let cls = class(chars[j].1);
        if cls != Class::Space {
            let mut k = j + 1;
            while k < n && class(chars[k].1) == cls {
                k += 1;
            }
            out.push(&text[at(start)..at(k)]);
            i = k;
            continue;
        }
        // Whitespace run: `\s+(?!\S)` leaves the last space for the next token when one follows.
        let mut k = i + 1;
        while k < n && class(chars[k].1) == Class::Space {
            k += 1;
        }
        if k < n && k - i > 1 {
            k -= 1;
        }
        out.push(&text[at(i)..at(k)]);
        i = k;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_split_matches_the_regex() {
        assert_eq!(gpt2_split("Hello world"), vec!["Hello", " world"]);
        assert_eq!(gpt2_split("I'm here  now"), vec!["I", "'m", " here", " ", " now"]);
        assert_eq!(gpt2_split("a\n\nb"), vec!["a", "\n", "\n", "b"]);
        assert_eq!(gpt2_split("x = 42!!"), vec!["x", " =", " 42", "!!"]);
        assert_eq!(gpt2_split("end  "), vec!["end", "  "]);
        assert_eq!(gpt2_split("héllo wörld"), vec!["héllo", " wörld"]);
    }
}
