//! The streamed decode step (`CudaOptions::streamed_step`, kernels/stream_step.cu,
//! docs/streamed-step.md): the single-kernel step's operation list run by one block per SM whose
//! producer warp streams the SM's GEMV weights from a per-SM stream laid out at load
//! (`step_streams`), while its consumer warps run the operations.

use super::*;
use crate::step_streams::{step_streams, PleForm};
use crate::stream_layout::{CellFormat, OpPlan, SmShare, Streams};

/// Ring depths the kernel is compiled for (`decode_stream_r{N}`), deepest first.
const RINGS: [(usize, &str); 2] = [(10, "decode_stream_r10"), (2, "decode_stream_r2")];
/// The same for bf16 weights (`decode_stream_w16_r{N}`: 32-KB chunks of bf16 cells).
const RINGS_W16: [(usize, &str); 2] = [(5, "decode_stream_w16_r5"), (2, "decode_stream_w16_r2")];
/// The same with an int8 output head (`decode_stream_w16q8_r{N}`: the plain bf16 kernels are
/// compiled without its code, so theirs stays the measured one).
const RINGS_W16_Q8: [(usize, &str); 2] =
    [(5, "decode_stream_w16q8_r5"), (2, "decode_stream_w16q8_r2")];
/// The same for int4 weights times x as a 23-bit fixed point (`decode_stream_w4_r{N}`: int4's
/// cells and chunks, W4A16).
const RINGS_W4: [(usize, &str); 2] = [(10, "decode_stream_w4_r10"), (2, "decode_stream_w4_r2")];

/// The streamed step's ring depths and chunk bytes for `quant` (int4 with `int8` activations:
/// W4A8 cells; int4 without: the same cells times x as a 23-bit fixed point on the integer
/// tensor cores; bf16: bf16 cells multiplying float activations).
fn stream_rings(quant: Quant, int8: bool) -> (&'static [(usize, &'static str)], usize) {
    match (quant, int8) {
        (Quant::Int4, true) => (&RINGS, STREAM_CHUNK_BYTES),
        (Quant::Int4, false) => (&RINGS_W4, STREAM_CHUNK_BYTES),
        (Quant::Bf16, _) => (&RINGS_W16, STREAM_W16_CHUNK_BYTES),
    }
}

/// The streamed step's launch shape on this GPU: the deepest ring that fits beside the GEMV
/// input (or three attention items' scratch) and the int8 fragments. Sets the kernel's
/// shared-memory limit; an error (`Unsupported`) where the step cannot run here. Called before
/// any weight is uploaded (`CudaRunner::new`), so `Auto` falls back to the launch plan cheaply.
/// `deepest_only` (`Auto`): only the deepest ring, the one measured against the launch plan (a
/// shallower one, e.g. int4's two chunks on an A10G, has not been; `choose_ring`).
/// `int8_head`: the output head as int8 cells (bf16 only), each ring slot with its scales beside.
pub(super) fn stream_config(
    gpu: &Gpu,
    spec: &hayai_model::ModelSpec,
    quant: Quant,
    int8_act: bool,
    max_cols: usize,
    deepest_only: bool,
    int8_head: bool,
) -> Result<StepConfig, CudaError> {
    let (rings, chunk) = stream_rings(quant, int8_act);
    if int8_head && quant != Quant::Bf16 {
        return Err(CudaError::Unsupported(
            "streamed step: an int8 output head is for bf16 weights".into(),
        ));
    }
    // Its kernels, and a ring slot's scales after everything else (kernels/stream_step.cu
    // `sring`).
    let (rings, chunk) = if int8_head {
        (&RINGS_W16_Q8[..], chunk + STREAM_W16_SCALE_CHUNK_BYTES)
    } else {
        (rings, chunk)
    };
    if !(quant == Quant::Int4 && int8_act) && (built_with(PLE_FUSED.1) || built_with(PLE_SPLIT.1)) {
        return Err(CudaError::Unsupported(
            "streamed step: a build with the fused or split PLE forms has only W4A8 kernels (--quant int4-a8)"
                .into(),
        ));
    }
    if max_cols > 96 * 128 {
        return Err(CudaError::Unsupported(format!(
            "streamed step: GEMV width {max_cols} (at most 12,288)"
        )));
    }
    if let Some(p) = &spec.ple {
        if p.dim > STREAM_WARPS * 32 {
            return Err(CudaError::Unsupported(format!(
                "streamed step: per-layer embedding width {} (at most {})",
                p.dim,
                STREAM_WARPS * 32
            )));
        }
    }
    let x_floats = stream_x_floats(spec, max_cols)?;
    let need = x_floats * 4 + STREAM_XF_BYTES;
    let (nch, kernel) = choose_ring(
        rings,
        chunk,
        need,
        |k| gpu.max_dynamic_smem(k),
        env_i32("HAYAI_STREAM_RING"),
        deepest_only,
    )
    .map_err(|e| match e {
        CudaError::Unsupported(m) => {
            CudaError::Unsupported(format!("streamed step: GEMV width {max_cols}: {m}"))
        }
        e => e,
    })?;
    let smem = nch * chunk + need;
    gpu.set_max_dynamic_smem(kernel, smem)?;
    let per_sm = unsafe {
        cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
            gpu.func(kernel),
            STREAM_THREADS as i32,
            smem,
        )
    }
    .map_err(drv)? as usize;
    if per_sm == 0 {
        return Err(CudaError::Unsupported(
            "streamed step: no block fits on an SM".into(),
        ));
    }
    let grid = stream_grid(gpu.sm_count as usize, env_i32("HAYAI_STREAM_SMS"))?;
    Ok(StepConfig {
        kernel,
        grid,
        smem,
        x_floats,
        warps: grid * STREAM_WARPS,
    })
}

impl CudaRunner {
    /// The recorded launch plan as the streamed step's operation list, the per-SM weight
    /// streams built and uploaded, and the one launch that runs it.
    /// `head8`: the output head's int8 blocks where the runner takes them (its `lm_head_int8`).
    pub(super) fn stream_launch(
        &mut self,
        head8: Option<&crate::quant::Int8Matrix>,
    ) -> Result<Launch, CudaError> {
        let cfg = self.step_kernel.as_ref().expect("stream config");
        let (kernel, grid, smem, x_floats) = (cfg.kernel, cfg.grid, cfg.smem, cfg.x_floats);
        for (var, define, what) in [PLE_FUSED, PLE_SPLIT] {
            if std::env::var(var).as_deref() == Ok("1") && !built_with(define) {
                return Err(CudaError::Unsupported(format!(
                    "{var}=1: these kernels have no {what} (a measurement build: \
                     HAYAI_CUDA_DEFINES={define})"
                )));
            }
        }
        // (W4A8 only: `stream_config` refused such builds for the other formats.)
        let a8 = self.quant == Quant::Int4 && self.int8_act;
        let fused = a8 && ple_fused_wanted(&self.model.spec);
        let split = a8 && ple_split_wanted(&self.model.spec);
        let form = if fused {
            PleForm::Fused
        } else if split {
            PleForm::Split
        } else {
            PleForm::Apart
        };
        if grid > super::ARGMAX_BLOCKS {
            // The argmax's per-SM results (`ArgmaxParams::own`) have ARGMAX_BLOCKS slots.
            return Err(CudaError::Unsupported(format!(
                "streamed step: {grid} SMs, more than {} argmax slots",
                super::ARGMAX_BLOCKS
            )));
        }
        let st = step_streams(&self.model, self.quant, grid, STREAM_WARPS, form, head8)?;
        let streams = &st.streams;
        let ops: Vec<(&'static str, &'static str, &[u64])> = self
            .plan
            .iter()
            .map(|l| (l.kernel, l.label, &l.params[..]))
            .collect();
        // The fused PLE operation's accumulators, one per layer ([layers][hidden] u64), zeroed
        // here once; each is zeroed again by the next layer's operation after its reader.
        let accs = if fused {
            let layers = st.labels.iter().filter(|l| **l == "gemv.ple_gate").count();
            let rows = self.model.spec.hidden;
            Some((self.gpu.alloc(layers * rows * 8)?, rows))
        } else {
            None
        };
        // The split gate's: gate/up's output with the gate's rows after its own (the plan's
        // buffer has room for gate/up's only), and one accumulator per layer ([layers][gate
        // rows] u64, zeroed here once; each is zeroed again by the next layer's down).
        let mut split_mem = None;
        let split_bufs = match (split, &self.model.spec.ple) {
            (true, Some(ple)) => {
                let layers = st
                    .labels
                    .iter()
                    .filter(|l| **l == "gemv.ple_gate_cols")
                    .count();
                let gu_rows = st
                    .labels
                    .iter()
                    .zip(&streams.ops)
                    .filter(|(l, _)| **l == "gemv.gate_up")
                    .map(|(_, p)| p.rows)
                    .max()
                    .unwrap_or(0);
                let mut max_units = vec![0usize; streams.ops.len()];
                for s in 0..grid {
                    for (m, sh) in max_units.iter_mut().zip(streams.sm_shares(s)) {
                        *m = (*m).max(sh.units as usize);
                    }
                }
                let (gu, acc) = (
                    self.gpu.alloc(gu_rows * 4)?,
                    self.gpu.alloc(layers.max(1) * ple.dim * 8)?,
                );
                let b = SplitBufs {
                    gu_out: gu.ptr(),
                    acc: acc.ptr(),
                    p_rows: ple.dim,
                    x_floats,
                    max_units,
                };
                split_mem = Some([gu, acc]);
                Some(b)
            }
            _ => None,
        };
        let ple_recs = match (&accs, split_bufs) {
            (Some((b, rows)), _) => PleRecs::Fused(PleAccs {
                base: b.ptr(),
                rows: *rows,
            }),
            (None, Some(b)) => PleRecs::Split(b),
            _ => PleRecs::Apart,
        };
        let StreamRecords {
            bytes,
            n_gemv,
            pos,
            names,
        } = stream_records(&ops, &st.labels, &streams.ops, ple_recs)?;
        let n = names.len();
        let meta = timeline_meta(&names, streams, grid);
        let shares: Vec<SmShare> = (0..grid).flat_map(|s| streams.sm_shares(s)).collect();
        let sm_base: Vec<u64> = streams.sm_base[..grid].iter().map(|&b| b as u64).collect();
        let sm_cells: Vec<u32> = (0..grid).map(|s| streams.sm_cells(s) as u32).collect();
        let ops = self.gpu.upload(&bytes)?;
        let stream = self.gpu.upload(&streams.bytes)?;
        let base = self.gpu.upload(&sm_base)?;
        let cells = self.gpu.upload(&sm_cells)?;
        let shares = self.gpu.upload(&shares)?;
        // The int8 head's scales (none: null pointers, the kernel copies none).
        let sc = if streams.scale_bytes.is_empty() {
            None
        } else {
            Some((
                self.gpu.upload(&streams.scale_bytes)?,
                self.gpu.upload(&streams.sc_base[..grid])?,
                self.gpu.upload(&streams.sc_from[..grid])?,
            ))
        };
        let (sc_stream, sc_base, sc_from) = sc
            .as_ref()
            .map_or((0, 0, 0), |(a, b, c)| (a.ptr(), b.ptr(), c.ptr()));
        // [2][n]: each operation's SM count, then each attention's ranges-stored count.
        let done = self.gpu.alloc(2 * n * 4)?;
        // The per-operation stamps, then (SS_TIMELINE builds) every SM's per-operation stamps and
        // its ring chunks' issue and landing times.
        let timing_words =
            n * STEP_STAMPS + grid * n * STREAM_TL_SLOTS + grid * STREAM_TL_CHUNKS * 2;
        let timing = self.gpu.alloc(timing_words * 8)?;
        self.stream_timeline = Some(StreamTimeline {
            words: timing_words,
            meta,
        });
        let p = StreamParams {
            ops: ops.ptr(),
            stream: stream.ptr(),
            sm_base: base.ptr(),
            sm_cells: cells.ptr(),
            shares: shares.ptr(),
            done: done.ptr(),
            timing: 0,
            n_ops: n as i32,
            n_gemv: n_gemv as i32,
            x_floats: x_floats as i32,
            attn_tk: env_i32("HAYAI_STREAM_ATTN_TK").unwrap_or(0),
            attn_min_keys: env_i32("HAYAI_STREAM_ATTN_MIN_KEYS").unwrap_or(STREAM_ATTN_MIN_KEYS),
            pos,
            sc_stream,
            sc_base,
            sc_from,
        };
        let launch = |p: &StreamParams| {
            Launch::new(
                &self.gpu,
                "decode_stream",
                kernel,
                (grid as u32, 1, 1),
                STREAM_THREADS as u32,
                smem as u32,
                p,
            )
        };
        let l = launch(&p);
        let profiled = launch(&StreamParams {
            timing: timing.ptr(),
            ..p
        });
        let labels = names.iter().map(|(_, l)| *l).collect();
        self.step_profile = Some((profiled, labels, timing.ptr()));
        self.stream_debug = Some(StreamDebug {
            ops: self.plan.clone(),
            params: p,
            launch: l.clone(),
            ple: form,
        });
        self.step_bufs = vec![ops, stream, base, cells, shares, done, timing];
        self.step_bufs.extend(accs.map(|(b, _)| b));
        self.step_bufs.extend(split_mem.into_iter().flatten());
        self.step_bufs
            .extend(sc.into_iter().flat_map(|(a, b, c)| [a, b, c]));
        Ok(l)
    }

    /// One decode step for `token`, operation by operation, and what each operation leaves for
    /// its consumers (labels in plan order): the launch plan's launches run one at a time; the
    /// streamed step launched once per operation k with every counter reset and only its first
    /// k + 1 operations (the earlier ones rerun, deterministically: the KV entry they append is
    /// rewritten with the same values). K-slice partials are added and the streamed gate/up's
    /// GeGLU applied on the host, so both paths' vectors compare directly. For checks: the
    /// streamed step runs O(operations^2) operations.
    pub fn op_outputs(&mut self, token: u32) -> Result<Vec<(&'static str, Vec<f32>)>, CudaError> {
        self.gpu.bind()?;
        hayai_model::runner::check_feed(&self.info, self.len, &[token])?;
        let io = [token as i32, self.len as i32];
        self.gpu.write(self.scratch.step_io.ptr(), &io)?;
        let mut out = Vec::new();
        if let Some(d) = &self.stream_debug {
            if d.ple != PleForm::Apart {
                return Err(CudaError::Unsupported(
                    "operation outputs: not with the streamed step's fused PLE operation or split \
                     PLE gate (HAYAI_STREAM_PLE_FUSED=0 or HAYAI_STREAM_PLE_SPLIT=0 runs gate and \
                     projection apart)"
                        .into(),
                ));
            }
            let n = d.ops.len();
            for (k, op) in d.ops.iter().enumerate() {
                self.gpu.write(d.params.done, &vec![0u32; 2 * n])?;
                let mut l = d.launch.clone();
                write_param(
                    &mut l.params,
                    0,
                    &StreamParams {
                        n_ops: k as i32 + 1,
                        ..d.params
                    },
                );
                l.run(&self.gpu)?;
                self.gpu.sync()?;
                out.push((op.label, self.op_output(op, true)?));
            }
        } else if self.step_kernel.is_none() {
            for l in &self.plan {
                l.run(&self.gpu)?;
                self.gpu.sync()?;
                out.push((l.label, self.op_output(l, false)?));
            }
        } else {
            return Err(CudaError::Unsupported(
                "operation outputs: not for the single-kernel step".into(),
            ));
        }
        self.len += 1;
        self.dev_io = None;
        Ok(out)
    }

    /// The vector a recorded launch leaves for its consumers (see `op_outputs`); `partials`:
    /// a GEMV's output as the step kernels leave it, `[splits][rows]`, GeGLU not applied.
    fn op_output(&self, l: &Launch, partials: bool) -> Result<Vec<f32>, CudaError> {
        let read = |ptr: u64, n: usize| -> Result<Vec<f32>, CudaError> {
            let mut v = vec![0f32; n];
            self.gpu.read(ptr, &mut v)?;
            Ok(v)
        };
        let k = l.kernel;
        if k.starts_with("gemv") {
            let g: GemvParams = read_param(&l.params, 0);
            let rows = g.rows as usize;
            if partials {
                let all = read(g.out, rows * g.splits as usize)?;
                let mut v = all[..rows].to_vec();
                for s in 1..g.splits as usize {
                    for (a, b) in v.iter_mut().zip(&all[s * rows..(s + 1) * rows]) {
                        *a += b;
                    }
                }
                if l.label == "gemv.gate_up" {
                    let gelu = hayai_model::cpu::ops::gelu_tanh;
                    v = v.chunks(2).map(|p| gelu(p[0]) * p[1]).collect();
                }
                Ok(v)
            } else {
                let n = if g.glu != 0 { rows / 2 } else { rows };
                read(if g.splits > 1 { g.out_final } else { g.out }, n)
            }
        } else if k.starts_with("attn") {
            let a: AttnParams = read_param(&l.params, 0);
            read(a.out, (a.nh * a.hd) as usize)
        } else if k == "ple_combine" {
            let p: PleParams = read_param(&l.params, 0);
            read(p.out, p.ld as usize)
        } else if k == "argmax_stage1" {
            let m: ArgmaxParams = read_param(&l.params, 0);
            read(m.logits, m.n as usize)
        } else if k == "argmax_stage2" {
            let m: ArgmaxParams = read_param(&l.params, 0);
            let mut t = [0i32; 1];
            self.gpu.read(m.out_tok, &mut t)?;
            Ok(vec![t[0] as f32])
        } else {
            Err(CudaError::Unsupported(format!(
                "operation outputs: no reader for kernel {k}"
            )))
        }
    }
}

/// The ring `stream_config` takes: the deepest of `rings` (deepest first) whose chunks fit with
/// `need` bytes beside them in `room(kernel)` bytes of dynamic shared memory; `want`
/// (`HAYAI_STREAM_RING`, a measurement): only that depth, e.g. the two-chunk ring an A10G gets,
/// on a GPU where the deepest fits; `deepest_only` (`Auto`): the deepest or none, the one
/// measured against the launch plan.
fn choose_ring(
    rings: &[(usize, &'static str)],
    chunk: usize,
    need: usize,
    mut room: impl FnMut(&'static str) -> Result<usize, CudaError>,
    want: Option<i32>,
    deepest_only: bool,
) -> Result<(usize, &'static str), CudaError> {
    if let Some(n) = want {
        if !rings.iter().any(|&(d, _)| d as i32 == n) {
            return Err(CudaError::Unsupported(format!(
                "HAYAI_STREAM_RING={n}: the kernels have rings of {:?} chunks",
                rings.iter().map(|r| r.0).collect::<Vec<_>>()
            )));
        }
    }
    let mut last_room = 0;
    for &(n, k) in rings
        .iter()
        .filter(|r| want.is_none_or(|w| r.0 as i32 == w))
    {
        last_room = room(k)?;
        if n * chunk + need > last_room {
            continue;
        }
        if deepest_only && want.is_none() && n != rings[0].0 {
            return Err(CudaError::Unsupported(format!(
                "only its {n}-chunk ring fits in {last_room} bytes of shared memory, not measured \
                 against the launch plan (--streamed-step runs it)"
            )));
        }
        return Ok((n, k));
    }
    Err(CudaError::Unsupported(format!(
        "no room for a ring in {last_room} bytes of shared memory"
    )))
}

/// Floats of the streamed step's GEMV input area (beside the int8 fragments, which follow it):
/// the widest GEMV input, or what the attention needs to stage [`STREAM_ATTN_MIN_ROWS`] key
/// rows of K and V beside its fixed areas if that is more (kernels/stream_step.cu `ssa_layout`
/// reuses both areas).
fn stream_x_floats(spec: &hayai_model::ModelSpec, max_cols: usize) -> Result<usize, CudaError> {
    let mut x = max_cols;
    for l in &spec.layers {
        let r = l.n_heads / l.n_kv_heads.max(1);
        if r > STREAM_ATTN_MAX_GROUP {
            return Err(CudaError::Unsupported(format!(
                "streamed step: {r} query heads per KV head (at most {STREAM_ATTN_MAX_GROUP})"
            )));
        }
        // A warp rotates a vector as pairs (i, i + hd/2), at most 8 per lane (`ssa_inputs`).
        if l.head_dim % 64 != 0 || l.head_dim > 512 {
            return Err(CudaError::Unsupported(format!(
                "streamed step: head dim {} (a multiple of 64, at most 512)",
                l.head_dim
            )));
        }
        let need = stream_attn_fixed(r, l.head_dim) + STREAM_ATTN_MIN_ROWS * (2 * l.head_dim + r);
        x = x.max(need.saturating_sub(STREAM_XF_BYTES / 4));
    }
    Ok(x.next_multiple_of(4))
}

/// Key rows the streamed step's attention gives a range with `x_floats` of GEMV input area (as
/// `ssa_layout` computes `tk` on the device; here for the sizing's test).
#[cfg(test)]
fn stream_attn_rows(x_floats: usize, r: usize, hd: usize) -> usize {
    (x_floats + STREAM_XF_BYTES / 4).saturating_sub(stream_attn_fixed(r, hd)) / (2 * hd + r)
}

/// Floats of `ssa_layout`'s fixed areas: q and the p.V accumulators per query head, the fresh
/// key and value, RoPE's table, per head m, l and correction (room for 8 heads), 4 spare.
fn stream_attn_fixed(r: usize, hd: usize) -> usize {
    (2 * r + 3) * hd + 4 * STREAM_ATTN_MAX_GROUP + 4
}

/// The streamed step's grid: one block on every SM, or (`HAYAI_STREAM_SMS`, a measurement) `n`
/// blocks, so `n` SMs, e.g. what a grid of thread-block clusters would keep (120 of 132 SMs in
/// clusters of 4 or 8 on the H200): the weight streams are laid out for that many SMs.
fn stream_grid(sm_count: usize, want: Option<i32>) -> Result<usize, CudaError> {
    match want {
        None => Ok(sm_count),
        Some(n) if n >= 1 && n as usize <= sm_count => Ok(n as usize),
        Some(n) => Err(CudaError::Unsupported(format!(
            "HAYAI_STREAM_SMS={n}: the streamed step runs on 1 to {sm_count} SMs here"
        ))),
    }
}

/// A measurement or check setting of the streamed step (ignored unless an integer).
/// The argmax's first stage over each SM's own lm_head rows (`HAYAI_STREAM_ARGMAX_OWN=0`: not).
fn argmax_own_wanted() -> bool {
    std::env::var("HAYAI_STREAM_ARGMAX_OWN").as_deref() != Ok("0")
}

pub(super) fn env_i32(var: &str) -> Option<i32> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

/// The fewest keys a range of the streamed step's attention takes where the context allows
/// (kernels/stream_step.cu `ssa_layout`, which caps it at a tile's rows and the ranges at one
/// item an SM). 1, 4 and 8 measured alike on E4B shapes in the twenty-first session; with the
/// step as it is now, 2 against 8 (H200, 128 + 512 tokens, docs/performance.md, forty-fourth
/// session): the 270M's shapes bf16 2,066.8-2,069.3 -> 2,132.3 tok/s (4: 2,122.9-2,126.4: its one
/// KV head's 128-640 keys in up to 132 ranges instead of 16-80), E4B int4 558.8 -> 564.1, bf16
/// +0.4% (4 keys).
pub(crate) const STREAM_ATTN_MIN_KEYS: i32 = 2;

/// Key rows per range the streamed step's attention is sized for at least.
const STREAM_ATTN_MIN_ROWS: usize = 8;

/// What `op_outputs` needs of the streamed step: the recorded operations, the launch and its
/// parameters.
pub(crate) struct StreamDebug {
    ops: Vec<Launch>,
    params: StreamParams,
    launch: Launch,
    /// How the PLE gates and projections run (unless `Apart`, the records are not the plan's
    /// one to one).
    ple: PleForm,
}

/// The fused PLE operation's and the split PLE gate's switches: the variable that turns them
/// off (`=0`) in a build that has them, the build's define, what they are.
const PLE_FUSED: (&str, &str, &str) = (
    "HAYAI_STREAM_PLE_FUSED",
    "-DSS_PLE_FUSED=1",
    "fused PLE operation",
);
const PLE_SPLIT: (&str, &str, &str) = (
    "HAYAI_STREAM_PLE_SPLIT",
    "-DSS_PLE_SPLIT=1",
    "split PLE gate",
);

/// Whether the streamed step runs each per-layer-embedding gate and projection as one operation
/// (kernels/stream_step.cu `ss_ple_columns`): only in a measurement build whose kernels have it
/// (`HAYAI_CUDA_DEFINES=-DSS_PLE_FUSED=1`, measured slower than the two GEMVs:
/// docs/performance.md, twenty-fifth session), for models with per-layer embeddings in at least
/// two layers (each layer's operation zeroes the previous layer's accumulator), unless
/// `HAYAI_STREAM_PLE_FUSED=0`. Its projection takes the gate's outputs as a bf16 pair
/// (`MatmulInputs::ple_projection`), which `check::set_decode_twin` gives the CPU twin.
pub(crate) fn ple_fused_wanted(spec: &hayai_model::ModelSpec) -> bool {
    ple_form_wanted(spec, PLE_FUSED)
}

/// Whether the streamed step splits each per-layer-embedding gate between gate/up and down
/// (kernels/stream_step.cu `SS_PLE_SPLIT`, docs/streamed-step.md; measured slower than the
/// gate's operation: docs/performance.md, twenty-seventh session): only in a measurement build
/// whose kernels have it (`HAYAI_CUDA_DEFINES=-DSS_PLE_SPLIT=1`), for models with per-layer
/// embeddings in at least two layers (each layer's down zeroes the previous layer's
/// accumulator), unless `HAYAI_STREAM_PLE_SPLIT=0`. `check::set_decode_twin` gives the CPU twin
/// the same split (`CpuRunner::set_ple_gate_split`).
pub(crate) fn ple_split_wanted(spec: &hayai_model::ModelSpec) -> bool {
    ple_form_wanted(spec, PLE_SPLIT)
}

/// A PLE form's switch ([`PLE_FUSED`], [`PLE_SPLIT`]) on for `spec`: built, per-layer
/// embeddings in at least two layers, not turned off.
fn ple_form_wanted(spec: &hayai_model::ModelSpec, (var, define, _): (&str, &str, &str)) -> bool {
    built_with(define)
        && spec.ple.is_some()
        && spec.layers.len() >= 2
        && std::env::var(var).as_deref() != Ok("0")
}

/// Whether the kernels were built with this `HAYAI_CUDA_DEFINES` entry.
fn built_with(define: &str) -> bool {
    option_env!("HAYAI_CUDA_DEFINES_BUILT")
        .unwrap_or("")
        .split_whitespace()
        .any(|d| d == define)
}

/// The fused PLE operation's accumulators: `[layers][rows]` u64 from `base`.
#[derive(Clone, Copy, Debug)]
struct PleAccs {
    base: u64,
    rows: usize,
}

/// What the split PLE gate's records need beside the plan's: gate/up's output buffer (its rows
/// and the gate's), the accumulators (`[layers][p_rows]` u64 from `acc`), the shared floats of
/// the GEMV input area and each stream operation's most units on one SM.
#[derive(Clone, Debug)]
struct SplitBufs {
    gu_out: u64,
    acc: u64,
    p_rows: usize,
    x_floats: usize,
    max_units: Vec<usize>,
}

/// How `stream_records` turns the plan's PLE gates and projections into records.
#[derive(Clone, Debug)]
enum PleRecs {
    Apart,
    Fused(PleAccs),
    Split(SplitBufs),
}

/// What the streamed step's timeline dump needs beside the raw stamps.
pub(crate) struct StreamTimeline {
    /// u64 words of the profiled launch's timing buffer.
    pub words: usize,
    /// JSON: the operations (kernel, label), and every GEMV's cells per SM (`[first, end)` in
    /// the SM's stream), for scripts/stream_timeline.py.
    pub meta: String,
}

fn timeline_meta(ops: &[(&str, &str)], streams: &Streams, grid: usize) -> String {
    let mut s = format!(
        "{{\"n_ops\": {}, \"n_sm\": {grid}, \"stamps\": {STEP_STAMPS}, \"tl_chunks\": {STREAM_TL_CHUNKS}, \"tl_slots\": {STREAM_TL_SLOTS}, \"chunk_cells\": 16, \"ops\": [",
        ops.len()
    );
    for (i, (kernel, label)) in ops.iter().enumerate() {
        let sep = if i > 0 { ", " } else { "" };
        s += &format!("{sep}[\"{kernel}\", \"{label}\"]");
    }
    s += "], \"gemv_cells\": [";
    let shares: Vec<Vec<SmShare>> = (0..grid).map(|sm| streams.sm_shares(sm)).collect();
    for (j, plan) in streams.ops.iter().enumerate() {
        let sep = if j > 0 { ", " } else { "" };
        let cells: Vec<String> = shares
            .iter()
            .map(|sh| {
                let c0 = sh[j].first_cell as usize;
                format!("[{c0}, {}]", c0 + sh[j].units as usize * plan.unit_groups())
            })
            .collect();
        s += &format!("{sep}[{}]", cells.join(", "));
    }
    s + "]}"
}

/// The plan's launches `(kernel, label, parameters)` as the streamed step's operation records
/// (kernels/step.cu `StepOp`: kind, then for a GEMV its ordinal among the GEMVs, which indexes
/// its per-SM shares, then the parameters), checked against the streams: the same GEMVs in the
/// same order with the same shapes and K splits (labels from `step_streams`), and the attentions
/// against what the kernel assumes of them: one position for all (it reads it once; head dims:
/// `stream_config`). With `ple` (streams laid out for it), each PLE gate and projection become
/// one fused record (kind 5, the gate's ordinal: its share and then the column operation's) and
/// the GEMV after it reads the layer's accumulator instead of the projection's partials.
fn stream_records(
    ops: &[(&'static str, &'static str, &[u64])],
    labels: &[&str],
    plans: &[OpPlan],
    ple: PleRecs,
) -> Result<StreamRecords, CudaError> {
    let err = |m: String| CudaError::Unsupported(format!("streamed step: {m}"));
    if ops.len() < 2 {
        return Err(err("fewer than two operations".into()));
    }
    let mut recs: Vec<Rec> = Vec::with_capacity(ops.len());
    let mut gi = 0usize;
    let mut pos = None;
    for &(kernel, label, words) in ops {
        let kind: i32 = match kernel {
            "gemv" | "gemv_q8" => 0,
            "attn_split" => 1,
            "ple_combine" => 2,
            "argmax_stage1" => 3,
            "argmax_stage2" => 4,
            k => return Err(err(format!("no operation for kernel {k}"))),
        };
        if words.len() * 8 > STEP_OP_BYTES - 8 {
            return Err(err(format!("{label} parameters exceed an operation")));
        }
        let mut words = words.to_vec();
        let mut ordinal = 0i32;
        if kind == 0 {
            if words.len() * 8 < std::mem::size_of::<GemvParams>() {
                return Err(err(format!("{label}: short GEMV parameters")));
            }
            let mut g: GemvParams = read_param(&words, 0);
            let (rows, cols, splits) = (g.rows as usize, g.cols as usize, g.splits as usize);
            let (plan, want) = plans
                .get(gi)
                .zip(labels.get(gi))
                .ok_or_else(|| err("more GEMVs than streams".into()))?;
            // Fused, the gate is whole along K (the stream's split, not the plan's) and the
            // projection's split is not used.
            let columns = plan.format == CellFormat::Int4Columns;
            let split = matches!(ple, PleRecs::Split(_));
            let fused_gate = matches!(ple, PleRecs::Fused(_)) && label == "gemv.ple_gate";
            // Split: the gate's stream is its column cells (after down's), and gate/up's holds
            // the gate's rows after its own (`split_ple_records` checks how many).
            let split_gate = split && label == "gemv.ple_gate" && *want == "gemv.ple_gate_cols";
            let split_gu = split && label == "gemv.gate_up" && plan.rows > rows;
            if (*want != label && !split_gate)
                || (plan.rows != rows && !split_gu)
                || plan.k != cols
                || !(plan.splits == splits || fused_gate || columns)
                || (columns && matches!(ple, PleRecs::Apart))
            {
                return Err(err(format!(
                    "GEMV {gi} ({label}, {rows} x {cols}, {splits} K splits) does not match its stream ({want}, {} x {}, {})",
                    plan.rows, plan.k, plan.splits
                )));
            }
            if fused_gate {
                g.splits = plan.splits as i32;
                write_param(&mut words, 0, &g);
            }
            // The int8 output head: int8 cells in the stream, marked for the kernel
            // (stream_step.cu SS_W_INT8), and only those.
            if (kernel == "gemv_q8") != (plan.format == CellFormat::Int8) {
                return Err(err(format!(
                    "GEMV {gi} ({label}): kernel {kernel} over {:?} cells",
                    plan.format
                )));
            }
            if plan.format == CellFormat::Int8 {
                g.int4 = STREAM_W_INT8;
                write_param(&mut words, 0, &g);
            }
            ordinal = gi as i32;
            gi += 1;
        }
        // Stage 1 right after a whole-row lm_head into its logits: each SM takes the rows it
        // stored, with no wait on the others (`HAYAI_STREAM_ARGMAX_OWN=0`: every SM a 256th of
        // all rows after the wait), and stage 2 the SMs' results.
        let fits = words.len() * 8 >= std::mem::size_of::<ArgmaxParams>();
        let own = fits
            && match (kind, recs.last()) {
                (3, Some(p)) if p.kind == 0 && p.label == "gemv.lm_head" => {
                    let g: GemvParams = read_param(&p.words, 0);
                    let m: ArgmaxParams = read_param(&words, 0);
                    g.splits == 1 && g.out == m.logits && argmax_own_wanted()
                }
                (4, Some(p)) => p.kind == 3 && p.own,
                _ => false,
            };
        if own {
            let mut m: ArgmaxParams = read_param(&words, 0);
            m.own = 1;
            write_param(&mut words, 0, &m);
        }
        if kind == 1 {
            if words.len() * 8 < std::mem::size_of::<AttnParams>() {
                return Err(err(format!("{label}: short attention parameters")));
            }
            let a: AttnParams = read_param(&words, 0);
            if *pos.get_or_insert(a.pos) != a.pos {
                return Err(err(format!(
                    "{label}: reads another position than the step's other attentions"
                )));
            }
        }
        recs.push(Rec {
            kind,
            ordinal,
            words,
            kernel,
            label,
            own,
        });
    }
    if gi != plans.len() {
        return Err(err(format!(
            "{gi} GEMVs in the plan, {} streams",
            plans.len()
        )));
    }
    match ple {
        PleRecs::Apart => {}
        PleRecs::Fused(acc) => recs = fuse_ple_records(recs, plans, acc)?,
        PleRecs::Split(b) => recs = split_ple_records(recs, plans, &b)?,
    }
    let mut bytes = vec![0u8; recs.len() * STEP_OP_BYTES];
    for (r, op) in recs.iter().zip(bytes.chunks_mut(STEP_OP_BYTES)) {
        op[0..4].copy_from_slice(&r.kind.to_le_bytes());
        op[4..8].copy_from_slice(&r.ordinal.to_le_bytes());
        for (w, b) in r.words.iter().zip(op[8..].chunks_mut(8)) {
            b.copy_from_slice(&w.to_le_bytes());
        }
    }
    Ok(StreamRecords {
        bytes,
        n_gemv: gi,
        pos: pos.unwrap_or(0),
        names: recs.iter().map(|r| (r.kernel, r.label)).collect(),
    })
}

/// One operation record before it is written out.
#[derive(Clone, Debug)]
struct Rec {
    kind: i32,
    ordinal: i32,
    words: Vec<u64>,
    kernel: &'static str,
    label: &'static str,
    /// An argmax stage over each SM's own lm_head rows (`ArgmaxParams::own`).
    own: bool,
}

/// The layers with a PLE gate: at least two, as the fused and split forms need (each layer's
/// operation zeroes the previous layer's accumulator).
fn ple_gate_layers(recs: &[Rec]) -> Result<usize, String> {
    let layers = recs.iter().filter(|r| r.label == "gemv.ple_gate").count();
    if layers < 2 {
        return Err(format!(
            "{layers} layers with per-layer embeddings (at least 2)"
        ));
    }
    Ok(layers)
}

/// Each `gemv.ple_gate` record and the `gemv.ple_proj` after it as one fused record (kernels/step.cu
/// `PleFusedParams`): layer l's sums go to accumulator l, and its operation zeroes accumulator
/// l - 1 (the first layer's, the last's: read by lm_head in the step before). The next GEMV (the
/// next layer's QKV, or lm_head) must read the projection's output; it reads the accumulator
/// instead (`in_splits` -1).
fn fuse_ple_records(recs: Vec<Rec>, plans: &[OpPlan], acc: PleAccs) -> Result<Vec<Rec>, CudaError> {
    let err = |m: String| CudaError::Unsupported(format!("streamed step: fused PLE: {m}"));
    let layers = ple_gate_layers(&recs).map_err(err)?;
    let at = |l: usize| acc.base + (l * acc.rows * 8) as u64;
    let mut out = Vec::with_capacity(recs.len());
    let mut layer = 0;
    // The projection's output, and the accumulator its reader takes instead.
    let mut pending: Option<(u64, u64)> = None;
    let mut i = 0;
    while i < recs.len() {
        let mut r = recs[i].clone();
        if r.kind == 0 {
            if let Some((from, to)) = pending.take() {
                let mut g: GemvParams = read_param(&r.words, 0);
                if g.input != from {
                    return Err(err(format!(
                        "{} does not read the projection's output",
                        r.label
                    )));
                }
                g.input = to;
                g.in_splits = -1;
                g.in_ld = 0;
                write_param(&mut r.words, 0, &g);
            }
        }
        if r.label != "gemv.ple_gate" {
            out.push(r);
            i += 1;
            continue;
        }
        let proj = recs
            .get(i + 1)
            .filter(|p| p.label == "gemv.ple_proj")
            .ok_or_else(|| err("a gate without its projection after it".into()))?;
        let (gp, cp) = (&plans[r.ordinal as usize], &plans[proj.ordinal as usize]);
        if gp.splits != 1 || cp.format != CellFormat::Int4Columns || gp.tiles() != cp.tiles() {
            return Err(err("the streams are not laid out for it".into()));
        }
        let (g, p): (GemvParams, GemvParams) =
            (read_param(&r.words, 0), read_param(&proj.words, 0));
        if p.rows as usize != acc.rows || p.cols != g.rows || p.act_mult == 0 {
            return Err(err(format!(
                "gate {} x {}, projection {} x {} (accumulators of {})",
                g.rows, g.cols, p.rows, p.cols, acc.rows
            )));
        }
        let f = PleFusedParams {
            g,
            act_mult: p.act_mult,
            acc: at(layer),
            zero: at((layer + layers - 1) % layers),
            p_rows: p.rows,
            pad: 0,
        };
        let mut words = vec![0u64; std::mem::size_of::<PleFusedParams>().div_ceil(8)];
        write_param(&mut words, 0, &f);
        out.push(Rec {
            kind: 5,
            ordinal: r.ordinal,
            words,
            kernel: "ple_fused",
            label: "gemv.ple_fused",
            own: false,
        });
        pending = Some((p.out, at(layer)));
        layer += 1;
        i += 2;
    }
    if pending.is_some() {
        return Err(err("no GEMV reads the last projection".into()));
    }
    Ok(out)
}

/// Each layer's `gemv.gate_up`, `gemv.down`, `gemv.ple_gate` and `gemv.ple_proj` records in the
/// split gate's form (kernels/step.cu `PleSplitParams`): gate/up (kind 6) with the gate's rows
/// after its own, into `gu_out`; down (kind 7) reading it, then the gate's column cells (the
/// stream operation after down's, its shares next to down's) into layer l's accumulator, zeroing
/// layer l - 1's (the first layer's, the last's: read in the step before); no gate record; the
/// projection (kind 8) taking the gate's inputs (down's partials, the residual, the post-feed-
/// forward norm) and forming its input from the gate's two parts.
fn split_ple_records(
    recs: Vec<Rec>,
    plans: &[OpPlan],
    b: &SplitBufs,
) -> Result<Vec<Rec>, CudaError> {
    let err = |m: String| CudaError::Unsupported(format!("streamed step: split PLE gate: {m}"));
    let layers = ple_gate_layers(&recs).map_err(err)?;
    let at = |l: usize| b.acc + (l * b.p_rows * 8) as u64;
    let words = |p: &PleSplitParams| {
        let mut w = vec![0u64; std::mem::size_of::<PleSplitParams>().div_ceil(8)];
        write_param(&mut w, 0, p);
        w
    };
    let mut out = Vec::with_capacity(recs.len());
    let mut layer = 0;
    let mut i = 0;
    while i < recs.len() {
        if recs.get(i + 2).map(|r| r.label) != Some("gemv.ple_gate") {
            out.push(recs[i].clone());
            i += 1;
            continue;
        }
        let four = &recs[i..(i + 4).min(recs.len())];
        let labels: Vec<&str> = four.iter().map(|r| r.label).collect();
        if labels
            != [
                "gemv.gate_up",
                "gemv.down",
                "gemv.ple_gate",
                "gemv.ple_proj",
            ]
        {
            return Err(err(format!("a gate after {labels:?}")));
        }
        let (gu, dn, gt, pj) = (&four[0], &four[1], &four[2], &four[3]);
        let mut ggu: GemvParams = read_param(&gu.words, 0);
        let mut gdn: GemvParams = read_param(&dn.words, 0);
        let ggt: GemvParams = read_param(&gt.words, 0);
        let mut gpj: GemvParams = read_param(&pj.words, 0);
        let (gup, dp, cp) = (
            &plans[gu.ordinal as usize],
            &plans[dn.ordinal as usize],
            &plans[gt.ordinal as usize],
        );
        let p_rows = ggt.rows as usize;
        if p_rows != b.p_rows
            || ggu.splits != 1
            || ggu.rows % 16 != 0
            || gup.rows != ggu.rows as usize + p_rows
            || gup.splits != 1
        {
            return Err(err(format!(
                "gate/up {} rows ({} K splits), its stream {} rows, the gate {p_rows} rows (accumulators of {})",
                ggu.rows, ggu.splits, gup.rows, b.p_rows
            )));
        }
        if gt.ordinal != dn.ordinal + 1
            || cp.format != CellFormat::Int4Columns
            || cp.tiles() != dp.tiles()
            || cp.splits != dp.splits
        {
            return Err(err("the streams are not laid out for it".into()));
        }
        if gdn.input != ggu.out
            || gdn.in_glu == 0
            || ggt.input != gdn.out
            || ggt.res_in == 0
            || ggt.res_out == 0
            || ggt.res_w == 0
            || ggt.norm_w != 0
            || gpj.input != ggt.out
            || gpj.cols != ggt.rows
            || gpj.act_mult == 0
        {
            return Err(err(
                "gate/up, down, the gate and the projection do not feed each other as the split \
                 needs"
                    .into(),
            ));
        }
        // Shared floats: gate/up's residual copy (its prologue constants, 4 x cols), down's
        // weighted rows and its units' products, the projection's x, down's output, the
        // residual and the norm's weight.
        let units = b.max_units.get(dn.ordinal as usize).copied().unwrap_or(0);
        let need = [
            4 * ggu.cols as usize,
            (16 + p_rows) * units,
            gpj.cols as usize + 3 * ggt.cols as usize,
        ];
        if need.iter().any(|&n| n > b.x_floats) {
            return Err(err(format!(
                "shared floats {need:?} (the GEMV input area holds {})",
                b.x_floats
            )));
        }
        let a_tile = ggu.rows / 16;
        ggu.rows = gup.rows as i32;
        ggu.out = b.gu_out;
        out.push(Rec {
            kind: 6,
            words: words(&PleSplitParams {
                g: ggu,
                a_tile,
                p_rows: p_rows as i32,
                ..Default::default()
            }),
            ..gu.clone()
        });
        gdn.input = b.gu_out;
        out.push(Rec {
            kind: 7,
            words: words(&PleSplitParams {
                g: gdn,
                p_rows: p_rows as i32,
                wf: ggt.res_w,
                acc: at(layer),
                zero: at((layer + layers - 1) % layers),
                ..Default::default()
            }),
            // (Two streams: scripts/stream_timeline.py counts them by this name.)
            kernel: "ple_split_down",
            ..dn.clone()
        });
        gpj.input = ggt.input;
        gpj.in_splits = ggt.in_splits;
        gpj.in_ld = ggt.in_ld;
        gpj.res_in = ggt.res_in;
        gpj.res_w = ggt.res_w;
        gpj.res_out = ggt.res_out;
        gpj.res_scalar = ggt.res_scalar;
        gpj.eps = ggt.eps;
        out.push(Rec {
            kind: 8,
            words: words(&PleSplitParams {
                g: gpj,
                p_rows: p_rows as i32,
                acc: at(layer),
                a_in: b.gu_out + (a_tile as u64) * 16 * 4,
                h_cols: ggt.cols,
                ..Default::default()
            }),
            ..pj.clone()
        });
        layer += 1;
        i += 4;
    }
    Ok(out)
}

/// What `stream_records` makes of a plan: the operation records, the number of GEMVs, the
/// step's position's address (0 without attention), every record's (kernel, label).
#[derive(Debug)]
struct StreamRecords {
    bytes: Vec<u8>,
    n_gemv: usize,
    pos: u64,
    names: Vec<(&'static str, &'static str)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The A10G's case, checked without one: ~99 KB of shared memory a block (101,376 bytes on
    /// sm_86) holds E4B's int4 rings only as two chunks, which `Auto` refuses (the launch plan
    /// runs) and `--streamed-step` takes; bf16 has no ring there; the H200's 227 KB take the
    /// deepest.
    #[test]
    fn rings_fit_the_gpu_and_auto_takes_the_deepest_only() {
        let spec = crate::synth::e4b_spec();
        let need = stream_x_floats(&spec, 10240).unwrap() * 4 + STREAM_XF_BYTES;
        let (a10g, h200) = (101_376usize, 232_448usize);
        let room = |b: usize| move |_: &'static str| Ok::<usize, CudaError>(b);
        for int8 in [false, true] {
            let (rings, chunk) = stream_rings(Quant::Int4, int8);
            let deep = choose_ring(rings, chunk, need, room(h200), None, true).unwrap();
            assert_eq!(deep, rings[0]);
            let e = choose_ring(rings, chunk, need, room(a10g), None, true)
                .unwrap_err()
                .to_string();
            assert!(e.contains("only its 2-chunk ring fits"), "{e}");
            let on = choose_ring(rings, chunk, need, room(a10g), None, false).unwrap();
            assert_eq!(on.0, 2);
            // The measurement knob takes the shallow ring where the deepest fits.
            let two = choose_ring(rings, chunk, need, room(h200), Some(2), true).unwrap();
            assert_eq!(two.0, 2);
            let e = choose_ring(rings, chunk, need, room(h200), Some(3), false)
                .unwrap_err()
                .to_string();
            assert!(e.contains("HAYAI_STREAM_RING=3"), "{e}");
        }
        let (rings, chunk) = stream_rings(Quant::Bf16, false);
        assert_eq!(
            choose_ring(rings, chunk, need, room(h200), None, true)
                .unwrap()
                .0,
            rings[0].0
        );
        let e = choose_ring(rings, chunk, need, room(a10g), None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no room for a ring in 101376 bytes"), "{e}");
    }

    #[test]
    fn stream_grid_takes_every_sm_or_a_valid_count() {
        assert_eq!(stream_grid(132, None).unwrap(), 132);
        assert_eq!(stream_grid(132, Some(120)).unwrap(), 120);
        assert_eq!(stream_grid(132, Some(132)).unwrap(), 132);
        for bad in [0, -4, 133] {
            let e = stream_grid(132, Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("HAYAI_STREAM_SMS") && e.contains("1 to 132"),
                "{e}"
            );
        }
    }

    #[test]
    fn each_format_has_its_rings_deepest_first_and_loaded() {
        let mut names = Vec::new();
        for (quant, int8, cell) in [
            (Quant::Int4, true, 1056),
            (Quant::Int4, false, 1056),
            (Quant::Bf16, false, 2048),
            (Quant::Bf16, true, 2048),
        ] {
            let (rings, chunk) = stream_rings(quant, int8);
            names.extend(rings.iter().map(|r| r.1));
            assert_eq!(chunk, 16 * cell, "{quant:?}");
            assert!(rings.windows(2).all(|w| w[0].0 > w[1].0), "{quant:?}");
            for (n, k) in rings {
                assert!(k.ends_with(&format!("_r{n}")), "{k}");
                assert!(
                    crate::device::KERNELS.iter().any(|(name, _)| name == k),
                    "{k}"
                );
            }
        }
        // Each format its own kernels (bf16 has one whatever `int8` says).
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 6, "{names:?}");
        // The E4B bf16 ring and input areas fit the H200's 227 KB of shared memory.
        let e4b = crate::synth::e4b_spec();
        let x = stream_x_floats(&e4b, 10240).unwrap();
        assert!(5 * STREAM_W16_CHUNK_BYTES + 4 * x + STREAM_XF_BYTES + 4608 <= 227 * 1024);
    }

    fn gemv(rows: i32, cols: i32, splits: i32) -> Vec<u64> {
        let p = GemvParams {
            rows,
            cols,
            splits,
            ..Default::default()
        };
        let mut w = vec![0u64; std::mem::size_of::<GemvParams>().div_ceil(8)];
        write_param(&mut w, 0, &p);
        w
    }

    /// Record i's parameters (after its kind and ordinal) as u64 words.
    fn record_words(r: &StreamRecords, i: usize) -> Vec<u64> {
        r.bytes[i * STEP_OP_BYTES + 8..(i + 1) * STEP_OP_BYTES]
            .chunks(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// The i32 at byte `at` of record i.
    fn record_i32(r: &StreamRecords, i: usize, at: usize) -> i32 {
        i32::from_le_bytes(r.bytes[i * STEP_OP_BYTES + at..][..4].try_into().unwrap())
    }

    fn plan(rows: usize, groups: usize, splits: usize) -> OpPlan {
        OpPlan {
            rows,
            k: groups * 128,
            format: crate::stream_layout::CellFormat::Int4,
            groups,
            splits,
            sms: Vec::new(),
        }
    }

    #[test]
    fn attention_staging_holds_at_least_eight_key_rows() {
        // E4B: the widest GEMV input (10,240) is not enough for 8 rows at head dim 512.
        let spec = crate::synth::e4b_spec();
        let x = stream_x_floats(&spec, 10240).unwrap();
        assert_eq!(x, 10820);
        assert_eq!(stream_attn_rows(x, 4, 512), 8);
        assert_eq!(stream_attn_rows(x, 4, 256), 21);
        // One row fewer fits in one float less (the size is exact).
        assert_eq!(stream_attn_rows(x - 4, 4, 512), 7);
        for arch in [
            hayai_model::spec::Arch::Gemma3,
            hayai_model::spec::Arch::Gemma4,
        ] {
            let spec = crate::synth::small_spec(arch);
            let x = stream_x_floats(&spec, 384).unwrap();
            for l in &spec.layers {
                assert!(stream_attn_rows(x, l.n_heads / l.n_kv_heads, l.head_dim) >= 8);
            }
        }
        // More than 8 query heads per KV head: refused.
        let mut spec = crate::synth::small_spec(hayai_model::spec::Arch::Gemma3);
        spec.layers[0].n_heads = 16;
        spec.layers[0].n_kv_heads = 1;
        let e = stream_x_floats(&spec, 384).unwrap_err().to_string();
        assert!(e.contains("16 query heads per KV head"), "{e}");
        let mut spec = crate::synth::small_spec(hayai_model::spec::Arch::Gemma3);
        spec.layers[1].head_dim = 96;
        let e = stream_x_floats(&spec, 384).unwrap_err().to_string();
        assert!(e.contains("head dim 96"), "{e}");
    }

    #[test]
    fn timeline_meta_names_every_operation_and_each_sms_cells() {
        use crate::stream_layout::{build, StreamOp, Weights};
        let m = crate::quant::quantize_int4(&hayai_model::weights::Matrix::from_f32(
            48,
            256,
            (0..48 * 256).map(|i| (i % 7) as f32 - 3.0).collect(),
        ));
        let st = build(
            &[StreamOp {
                weights: Weights::Int4(&m),
                whole: false,
                after_prev: false,
                max_splits: 0,
            }],
            3,
            4,
        )
        .unwrap();
        let ops = [("gemv", "gemv.o"), ("argmax_stage1", "argmax")];
        let meta = timeline_meta(&ops, &st, 3);
        assert!(meta.starts_with("{\"n_ops\": 2, \"n_sm\": 3, "), "{meta}");
        assert!(meta.contains("\"ops\": [[\"gemv\", \"gemv.o\"], [\"argmax_stage1\", \"argmax\"]]"));
        // One GEMV, three SMs: each SM's [first, end) cells, together all of them.
        let cells = meta.split("\"gemv_cells\": ").nth(1).unwrap();
        let nums: Vec<usize> = cells
            .split(|c: char| !c.is_ascii_digit())
            .filter(|t| !t.is_empty())
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(nums.len(), 6);
        let total: usize = nums.chunks(2).map(|p| p[1] - p[0]).sum();
        assert_eq!(total, st.ops[0].units() * st.ops[0].unit_groups());
        assert!(meta.ends_with("]]}"));
    }

    fn attn(pos: u64) -> Vec<u64> {
        let a = AttnParams {
            nh: 7,
            hd: 256,
            pos,
            ..Default::default()
        };
        let mut w = vec![0u64; std::mem::size_of::<AttnParams>().div_ceil(8)];
        write_param(&mut w, 0, &a);
        w
    }

    #[test]
    fn records_carry_kinds_and_gemv_ordinals() {
        let (qkv, o, att) = (gemv(64, 256, 2), gemv(32, 512, 1), attn(0x1004));
        let ops = [
            ("gemv", "gemv.qkv", &qkv[..]),
            ("attn_split", "attention", &att[..]),
            ("gemv", "gemv.o", &o[..]),
            ("argmax_stage1", "argmax", &att[..]),
        ];
        let labels = ["gemv.qkv", "gemv.o"];
        let plans = [plan(64, 2, 2), plan(32, 4, 1)];
        let StreamRecords {
            bytes: b,
            n_gemv: n,
            pos,
            names,
        } = stream_records(&ops, &labels, &plans, PleRecs::Apart).unwrap();
        assert_eq!(names.len(), 4);
        assert_eq!(names[1], ("attn_split", "attention"));
        assert_eq!((n, pos), (2, 0x1004));
        assert_eq!(b.len(), 4 * STEP_OP_BYTES);
        let word = |op: usize, at: usize| {
            i32::from_le_bytes(b[op * STEP_OP_BYTES + at..][..4].try_into().unwrap())
        };
        assert_eq!((word(0, 0), word(0, 4)), (0, 0));
        assert_eq!((word(1, 0), word(1, 4)), (1, 0));
        assert_eq!((word(2, 0), word(2, 4)), (0, 1));
        assert_eq!(word(3, 0), 3);
        // The parameters follow the first 8 bytes unchanged.
        let rows_at = 8 + std::mem::offset_of!(GemvParams, rows);
        assert_eq!(word(2, rows_at), 32);
        assert_eq!(word(1, 8 + std::mem::offset_of!(AttnParams, nh)), 7);
    }

    #[test]
    fn argmax_takes_each_sms_own_rows_after_a_whole_row_lm_head() {
        let arg = |logits: u64| {
            let m = ArgmaxParams {
                logits,
                blocks: 256,
                ..Default::default()
            };
            let mut w = vec![0u64; std::mem::size_of::<ArgmaxParams>().div_ceil(8)];
            write_param(&mut w, 0, &m);
            w
        };
        let own_at = 8 + std::mem::offset_of!(ArgmaxParams, own);
        let lm = |splits: i32| {
            let mut w = gemv(64, 256, splits);
            let mut g: GemvParams = read_param(&w, 0);
            g.out = 0x5000;
            write_param(&mut w, 0, &g);
            w
        };
        let (a, other) = (arg(0x5000), arg(0x6000));
        for (splits, a1, want) in [(1, &a, 1), (2, &a, 0)] {
            let lm = lm(splits);
            let ops = [
                ("gemv", "gemv.lm_head", &lm[..]),
                ("argmax_stage1", "argmax", &a1[..]),
                ("argmax_stage2", "argmax", &a1[..]),
            ];
            let r = stream_records(
                &ops,
                &["gemv.lm_head"],
                &[plan(64, 2, splits as usize)],
                PleRecs::Apart,
            )
            .unwrap();
            assert_eq!(record_i32(&r, 1, own_at), want, "splits {splits}");
            assert_eq!(record_i32(&r, 2, own_at), want, "splits {splits}");
            // Everything else as the plan gave it.
            let m: ArgmaxParams = read_param(&record_words(&r, 1), 0);
            assert_eq!((m.logits, m.blocks), (0x5000, 256));
        }
        // Stage 1 over other logits than lm_head's: over all of them after the wait.
        let lm = lm(1);
        let ops = [
            ("gemv", "gemv.lm_head", &lm[..]),
            ("argmax_stage1", "argmax", &other[..]),
            ("argmax_stage2", "argmax", &other[..]),
        ];
        let r = stream_records(&ops, &["gemv.lm_head"], &[plan(64, 2, 1)], PleRecs::Apart).unwrap();
        assert_eq!(
            (record_i32(&r, 1, own_at), record_i32(&r, 2, own_at)),
            (0, 0)
        );
    }

    #[test]
    fn records_refuse_what_the_streams_do_not_hold() {
        let qkv = gemv(64, 256, 2);
        let ops = [
            ("gemv", "gemv.qkv", &qkv[..]),
            ("argmax_stage2", "argmax", &qkv[..]),
        ];
        // Another K split than the stream's, another label, a missing stream, an unknown kernel.
        for (labels, plans) in [
            (vec!["gemv.qkv"], vec![plan(64, 2, 1)]),
            (vec!["gemv.o"], vec![plan(64, 2, 2)]),
            (vec![], vec![]),
        ] {
            let e = stream_records(&ops, &labels, &plans, PleRecs::Apart)
                .unwrap_err()
                .to_string();
            assert!(e.contains("streamed step"), "{e}");
        }
        // A stream more than the plan has GEMVs.
        let e = stream_records(
            &ops,
            &["gemv.qkv", "gemv.o"],
            &[plan(64, 2, 2), plan(16, 1, 1)],
            PleRecs::Apart,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("1 GEMVs in the plan, 2 streams"), "{e}");
        let odd = [
            ("gemv_mma", "gemv.qkv", &qkv[..]),
            ("argmax_stage2", "argmax", &qkv[..]),
        ];
        let e = stream_records(&odd, &["gemv.qkv"], &[plan(64, 2, 2)], PleRecs::Apart)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no operation for kernel gemv_mma"), "{e}");
        // Attentions: short parameters, two positions.
        let (a1, a2, short) = (attn(0x1004), attn(0x1008), vec![7u64; 4]);
        for (ops, want) in [
            (
                vec![("attn_split", "attention", &short[..])],
                "short attention",
            ),
            (
                vec![
                    ("attn_split", "attention", &a1[..]),
                    ("attn_split", "attention", &a2[..]),
                ],
                "another position",
            ),
        ] {
            let mut ops = ops;
            ops.push(("argmax_stage2", "argmax", &qkv[..]));
            let e = stream_records(&ops, &[], &[], PleRecs::Apart)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    /// Two layers' PLE gates and projections as fused records: each the gate's parameters
    /// (whole along K), the projection's per-layer input, its layer's accumulator and the
    /// previous one's to zero; the GEMV after it reads the accumulator.
    #[test]
    fn fused_ple_records_take_the_gate_and_projection_and_feed_the_next_gemv() {
        let gemv_p = |rows, cols, splits, input: u64, out: u64, act_mult: u64| {
            let p = GemvParams {
                rows,
                cols,
                splits,
                input,
                out,
                act_mult,
                in_splits: 2,
                ..Default::default()
            };
            let mut w = vec![0u64; std::mem::size_of::<GemvParams>().div_ceil(8)];
            write_param(&mut w, 0, &p);
            w
        };
        let (hid, pd) = (256usize, 32usize);
        let qkv = gemv_p(64, hid as i32, 1, 0x900, 0xA00, 0);
        let gate = |l: u64| gemv_p(pd as i32, hid as i32, 2, 0xB00 + l, 0xC00, 0);
        let proj = |l: u64| gemv_p(hid as i32, pd as i32, 2, 0xC00, 0xD00 + l, 0xE00 + l);
        let head = gemv_p(128, hid as i32, 1, 0xD01, 0xF00, 0);
        let (g0, p0, g1, p1) = (gate(0), proj(0), gate(1), proj(1));
        let qkv1 = gemv_p(64, hid as i32, 1, 0xD00, 0xA00, 0);
        let ops = [
            ("gemv", "gemv.qkv", &qkv[..]),
            ("gemv", "gemv.ple_gate", &g0[..]),
            ("gemv", "gemv.ple_proj", &p0[..]),
            ("gemv", "gemv.qkv", &qkv1[..]),
            ("gemv", "gemv.ple_gate", &g1[..]),
            ("gemv", "gemv.ple_proj", &p1[..]),
            ("gemv", "gemv.lm_head", &head[..]),
            ("argmax_stage1", "argmax", &qkv[..]),
        ];
        let labels: Vec<&str> = ops.iter().filter(|o| o.0 == "gemv").map(|o| o.1).collect();
        let col = |rows: usize| OpPlan {
            rows,
            k: pd,
            format: CellFormat::Int4Columns,
            groups: rows.div_ceil(96),
            splits: 1,
            sms: Vec::new(),
        };
        let plans = [
            plan(64, 2, 1),
            plan(pd, 2, 1),
            col(hid),
            plan(64, 2, 1),
            plan(pd, 2, 1),
            col(hid),
            plan(128, 2, 1),
        ];
        let acc = PleAccs {
            base: 0x10000,
            rows: hid,
        };
        let r = stream_records(&ops, &labels, &plans, PleRecs::Fused(acc)).unwrap();
        assert_eq!(r.n_gemv, 7);
        let kinds: Vec<&str> = r.names.iter().map(|n| n.0).collect();
        assert_eq!(
            kinds,
            [
                "gemv",
                "ple_fused",
                "gemv",
                "ple_fused",
                "gemv",
                "argmax_stage1"
            ]
        );
        let (rec, word) = (|i| record_words(&r, i), |i, at| record_i32(&r, i, at));
        let layer = (hid * 8) as u64;
        for (i, l, ordinal) in [(1usize, 0u64, 1), (3, 1, 4)] {
            assert_eq!((word(i, 0), word(i, 4)), (5, ordinal));
            let f: PleFusedParams = read_param(&rec(i), 0);
            assert_eq!((f.g.rows, f.g.splits, f.g.input), (pd as i32, 1, 0xB00 + l));
            assert_eq!((f.act_mult, f.p_rows), (0xE00 + l, hid as i32));
            assert_eq!(
                (f.acc, f.zero),
                (0x10000 + l * layer, 0x10000 + (1 - l) * layer)
            );
            // The GEMV after it reads the accumulator.
            let next: GemvParams = read_param(&rec(i + 1), 0);
            assert_eq!((next.input, next.in_splits), (f.acc, -1));
        }
        let first: GemvParams = read_param(&rec(0), 0);
        assert_eq!((first.input, first.in_splits), (0x900, 2));
        // Unfused streams (row cells) refuse fusion; column cells refuse records without it.
        let unfused: Vec<OpPlan> = plans
            .iter()
            .map(|p| {
                if p.format == CellFormat::Int4Columns {
                    plan(hid, 1, 2)
                } else {
                    p.clone()
                }
            })
            .collect();
        assert!(stream_records(&ops, &labels, &unfused, PleRecs::Fused(acc)).is_err());
        assert!(stream_records(&ops, &labels, &plans, PleRecs::Apart).is_err());
        // The GEMV after a projection must read its output.
        let stray = gemv_p(128, hid as i32, 1, 0x1234, 0xF00, 0);
        let mut bad = ops;
        bad[6] = ("gemv", "gemv.lm_head", &stray[..]);
        let e = stream_records(&bad, &labels, &plans, PleRecs::Fused(acc))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not read the projection's output"), "{e}");
        // One layer: no previous accumulator to zero.
        let one = &ops[3..];
        let e = stream_records(one, &labels[3..], &plans[3..], PleRecs::Fused(acc))
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 layers"), "{e}");
    }

    /// Two layers' gate/up, down, PLE gate and projection in the split gate's form: gate/up with
    /// the gate's rows into the split's buffer, down reading it and adding the gate's down part
    /// into its layer's accumulator (zeroing the other's), no gate record, the projection taking
    /// the gate's inputs; and what the split refuses.
    #[test]
    fn split_ple_records_move_the_gate_into_gate_up_down_and_the_projection() {
        let (hid, ffn, pd) = (256i32, 512i32, 128i32);
        let gp = |rows, cols, splits, input: u64, out: u64| GemvParams {
            rows,
            cols,
            splits,
            input,
            out,
            in_splits: 1,
            ..Default::default()
        };
        let w = |p: &GemvParams| {
            let mut w = vec![0u64; std::mem::size_of::<GemvParams>().div_ceil(8)];
            write_param(&mut w, 0, p);
            w
        };
        let layer = |l: u64| {
            let gu = GemvParams {
                in_glu: 0,
                ..gp(2 * ffn, hid, 1, 0x100 + l, 0x200)
            };
            let dn = GemvParams {
                in_glu: 1,
                ..gp(hid, ffn, 2, 0x200, 0x300)
            };
            let gt = GemvParams {
                in_splits: 2,
                in_ld: hid,
                res_in: 0x400 + l,
                res_out: 0x500 + l,
                res_w: 0x600 + l,
                res_scalar: 1.0,
                eps: 1e-6,
                ..gp(pd, hid, 1, 0x300, 0x700)
            };
            let pj = GemvParams {
                act_mult: 0x800 + l,
                ..gp(hid, pd, 1, 0x700, 0x900 + l)
            };
            [w(&gu), w(&dn), w(&gt), w(&pj)]
        };
        let (l0, l1) = (layer(0), layer(1));
        let head = w(&gp(128, hid, 1, 0x901, 0xF00));
        let names = [
            "gemv.gate_up",
            "gemv.down",
            "gemv.ple_gate",
            "gemv.ple_proj",
        ];
        let mut ops: Vec<(&'static str, &'static str, &[u64])> = Vec::new();
        for l in [&l0, &l1] {
            for (n, wds) in names.iter().zip(l.iter()) {
                ops.push(("gemv", n, &wds[..]));
            }
        }
        ops.push(("gemv", "gemv.lm_head", &head[..]));
        ops.push(("argmax_stage1", "argmax", &head[..]));
        let cols = OpPlan {
            rows: pd as usize,
            k: hid as usize,
            format: CellFormat::Int4Columns,
            groups: 2,
            splits: 2,
            sms: Vec::new(),
        };
        let layer_plans = [
            plan((2 * ffn + pd) as usize, 2, 1),
            plan(hid as usize, 4, 2),
            cols.clone(),
            plan(hid as usize, 1, 1),
        ];
        let plans: Vec<OpPlan> = layer_plans
            .iter()
            .chain(layer_plans.iter())
            .cloned()
            .chain([plan(128, 2, 1)])
            .collect();
        let labels = [
            "gemv.gate_up",
            "gemv.down",
            "gemv.ple_gate_cols",
            "gemv.ple_proj",
            "gemv.gate_up",
            "gemv.down",
            "gemv.ple_gate_cols",
            "gemv.ple_proj",
            "gemv.lm_head",
        ];
        let bufs = SplitBufs {
            gu_out: 0x10000,
            acc: 0x20000,
            p_rows: pd as usize,
            x_floats: 2048,
            max_units: vec![4; plans.len()],
        };
        let r = stream_records(&ops, &labels, &plans, PleRecs::Split(bufs.clone())).unwrap();
        assert_eq!(r.n_gemv, 9);
        let (rec, word) = (|i| record_words(&r, i), |i, at| record_i32(&r, i, at));
        let kinds: Vec<(i32, i32)> = (0..r.names.len())
            .map(|i| (word(i, 0), word(i, 4)))
            .collect();
        assert_eq!(
            kinds,
            [
                (6, 0),
                (7, 1),
                (8, 3),
                (6, 4),
                (7, 5),
                (8, 7),
                (0, 8),
                (3, 0)
            ]
        );
        let acc = |l: u64| 0x20000 + l * (pd as u64) * 8;
        for (l, i) in [(0u64, 0usize), (1, 3)] {
            let gu: PleSplitParams = read_param(&rec(i), 0);
            assert_eq!(
                (gu.g.rows, gu.g.out, gu.g.input),
                (2 * ffn + pd, 0x10000, 0x100 + l)
            );
            assert_eq!((gu.a_tile, gu.p_rows), (2 * ffn / 16, pd));
            let dn: PleSplitParams = read_param(&rec(i + 1), 0);
            assert_eq!((dn.g.input, dn.g.out, dn.g.splits), (0x10000, 0x300, 2));
            assert_eq!((dn.wf, dn.acc, dn.zero), (0x600 + l, acc(l), acc(1 - l)));
            let pj: PleSplitParams = read_param(&rec(i + 2), 0);
            assert_eq!((pj.g.input, pj.g.in_splits, pj.g.in_ld), (0x300, 2, hid));
            assert_eq!(
                (pj.g.res_in, pj.g.res_out, pj.g.res_w, pj.g.act_mult),
                (0x400 + l, 0x500 + l, 0x600 + l, 0x800 + l)
            );
            assert_eq!(
                (pj.g.eps, pj.g.res_scalar, pj.g.out),
                (1e-6, 1.0, 0x900 + l)
            );
            assert_eq!(
                (pj.acc, pj.a_in, pj.h_cols),
                (acc(l), 0x10000 + 2 * ffn as u64 * 4, hid)
            );
        }
        // The next layer's and lm_head's records are the plan's.
        let head_rec: GemvParams = read_param(&rec(6), 0);
        assert_eq!(head_rec.input, 0x901);
        // Refused: too few shared floats, a gate/up stream without the gate's rows, the gate's
        // column cells not after down, a projection that does not read the gate, one layer.
        let small = SplitBufs {
            x_floats: 1000,
            ..bufs.clone()
        };
        let e = stream_records(&ops, &labels, &plans, PleRecs::Split(small))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shared floats"), "{e}");
        let mut short = plans.clone();
        short[0] = plan((2 * ffn + 16) as usize, 2, 1);
        let e = stream_records(&ops, &labels, &short, PleRecs::Split(bufs.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("its stream 1040 rows"), "{e}");
        let mut rows = plans.clone();
        rows[2] = plan(pd as usize, 2, 1);
        assert!(stream_records(&ops, &labels, &rows, PleRecs::Split(bufs.clone())).is_err());
        let stray = w(&GemvParams {
            act_mult: 0x800,
            ..gp(hid, pd, 1, 0x1234, 0x900)
        });
        let mut bad = ops.clone();
        bad[3] = ("gemv", "gemv.ple_proj", &stray[..]);
        let e = stream_records(&bad, &labels, &plans, PleRecs::Split(bufs.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("do not feed each other"), "{e}");
        let one: Vec<_> = ops[4..].to_vec();
        let e = stream_records(&one, &labels[4..], &plans[4..], PleRecs::Split(bufs))
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 layers"), "{e}");
    }
}
