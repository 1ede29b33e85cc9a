//! The engine's view of a model: the [`ModelHandle`] trait (implemented here for the real
//! [`crate::model::Model`], by fakes in tests) and the [`Reloaded`] model a reload swaps in.
//!
//! Owns what the engine may ask of a model (name, limits, EOS ids, token bytes, tokenizing, chat rendering) so
//! the step loop and the HTTP layer never reach into the tokenizer or the template themselves.
//!
//! It must never load or read a model file: a [`Reloaded`] arrives with its weights already loaded by the loader
//! thread, and its [`SwapFn`] only moves them into the backend.

use std::sync::Arc;

use crate::backend::{Backend, BackendError};

/// What the engine needs to know about the loaded model (implemented for [`crate::model::Model`] in `main`'s
/// wiring, and by fakes in tests).
pub trait ModelHandle: Send + Sync {
    /// Model name from its metadata.
    fn name(&self) -> &str;
    /// Context length (max positions).
    fn context_len(&self) -> usize;
    /// End-of-sequence token ids.
    fn eos_token_ids(&self) -> &[u32];
    /// Raw bytes of a token (byte-level BPE decoded); empty for unknown ids.
    fn token_bytes(&self, id: u32) -> &[u8];
    /// Whether a token is a special/control token (not rendered in output text).
    fn is_special(&self, id: u32) -> bool;
    /// Tokenizes a completion prompt (adds BOS when the model wants it).
    fn encode_prompt(&self, text: &str) -> Vec<u32>;
    /// Tokenizes an already rendered chat prompt (the template carries the special tokens).
    fn encode_chat(&self, text: &str) -> Vec<u32>;
    /// Renders a chat with the model's template and the generation prompt appended.
    fn render_chat(&self, messages: &[(String, String)]) -> Result<String, String>;
}

/// Applies new weights to the backend (built by the loader thread; runs on the engine thread between steps).
pub type SwapFn = Box<dyn FnOnce(&mut dyn Backend) -> Result<(), BackendError> + Send>;

/// A model loaded off the engine thread, ready to be swapped in.
pub struct Reloaded {
    /// Swaps the weights into the backend.
    pub swap: SwapFn,
    /// Tokenizer/config view of the new model.
    pub handle: Arc<dyn ModelHandle>,
    /// Where it was loaded from.
    pub path: String,
}

/// The real model behind the engine.
impl ModelHandle for crate::model::Model {
    fn name(&self) -> &str {
        &self.config.name
    }
    fn context_len(&self) -> usize {
        self.config.context_len
    }
    fn eos_token_ids(&self) -> &[u32] {
        &self.config.eos_token_ids
    }
    fn token_bytes(&self, id: u32) -> &[u8] {
        self.tokenizer.token_bytes(id)
    }
    fn is_special(&self, id: u32) -> bool {
        self.tokenizer.is_special(id)
    }
    fn encode_prompt(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        if self.tokenizer.add_bos()
            && let Some(b) = self.config.bos_token_id
        {
            ids.push(b);
        }
        ids.extend(self.tokenizer.encode(text));
        ids
    }
    fn encode_chat(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text)
    }
    fn render_chat(&self, messages: &[(String, String)]) -> Result<String, String> {
        let Some(t) = &self.chat_template else {
            return Err(format!(
                "model {:?} has no chat template in its GGUF metadata; use /v1/completions",
                self.config.name
            ));
        };
        let msgs: Vec<crate::chat_template::ChatMessage> = messages
            .iter()
            .map(|(r, c)| crate::chat_template::ChatMessage::new(r.as_str(), c.as_str()))
            .collect();
        t.render(&msgs, true).map_err(|e| e.to_string())
    }
}
