//! Parity and speed checks on a GPU machine (run by `scripts/gpu-check.sh`).
//!
//! usage: gpu_check [parity] [fuse] [single] [a8] [tc] [kw] [ad] [hd] [e4b-parity] [prefill] [prefill-e4b]
//!        [prefill-bench] [bench] [bench-nopdl] [bench-fuse] [bench-u8] [bench-prefetch] [bench-tile]
//!        [bench-a8] [bench-pf] [bench-pfa] [bench-tc] [bench-kw] [bench-hd] [bench-single] [bench-bf16]
//!        [bench-bf16-tiled] [stream] [stream-w4] [stream-bf16] [bench-stream] [bench-stream-w4]
//!        [bench-stream-bf16] [lm-head-int8] ...
//!        (default: all)
//!
//! The bench stages take the prompt and generation lengths from `HAYAI_BENCH_PROMPT` and
//! `HAYAI_BENCH_GEN` (default 128 and 512), so a measurement build can be timed at a long
//! context the same way (`scripts/gpu-session.sh` rotate: `VAR=VALUE@PATH`).

use std::sync::Arc;
use std::time::Instant;

use hayai_cuda::bench::{bench_engine, BenchOptions};
use hayai_cuda::check::{graph_matches_eager, parity, prefill_parity, same_results};
use hayai_cuda::synth::{e4b_spec, int8_head_cases, random_model_bf16, small_spec};
use hayai_cuda::{CudaOptions, Quant, StreamedStep};
use hayai_model::random::random_model;
use hayai_model::Arch;

fn opts(quant: Quant, persistent_gemv: bool) -> CudaOptions {
    CudaOptions {
        quant,
        persistent_gemv,
        ..Default::default()
    }
}

/// A bench length from the environment variable `var` (a positive integer), else `default`.
fn bench_len(var: &str, default: usize) -> Result<usize, String> {
    match std::env::var(var) {
        Err(_) => Ok(default),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{var}={v}: expected a positive integer")),
        },
    }
}

/// A change of options (an attention order, a GEMV variant) applied to a base.
type Variant = fn(CudaOptions) -> CudaOptions;

/// `o` with the attention compiled for the head dim, p.V by warps (the int4 default).
fn warp_values(o: CudaOptions) -> CudaOptions {
    CudaOptions {
        attn_by_head_dim: Some(true),
        attn_warp_values: true,
        ..o
    }
}

/// `o` with the run-time-head-dim attention (p.V by threads): the sums the shared-memory tile
/// and the head-dim kernels without warp values reproduce bit for bit.
fn runtime_attention(o: CudaOptions) -> CudaOptions {
    CudaOptions {
        attn_by_head_dim: Some(false),
        attn_warp_values: false,
        ..o
    }
}

/// Batched prefill: `PrefillReport::precise_ok` (the precise mode against its CPU twin, to
/// 1e-3 or to twice what its rounding alone does to the model; chunking changes nothing). The
/// default mode's distance to its twin is printed: random-weight models amplify bf16 rounding
/// chaotically.
fn prefill_ok(r: &hayai_cuda::check::PrefillReport) -> bool {
    r.precise_ok()
}

/// The two small random models the checks run on (Gemma 4: head dims 128/256, sliding window
/// 8, KV sharing, per-layer embeddings, softcap; Gemma 3), each with a prompt of `len` tokens.
fn small_models(len: usize) -> Vec<(&'static str, hayai_model::Model, Vec<u32>)> {
    [
        ("small-gemma4", Arch::Gemma4, 1),
        ("small-gemma3", Arch::Gemma3, 2),
    ]
    .into_iter()
    .map(|(name, arch, seed)| {
        let m = random_model(&small_spec(arch), seed);
        let p = hayai_cuda::bench::bench_prompt(len, m.spec.vocab);
        (name, m, p)
    })
    .collect()
}

/// A small model the streamed step can run (its cells are whole 16-row tiles: a vocabulary of
/// 1,024 instead of 1,000) and a 32-token prompt.
fn stream_model(arch: Arch, seed: u64) -> (hayai_model::Model, Vec<u32>) {
    let mut spec = small_spec(arch);
    spec.vocab = 1024;
    if let Some(p) = spec.ple.as_mut() {
        p.vocab = 1024;
    }
    let m = random_model(&spec, seed);
    let p = hayai_cuda::bench::bench_prompt(32, m.spec.vocab);
    (m, p)
}

/// (passed, line) of a parity run: logits within `tol` (rel L2) of the CPU reference and every
/// greedy token identical, or with int8 activations within what rounding flips do by themselves
/// (`ParityReport::agrees`).
fn parity_verdict(
    r: Result<hayai_cuda::check::ParityReport, hayai_cuda::CudaError>,
    tol: f64,
    label: String,
) -> (bool, String) {
    match r {
        Ok(r) => (r.agrees(tol), format!("{label}{}", r.line())),
        Err(e) => (false, e.to_string()),
    }
}

/// The streamed step's options for `quant`, W4A8 where `int8` (int4 only).
fn streamed(quant: Quant, int8: bool) -> CudaOptions {
    CudaOptions {
        streamed_step: StreamedStep::On,
        int8_activations: int8,
        ..opts(quant, false)
    }
}

/// (passed, line) of the streamed step `base` (`streamed`) on `m` (`prompt`, then 300 greedy
/// steps) held to 1e-4 (see `parity_verdict`), with graph replay and with eager launches.
fn streamed_parity(
    m: &hayai_model::Model,
    prompt: &[u32],
    base: &CudaOptions,
    label: &str,
) -> Vec<(bool, String)> {
    [true, false]
        .into_iter()
        .map(|use_graph| {
            let o = CudaOptions {
                use_graph,
                batched_prefill: false,
                ..base.clone()
            };
            parity_verdict(
                parity(m, &o, prompt, 300),
                1e-4,
                format!("{label}graph {use_graph} "),
            )
        })
        .collect()
}

/// (passed, line) of a parity run of `o` on `m` (`prompt`, then `steps` greedy steps) held to
/// `tol` (see `parity_verdict`).
fn check_parity(
    m: &hayai_model::Model,
    o: &CudaOptions,
    prompt: &[u32],
    steps: usize,
    tol: f64,
    label: &str,
) -> (bool, String) {
    parity_verdict(parity(m, o, prompt, steps), tol, label.to_string())
}

/// The checks of a streamed form without int8 activations (`quant`: W4A16 or bf16), as (model,
/// passed, line): against its CPU reference on the small models (to tolerance plus greedy
/// identity, its K splits being the stream layout's; graph replay and eager launch) and on E4B
/// shapes (8 steps), and one decode step of the small Gemma 3 after 31 tokens operation by
/// operation against the launch plan in the same format (each within 1e-4).
fn streamed_form_checks(quant: Quant, what: &str) -> Vec<(&'static str, bool, String)> {
    let mut out = Vec::new();
    let form = streamed(quant, false);
    for (name, arch, seed) in [
        ("small-gemma4", Arch::Gemma4, 1),
        ("small-gemma3", Arch::Gemma3, 2),
    ] {
        let (m, p) = stream_model(arch, seed);
        for (ok, line) in streamed_parity(&m, &p, &form, &format!("streamed {what} ")) {
            out.push((name, ok, line));
        }
    }
    let (m, p) = stream_model(Arch::Gemma3, 2);
    match hayai_cuda::check::op_outputs_compare(&m, &opts(quant, false), &form, &p[..31], p[31]) {
        Ok(rows) => {
            let worst = rows.iter().map(|r| r.1).fold(0.0f64, f64::max);
            println!("{what} after 31 tokens: operation, rel L2 streamed vs launch plan, max |launch plan|");
            for (i, (label, rel, max)) in rows.iter().enumerate() {
                if i < 12 || *rel > 1e-5 {
                    println!("  {i:3} {label:16} {rel:.2e} {max:.3e}");
                }
            }
            out.push((
                "small-gemma3",
                worst < 1e-4,
                format!("{what} operations: worst rel L2 {worst:.2e} (bound 1e-4)"),
            ));
        }
        Err(e) => out.push((
            "small-gemma3",
            false,
            format!("{what} operation outputs: {e}"),
        )),
    }
    let m = random_model_bf16(&e4b_spec(), 7);
    let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
    let (ok, line) = check_parity(&m, &form, &p, 8, 1e-3, &format!("streamed {what} "));
    out.push(("e4b", ok, line));
    out
}

/// (passed, line) of a yes/no check (bit-identity of two configurations).
fn verdict(r: Result<bool, hayai_cuda::CudaError>, line: String) -> (bool, String) {
    match r {
        Ok(ok) => (ok, line),
        Err(e) => (false, e.to_string()),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let want = |k: &str| args.is_empty() || args.iter().any(|a| a == k);
    let b = hayai_cuda::build_info();
    println!(
        "build: archs {:?}, {} kernels, fatbin {} bytes",
        b.cuda_archs, b.cuda_kernels, b.fatbin_bytes
    );
    let Some(g) = hayai_cuda::probe() else {
        println!("no CUDA device found");
        std::process::exit(2);
    };
    println!("gpu: {g:?}");
    let mut failures = 0;
    let mut check = |name: &str, ok: bool, line: String| {
        println!("[{}] {name}: {line}", if ok { "PASS" } else { "FAIL" });
        if !ok {
            failures += 1;
        }
    };

    if want("parity") {
        for (name, m, p) in small_models(32) {
            for persistent in [true, false] {
                let kind = if persistent { "persistent" } else { "tiled" };
                for q in [Quant::Bf16, Quant::Int4] {
                    {
                        let (ok, line) = parity_verdict(
                            parity(&m, &opts(q, persistent), &p, 300),
                            1e-4,
                            format!("{kind} "),
                        );
                        check(name, ok, line);
                    }
                }
                let (ok, line) = verdict(
                    graph_matches_eager(&m, Quant::Int4, persistent, &p[..8]),
                    format!("{kind} graph replay == eager launches"),
                );
                check(name, ok, line);
            }
            // The int4 GEMV on CUDA cores (the tiled default is on tensor cores).
            let o = CudaOptions {
                tensor_core_gemv: false,
                ..opts(Quant::Int4, false)
            };
            {
                let (ok, line) = check_parity(&m, &o, &p, 300, 1e-4, "tiled cuda-cores ");
                check(name, ok, line);
            }
            // Programmatic dependent launch off (the cases above run with it on sm_90+).
            let o = CudaOptions {
                pdl: false,
                ..opts(Quant::Int4, false)
            };
            {
                let (ok, line) = check_parity(&m, &o, &p, 300, 1e-4, "tiled pdl=off ");
                check(name, ok, line);
            }
        }
    }
    if want("single") {
        // The single-kernel step against the CPU reference (its K splits differ from the
        // launch plan's, so the comparison is to tolerance plus greedy identity), graph replay
        // against eager launch, and the E4B shapes.
        for (name, m, p) in small_models(32) {
            for q in [Quant::Bf16, Quant::Int4] {
                for use_graph in [true, false] {
                    let o = CudaOptions {
                        single_kernel: true,
                        use_graph,
                        batched_prefill: false,
                        ..opts(q, false)
                    };
                    {
                        let (ok, line) = parity_verdict(
                            parity(&m, &o, &p, 300),
                            1e-4,
                            format!("single-kernel graph {use_graph} "),
                        );
                        check(name, ok, line);
                    }
                }
            }
        }
        let m = random_model_bf16(&e4b_spec(), 7);
        let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
        for q in [Quant::Bf16, Quant::Int4] {
            let o = CudaOptions {
                single_kernel: true,
                ..opts(q, false)
            };
            {
                let (ok, line) = check_parity(&m, &o, &p, 8, 1e-3, "single-kernel ");
                check("e4b", ok, line);
            }
        }
    }
    if want("stream-gemma3") {
        // The streamed step on the small Gemma 3 alone (vocabulary 1,024), graph replay: the
        // model where it sat 9.8e-4 from its twin (docs/performance.md, eleventh session).
        let (m, p) = stream_model(Arch::Gemma3, 2);
        let o = CudaOptions {
            batched_prefill: false,
            ..streamed(Quant::Int4, true)
        };
        let (ok, line) = parity_verdict(parity(&m, &o, &p, 300), 1e-4, "streamed ".into());
        check("small-gemma3", ok, line);
    }
    if want("stream-ops") {
        // One decode step operation by operation, the launch plan's W4A8 against the streamed
        // step on the small Gemma 3 (vocabulary 1,024): from an empty cache and after 31 tokens
        // of batched prefill (the same kernels on both). The first operation whose output moves
        // is where the two paths part.
        let (m, p) = stream_model(Arch::Gemma3, 2);
        let a = CudaOptions {
            int8_activations: true,
            ..opts(Quant::Int4, false)
        };
        let b = streamed(Quant::Int4, true);
        for (prompt, token) in [(&p[..0], p[0]), (&p[..31], p[31])] {
            match hayai_cuda::check::op_outputs_compare(&m, &a, &b, prompt, token) {
                Ok(rows) => {
                    println!("after {} tokens: operation, rel L2 streamed vs launch plan, max |launch plan|", prompt.len());
                    for (i, (label, rel, max)) in rows.iter().enumerate() {
                        if i < 12 || *rel > 1e-6 {
                            println!("  {i:3} {label:16} {rel:.2e} {max:.3e}");
                        }
                    }
                }
                Err(e) => check("small-gemma3", false, format!("operation outputs: {e}")),
            }
        }
    }
    if want("stream") {
        // The streamed step (W4A8) against the CPU reference that rounds its matrix inputs the
        // same way (MatmulInputs::Int8 { group: 128 }); its K splits are the stream layout's, so
        // the comparison is to tolerance plus greedy identity; graph replay and eager launch.
        // Its cells are whole 16-row tiles: the small models with a vocabulary of 1,024.
        for (name, arch, seed) in [
            ("small-gemma4", Arch::Gemma4, 1),
            ("small-gemma3", Arch::Gemma3, 2),
        ] {
            let (m, p) = stream_model(arch, seed);
            // The launch plan's W4A8 on the same model: how far the same arithmetic in
            // another summation order sits from the reference (int8 rounding flips).
            let o = CudaOptions {
                int8_activations: true,
                batched_prefill: false,
                ..opts(Quant::Int4, false)
            };
            let (_, line) =
                parity_verdict(parity(&m, &o, &p, 300), 1e-4, "launch plan W4A8 ".into());
            println!("[INFO] {name} (vocab 1,024): {line}");
            // ... with the run-time-head-dim attention (`attn_split`, as the streamed step's).
            let (_, line) = parity_verdict(
                parity(&m, &runtime_attention(o), &p, 300),
                1e-4,
                "launch plan W4A8, run-time-head-dim attention ".into(),
            );
            println!("[INFO] {name} (vocab 1,024): {line}");
            for (ok, line) in streamed_parity(&m, &p, &streamed(Quant::Int4, true), "streamed ") {
                check(name, ok, line);
            }
        }
        let m = random_model_bf16(&e4b_spec(), 7);
        let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
        let o = streamed(Quant::Int4, true);
        let (ok, line) = check_parity(&m, &o, &p, 8, 1e-3, "streamed ");
        check("e4b", ok, line);
    }
    if want("stream-w4") {
        // The streamed step with int4 weights times x as a 23-bit fixed point per 128 columns
        // on the integer tensor cores (W4A16) against the f32 CPU reference (each x within
        // 2^-22 of its group's largest |x|: held to the plain tolerance), and operation by
        // operation against the launch plan's int4 (`gemv_mma`, x as a bf16 pair).
        for (name, ok, line) in streamed_form_checks(Quant::Int4, "W4A16") {
            check(name, ok, line);
        }
    }
    if want("lm-head-int8") {
        // The output head as int8 blocks (`LmHead::Int8`: `gemv_q8` in the launch plan, int8
        // cells and their scale ring in the streamed step, graph and eager) against the CPU
        // reference with that head at its exact values, both architectures: the GPU test
        // `lm_head_int8_matches_cpu`'s checks, here so that a compute_80 PTX-only build runs
        // them on the A10G's code paths (the bulk copies' cp.async twin for the scales).
        for (what, m, o) in int8_head_cases() {
            let p = hayai_cuda::bench::bench_prompt(16, m.spec.vocab);
            let (ok, line) = parity_verdict(parity(&m, &o, &p, 280), 1e-4, format!("{what}: "));
            check("lm-head-int8", ok, line);
        }
    }
    if want("stream-bf16") {
        // The streamed step with bf16 weights (float activations on the CUDA cores) against the
        // bf16 CPU reference, and operation by operation against the launch plan's bf16 (whose
        // x is a bf16 pair, 16 bits).
        for (name, ok, line) in streamed_form_checks(Quant::Bf16, "bf16") {
            check(name, ok, line);
        }
    }
    if want("a8") {
        // int4 GEMVs with int8 activations against the CPU reference that rounds its matrix
        // inputs the same way (MatmulInputs::Int8 { group: 128 }): on the integer tensor cores
        // (`gemv_mma_a8` / `gemv_mma_kw_a8`) and with DP4A on CUDA cores (`gemv_a8`).
        for tc in [true, false] {
            let a8 = |q: Quant| CudaOptions {
                int8_activations: true,
                tensor_core_gemv: tc,
                ..opts(q, false)
            };
            let what = if tc {
                "int8 activations, tensor cores "
            } else {
                "int8 activations, DP4A "
            };
            for (name, m, p) in small_models(32) {
                let (ok, line) = check_parity(&m, &a8(Quant::Int4), &p, 300, 1e-4, what);
                check(name, ok, line);
            }
            let m = random_model_bf16(&e4b_spec(), 7);
            let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
            let (ok, line) = check_parity(&m, &a8(Quant::Int4), &p, 8, 1e-3, what);
            check("e4b", ok, line);
        }
    }
    if want("tc") {
        // int4 GEMVs on tensor cores against the CPU reference that rounds its matrix inputs
        // the same way (MatmulInputs::Bf16Pair).
        let tc = |persistent: bool| CudaOptions {
            tensor_core_gemv: true,
            ..opts(Quant::Int4, persistent)
        };
        for (name, m, p) in small_models(32) {
            let (ok, line) = check_parity(&m, &tc(false), &p, 300, 1e-4, "tensor cores ");
            check(name, ok, line);
            // Variants that must give the same bits: graph replay vs eager launches, each
            // GEMV pulling its own weights into L2 first (a hint), the shared-memory weight
            // ring (the same products in the same order as split-K `gemv_mma`).
            // (base, variant, prompt tokens, steps)
            let split_k = CudaOptions {
                tensor_core_kwarps: false,
                ..tc(false)
            };
            let same = [
                (
                    tc(false),
                    CudaOptions {
                        use_graph: false,
                        ..tc(false)
                    },
                    8,
                    0,
                    "graph replay == eager launches",
                ),
                (
                    tc(false),
                    CudaOptions {
                        l2_prefetch_own: true,
                        ..tc(false)
                    },
                    8,
                    100,
                    "own-weight L2 prefetch == without",
                ),
                (
                    tc(false),
                    CudaOptions {
                        l2_prefetch_attn: 2,
                        ..tc(false)
                    },
                    8,
                    100,
                    "attention's L2 prefetch of gate/up == without",
                ),
                (
                    split_k.clone(),
                    CudaOptions {
                        tensor_core_ring: true,
                        ..split_k
                    },
                    p.len(),
                    300,
                    "cp.async weight ring == register pipeline (split-K)",
                ),
            ];
            for (base, o, n, steps, what) in same {
                let (ok, line) = verdict(
                    same_results(&m, &base, &o, &p[..n], steps),
                    format!("tensor cores: {what}"),
                );
                check(name, ok, line);
            }
        }
        let m = random_model_bf16(&e4b_spec(), 7);
        let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
        let (ok, line) = check_parity(&m, &tc(false), &p, 8, 1e-3, "tensor cores ");
        check("e4b", ok, line);
    }
    if want("kw") {
        // Small tensor-core GEMVs with warps sharing 16-row tiles along K (the default) and
        // split along K across blocks: each against the CPU reference (small models, 300
        // steps; E4B shapes, 8); graph == eager.
        let split = |kw: bool| CudaOptions {
            tensor_core_kwarps: kw,
            ..opts(Quant::Int4, false)
        };
        for (name, m, p) in small_models(32) {
            for (kw, what) in [(true, "K shared by warps "), (false, "split-K ")] {
                let (ok, line) = check_parity(&m, &split(kw), &p, 300, 1e-4, what);
                check(name, ok, line);
            }
            let eager = CudaOptions {
                use_graph: false,
                ..split(true)
            };
            let (ok, line) = verdict(
                same_results(&m, &split(true), &eager, &p[..8], 0),
                "K shared by warps: graph replay == eager launches".to_string(),
            );
            check(name, ok, line);
        }
        let m = random_model_bf16(&e4b_spec(), 7);
        let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
        for (kw, what) in [(true, "K shared by warps "), (false, "split-K ")] {
            let (ok, line) = check_parity(&m, &split(kw), &p, 8, 1e-3, what);
            check("e4b", ok, line);
        }
    }
    if want("ad") {
        // Attention splits adapted to the context (at least 8 or 32 keys each) in a plan sized
        // for a long context, so most of the grid's splits sit out: against the CPU reference.
        let ad = |q: Quant, max_context: usize, min_keys: usize| CudaOptions {
            attn_min_keys: min_keys,
            max_context: Some(max_context),
            ..warp_values(opts(q, false))
        };
        for (name, m, p) in small_models(32) {
            for q in [Quant::Bf16, Quant::Int4] {
                for k in [8, 32] {
                    let o = ad(q, m.spec.max_context, k);
                    let what = format!("splits of >= {k} keys ");
                    let (ok, line) = check_parity(&m, &o, &p, 300, 1e-4, &what);
                    check(name, ok, line);
                }
            }
        }
        let m = random_model_bf16(&e4b_spec(), 7);
        let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
        for k in [8, 32] {
            let what = format!("splits of >= {k} keys, 8192 ");
            let (ok, line) = check_parity(&m, &ad(Quant::Int4, 8192, k), &p, 8, 1e-3, &what);
            check("e4b", ok, line);
        }
    }
    if want("hd") {
        // Attention compiled for head dims 256 and 512 (E4B's sliding and global layers)
        // against the run-time kernel: bit for bit.
        let m = random_model_bf16(&e4b_spec(), 7);
        let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
        let o = runtime_attention(opts(Quant::Int4, false));
        let hd = CudaOptions {
            attn_by_head_dim: Some(true),
            ..o.clone()
        };
        let (ok, line) = verdict(
            same_results(&m, &o, &hd, &p, 8),
            "attention by head dim == run-time head dim (256, 512): bit-identical".to_string(),
        );
        check("e4b", ok, line);
        // The p.V phase by warps (the int4 default) and by threads (bf16's): two summation
        // orders, each against the CPU reference.
        let orders: [(Variant, &str); 2] = [
            (warp_values, "attention p.V by warps "),
            (runtime_attention, "attention p.V by threads "),
        ];
        for q in [Quant::Bf16, Quant::Int4] {
            for (order, what) in orders {
                let (ok, line) = check_parity(&m, &order(opts(q, false)), &p, 8, 1e-3, what);
                check("e4b", ok, line);
            }
        }
        for (name, m, p) in small_models(32) {
            for q in [Quant::Bf16, Quant::Int4] {
                for (order, what) in orders {
                    let (ok, line) = check_parity(&m, &order(opts(q, false)), &p, 300, 1e-4, what);
                    check(name, ok, line);
                }
            }
        }
    }
    if want("e4b-parity") {
        let t = Instant::now();
        let m = random_model_bf16(&e4b_spec(), 7);
        println!(
            "e4b synthetic model built in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let p = hayai_cuda::bench::bench_prompt(6, m.spec.vocab);
        for (q, steps) in [(Quant::Bf16, 8), (Quant::Int4, 8)] {
            let t = Instant::now();
            let (ok, line) = check_parity(&m, &opts(q, true), &p, steps, 1e-3, "");
            check("e4b", ok, line);
            println!("  ({:.1} s)", t.elapsed().as_secs_f64());
        }
    }
    if want("fuse") {
        // gemv_pair (PLE gate + projection in one launch) against the separate launches: bit
        // for bit, both GEMV kernels, both quantizations, eager and graph; then CPU parity.
        // Against the CUDA-core GEMV: these variants replace the tensor-core default.
        let m = random_model(&small_spec(Arch::Gemma4), 1);
        let p = hayai_cuda::bench::bench_prompt(32, m.spec.vocab);
        let cuda_cores = |q: Quant, persistent: bool| CudaOptions {
            tensor_core_gemv: false,
            ..opts(q, persistent)
        };
        for persistent in [false, true] {
            for q in [Quant::Bf16, Quant::Int4] {
                for use_graph in [true, false] {
                    let o = CudaOptions {
                        use_graph,
                        ..cuda_cores(q, persistent)
                    };
                    let f = CudaOptions {
                        fuse_ple: true,
                        ..o.clone()
                    };
                    {
                        let (ok, line) = verdict(
                            same_results(&m, &o, &f, &p, 100),
                            format!(
                                "fused PLE == separate ({}, {}, graph {use_graph}): bit-identical",
                                if persistent { "persistent" } else { "tiled" },
                                q.name()
                            ),
                        );
                        check("small-gemma4", ok, line);
                    }
                }
            }
        }
        // The tiled GEMV with 8 loads in flight per lane: the same additions in the same order.
        for q in [Quant::Bf16, Quant::Int4] {
            let o = cuda_cores(q, false);
            let u = CudaOptions {
                gemv_unroll8: true,
                ..o.clone()
            };
            {
                let (ok, line) = verdict(
                    same_results(&m, &o, &u, &p, 100),
                    format!("gemv_u8 == gemv ({}): bit-identical", q.name()),
                );
                check("small-gemma4", ok, line);
            }
        }
        // Attention with its K/V tile in shared memory, and compiled for its head dim: the same
        // arithmetic, the same results (small Gemma 4 and Gemma 3: sliding ring, KV sharing,
        // 300 steps past the wrap-around; head dims 128 and 256).
        for (name, m, p) in small_models(32) {
            for q in [Quant::Bf16, Quant::Int4] {
                let o = runtime_attention(CudaOptions {
                    batched_prefill: false,
                    ..opts(q, false)
                });
                let tile = CudaOptions {
                    attn_smem_tile: true,
                    ..o.clone()
                };
                let hd = CudaOptions {
                    attn_by_head_dim: Some(true),
                    ..o.clone()
                };
                for (f, what) in [
                    (tile, "attention tile in shared memory == global"),
                    (hd, "attention by head dim == run-time head dim"),
                ] {
                    let (ok, line) = verdict(
                        same_results(&m, &o, &f, &p, 300),
                        format!("{what} ({}): bit-identical", q.name()),
                    );
                    check(name, ok, line);
                }
            }
        }
        // The L2 prefetches are hints: the same results.
        for (q, ahead) in [
            (Quant::Bf16, 0),
            (Quant::Int4, 0),
            (Quant::Int4, 1),
            (Quant::Bf16, 2),
        ] {
            let o = opts(q, false);
            let f = CudaOptions {
                attn_prefetch: ahead == 0,
                l2_prefetch: ahead,
                ..o.clone()
            };
            {
                let (ok, line) = verdict(
                    same_results(&m, &o, &f, &p, 100),
                    format!(
                        "{} on == off ({}): bit-identical",
                        if ahead == 0 {
                            "attention prefetch".to_string()
                        } else {
                            format!("l2 prefetch {ahead}")
                        },
                        q.name()
                    ),
                );
                check("small-gemma4", ok, line);
            }
        }
        let o = CudaOptions {
            fuse_ple: true,
            ..opts(Quant::Int4, false)
        };
        {
            let (ok, line) = check_parity(&m, &o, &p, 300, 1e-4, "fused PLE ");
            check("small-gemma4", ok, line);
        }
    }
    if want("prefill") {
        // Batched (tensor-core) prefill vs the CPU reference: 300 tokens cross a chunk boundary
        // and the small models' 8-token sliding window many times.
        for (name, m, p) in small_models(300) {
            for q in [Quant::Bf16, Quant::Int4] {
                match prefill_parity(&m, &opts(q, false), &p, 64, true) {
                    Ok(r) => check(name, prefill_ok(&r), r.line()),
                    Err(e) => check(name, false, e.to_string()),
                }
            }
        }
    }
    if want("prefill-e4b") {
        let t = Instant::now();
        let m = random_model_bf16(&e4b_spec(), 7);
        let p = hayai_cuda::bench::bench_prompt(18, m.spec.vocab);
        for q in [Quant::Bf16, Quant::Int4] {
            match prefill_parity(&m, &opts(q, false), &p, 2, true) {
                Ok(r) => check("e4b", prefill_ok(&r), r.line()),
                Err(e) => check("e4b", false, e.to_string()),
            }
        }
        println!("  ({:.1} s)", t.elapsed().as_secs_f64());
    }
    if want("prefill-bench") {
        // Prompt processing speed on E4B shapes: Rows::Last forward of n tokens (n - 1 batched,
        // the last through the decode graph), best of 3 after a warm-up.
        let m = Arc::new(random_model_bf16(&e4b_spec(), 7));
        for q in [Quant::Int4, Quant::Bf16] {
            let o = CudaOptions {
                quant: q,
                max_context: Some(4200),
                ..Default::default()
            };
            let mut r = match hayai_cuda::CudaRunner::new(m.clone(), o) {
                Ok(r) => r,
                Err(e) => {
                    check("prefill-bench", false, e.to_string());
                    continue;
                }
            };
            for n in [128usize, 512, 1024, 4096] {
                let p = hayai_cuda::bench::bench_prompt(n, m.spec.vocab);
                let mut best = f64::INFINITY;
                for _ in 0..4 {
                    hayai_model::Runner::truncate(&mut r, 0);
                    let t = Instant::now();
                    let res = hayai_model::Runner::forward(
                        &mut r,
                        &p,
                        hayai_model::Rows::Last,
                        &mut |_, _| {},
                    );
                    if let Err(e) = res {
                        check("prefill-bench", false, e.to_string());
                        break;
                    }
                    best = best.min(t.elapsed().as_secs_f64());
                }
                println!(
                    "prefill e4b {} {n} tokens: {:.1} ms, {:.0} tok/s",
                    q.name(),
                    best * 1e3,
                    n as f64 / best
                );
            }
        }
    }
    // Benchmarks on E4B shapes: the defaults and the decode-kernel variants.
    let mut runs: Vec<CudaOptions> = Vec::new();
    if want("bench") {
        runs.push(opts(Quant::Int4, true));
        runs.push(opts(Quant::Int4, false));
    }
    if want("bench-nopdl") {
        for persistent in [true, false] {
            runs.push(CudaOptions {
                pdl: false,
                ..opts(Quant::Int4, persistent)
            });
        }
    }
    if want("bench-fuse") {
        for persistent in [false, true] {
            runs.push(CudaOptions {
                fuse_ple: true,
                ..opts(Quant::Int4, persistent)
            });
        }
    }
    if want("bench-u8") {
        for (quant, fuse_ple) in [
            (Quant::Int4, false),
            (Quant::Int4, true),
            (Quant::Bf16, false),
        ] {
            runs.push(CudaOptions {
                gemv_unroll8: true,
                fuse_ple,
                ..opts(quant, false)
            });
        }
    }
    if want("bench-prefetch") {
        runs.push(CudaOptions {
            attn_prefetch: true,
            ..opts(Quant::Int4, false)
        });
        runs.push(CudaOptions {
            attn_prefetch: true,
            fuse_ple: true,
            gemv_unroll8: true,
            ..opts(Quant::Int4, false)
        });
    }
    if want("bench-tile") {
        for quant in [Quant::Int4, Quant::Bf16] {
            runs.push(CudaOptions {
                attn_smem_tile: true,
                ..opts(quant, false)
            });
        }
    }
    if want("bench-a8") {
        runs.push(CudaOptions {
            int8_activations: true,
            ..opts(Quant::Int4, false)
        });
    }
    if want("bench-pf") {
        for (quant, ahead, a8) in [
            (Quant::Int4, 1, false),
            (Quant::Int4, 2, false),
            (Quant::Int4, 1, true),
            (Quant::Bf16, 1, false),
        ] {
            runs.push(CudaOptions {
                l2_prefetch: ahead,
                int8_activations: a8,
                ..opts(quant, false)
            });
        }
    }
    if want("bench-hd") {
        // The run-time-head-dim attention, then compiled for the head dim with p.V by threads
        // (the default adds p.V by warps).
        for hd in [false, true] {
            runs.push(CudaOptions {
                attn_by_head_dim: Some(hd),
                ..runtime_attention(opts(Quant::Int4, false))
            });
        }
    }
    if want("bench-pfa") {
        // Attention pulls the weights of the GEMV one (O) or two (gate/up) after it into L2.
        for n in [1, 2] {
            runs.push(CudaOptions {
                l2_prefetch_attn: n,
                ..opts(Quant::Int4, false)
            });
        }
    }
    if want("bench-kw") {
        // Small GEMVs split along K across blocks (the default shares K among a block's warps).
        runs.push(CudaOptions {
            tensor_core_kwarps: false,
            ..opts(Quant::Int4, false)
        });
    }
    if want("bench-tc") {
        // The tiled int4 GEMV on CUDA cores (the default runs on tensor cores).
        runs.push(CudaOptions {
            tensor_core_gemv: false,
            ..opts(Quant::Int4, false)
        });
    }
    if want("bench-stream") {
        runs.push(streamed(Quant::Int4, true));
    }
    if want("bench-stream-w4") {
        runs.push(streamed(Quant::Int4, false));
    }
    if want("bench-stream-bf16") {
        runs.push(streamed(Quant::Bf16, false));
    }
    if want("bench-single") {
        for quant in [Quant::Int4, Quant::Bf16] {
            runs.push(CudaOptions {
                single_kernel: true,
                ..opts(quant, false)
            });
        }
    }
    if want("bench-bf16") {
        runs.push(opts(Quant::Bf16, true));
    }
    if want("bench-bf16-tiled") {
        runs.push(opts(Quant::Bf16, false));
    }
    if !runs.is_empty() {
        let lens = bench_len("HAYAI_BENCH_PROMPT", 128)
            .and_then(|p| bench_len("HAYAI_BENCH_GEN", 512).map(|g| (p, g)));
        let (prompt_len, gen) = match lens {
            Ok(l) => l,
            Err(e) => {
                eprintln!("gpu_check: {e}");
                std::process::exit(2);
            }
        };
        let t = Instant::now();
        let m = Arc::new(random_model_bf16(&e4b_spec(), 7));
        println!(
            "e4b synthetic model built in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        for cuda in runs {
            let o = BenchOptions {
                cuda,
                prompt_len,
                gen,
                ..Default::default()
            };
            match bench_engine(m.clone(), &o) {
                Ok(r) => println!(
                    "== bench-engine synth:e4b --quant {} --prompt-len {prompt_len} --gen {gen}\n{}",
                    o.cuda.quant.name(),
                    r.to_text()
                ),
                Err(e) => check("bench", false, e.to_string()),
            }
        }
    }
    println!("failures: {failures}");
    std::process::exit(if failures == 0 { 0 } else { 1 });
}
