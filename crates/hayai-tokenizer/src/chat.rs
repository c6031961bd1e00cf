//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`, HF
//! `tokenizer_config.json` / `chat_template.jinja`) rendered with minijinja in an HF-compatible context,
//! plus built-in Gemma 3 / Gemma 4 formats for models that ship none.

use std::path::Path;

use hayai_core::gguf::GgufFile;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TokenizerError};
use crate::gguf::gguf_chat_template;
use crate::hf::hf_chat_template;
use crate::tokenizer::Tokenizer;

/// One chat message. `role` is `system`, `user`, `assistant` (or its Gemma name `model`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Which built-in prompt format to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatFamily {
    /// `<start_of_turn>role\n...<end_of_turn>\n`; the system prompt is merged into the first user turn.
    Gemma3,
    /// `<|turn>role\n...<turn|>\n`, with a real `system` turn.
    Gemma4,
}

impl ChatFamily {
    /// Guess the family from the vocabulary's turn markers.
    pub fn detect(tok: &Tokenizer) -> Option<ChatFamily> {
        if tok.special_id("<|turn>").is_some() {
            Some(ChatFamily::Gemma4)
        } else if tok.special_id("<start_of_turn>").is_some() {
            Some(ChatFamily::Gemma3)
        } else {
            None
        }
    }
}

/// Marks errors produced by the template's own `raise_exception(...)` calls.
const RAISE_MARK: &str = "raise_exception: ";
const TEMPLATE_NAME: &str = "chat";

enum Kind {
    Jinja(Box<Environment<'static>>),
    Builtin(ChatFamily),
}

/// A compiled chat template.
pub struct ChatTemplate {
    kind: Kind,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Jinja(_) => "jinja".to_string(),
            Kind::Builtin(fam) => format!("builtin {fam:?}"),
        };
        f.debug_struct("ChatTemplate")
            .field("kind", &kind)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn template_err(e: minijinja::Error) -> TokenizerError {
    let detail = e.detail().unwrap_or_default();
    if let Some(msg) = detail.strip_prefix(RAISE_MARK) {
        return TokenizerError::TemplateException(msg.to_string());
    }
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    TokenizerError::Template(msg)
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISE_MARK}{msg}"),
    ))
}

/// `strftime_now(fmt)`, used by some HF templates for a date line. Only a few common formats are
/// understood; the clock is UTC.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    // Civil-from-days (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    fmt.replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", month)
        .replace("%b", &month[..3])
}

fn json_string(s: &str, out: &mut String) {
    // serde_json escapes exactly what Python's json.dumps(ensure_ascii=False) escapes.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
}

/// Python `json.dumps` layout: `", "` / `": "` separators, or one item per line with `indent`.
fn py_json(
    v: &Value,
    indent: Option<usize>,
    level: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::String => json_string(v.as_str().unwrap_or_default(), out),
        ValueKind::Number => out.push_str(&serde_json::to_string(v).map_err(|e| {
            minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"))
        })?),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                match k.as_str() {
                    Some(s) => json_string(s, out),
                    None => json_string(&k.to_string(), out),
                }
                out.push_str(": ");
                py_json(&v.get_item(k)?, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                py_json(item, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        _ => json_string(&v.to_string(), out),
    }
    Ok(())
}

/// HF's `tojson` (Python `json.dumps(..., ensure_ascii=False)`): spaced separators, no HTML escaping,
/// map order preserved; `indent` positional or keyword.
fn hf_tojson(
    value: &Value,
    indent: Option<usize>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(i) => Some(i),
        None => indent,
    };
    // Accepted for compatibility; output is always non-ASCII-preserving and unsorted.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("separators")?;
    let _: Option<Value> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    py_json(value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn normalize_role(role: &str) -> Result<&'static str> {
    match role {
        "system" | "developer" => Ok("system"),
        "user" => Ok("user"),
        "assistant" | "model" => Ok("assistant"),
        other => Err(TokenizerError::UnsupportedRole(other.to_string())),
    }
}

impl ChatTemplate {
    /// Compile a Jinja chat template (HF conventions: `trim_blocks`, `lstrip_blocks`, loop controls,
    /// Python string methods such as `.strip()` / `.startswith()`, `raise_exception`, HF's `tojson`).
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", hf_tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(template_err)?;
        Ok(ChatTemplate {
            kind: Kind::Jinja(Box::new(env)),
            bos_token: "<bos>".into(),
            eos_token: "<eos>".into(),
        })
    }

    /// A built-in Gemma format.
    pub fn builtin(family: ChatFamily) -> Self {
        ChatTemplate {
            kind: Kind::Builtin(family),
            bos_token: "<bos>".into(),
            eos_token: "<eos>".into(),
        }
    }

    /// The model's template if it ships one, else the built-in format matching its vocabulary
    /// (Gemma 3 when the vocabulary has neither marker). BOS/EOS strings come from the tokenizer.
    pub fn for_model(source: Option<&str>, tok: &Tokenizer) -> Result<Self> {
        let t = match source {
            Some(src) => Self::new(src)?,
            None => Self::builtin(ChatFamily::detect(tok).unwrap_or(ChatFamily::Gemma3)),
        };
        let name = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).map(str::to_string);
        Ok(t.with_special_tokens(
            name(tok.bos_id()).unwrap_or_else(|| "<bos>".into()),
            name(tok.eos_id()).unwrap_or_else(|| "<eos>".into()),
        ))
    }

    /// The template shipped with a model at `path` — a GGUF file (`tokenizer.chat_template`) or an HF
    /// checkpoint directory (`chat_template.jinja` / `tokenizer_config.json`) — else the built-in
    /// `fallback` format. `bos_token`/`eos_token` are `<bos>`/`<eos>` (Gemma's).
    pub fn from_model_path(path: &Path, fallback: ChatFamily) -> Result<Self> {
        let source = if path.is_dir() {
            hf_chat_template(path)?
        } else {
            let file = GgufFile::open(path).map_err(|e| TokenizerError::Gguf(e.to_string()))?;
            gguf_chat_template(&file)
        };
        Ok(match source {
            Some(src) => Self::new(&src)?,
            None => Self::builtin(fallback),
        })
    }

    /// Set the strings passed as `bos_token` / `eos_token` (defaults `<bos>` / `<eos>`).
    pub fn with_special_tokens(mut self, bos: impl Into<String>, eos: impl Into<String>) -> Self {
        self.bos_token = bos.into();
        self.eos_token = eos.into();
        self
    }

    pub fn is_builtin(&self) -> bool {
        matches!(self.kind, Kind::Builtin(_))
    }

    /// Render a conversation. `add_generation_prompt` appends the opening of the model's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        match &self.kind {
            Kind::Jinja(env) => {
                let tmpl = env.get_template(TEMPLATE_NAME).map_err(template_err)?;
                let ctx = minijinja::context! {
                    messages => Value::from_serialize(messages),
                    bos_token => self.bos_token.as_str(),
                    eos_token => self.eos_token.as_str(),
                    add_generation_prompt => add_generation_prompt,
                };
                tmpl.render(ctx).map_err(template_err)
            }
            Kind::Builtin(ChatFamily::Gemma3) => {
                self.render_gemma3(messages, add_generation_prompt)
            }
            Kind::Builtin(ChatFamily::Gemma4) => {
                self.render_gemma4(messages, add_generation_prompt)
            }
        }
    }

    /// Gemma 3: no system role; system text is prepended (plus a blank line) to the next user turn,
    /// as the HF template does for a leading system message (later ones are merged the same way rather
    /// than rejected). User/model contents are trimmed, like the HF template's `| trim`.
    fn render_gemma3(&self, messages: &[ChatMessage], gen: bool) -> Result<String> {
        let mut out = self.bos_token.clone();
        let mut system_prefix = String::new();
        for m in messages {
            let content = m.content.trim();
            match normalize_role(&m.role)? {
                // Untrimmed, as in the HF template.
                "system" => {
                    system_prefix.push_str(&m.content);
                    system_prefix.push_str("\n\n");
                }
                "user" => {
                    out.push_str("<start_of_turn>user\n");
                    out.push_str(&std::mem::take(&mut system_prefix));
                    out.push_str(content);
                    out.push_str("<end_of_turn>\n");
                }
                _ => {
                    out.push_str("<start_of_turn>model\n");
                    out.push_str(content);
                    out.push_str("<end_of_turn>\n");
                }
            }
        }
        if !system_prefix.is_empty() {
            // A system prompt with no user turn after it still reaches the model.
            out.push_str("<start_of_turn>user\n");
            out.push_str(system_prefix.trim_end());
            out.push_str("<end_of_turn>\n");
        }
        if gen {
            out.push_str("<start_of_turn>model\n");
        }
        Ok(out)
    }

    /// Gemma 4: `system` is a real turn; `assistant` renders as `model`.
    fn render_gemma4(&self, messages: &[ChatMessage], gen: bool) -> Result<String> {
        let mut out = self.bos_token.clone();
        for m in messages {
            let role = match normalize_role(&m.role)? {
                "assistant" => "model",
                r => r,
            };
            out.push_str("<|turn>");
            out.push_str(role);
            out.push('\n');
            out.push_str(m.content.trim());
            out.push_str("<turn|>\n");
        }
        if gen {
            out.push_str("<|turn>model\n");
        }
        Ok(out)
    }
}
