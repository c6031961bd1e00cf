//! Request bodies of the OpenAI-compatible endpoints and their validation into an engine
//! request. Everything here is pure (no I/O), so it can be fuzzed directly.

use std::sync::Arc;

use hayai_engine::{GenRequest, SamplingParams};
use hayai_model::RunnerInfo;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::text::{ChatMessage, TextModel};
use crate::ServerConfig;

/// `stop`: one string or a list of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `seed`: any 64-bit integer, signed or not.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Seed {
    Signed(i64),
    Unsigned(u64),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling and stopping fields shared by both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct CommonFields {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<Seed>,
    pub stop: Option<StopField>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub ignore_eos: Option<bool>,
    pub n: Option<i64>,
    pub best_of: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub add_special_tokens: Option<bool>,
    pub return_token_ids: Option<bool>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub min_tokens: Option<i64>,
    pub user: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    pub prompt: Option<Value>,
    pub echo: Option<bool>,
    pub logprobs: Option<i64>,
    pub prompt_logprobs: Option<i64>,
    pub suffix: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct RawMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<RawMessage>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub add_generation_prompt: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub response_format: Option<Value>,
    pub prompt_logprobs: Option<i64>,
    pub echo: Option<bool>,
}

/// What a handler needs to validate and tokenize a request.
pub struct Ctx<'a> {
    pub cfg: &'a ServerConfig,
    pub info: &'a RunnerInfo,
    pub text: &'a Arc<dyn TextModel>,
}

/// A validated request, ready for the engine, plus the response options.
#[derive(Debug)]
pub struct Prepared {
    pub gen: GenRequest,
    /// The model name echoed back in responses.
    pub model: String,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: bool,
    pub return_token_ids: bool,
    /// Completions: top-k of the legacy `logprobs` object. Chat: `top_logprobs` when
    /// `logprobs: true`.
    pub logprobs: Option<usize>,
    /// The client asked for `prompt_logprobs` (not just needed internally for `echo`).
    pub prompt_logprobs: Option<usize>,
}

/// Deserialize a JSON body into `T`, naming the offending field on failure.
pub fn from_value<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    serde_path_to_error::deserialize::<_, T>(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::invalid_param(&path, format!("invalid value for `{path}`: {inner}"))
        }
    })
}

fn check_model(ctx: &Ctx, model: &Option<String>) -> Result<String, ApiError> {
    match model {
        None => Ok(ctx.cfg.served_model_name.clone()),
        Some(m) if *m == ctx.cfg.served_model_name || *m == ctx.cfg.model_id => Ok(m.clone()),
        Some(m) => Err(ApiError::model_not_found(m)),
    }
}

fn check_token_ids(ctx: &Ctx, param: &str, ids: &[i64]) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|&t| {
            if t < 0 || t as u64 >= ctx.info.vocab_size as u64 {
                Err(ApiError::invalid_param(
                    param,
                    format!(
                        "token id {t} is out of range (vocabulary has {} entries)",
                        ctx.info.vocab_size
                    ),
                ))
            } else {
                Ok(t as u32)
            }
        })
        .collect()
}

fn check_top(ctx: &Ctx, param: &str, v: i64) -> Result<usize, ApiError> {
    if v < 0 || v as u64 > ctx.cfg.max_logprobs as u64 {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "`{param}` must be between 0 and {}, got {v}",
                ctx.cfg.max_logprobs
            ),
        ));
    }
    Ok(v as usize)
}

/// Options common to both endpoints, validated. `prompt` is already tokenized.
fn build(
    ctx: &Ctx,
    c: &CommonFields,
    prompt: Vec<u32>,
    max_tokens: Option<i64>,
    default_max: Option<usize>,
) -> Result<Prepared, ApiError> {
    let model = check_model(ctx, &c.model)?;
    if let Some(n) = c.n {
        if n != 1 {
            return Err(ApiError::unsupported("n", "only n = 1 is supported"));
        }
    }
    if let Some(b) = c.best_of {
        if b != 1 {
            return Err(ApiError::unsupported(
                "best_of",
                "only best_of = 1 is supported",
            ));
        }
    }
    for (name, v, neutral) in [
        ("presence_penalty", c.presence_penalty, 0.0),
        ("frequency_penalty", c.frequency_penalty, 0.0),
        ("repetition_penalty", c.repetition_penalty, 1.0),
    ] {
        if let Some(x) = v {
            if x != neutral {
                return Err(ApiError::unsupported(
                    name,
                    format!("`{name}` is not supported (only its neutral value {neutral})"),
                ));
            }
        }
    }
    if c.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::unsupported(
            "logit_bias",
            "`logit_bias` is not supported",
        ));
    }
    if c.min_tokens.is_some_and(|m| m != 0) {
        return Err(ApiError::unsupported(
            "min_tokens",
            "`min_tokens` is not supported",
        ));
    }

    if prompt.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= ctx.info.vocab_size) {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "prompt token id {bad} is out of range (vocabulary has {} entries)",
                ctx.info.vocab_size
            ),
        ));
    }
    let max_ctx = ctx.info.max_context;
    if prompt.len() >= max_ctx {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "the prompt has {} tokens; the context limit is {max_ctx} (at least one \
                 token must remain for generation)",
                prompt.len()
            ),
        ));
    }
    let remaining = max_ctx - prompt.len();
    let max_tokens = match max_tokens {
        Some(m) if m < 1 => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!("max_tokens must be at least 1, got {m}"),
            ))
        }
        Some(m) if m as u64 > remaining as u64 => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "prompt ({} tokens) plus max_tokens ({m}) exceeds the context limit of \
                     {max_ctx}",
                    prompt.len()
                ),
            ))
        }
        Some(m) => m as usize,
        None => default_max
            .unwrap_or(remaining)
            .min(ctx.cfg.max_tokens_default.unwrap_or(remaining))
            .min(remaining)
            .max(1),
    };

    let temperature = c.temperature.unwrap_or(ctx.cfg.default_temperature as f64);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::invalid_param(
            "temperature",
            format!("temperature must be a finite number >= 0, got {temperature}"),
        ));
    }
    let top_p = c.top_p.unwrap_or(ctx.cfg.default_top_p as f64);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_param(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match c.top_k {
        None => ctx.cfg.default_top_k,
        Some(-1) | Some(0) => 0,
        Some(k) if k < 0 => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("top_k must be -1 or 0 (disabled) or at least 1, got {k}"),
            ))
        }
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
    };
    let sampling = SamplingParams {
        temperature: temperature as f32,
        top_k,
        top_p: top_p as f32,
        // Negative seeds are reinterpreted: any 64-bit pattern is a valid seed.
        seed: c.seed.as_ref().map(|s| match *s {
            Seed::Signed(v) => v as u64,
            Seed::Unsigned(v) => v,
        }),
    };
    sampling
        .validate()
        .map_err(|m| ApiError::invalid_param("temperature", m))?;

    let stop = match &c.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop.len() > 16 {
        return Err(ApiError::invalid_param(
            "stop",
            "at most 16 stop strings are allowed",
        ));
    }
    let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let mut stop_token_ids = match &c.stop_token_ids {
        None => Vec::new(),
        Some(v) => check_token_ids(ctx, "stop_token_ids", v)?,
    };
    let ignore_eos = c.ignore_eos.unwrap_or(false);
    if !ignore_eos {
        // The template's end-of-turn markers end generation like EOS does.
        stop_token_ids.extend(ctx.text.stop_token_ids());
    }
    let stream = c.stream.unwrap_or(false);
    let include_usage = c
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);

    Ok(Prepared {
        gen: GenRequest {
            prompt,
            max_tokens,
            sampling,
            stop_token_ids,
            ignore_eos,
            prompt_logprobs: None,
            logprobs: None,
        },
        model,
        stop,
        stream,
        include_usage,
        echo: false,
        return_token_ids: c.return_token_ids.unwrap_or(false),
        logprobs: None,
        prompt_logprobs: None,
    })
}

/// The `prompt` of `/v1/completions`: text or token ids, possibly in a one-element list.
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

pub fn parse_prompt(ctx: &Ctx, v: Option<&Value>) -> Result<PromptInput, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("prompt", m);
    let v = v.ok_or_else(|| bad("`prompt` is required"))?;
    match v {
        Value::String(s) => Ok(PromptInput::Text(s.clone())),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(bad("the prompt is empty"));
            }
            if items.iter().all(|x| x.is_number()) {
                let ids: Vec<i64> = items
                    .iter()
                    .map(|x| x.as_i64().ok_or(()))
                    .collect::<Result<_, ()>>()
                    .map_err(|_| bad("token ids must be integers"))?;
                return Ok(PromptInput::Ids(check_token_ids(ctx, "prompt", &ids)?));
            }
            if items.len() != 1 {
                return Err(ApiError::unsupported(
                    "prompt",
                    "batched prompts are not supported: send one prompt per request",
                ));
            }
            match &items[0] {
                Value::String(s) => Ok(PromptInput::Text(s.clone())),
                Value::Array(inner) if !inner.is_empty() && inner.iter().all(|x| x.is_number()) => {
                    let ids: Vec<i64> = inner
                        .iter()
                        .map(|x| x.as_i64().ok_or(()))
                        .collect::<Result<_, ()>>()
                        .map_err(|_| bad("token ids must be integers"))?;
                    Ok(PromptInput::Ids(check_token_ids(ctx, "prompt", &ids)?))
                }
                Value::Array(inner) if inner.is_empty() => Err(bad("the prompt is empty")),
                _ => Err(bad(
                    "`prompt` must be a string, a list of token ids, or a one-element list of either",
                )),
            }
        }
        _ => Err(bad(
            "`prompt` must be a string, a list of token ids, or a one-element list of either",
        )),
    }
}

pub fn prepare_completion(ctx: &Ctx, body: &Value) -> Result<Prepared, ApiError> {
    // Two passes over the same object (rather than `serde(flatten)`) so errors name the field.
    let common: CommonFields = from_value(body)?;
    check_model(ctx, &common.model)?;
    let b: CompletionBody = from_value(body)?;
    if b.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "`suffix` is not supported"));
    }
    let prompt = match parse_prompt(ctx, b.prompt.as_ref())? {
        PromptInput::Ids(ids) => ids,
        PromptInput::Text(t) => ctx
            .text
            .encode(&t, common.add_special_tokens.unwrap_or(true))
            .map_err(|e| ApiError::invalid_param("prompt", format!("cannot tokenize: {e}")))?,
    };
    let logprobs = b
        .logprobs
        .map(|v| check_top(ctx, "logprobs", v))
        .transpose()?;
    let prompt_logprobs = b
        .prompt_logprobs
        .map(|v| check_top(ctx, "prompt_logprobs", v))
        .transpose()?;
    // OpenAI's legacy default for completions.
    let mut p = build(ctx, &common, prompt, common.max_tokens, Some(16))?;
    p.echo = b.echo.unwrap_or(false);
    if p.stream && (prompt_logprobs.is_some() || logprobs.is_some()) {
        return Err(ApiError::unsupported(
            if prompt_logprobs.is_some() {
                "prompt_logprobs"
            } else {
                "logprobs"
            },
            "log-probabilities are only supported without streaming",
        ));
    }
    p.logprobs = logprobs;
    p.prompt_logprobs = prompt_logprobs;
    p.gen.logprobs = logprobs;
    // The legacy object lists the prompt too when echoing.
    let internal_prompt_lp = match (p.echo, logprobs) {
        (true, Some(k)) => Some(k.max(prompt_logprobs.unwrap_or(0))),
        _ => prompt_logprobs,
    };
    p.gen.prompt_logprobs = internal_prompt_lp;
    Ok(p)
}

/// Chat message content: a string, or a list of `{"type": "text", "text": ...}` parts.
fn message_text(i: usize, content: &Option<Value>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                let ty = p.get("type").and_then(Value::as_str);
                match (ty, p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::invalid_param(&param, "a text part needs `text`"))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::unsupported(
                            &param,
                            format!("content parts of type `{other}` are not supported"),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::invalid_param(
                            &param,
                            "a content part needs `type`",
                        ))
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid_param(
            &param,
            "content must be a string or a list of parts",
        )),
    }
}

pub fn prepare_chat(ctx: &Ctx, body: &Value) -> Result<Prepared, ApiError> {
    let common: CommonFields = from_value(body)?;
    check_model(ctx, &common.model)?;
    let b: ChatBody = from_value(body)?;
    if b.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must not be empty",
        ));
    }
    if b.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::unsupported(
            "tools",
            "tool calling is not supported",
        ));
    }
    if let Some(rf) = &b.response_format {
        if rf.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::unsupported(
                "response_format",
                "only `{\"type\": \"text\"}` is supported",
            ));
        }
    }
    if b.prompt_logprobs.is_some() {
        return Err(ApiError::unsupported(
            "prompt_logprobs",
            "`prompt_logprobs` is supported on /v1/completions only",
        ));
    }
    if b.echo == Some(true) {
        return Err(ApiError::unsupported(
            "echo",
            "`echo` is supported on /v1/completions only",
        ));
    }
    let mut messages = Vec::with_capacity(b.messages.len());
    for (i, m) in b.messages.iter().enumerate() {
        messages.push(ChatMessage {
            role: m.role.clone(),
            content: message_text(i, &m.content)?,
        });
    }
    let rendered = ctx
        .text
        .render_chat(&messages, b.add_generation_prompt.unwrap_or(true))
        .map_err(|e| ApiError::invalid_param("messages", format!("chat template: {e}")))?;
    // The template already writes BOS.
    let prompt = ctx
        .text
        .encode(&rendered, common.add_special_tokens.unwrap_or(false))
        .map_err(|e| ApiError::invalid_param("messages", format!("cannot tokenize: {e}")))?;
    let max_tokens = b.max_completion_tokens.or(common.max_tokens);
    let mut p = build(ctx, &common, prompt, max_tokens, None)?;
    let logprobs = match (b.logprobs.unwrap_or(false), b.top_logprobs) {
        (true, k) => Some(check_top(ctx, "top_logprobs", k.unwrap_or(0))?),
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "`top_logprobs` requires `logprobs: true`",
            ))
        }
        (false, _) => None,
    };
    if p.stream && logprobs.is_some() {
        return Err(ApiError::unsupported(
            "logprobs",
            "log-probabilities are only supported without streaming",
        ));
    }
    p.logprobs = logprobs;
    p.gen.logprobs = logprobs;
    Ok(p)
}
