//! Blocking OpenAI-compatible HTTP client (ureq). One `Client` is shared by all worker threads; ureq's
//! agent pools keep-alive connections.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{Error, Result};

/// How long `run_*` functions wait for `GET /v1/models` to answer by default.
pub const DEFAULT_WAIT_READY: Duration = Duration::from_secs(60);

/// Response bodies can be large (`prompt_logprobs` for ~3k-token prompts); allow up to 1 GiB.
const BODY_LIMIT: u64 = 1 << 30;
/// Error bodies are quoted in messages; keep them short.
const ERROR_BODY_CHARS: usize = 500;

/// A client bound to one server.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    base: String,
}

impl Client {
    /// `base_url` may be given with or without a trailing `/v1` (both `http://h:8000` and
    /// `http://h:8000/v1/` work). `timeout` bounds each whole request; `None` waits forever.
    pub fn new(base_url: &str, timeout: Option<Duration>) -> Result<Self> {
        let mut base = base_url.trim().trim_end_matches('/').to_string();
        if let Some(stripped) = base.strip_suffix("/v1") {
            base = stripped.to_string();
        }
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::Options(format!(
                "base URL {base_url:?} must start with http:// or https://"
            )));
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(timeout)
            .max_idle_connections(512)
            .max_idle_connections_per_host(512)
            .build();
        Ok(Client {
            agent: config.into(),
            base,
        })
    }

    /// The normalised base URL (no trailing `/v1`).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Absolute URL for an API path such as `/v1/models`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `GET path` → (url, status, body), whatever the status.
    fn get(&self, path: &str) -> Result<(String, u16, String)> {
        let url = self.url(path);
        let mut resp = self.agent.get(&url).call().map_err(|e| Error::Http {
            url: url.clone(),
            msg: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let text = read_body(&url, resp.body_mut())?;
        Ok((url, status, text))
    }

    /// `GET path` → JSON body; non-2xx is an error.
    pub fn get_json(&self, path: &str) -> Result<Value> {
        let (url, status, text) = self.get(path)?;
        parse_response(&url, status, &text)
    }

    /// `GET path` → the body as text (e.g. `/metrics`); non-2xx is an error.
    pub fn get_text(&self, path: &str) -> Result<String> {
        let (url, status, text) = self.get(path)?;
        if !(200..300).contains(&status) {
            return Err(status_error(&url, status, &text));
        }
        Ok(text)
    }

    /// Send `body` as JSON to `path`; the response is returned whatever its status.
    fn post(
        &self,
        path: &str,
        body: &Value,
        accept: Option<&str>,
    ) -> Result<(String, ureq::http::Response<ureq::Body>)> {
        let url = self.url(path);
        let mut req = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json");
        if let Some(a) = accept {
            req = req.header("Accept", a);
        }
        let resp = req
            .send(body.to_string().as_bytes())
            .map_err(|e| Error::Http {
                url: url.clone(),
                msg: e.to_string(),
            })?;
        Ok((url, resp))
    }

    /// `POST path` with a JSON body → JSON body; non-2xx is an error.
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        let (url, mut resp) = self.post(path, body, None)?;
        let status = resp.status().as_u16();
        let text = read_body(&url, resp.body_mut())?;
        parse_response(&url, status, &text)
    }

    /// `POST path` expecting a server-sent-event stream. `on_event` is called with the arrival time
    /// and JSON payload of each `data:` event until `data: [DONE]` or the end of the stream.
    pub fn post_stream(
        &self,
        path: &str,
        body: &Value,
        mut on_event: impl FnMut(Instant, &Value) -> Result<()>,
    ) -> Result<()> {
        let (url, mut resp) = self.post(path, body, Some("text/event-stream"))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let text = read_body(&url, resp.body_mut())?;
            return Err(status_error(&url, status, &text));
        }
        let reader = BufReader::new(resp.body_mut().with_config().limit(BODY_LIMIT).reader());
        for line in reader.lines() {
            let line = line.map_err(|e| Error::Http {
                url: url.clone(),
                msg: format!("reading event stream: {e}"),
            })?;
            let Some(data) = line.strip_prefix("data:") else {
                continue; // comments, `event:` lines, blank separators
            };
            let data = data.trim();
            if data == "[DONE]" {
                break;
            }
            if data.is_empty() {
                continue;
            }
            let now = Instant::now();
            let v: Value = serde_json::from_str(data).map_err(|e| {
                Error::Protocol(format!(
                    "{url}: stream event is not JSON ({e}): {data:.200}"
                ))
            })?;
            if let Some(err) = v.get("error") {
                // A server-reported failure mid-stream is a failed request, not a broken contract.
                return Err(Error::Http {
                    url: url.clone(),
                    msg: format!("error event in stream: {err}"),
                });
            }
            on_event(now, &v)?;
        }
        Ok(())
    }

    /// The `id` of the first model listed by `GET /v1/models`.
    pub fn first_model_id(&self) -> Result<String> {
        let v = self.get_json("/v1/models")?;
        v.get("data")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(|m| m.get("id"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                Error::Protocol(format!(
                    "GET {} did not list any model (expected data[0].id): {:.300}",
                    self.url("/v1/models"),
                    v.to_string()
                ))
            })
    }

    /// Poll `GET /v1/models` every 500 ms until it answers 200 with at least one model (servers
    /// answer 503 or refuse connections while loading), for at most `timeout`. Returns the model ids.
    pub fn wait_ready(&self, timeout: Duration) -> Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.get_json("/v1/models") {
                Ok(v) => {
                    let ids: Vec<String> = v
                        .get("data")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|m| m.get("id").and_then(Value::as_str))
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default();
                    if !ids.is_empty() {
                        return Ok(ids);
                    }
                    format!("no model listed: {:.200}", v.to_string())
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(Error::Http {
                    url: self.url("/v1/models"),
                    msg: format!(
                        "server not ready after {:.0} s: {last}",
                        timeout.as_secs_f64()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Optionally wait for readiness (see [`Self::wait_ready`]), then resolve the model name: the
    /// given one, or the server's first model.
    pub fn prepare(&self, model: Option<&str>, wait: Option<Duration>) -> Result<String> {
        if let Some(t) = wait {
            let ids = self.wait_ready(t)?;
            if let Some(m) = model.filter(|m| !m.is_empty()) {
                return Ok(m.to_string());
            }
            return Ok(ids[0].clone());
        }
        self.resolve_model(model)
    }

    /// Resolve an optional model name: the given one, or the server's first model.
    pub fn resolve_model(&self, model: Option<&str>) -> Result<String> {
        match model {
            Some(m) if !m.is_empty() => Ok(m.to_string()),
            _ => self.first_model_id(),
        }
    }
}

fn read_body(url: &str, body: &mut ureq::Body) -> Result<String> {
    body.with_config()
        .limit(BODY_LIMIT)
        .read_to_string()
        .map_err(|e| Error::Http {
            url: url.to_string(),
            msg: format!("reading response body: {e}"),
        })
}

fn status_error(url: &str, status: u16, text: &str) -> Error {
    // Prefer the OpenAI-style `error.message` when present.
    let msg = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| text.chars().take(ERROR_BODY_CHARS).collect());
    Error::Status {
        url: url.to_string(),
        status,
        body: msg,
    }
}

fn parse_response(url: &str, status: u16, text: &str) -> Result<Value> {
    if !(200..300).contains(&status) {
        return Err(status_error(url, status, text));
    }
    serde_json::from_str(text).map_err(|e| {
        Error::Protocol(format!(
            "{url}: response is not JSON ({e}): {}",
            text.chars().take(ERROR_BODY_CHARS).collect::<String>()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_normalisation() {
        for b in [
            "http://h:8000",
            "http://h:8000/",
            "http://h:8000/v1",
            "http://h:8000/v1/",
        ] {
            assert_eq!(Client::new(b, None).unwrap().base_url(), "http://h:8000");
        }
        assert!(Client::new("h:8000", None).is_err());
    }
}
