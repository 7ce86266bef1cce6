//! Chat templates (Jinja, as shipped in GGUF `tokenizer.chat_template` or
//! `tokenizer_config.json`), rendered with minijinja and Python-compatible string methods.

use crate::{Error, Result};
use serde::Serialize;
use std::path::Path;

/// One chat message as templates expect it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Message text.
    pub content: String,
}

impl ChatMessage {
    /// Shorthand constructor.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos: String,
    eos: String,
}

fn tpl_err(e: impl std::fmt::Display) -> Error {
    Error::ChatTemplate(e.to_string())
}

impl ChatTemplate {
    /// Compiles a template; `bos`/`eos` are exposed to it as `bos_token`/`eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(tpl_err)?;
        Ok(Self {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Reads `chat_template` from a `tokenizer_config.json` (a string, or a list of named
    /// templates of which `default` is taken).
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<Self>> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| tpl_err(format!("{}: {e}", path.display())))?;
        let token = |k: &str| match &v[k] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o
                .get("content")
                .and_then(|c| c.as_str())
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        };
        let src = match &v["chat_template"] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .or_else(|| list.first())
                .and_then(|t| t["template"].as_str().map(str::to_string)),
            _ => None,
        };
        src.map(|s| Self::new(&s, &token("bos_token"), &token("eos_token")))
            .transpose()
    }

    /// Renders messages; `add_generation_prompt` opens an assistant turn at the end.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_values(messages, add_generation_prompt)
    }

    /// Renders any serialisable message list (e.g. with `tool_calls`).
    pub fn render_values<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tpl = self.env.get_template("chat").map_err(tpl_err)?;
        tpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(tpl_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::CHATML_TEMPLATE;

    #[test]
    fn chatml_renders() {
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
        let s = t.render(&[ChatMessage::new("user", "hi")], true).unwrap();
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn python_methods_and_raise_work() {
        let src = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('need system') }}{% endif %}{{ messages[0]['content'].strip().upper() }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("system", "  ok ")], false)
                .unwrap(),
            "OK"
        );
        let e = t
            .render(&[ChatMessage::new("user", "x")], false)
            .unwrap_err();
        assert!(e.to_string().contains("need system"), "{e}");
    }

    #[test]
    fn bad_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}
