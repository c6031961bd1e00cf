//! The streamed decode step (`CudaOptions::streamed_step`, kernels/stream_step.cu,
//! docs/streamed-step.md): the single-kernel step's operation list run by one block per SM whose
//! producer warp streams the SM's GEMV weights from a per-SM stream laid out at load
//! (`step_streams`), while its consumer warps run the operations.

use super::*;
use crate::step_streams::step_streams;
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
        if grid > super::ARGMAX_BLOCKS {
            // The argmax's per-SM results (`ArgmaxParams::own`) have ARGMAX_BLOCKS slots.
            return Err(CudaError::Unsupported(format!(
                "streamed step: {grid} SMs, more than {} argmax slots",
                super::ARGMAX_BLOCKS
            )));
        }
        // The timing probe's operations left out (none by default).
        let labels: Vec<&str> = self.plan.iter().map(|l| l.label).collect();
        let skip = probe_env(
            "HAYAI_STREAM_PROBE_SKIP",
            &labels,
            probe_skip,
            "the streamed step runs without these operations, a timing probe whose outputs are \
             wrong",
        )?;
        let kept: Vec<&Launch> = self
            .plan
            .iter()
            .filter(|l| !skip.iter().any(|s| s == l.label))
            .collect();
        let st = step_streams(&self.model, self.quant, grid, STREAM_WARPS, head8, &skip)?;
        self.probe_skip = skip;
        let streams = &st.streams;
        let ops: Vec<(&'static str, &'static str, &[u64])> = kept
            .iter()
            .map(|l| (l.kernel, l.label, &l.params[..]))
            .collect();
        let StreamRecords {
            mut bytes,
            n_gemv,
            pos,
            names,
        } = stream_records(&ops, &st.labels, &streams.ops)?;
        let n = names.len();
        // The timing probe's operations started without their wait (none by default).
        let kept_labels: Vec<&str> = names.iter().map(|&(_, l)| l).collect();
        let nowait = probe_env(
            "HAYAI_STREAM_PROBE_NOWAIT",
            &kept_labels,
            probe_labels,
            "these operations start without waiting for the one before them, a timing probe \
             whose outputs are wrong (read only by kernels built with -DSS_PROBE_NOWAIT=1)",
        )?;
        // And the GEMVs run without their prologue (none by default).
        let noprologue = probe_env(
            "HAYAI_STREAM_PROBE_NOPROLOGUE",
            &kept_labels,
            probe_gemv_labels,
            "these GEMVs run on a stale input without their prologue (inputs, residual, norm, \
             x's quantization), a timing probe whose outputs are wrong (read only by kernels \
             built with -DSS_PROBE_NOWAIT=1)",
        )?;
        mark_probes(&mut bytes, &kept_labels, &nowait, &noprologue)
            .map_err(|m| CudaError::Unsupported(format!("streamed-step timing probe: {m}")))?;
        self.probe_marked = !nowait.is_empty() || !noprologue.is_empty();
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
            ops: kept.into_iter().cloned().collect(),
            params: p,
            launch: l.clone(),
        });
        self.step_bufs = vec![ops, stream, base, cells, shares, done, timing];
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

/// How a timing probe's variable is read: its value and the plan's labels to the labels taken.
type ProbeParse = fn(Option<&str>, &[&str]) -> Result<Vec<String>, String>;

/// A timing probe's labels from the environment variable `var`, checked by `parse`; when any
/// are set, a warning on stderr names them and says `what` they do.
fn probe_env(
    var: &str,
    labels: &[&str],
    parse: ProbeParse,
    what: &str,
) -> Result<Vec<String>, CudaError> {
    let out = parse(std::env::var(var).ok().as_deref(), labels)
        .map_err(|m| CudaError::Unsupported(format!("{var}: {m}")))?;
    if !out.is_empty() {
        eprintln!("warning: {var}={}: {what}", out.join(","));
    }
    Ok(out)
}

/// The streamed step's timing probe (`HAYAI_STREAM_PROBE_SKIP`, a comma-separated list of
/// operation labels, e.g. `gemv.ple_gate`): those operations are left out of the step, every
/// layer's, their weights out of the streams, so the step's time without them bounds what
/// removing them could gain. Their consumers read stale buffers: the outputs are wrong, which
/// the runner says on stderr. GEMVs and the attention only (not the argmax, whose token the
/// host waits for); each label must name an operation of `labels` (the plan's).
fn probe_skip(var: Option<&str>, labels: &[&str]) -> Result<Vec<String>, String> {
    let out = probe_labels(var, labels)?;
    if labels
        .iter()
        .all(|l| out.iter().any(|s| s == l) || l.starts_with("argmax"))
    {
        return Err("nothing but the argmax would be left".into());
    }
    Ok(out)
}

/// A timing probe's comma-separated operation labels (`HAYAI_STREAM_PROBE_SKIP`, `_NOWAIT`,
/// `_NOPROLOGUE`), each once: GEMVs and the attention only, each a label of
/// `labels` (the plan's).
fn probe_labels(var: Option<&str>, labels: &[&str]) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in var.unwrap_or("").split(',').map(str::trim) {
        if item.is_empty() || out.iter().any(|s| s == item) {
            continue;
        }
        if !(item.starts_with("gemv.") || item == "attention") {
            return Err(format!(
                "`{item}`: only GEMVs (gemv.*) and the attention can be left out"
            ));
        }
        if !labels.contains(&item) {
            return Err(format!("no operation `{item}` in this model's step"));
        }
        out.push(item.to_string());
    }
    Ok(out)
}

/// [`probe_labels`] for the probes that take GEMVs only (`HAYAI_STREAM_PROBE_NOPROLOGUE`).
fn probe_gemv_labels(var: Option<&str>, labels: &[&str]) -> Result<Vec<String>, String> {
    let out = probe_labels(var, labels)?;
    match out.iter().find(|l| !l.starts_with("gemv.")) {
        Some(l) => Err(format!(
            "`{l}`: only GEMVs (gemv.*) have a prologue to leave out"
        )),
        None => Ok(out),
    }
}

/// Where an operation record holds the probe word (stream_step.cu `SS_PROBE_WORD`): past every
/// operation's parameters.
const STREAM_PROBE_AT: usize = STEP_OP_BYTES - 4;
/// The probe word's bits (stream_step.cu `SS_PROBE_NOWAIT_BIT`, `SS_PROBE_NOPRO_BIT`).
const PROBE_NOWAIT: i32 = 1;
const PROBE_NOPROLOGUE: i32 = 2;

/// The streamed step's in-situ timing probes, marked in each named operation's record (each
/// layer's; labels as [`probe_labels`]). `nowait` (`HAYAI_STREAM_PROBE_NOWAIT`): the operation
/// starts on its stale input without waiting for the one before it, so the step shows what one
/// grid-wide hand-over fewer would give with every cell still run (a fold's ceiling; the first
/// operation has no wait to leave out). `noprologue` (`HAYAI_STREAM_PROBE_NOPROLOGUE`, GEMVs):
/// the GEMV multiplies whatever x its SM holds, without the prologue that builds it, so the step
/// shows what that prologue costs where it runs. Only kernels built with `-DSS_PROBE_NOWAIT=1`
/// read the word.
fn mark_probes(
    bytes: &mut [u8],
    labels: &[&str],
    nowait: &[String],
    noprologue: &[String],
) -> Result<(), String> {
    for (i, l) in labels.iter().enumerate() {
        let named = |v: &[String]| v.iter().any(|s| s == l);
        let mut bits = 0;
        if i > 0 && named(nowait) {
            bits |= PROBE_NOWAIT;
        }
        if named(noprologue) {
            bits |= PROBE_NOPROLOGUE;
        }
        if bits == 0 {
            continue;
        }
        let word = &mut bytes[i * STEP_OP_BYTES + STREAM_PROBE_AT..][..4];
        if word.iter().any(|&b| b != 0) {
            return Err(format!("{l}: its parameters reach the probe word"));
        }
        word.copy_from_slice(&bits.to_le_bytes());
    }
    Ok(())
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
/// `stream_config`).
fn stream_records(
    ops: &[(&'static str, &'static str, &[u64])],
    labels: &[&str],
    plans: &[OpPlan],
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
            if *want != label || plan.rows != rows || plan.k != cols || plan.splits != splits {
                return Err(err(format!(
                    "GEMV {gi} ({label}, {rows} x {cols}, {splits} K splits) does not match its stream ({want}, {} x {}, {})",
                    plan.rows, plan.k, plan.splits
                )));
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

    /// The probe's list: GEMV and attention labels of the plan, each once; anything else (an
    /// unknown label, the argmax, leaving nothing) is an error that names it.
    #[test]
    fn probe_skip_takes_the_plans_gemvs_and_attention_only() {
        let labels = [
            "gemv.qkv",
            "attention",
            "gemv.o",
            "gemv.ple_gate",
            "gemv.ple_proj",
            "argmax",
            "argmax",
        ];
        assert!(probe_skip(None, &labels).unwrap().is_empty());
        assert!(probe_skip(Some(""), &labels).unwrap().is_empty());
        assert_eq!(
            probe_skip(Some(" gemv.ple_gate,attention,gemv.ple_gate "), &labels).unwrap(),
            ["gemv.ple_gate", "attention"]
        );
        for (var, want) in [
            ("gemv.down", "no operation `gemv.down`"),
            ("argmax", "only GEMVs"),
            ("ple_combine", "only GEMVs"),
            (
                "gemv.qkv,attention,gemv.o,gemv.ple_gate,gemv.ple_proj",
                "nothing but the argmax",
            ),
        ] {
            let e = probe_skip(Some(var), &labels).unwrap_err();
            assert!(e.contains(want), "{var}: {e}");
        }
    }

    /// The in-situ probes mark every operation they name, each layer's, in the word past the
    /// parameters and nothing else: the wait's bit on all but the first operation (which has
    /// no wait), the prologue's on GEMVs only.
    #[test]
    fn probe_words_mark_the_named_operations_past_their_parameters() {
        let labels = [
            "gemv.qkv",
            "attention",
            "gemv.o",
            "gemv.qkv",
            "attention",
            "argmax",
        ];
        let nowait = probe_labels(Some("gemv.qkv,attention"), &labels).unwrap();
        assert!(probe_labels(Some("argmax"), &labels).is_err());
        let mut bytes = vec![0u8; labels.len() * STEP_OP_BYTES];
        bytes[7] = 9; // a parameter byte stays
        mark_probes(&mut bytes, &labels, &nowait, &[]).unwrap();
        let word = |bytes: &[u8], i: usize| {
            i32::from_le_bytes(
                bytes[i * STEP_OP_BYTES + STREAM_PROBE_AT..][..4]
                    .try_into()
                    .unwrap(),
            )
        };
        assert_eq!(
            (0..labels.len())
                .map(|i| word(&bytes, i))
                .collect::<Vec<_>>(),
            [0, 1, 0, 1, 1, 0]
        );
        assert_eq!(bytes.iter().filter(|&&b| b != 0).count(), 4);
        assert_eq!(bytes[7], 9);
        // Parameters that reach the word are an error, not overwritten.
        bytes[STEP_OP_BYTES * 2 + STREAM_PROBE_AT] = 5;
        let e = mark_probes(&mut bytes, &labels, &["gemv.o".to_string()], &[]).unwrap_err();
        assert!(e.contains("gemv.o"), "{e}");
        // The word sits past the largest record the stream takes (GEMV and attention).
        assert!(
            std::mem::size_of::<GemvParams>().max(std::mem::size_of::<AttnParams>())
                <= STREAM_PROBE_AT - 8
        );
        // The prologue probe: GEMVs only, the first operation too, its bit beside the wait's.
        assert!(probe_gemv_labels(Some("attention"), &labels).is_err());
        let nopro = probe_gemv_labels(Some("gemv.qkv"), &labels).unwrap();
        let mut bytes = vec![0u8; labels.len() * STEP_OP_BYTES];
        mark_probes(&mut bytes, &labels, &nowait, &nopro).unwrap();
        assert_eq!(
            (0..labels.len())
                .map(|i| word(&bytes, i))
                .collect::<Vec<_>>(),
            [2, 1, 0, 3, 1, 0]
        );
    }

    /// Streams built without the probe's operations keep every other GEMV, in order and shape.
    #[test]
    fn streams_without_the_probes_operations_keep_the_others() {
        let spec = {
            let mut s = crate::synth::small_spec(hayai_model::spec::Arch::Gemma4);
            s.vocab = 1024;
            if let Some(p) = s.ple.as_mut() {
                p.vocab = 1024;
            }
            s
        };
        let model = crate::synth::random_model_bf16(&spec, 7);
        let skip = vec!["gemv.ple_gate".to_string()];
        let all = step_streams(&model, Quant::Int4, 13, 11, None, &[]).unwrap();
        let st = step_streams(&model, Quant::Int4, 13, 11, None, &skip).unwrap();
        let gates = all.labels.iter().filter(|l| **l == "gemv.ple_gate").count();
        assert!(gates > 0);
        assert_eq!(st.labels.len(), all.labels.len() - gates);
        assert!(!st.labels.contains(&"gemv.ple_gate"));
        // Every other GEMV keeps its shape and place.
        let rest: Vec<_> = all
            .labels
            .iter()
            .zip(&all.streams.ops)
            .filter(|(l, _)| **l != "gemv.ple_gate")
            .map(|(l, p)| (*l, p.rows, p.k))
            .collect();
        let kept: Vec<_> = st
            .labels
            .iter()
            .zip(&st.streams.ops)
            .map(|(l, p)| (*l, p.rows, p.k))
            .collect();
        assert_eq!(kept, rest);
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
        } = stream_records(&ops, &labels, &plans).unwrap();
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
            let r =
                stream_records(&ops, &["gemv.lm_head"], &[plan(64, 2, splits as usize)]).unwrap();
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
        let r = stream_records(&ops, &["gemv.lm_head"], &[plan(64, 2, 1)]).unwrap();
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
            let e = stream_records(&ops, &labels, &plans)
                .unwrap_err()
                .to_string();
            assert!(e.contains("streamed step"), "{e}");
        }
        // A stream more than the plan has GEMVs.
        let e = stream_records(
            &ops,
            &["gemv.qkv", "gemv.o"],
            &[plan(64, 2, 2), plan(16, 1, 1)],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("1 GEMVs in the plan, 2 streams"), "{e}");
        let odd = [
            ("gemv_mma", "gemv.qkv", &qkv[..]),
            ("argmax_stage2", "argmax", &qkv[..]),
        ];
        let e = stream_records(&odd, &["gemv.qkv"], &[plan(64, 2, 2)])
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
            let e = stream_records(&ops, &[], &[]).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
