//! A tiny in-test OpenAI-compatible server: a `TcpListener` thread that hands each parsed request to
//! a test-supplied handler and writes back the canned JSON (or SSE events) the handler builds.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

#[derive(Debug, Clone)]
pub struct MockRequest {
    pub method: String,
    pub path: String,
    pub body: Value,
    pub received_at: Instant,
}

pub enum MockResponse {
    Json(u16, Value),
    Raw(u16, String),
    /// Server-sent events: each item is sent after its delay as `data: <payload>`.
    Sse(Vec<(Duration, String)>),
}

pub type Handler = dyn Fn(&MockRequest) -> MockResponse + Send + Sync;

pub struct MockServer {
    pub url: String,
    pub requests: Arc<Mutex<Vec<MockRequest>>>,
}

impl MockServer {
    pub fn start(handler: impl Fn(&MockRequest) -> MockResponse + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let handler = handler.clone();
                let log = log.clone();
                std::thread::spawn(move || serve(stream, &*handler, &log));
            }
        });
        MockServer { url, requests }
    }

    /// Requests received on `path`, in arrival order.
    pub fn requests_to(&self, path: &str) -> Vec<MockRequest> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

fn serve(stream: TcpStream, handler: &Handler, log: &Mutex<Vec<MockRequest>>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut out = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let received_at = Instant::now();
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut content_length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    content_length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let req = MockRequest {
            method,
            path,
            body,
            received_at,
        };
        log.lock().unwrap().push(req.clone());
        match handler(&req) {
            MockResponse::Json(status, v) => {
                if write_plain(&mut out, status, &v.to_string()).is_err() {
                    return;
                }
            }
            MockResponse::Raw(status, s) => {
                if write_plain(&mut out, status, &s).is_err() {
                    return;
                }
            }
            MockResponse::Sse(events) => {
                let _ = out.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
                );
                for (delay, data) in events {
                    std::thread::sleep(delay);
                    let _ = out.write_all(format!("data: {data}\n\n").as_bytes());
                    let _ = out.flush();
                }
                return; // close-delimited body
            }
        }
    }
}

fn write_plain(out: &mut TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    // One write: piecewise writes on a raw socket hit Nagle + delayed-ACK stalls (~40 ms).
    let msg = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    out.write_all(msg.as_bytes())?;
    out.flush()
}

/// `GET /v1/models` answer listing one model.
pub fn models(id: &str) -> MockResponse {
    MockResponse::Json(
        200,
        serde_json::json!({"object": "list", "data": [{"id": id, "object": "model"}]}),
    )
}

/// Write a ShareGPT file with the given (id, text) prompts.
pub fn sharegpt_file(dir: &std::path::Path, prompts: &[(&str, &str)]) -> std::path::PathBuf {
    let v: Vec<Value> = prompts
        .iter()
        .map(|(id, text)| serde_json::json!({"id": id, "conversations": [{"from": "human", "value": text}]}))
        .collect();
    let path = dir.join("prompts.json");
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    path
}
