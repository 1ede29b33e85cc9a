//! Chat templates: renders the model's own Jinja template (`tokenizer.chat_template` in the GGUF metadata)
//! with minijinja, HF-compatible.
//!
//! Owns turning a list of chat messages into the prompt text. Configured like transformers'
//! `apply_chat_template`: `trim_blocks` and `lstrip_blocks`, Python string/dict methods (`.strip()`,
//! `.items()`, ...) through minijinja-contrib's pycompat, `raise_exception`, loop controls; the context has
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`. Never hard-codes a prompt format.

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value, context};

/// Name of the template inside the environment.
const TEMPLATE_NAME: &str = "chat";

/// Errors of a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template does not compile (reached through `ModelError`, whose printers show the cause chain).
    #[error("the model's chat template does not compile")]
    Compile(#[source] JinjaError),
    /// Rendering failed (including `raise_exception` from the template, e.g. bad role order). The reason is in
    /// the message, not the source chain: the engine hands this message, as is, to the API client.
    #[error("cannot render the chat template: {0}")]
    Render(JinjaError),
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChatTemplate({} bytes)", self.source.len())
    }
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the strings the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(ChatTemplateError::Compile)?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's answer begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(ChatTemplateError::Render)?;
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        tmpl.render(context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(ChatTemplateError::Render)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template (from its tokenizer_config.json): ChatML with a default system message.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_hf_template() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").expect("compile");
        let s = t.render(&[ChatMessage::new("user", "Hi")], true).expect("render");
        assert!(s.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
        assert!(
            s.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
            "{s:?}"
        );
        let s = t
            .render(
                &[ChatMessage::new("system", "S"), ChatMessage::new("user", "Hi")],
                false,
            )
            .expect("render");
        assert_eq!(
            s,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn python_methods_and_raise_exception() {
        let src = "{% for m in messages %}{% if m.role not in ['user'] %}{{ raise_exception('only user') }}{% endif %}[{{ m.content.strip() | upper }}]{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").expect("compile");
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  hi ")], false)
                .expect("render"),
            "[HI]</s>"
        );
        let err = t
            .render(&[ChatMessage::new("bot", "x")], false)
            .expect_err("must raise");
        assert!(err.to_string().contains("only user"), "{err}");
    }
}
