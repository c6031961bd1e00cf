//! The engine thread: it owns the [`Engine`] (which is not `Sync`) and serves queued jobs one
//! at a time, in arrival order.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hayai_engine::{Engine, EngineError, Flow, GenOutput, GenRequest};
use hayai_model::ModelError;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::metrics::{Histogram, Metrics};
use crate::text::{decode_after, IncrementalDecoder, StopMatcher, TextModel};

/// What the engine thread reports back to the request's handler.
#[derive(Debug)]
pub enum Event {
    /// Streaming only: newly completed text and the ids generated since the last delta.
    Delta {
        text: String,
        ids: Vec<u32>,
    },
    Done(Result<Finished, ApiError>),
}

#[derive(Debug)]
pub struct Finished {
    pub output: GenOutput,
    /// Generated text, cut before a matched stop string.
    pub text: String,
    pub finish_reason: &'static str,
}

pub struct Job {
    pub gen: GenRequest,
    pub stop: Vec<String>,
    pub stream: bool,
    pub events: UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub enqueued: Instant,
}

impl Job {
    fn abandoned(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }
}

/// Sets the job's cancellation flag when dropped, i.e. when the handler future or the SSE
/// stream goes away because the client disconnected.
pub struct CancelGuard(pub Arc<AtomicBool>);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The sending side of the bounded FIFO in front of the engine thread.
#[derive(Clone)]
pub struct Queue {
    tx: SyncSender<Job>,
    metrics: Arc<Metrics>,
}

impl Queue {
    /// Enqueue a job; a full queue is a 503.
    pub fn submit(
        &self,
        gen: GenRequest,
        stop: Vec<String>,
        stream: bool,
    ) -> Result<(UnboundedReceiver<Event>, CancelGuard), ApiError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            gen,
            stop,
            stream,
            events: tx,
            cancel: cancel.clone(),
            enqueued: Instant::now(),
        };
        // Count first so the engine thread never decrements below zero.
        self.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(job) {
            Ok(()) => Ok((rx, CancelGuard(cancel))),
            Err(e) => {
                self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    TrySendError::Full(_) => {
                        ApiError::overloaded("the request queue is full; retry later")
                    }
                    TrySendError::Disconnected(_) => {
                        ApiError::internal("the engine thread has stopped")
                    }
                })
            }
        }
    }
}

/// Start the engine thread. `capacity` is the number of jobs that may wait behind the one being
/// generated. The thread ends when every [`Queue`] clone is dropped.
pub fn spawn(
    engine: Engine,
    text: Arc<dyn TextModel>,
    metrics: Arc<Metrics>,
    capacity: usize,
) -> std::io::Result<(Queue, JoinHandle<()>)> {
    let (tx, rx) = sync_channel::<Job>(capacity.max(1));
    let m = metrics.clone();
    let handle = std::thread::Builder::new()
        .name("hayai-engine".into())
        .spawn(move || engine_loop(engine, text, m, rx))?;
    Ok((Queue { tx, metrics }, handle))
}

fn engine_loop(
    mut engine: Engine,
    text: Arc<dyn TextModel>,
    metrics: Arc<Metrics>,
    rx: Receiver<Job>,
) {
    while let Ok(job) = rx.recv() {
        metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
        if job.abandoned() {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        metrics.running.fetch_add(1, Ordering::SeqCst);
        let result = catch_unwind(AssertUnwindSafe(|| {
            run_job(&mut engine, &text, &metrics, &job)
        }));
        metrics.running.fetch_sub(1, Ordering::SeqCst);
        let result = match result {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(ApiError::internal(format!("generation failed: {msg}")))
            }
        };
        if job.abandoned() {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        // The receiver may be gone (client disconnected); nothing to do then.
        let _ = job.events.send(Event::Done(result));
    }
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::InvalidRequest(m) => ApiError::bad_request(m),
        EngineError::Model(
            m @ (ModelError::TokenOutOfRange { .. } | ModelError::ContextOverflow { .. }),
        ) => ApiError::bad_request(m.to_string()),
        EngineError::Model(m) => ApiError::internal(format!("model error: {m}")),
    }
}

fn run_job(
    engine: &mut Engine,
    text: &Arc<dyn TextModel>,
    metrics: &Metrics,
    job: &Job,
) -> Result<Finished, ApiError> {
    let matcher = StopMatcher::new(job.stop.clone());
    // Text is only needed token by token for streaming or stop strings; otherwise it is
    // decoded once at the end.
    let mut dec = (job.stream || !matcher.is_empty())
        .then(|| IncrementalDecoder::new(text.clone(), &job.gen.prompt));
    let mut sent_bytes = 0usize;
    let mut sent_ids = 0usize;
    let mut stop_at: Option<usize> = None;
    let mut itl = Histogram::itl();
    let mut last: Option<Instant> = None;

    let result = engine.generate(&job.gen, &mut |id| {
        let now = Instant::now();
        if let Some(prev) = last {
            itl.observe(now - prev);
        }
        last = Some(now);
        if let Some(d) = dec.as_mut() {
            let old = d.text().len();
            d.push(id);
            stop_at = matcher.find(d.text(), old);
            if job.stream {
                let end = stop_at.unwrap_or_else(|| matcher.safe_len(d.text()));
                if end > sent_bytes {
                    let ids = d.generated()[sent_ids..].to_vec();
                    sent_ids += ids.len();
                    let _ = job.events.send(Event::Delta {
                        text: d.text()[sent_bytes..end].to_string(),
                        ids,
                    });
                    sent_bytes = end;
                }
            }
        }
        if stop_at.is_some() || job.abandoned() {
            Flow::Stop
        } else {
            Flow::Continue
        }
    });
    let output = result.map_err(engine_error)?;

    let mut finish_reason = output.finish.as_openai();
    let text_out = match dec.as_mut() {
        Some(d) => {
            let old = d.text().len();
            d.finish();
            if stop_at.is_none() {
                stop_at = matcher.find(d.text(), old);
            }
            let mut t = d.text().to_string();
            if let Some(p) = stop_at {
                t.truncate(p);
                finish_reason = "stop";
            }
            if job.stream {
                let ids = d.generated()[sent_ids..].to_vec();
                if t.len() > sent_bytes || !ids.is_empty() {
                    let _ = job.events.send(Event::Delta {
                        text: t.get(sent_bytes..).unwrap_or("").to_string(),
                        ids,
                    });
                }
            }
            t
        }
        None => decode_after(text, &job.gen.prompt, &output.tokens),
    };

    let e2e = job.enqueued.elapsed();
    let queue = e2e
        .checked_sub(output.timings.prefill + output.timings.decode)
        .unwrap_or(Duration::ZERO);
    metrics.finish_request(
        job.gen.prompt.len(),
        output.tokens.len(),
        queue,
        output.timings.ttft,
        output.timings.decode,
        e2e,
        &itl,
    );
    Ok(Finished {
        output,
        text: text_out,
        finish_reason,
    })
}
