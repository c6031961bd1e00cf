//! Prometheus text-format metrics, kept with atomics and small locked histograms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Latency buckets (seconds) shared by the TTFT and end-to-end histograms.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0,
];
/// Inter-token latency buckets (seconds): decode steps are milliseconds.
const ITL_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
    0.25, 0.5, 1.0,
];

#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn itl() -> Self {
        Self::new(ITL_BUCKETS)
    }

    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        // Non-cumulative storage; rendering accumulates.
        if let Some(i) = self.bounds.iter().position(|&b| s <= b) {
            self.counts[i] += 1;
        }
        self.sum += s;
        self.count += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        debug_assert_eq!(self.bounds, other.bounds);
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut acc = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            acc += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub queue_depth: AtomicUsize,
    pub running: AtomicUsize,
    pub cancelled: AtomicU64,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
    queue_time: Mutex<Histogram>,
    /// f64 bits: decode tokens per second of the last finished request.
    recent_tps: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            queue_depth: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            cancelled: AtomicU64::new(0),
            ttft: Mutex::new(Histogram::new(LATENCY_BUCKETS)),
            itl: Mutex::new(Histogram::new(ITL_BUCKETS)),
            e2e: Mutex::new(Histogram::new(LATENCY_BUCKETS)),
            queue_time: Mutex::new(Histogram::new(LATENCY_BUCKETS)),
            recent_tps: AtomicU64::new(0f64.to_bits()),
        }
    }
}

/// A poisoned metrics lock only means another thread panicked mid-update; the counts are still
/// usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        *lock(&self.requests)
            .entry((endpoint.to_string(), status))
            .or_insert(0) += 1;
    }

    /// Record one finished generation.
    #[allow(clippy::too_many_arguments)]
    pub fn finish_request(
        &self,
        prompt_tokens: usize,
        generated: usize,
        queue: Duration,
        ttft: Duration,
        decode: Duration,
        e2e: Duration,
        itl: &Histogram,
    ) {
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.generation_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
        lock(&self.queue_time).observe(queue);
        lock(&self.ttft).observe(queue + ttft);
        lock(&self.e2e).observe(e2e);
        lock(&self.itl).merge(itl);
        if generated > 1 && !decode.is_zero() {
            let tps = (generated - 1) as f64 / decode.as_secs_f64();
            self.recent_tps.store(tps.to_bits(), Ordering::Relaxed);
        }
    }

    pub fn requests_with(&self, endpoint: &str, status: u16) -> u64 {
        lock(&self.requests)
            .get(&(endpoint.to_string(), status))
            .copied()
            .unwrap_or(0)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP hayai_requests_total HTTP requests by endpoint and status.\n");
        out.push_str("# TYPE hayai_requests_total counter\n");
        for ((ep, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "hayai_requests_total{{endpoint=\"{ep}\",status=\"{status}\"}} {n}"
            );
        }
        let counters = [
            (
                "hayai_prompt_tokens_total",
                "Prompt tokens processed.",
                self.prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "hayai_generation_tokens_total",
                "Tokens generated.",
                self.generation_tokens.load(Ordering::Relaxed),
            ),
            (
                "hayai_requests_cancelled_total",
                "Generations cancelled by a client disconnect (queued or running).",
                self.cancelled.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let gauges = [
            (
                "hayai_queue_depth",
                "Requests waiting for the engine.",
                self.queue_depth.load(Ordering::Relaxed) as f64,
            ),
            (
                "hayai_requests_running",
                "Requests being generated.",
                self.running.load(Ordering::Relaxed) as f64,
            ),
            (
                "hayai_recent_tokens_per_second",
                "Decode throughput of the last finished request.",
                f64::from_bits(self.recent_tps.load(Ordering::Relaxed)),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        lock(&self.ttft).render(
            &mut out,
            "hayai_time_to_first_token_seconds",
            "Time from enqueue to the first generated token.",
        );
        lock(&self.itl).render(
            &mut out,
            "hayai_inter_token_latency_seconds",
            "Time between consecutive generated tokens.",
        );
        lock(&self.e2e).render(
            &mut out,
            "hayai_e2e_request_latency_seconds",
            "Time from enqueue to the end of generation.",
        );
        lock(&self.queue_time).render(
            &mut out,
            "hayai_queue_time_seconds",
            "Time a request waited in the queue.",
        );
        out
    }
}

/// Request totals read back from the text [`Metrics::render`] writes: a client's view of
/// `/metrics`, e.g. to split a benchmark's latency into the first token and the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// Finished generations (the end-to-end histogram's count).
    pub requests: u64,
    pub prompt_tokens: u64,
    pub generated: u64,
    /// Summed over the requests: enqueue to the first token, and enqueue to the end.
    pub ttft_s: f64,
    pub e2e_s: f64,
}

impl Totals {
    /// `None` when a total is missing or unreadable.
    pub fn parse(text: &str) -> Option<Totals> {
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        Some(Totals {
            requests: value("hayai_e2e_request_latency_seconds_count")? as u64,
            prompt_tokens: value("hayai_prompt_tokens_total")? as u64,
            generated: value("hayai_generation_tokens_total")? as u64,
            ttft_s: value("hayai_time_to_first_token_seconds_sum")?,
            e2e_s: value("hayai_e2e_request_latency_seconds_sum")?,
        })
    }

    /// What happened between `earlier` and these totals.
    pub fn since(&self, earlier: &Totals) -> Totals {
        Totals {
            requests: self.requests.saturating_sub(earlier.requests),
            prompt_tokens: self.prompt_tokens.saturating_sub(earlier.prompt_tokens),
            generated: self.generated.saturating_sub(earlier.generated),
            ttft_s: self.ttft_s - earlier.ttft_s,
            e2e_s: self.e2e_s - earlier.e2e_s,
        }
    }

    /// Mean seconds from enqueue to the first token (queue, prefill, the first step).
    pub fn mean_ttft_s(&self) -> f64 {
        self.ttft_s / self.requests.max(1) as f64
    }

    /// Mean seconds from enqueue to the end of generation.
    pub fn mean_e2e_s(&self) -> f64 {
        self.e2e_s / self.requests.max(1) as f64
    }

    /// Tokens after each request's first over the time after it (the decode loop's rate).
    pub fn decode_tps(&self) -> f64 {
        let tokens = self.generated.saturating_sub(self.requests) as f64;
        let secs = self.e2e_s - self.ttft_s;
        if secs > 0.0 {
            tokens / secs
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_renders_cumulative_buckets() {
        let m = Metrics::default();
        let mut itl = Histogram::itl();
        itl.observe(Duration::from_micros(800));
        itl.observe(Duration::from_millis(4));
        itl.observe(Duration::from_secs(5));
        m.finish_request(
            10,
            4,
            Duration::ZERO,
            Duration::from_millis(30),
            Duration::from_millis(100),
            Duration::from_millis(130),
            &itl,
        );
        m.count_request("/v1/completions", 200);
        let s = m.render();
        assert!(s.contains("hayai_inter_token_latency_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(s.contains("hayai_inter_token_latency_seconds_bucket{le=\"0.004\"} 2\n"));
        assert!(s.contains("hayai_inter_token_latency_seconds_bucket{le=\"1\"} 2\n"));
        assert!(s.contains("hayai_inter_token_latency_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(s.contains("hayai_inter_token_latency_seconds_count 3\n"));
        assert!(s.contains("hayai_prompt_tokens_total 10\n"));
        assert!(s.contains("hayai_generation_tokens_total 4\n"));
        assert!(s.contains("hayai_recent_tokens_per_second 30\n"));
        assert!(s.contains("hayai_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1\n"));
    }

    #[test]
    fn totals_read_back_what_render_writes() {
        let m = Metrics::default();
        let itl = Histogram::itl();
        let ms = Duration::from_millis;
        assert_eq!(Totals::parse(&m.render()), Some(Totals::default()));
        m.finish_request(100, 512, ms(1), ms(9), ms(250), ms(260), &itl);
        let first = Totals::parse(&m.render()).unwrap();
        m.finish_request(50, 101, ms(0), ms(4), ms(50), ms(54), &itl);
        let t = Totals::parse(&m.render()).unwrap();
        assert_eq!((t.requests, t.prompt_tokens, t.generated), (2, 150, 613));
        // TTFT counts the queue: (1 + 9) + (0 + 4) ms.
        assert!((t.ttft_s - 0.014).abs() < 1e-9, "{t:?}");
        assert!((t.e2e_s - 0.314).abs() < 1e-9, "{t:?}");
        assert!((t.mean_ttft_s() - 0.007).abs() < 1e-9);
        // 611 tokens after the firsts over 0.300 s.
        assert!(
            (t.decode_tps() - 611.0 / 0.300).abs() < 1e-6,
            "{}",
            t.decode_tps()
        );
        let d = t.since(&first);
        assert_eq!((d.requests, d.prompt_tokens, d.generated), (1, 50, 101));
        assert!((d.decode_tps() - 100.0 / 0.050).abs() < 1e-6);
        assert_eq!(Totals::parse("hayai_prompt_tokens_total 3\n"), None);
    }
}
