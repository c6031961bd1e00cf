//! What an int4 weight format costs in quality, measured on the CPU reference: perplexity of a
//! model over PPL records (challenge JSONL) with every int4-eligible projection quantized and
//! dequantized by each candidate scheme (the rest rounded to bf16, as `--quant int4` does).
//!
//! usage: int4_quality [MODEL] [RECORDS] [LIMIT] [SCHEME ...]
//!        (defaults: the real Gemma 3 270M, the Apache records, all records, every scheme;
//!        `-` keeps a default; SCHEME is a name from the table below, e.g. "sym8 g128")
//!
//! Schemes: `sym7` is the current GPU format (symmetric, scale = max|x| / 7, bf16 scale);
//! `sym8` uses all 16 levels (scale = the signed value of largest magnitude / -8, as Q4_0);
//! `asym` stores a bf16 scale and minimum per group (16 levels between min and max, as Q4_1).
//! `+head` keeps the output projection in bf16.

use std::sync::Arc;
use std::time::Instant;

use half::bf16;
use hayai_bench::ppl::{load_records, PplAccumulator, PplRecord};
use hayai_cuda::quant::{bf16_matrix, quantize_model_with};
use hayai_engine::LogprobEntry;
use hayai_model::cpu::CpuRunner;
use hayai_model::{Matrix, Model, Rows, Runner};

#[derive(Clone, Copy)]
enum Scheme {
    Sym7,
    Sym8,
    Asym,
}

fn bf(v: f32) -> f32 {
    bf16::from_f32(v).to_f32()
}

fn qdq_group(g: &mut [f32], s: Scheme) {
    match s {
        Scheme::Sym7 => {
            let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = bf(amax / 7.0);
            for v in g {
                *v = if d == 0.0 {
                    0.0
                } else {
                    (*v / d).round().clamp(-8.0, 7.0) * d
                };
            }
        }
        Scheme::Sym8 => {
            let big = g
                .iter()
                .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            let d = bf(big / -8.0);
            for v in g {
                *v = if d == 0.0 {
                    0.0
                } else {
                    (*v / d).round().clamp(-8.0, 7.0) * d
                };
            }
        }
        Scheme::Asym => {
            let lo = g.iter().fold(f32::INFINITY, |m, &v| m.min(v));
            let hi = g.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let d = bf((hi - lo) / 15.0);
            let m = bf(lo);
            for v in g {
                *v = if d == 0.0 {
                    m
                } else {
                    ((*v - m) / d).round().clamp(0.0, 15.0) * d + m
                };
            }
        }
    }
}

fn qdq(m: &Matrix, s: Scheme, group: usize) -> Matrix {
    let mut data: Vec<f32> = (0..m.rows).flat_map(|r| m.row(r).to_vec()).collect();
    for row in data.chunks_mut(m.cols) {
        row.chunks_mut(group).for_each(|g| qdq_group(g, s));
    }
    Matrix::from_f32(m.rows, m.cols, data)
}

/// The model with every int4-eligible projection quantized by `s` (see `quantize_model_with`),
/// optionally with the output projection kept in bf16.
fn quantized(model: &Model, s: Scheme, group: usize, head_bf16: bool) -> Model {
    let mut m = quantize_model_with(model, |x| qdq(x, s, group));
    if head_bf16 {
        let head = model
            .weights
            .lm_head
            .as_ref()
            .unwrap_or(&model.weights.embed);
        m.weights.lm_head = Some(bf16_matrix(head));
    }
    m
}

/// Perplexity over `recs` as `hayai ppl` scores it in process.
fn ppl(model: Model, recs: &[PplRecord]) -> f64 {
    let mut r = CpuRunner::new(Arc::new(model)).expect("runner");
    let mut acc = PplAccumulator::default();
    for rec in recs {
        let seq = rec.prompt();
        let first = rec.context_token_ids.len();
        let mut lps = Vec::new();
        r.truncate(0);
        r.forward(&seq, Rows::All, &mut |i, logits| {
            if i + 1 >= first && i + 1 < seq.len() {
                lps.push(LogprobEntry::from_logits(logits, seq[i + 1], 0).logprob as f64);
            }
        })
        .expect("forward");
        acc.add(&rec.id, &lps).expect("record");
    }
    acc.summary().ppl
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).filter(|a| a.as_str() != "-");
    let model_path = arg(0)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(hayai_core::cache::real_model_path);
    let rec_path = arg(1).cloned().unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../data/reference/apache-2.0-ppl-records.jsonl"
        )
        .to_string()
    });
    let limit: usize = arg(2).map_or(usize::MAX, |n| n.parse().expect("LIMIT"));
    let only: Vec<&String> = args.iter().skip(3).collect();
    let model = hayai_model::load::load_model(&model_path).expect("model");
    let mut recs = load_records(std::path::Path::new(&rec_path)).expect("records");
    recs.truncate(limit);
    println!(
        "{} | {} records, {} target tokens",
        model_path.display(),
        recs.len(),
        recs.iter().map(|r| r.target_token_ids.len()).sum::<usize>()
    );
    let t = Instant::now();
    println!(
        "{:<18} ppl {:.4}  ({:.0} s)",
        "native f32",
        ppl(model.clone(), &recs),
        t.elapsed().as_secs_f64()
    );
    for (name, s, group, head) in [
        ("sym7 g128", Scheme::Sym7, 128, false),
        ("sym8 g128", Scheme::Sym8, 128, false),
        ("asym g128", Scheme::Asym, 128, false),
        ("sym7 g32", Scheme::Sym7, 32, false),
        ("sym8 g32", Scheme::Sym8, 32, false),
        ("asym g32", Scheme::Asym, 32, false),
        ("sym8 g128 +head", Scheme::Sym8, 128, true),
        ("asym g32 +head", Scheme::Asym, 32, true),
    ] {
        if !only.is_empty() && !only.iter().any(|o| o.as_str() == name) {
            continue;
        }
        let t = Instant::now();
        let p = ppl(quantized(&model, s, group, head), &recs);
        println!(
            "{name:<18} ppl {p:.4}  ({:.0} s)",
            t.elapsed().as_secs_f64()
        );
    }
}
