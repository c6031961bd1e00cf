//! [`CudaRunner`]: weights on the GPU, a fixed decode plan (a list of kernel launches whose
//! pointers never change), captured once as a CUDA graph and replayed per token.
//!
//! Per-step inputs live in a device buffer `step_io = [token, position]`; the argmax kernel at
//! the end of the graph writes the next token there and advances the position, so consecutive
//! greedy steps copy nothing to the device and only the 4-byte token id back (into a mapped host
//! slot, for `greedy_decode`).

use std::sync::Arc;

use cudarc::driver::{sys, CudaGraph};
use hayai_model::{Model, ModelError, Rows, Runner, RunnerInfo};

use crate::device::{drv, DevBuf, Gpu};
use crate::quant::{int4_eligible, quantize_int4, to_bf16_bits, Int4Matrix};
use crate::CudaError;

mod launch;
mod opbench;
mod options;
mod plan;
mod prefill;
mod shapes;
mod step;
mod stream;
use launch::*;
pub(crate) use launch::{BwParams, Launch};
pub use opbench::OpTime;
pub use options::{CudaOptions, LmHead, Quant, StreamedStep, RING_SLACK};
pub use prefill::PREFILL_CHUNK;
use shapes::*;

/// Whether the GPU kernels can run `spec` (checked without touching a GPU): head dims multiples
/// of 128 up to 512, every projection width a multiple of 32, PLE width a multiple of 32 up to
/// 1024.
pub fn check_supported(spec: &hayai_model::ModelSpec) -> Result<(), CudaError> {
    spec.validate().map_err(ModelError::Config)?;
    let width = |what: String, n: usize| {
        if n == 0 || n % 32 != 0 {
            Err(CudaError::Unsupported(format!(
                "{what} width {n} (the GPU kernels take multiples of 32)"
            )))
        } else {
            Ok(())
        }
    };
    width("hidden".into(), spec.hidden)?;
    for (i, l) in spec.layers.iter().enumerate() {
        if l.head_dim % 128 != 0 || l.head_dim > 512 {
            return Err(CudaError::Unsupported(format!(
                "layer {i}: head dim {} (the GPU kernels take multiples of 128 up to 512)",
                l.head_dim
            )));
        }
        width(format!("layer {i} intermediate"), l.intermediate)?;
        width(format!("layer {i} attention output"), l.q_dim())?;
    }
    if let Some(p) = &spec.ple {
        if p.dim > 1024 {
            return Err(CudaError::Unsupported(format!("PLE width {}", p.dim)));
        }
        width("PLE".into(), p.dim)?;
    }
    Ok(())
}

/// The widest input of the decode step's GEMVs: the projections' width (a fused matrix shares
/// its parts'), the lm_head's and the PLE model projection's.
fn gemv_max_cols(model: &Model) -> usize {
    let w = &model.weights;
    w.layers
        .iter()
        .flat_map(|l| [l.q.cols, l.o.cols, l.gate.cols, l.down.cols])
        .chain([w.lm_head().cols])
        .chain(w.ple.as_ref().map(|p| p.model_proj.cols))
        .max()
        .unwrap_or(0)
}

/// Boxed runner for the engine.
pub fn load_runner(model: Arc<Model>, opts: CudaOptions) -> Result<Box<dyn Runner>, CudaError> {
    Ok(Box::new(CudaRunner::new(model, opts)?))
}

/// A projection (or several fused by rows) on the GPU.
struct DevMat {
    w: u64,
    scales: u64,
    /// int4 scales again in the single-kernel step's octet layout ([rows/8][cols/128][8] bf16,
    /// rows padded with zeros), when that step is in use; else 0.
    scales_oct: u64,
    rows: usize,
    cols: usize,
    int4: bool,
    bytes: usize,
    _bufs: Vec<DevBuf>,
}

/// A fused weight matrix on the host, as the GPU stores it: int4 (group 128) where the width
/// allows and `quant` asks for it, else bf16 bits.
pub(crate) enum HostMat {
    Int4(Int4Matrix),
    Bf16 {
        rows: usize,
        cols: usize,
        bits: Vec<u16>,
    },
}

/// `mats` (same width) concatenated by rows, or interleaved row by row when `interleave`
/// (gate/up pairs for the fused GeGLU GEMV), in the GPU's storage format. What `upload_mats`
/// uploads and the streamed step's weight streams are built from (`step_streams`).
pub(crate) fn fuse_host(
    mats: &[&hayai_model::Matrix],
    interleave: bool,
    quant: Quant,
) -> Result<HostMat, CudaError> {
    let cols = mats[0].cols;
    if mats.iter().any(|m| m.cols != cols) {
        return Err(CudaError::Unsupported(
            "fused matrices differ in width".into(),
        ));
    }
    let rows: usize = mats.iter().map(|m| m.rows).sum();
    if interleave && mats.iter().any(|m| m.rows != mats[0].rows) {
        return Err(CudaError::Unsupported("gate/up differ in height".into()));
    }
    // Order of (matrix, row) pairs in the fused matrix.
    let order: Vec<(usize, usize)> = if interleave {
        (0..mats[0].rows)
            .flat_map(|r| (0..mats.len()).map(move |m| (m, r)))
            .collect()
    } else {
        mats.iter()
            .enumerate()
            .flat_map(|(m, x)| (0..x.rows).map(move |r| (m, r)))
            .collect()
    };
    if quant == Quant::Int4 && int4_eligible(cols) {
        let qs: Vec<_> = mats.iter().map(|m| quantize_int4(m)).collect();
        let (rb, g) = (cols / 2, cols / 128);
        let mut packed = Vec::with_capacity(rows * rb);
        let mut scales = Vec::with_capacity(rows * g);
        for &(m, r) in &order {
            packed.extend_from_slice(&qs[m].packed[r * rb..(r + 1) * rb]);
            scales.extend_from_slice(&qs[m].scales[r * g..(r + 1) * g]);
        }
        return Ok(HostMat::Int4(Int4Matrix {
            rows,
            cols,
            packed,
            scales,
        }));
    }
    if cols % 32 != 0 {
        return Err(CudaError::Unsupported(format!(
            "matrix width {cols} is not a multiple of 32"
        )));
    }
    let bits: Vec<Vec<u16>> = mats.iter().map(|m| to_bf16_bits(m)).collect();
    let mut data = Vec::with_capacity(rows * cols);
    for &(m, r) in &order {
        data.extend_from_slice(&bits[m][r * cols..(r + 1) * cols]);
    }
    Ok(HostMat::Bf16 {
        rows,
        cols,
        bits: data,
    })
}

/// Upload `mats` fused as `fuse_host` lays them out (plus the octet scale layout the
/// single-kernel step reads, when asked).
fn upload_mats(
    gpu: &Gpu,
    mats: &[&hayai_model::Matrix],
    interleave: bool,
    quant: Quant,
    octet_scales: bool,
) -> Result<DevMat, CudaError> {
    match fuse_host(mats, interleave, quant)? {
        HostMat::Int4(m) => {
            let (rows, cols, g) = (m.rows, m.cols, m.cols / 128);
            let wb = gpu.upload(&m.packed)?;
            let sb = gpu.upload(&m.scales)?;
            let mut bufs = vec![wb, sb];
            let mut scales_oct = 0;
            if octet_scales {
                let ob = gpu.upload(&octet_layout(&m.scales, rows, g))?;
                scales_oct = ob.ptr();
                bufs.push(ob);
            }
            Ok(DevMat {
                w: bufs[0].ptr(),
                scales: bufs[1].ptr(),
                scales_oct,
                rows,
                cols,
                int4: true,
                bytes: m.packed.len() + m.scales.len() * 2,
                _bufs: bufs,
            })
        }
        HostMat::Bf16 { rows, cols, bits } => {
            let wb = gpu.upload(&bits)?;
            Ok(DevMat {
                w: wb.ptr(),
                scales: 0,
                scales_oct: 0,
                rows,
                cols,
                int4: false,
                bytes: bits.len() * 2,
                _bufs: vec![wb],
            })
        }
    }
}

/// Row-major `[rows][groups]` scales as `[rows/8][groups][8]` (rows padded with zeros).
fn octet_layout<T: Copy + Default>(scales: &[T], rows: usize, groups: usize) -> Vec<T> {
    let octets = rows.div_ceil(8);
    let mut out = vec![T::default(); octets * groups * 8];
    for r in 0..rows {
        for g in 0..groups {
            out[((r / 8) * groups + g) * 8 + r % 8] = scales[r * groups + g];
        }
    }
    out
}

struct DevLayer {
    qkv: DevMat,
    o: DevMat,
    gateup: DevMat,
    down: DevMat,
    ple_gate: Option<DevMat>,
    ple_proj: Option<DevMat>,
    attn_norm: DevBuf,
    q_norm: DevBuf,
    k_norm: Option<DevBuf>,
    post_attn: DevBuf,
    pre_ffn: DevBuf,
    post_ffn: DevBuf,
    ple_post: Option<DevBuf>,
    inv_freq: DevBuf,
    kv: Option<(DevBuf, DevBuf)>,
    cap: usize,
    attn_splits: usize,
}

struct Scratch {
    h: [DevBuf; 2],
    qkv_part: DevBuf,
    qkv_fin: DevBuf,
    o_fin: DevBuf,
    down_fin: DevBuf,
    pg_fin: DevBuf,
    pp_fin: DevBuf,
    plp_fin: DevBuf,
    counters: DevBuf,
    attn_counters: DevBuf,
    gu_part: DevBuf,
    q: DevBuf,
    attn_ml: DevBuf,
    attn_acc: DevBuf,
    attn_out: DevBuf,
    o_part: DevBuf,
    ffn_act: DevBuf,
    down_part: DevBuf,
    pg_part: DevBuf,
    pp_part: DevBuf,
    plp_part: DevBuf,
    ple_out: DevBuf,
    logits: DevBuf,
    blk_val: DevBuf,
    blk_idx: DevBuf,
    step_io: DevBuf,
    out_tok: DevBuf,
    /// Where the argmax also stores each step's token for `greedy_decode`.
    tok_slots: crate::device::TokenSlots,
    /// Grid barrier of `gemv_pair`: {arrive, depart}.
    pair_barrier: DevBuf,
}

const GEMV_ROWS_PER_BLOCK: usize = 64;
pub(crate) const MAX_SPLITS: usize = 16;
const ARGMAX_BLOCKS: usize = 256;
/// Must match `ATTN_MAX_SPLITS` in attention.cu.
const ATTN_MAX_SPLITS: usize = 128;

pub struct CudaRunner {
    // Field order matters for drop: the graph and buffers go before the context.
    graph: Option<CudaGraph>,
    plan: Vec<Launch>,
    prefill: Option<prefill::PrefillScratch>,
    scratch: Scratch,
    layers: Vec<DevLayer>,
    embed: DevBuf,
    lm_head: DevMat,
    /// The output head as int8 with f16 scales per 32 columns ([`CudaOptions::lm_head`]:
    /// `w` the int8 values, `scales` the f16 bits), which the decode step's lm_head GEMV takes
    /// instead of `lm_head` (the prefill's GEMM keeps that).
    lm_head_int8: Option<DevMat>,
    ple_table: Option<DevBuf>,
    ple_model: Option<DevMat>,
    ple_norm: Option<DevBuf>,
    final_norm: DevBuf,
    /// The single-kernel step's operation list and barrier counter.
    step_bufs: Vec<DevBuf>,
    gpu: Gpu,
    model: Arc<Model>,
    info: RunnerInfo,
    quant: Quant,
    use_graph: bool,
    persistent: bool,
    fuse_ple: bool,
    /// The tiled GEMV kernel's name (`gemv` or `gemv_u8`).
    tiled_gemv: &'static str,
    attn_prefetch: bool,
    /// See [`CudaOptions::attn_by_head_dim`].
    attn_by_head_dim: bool,
    /// See [`CudaOptions::attn_warp_values`].
    attn_warp_values: bool,
    /// See [`CudaOptions::attn_min_keys`].
    attn_min_keys: usize,
    /// int4 GEMVs with int8 activations (`gemv_mma_a8` / `gemv_mma_kw_a8` with `tc_gemv`, else
    /// `gemv_a8`).
    int8_act: bool,
    /// int4 GEMVs as `gemv_mma` (tensor cores).
    tc_gemv: bool,
    /// ... as `gemv_mma_ring` (weights through a shared-memory ring).
    tc_ring: bool,
    /// See [`CudaOptions::tensor_core_kwarps`] (never with the ring).
    tc_kwarps: bool,
    /// Head dims whose attention runs as `attn_split_tile` (the tile fits shared memory).
    attn_tile_dims: Vec<usize>,
    /// The single-kernel (or streamed) step's launch shape, when it is in use.
    step_kernel: Option<StepConfig>,
    /// The options it was built with, `Auto` decided (`opts.streamed()`: the step runs as the
    /// streamed step, kernels/stream_step.cu).
    opts: CudaOptions,
    /// Why `Auto` kept the launch plan (None: not asked, or the streamed step runs).
    launch_plan_reason: Option<String>,
    /// The streamed step's timing probe: the operations left out (`HAYAI_STREAM_PROBE_SKIP`),
    /// whose weights it does not stream.
    probe_skip: Vec<String>,
    /// Operations marked in place (`HAYAI_STREAM_PROBE_NOWAIT`, `_NOPROLOGUE`).
    probe_marked: bool,
    /// Its recorded operations, for `op_outputs`.
    stream_debug: Option<stream::StreamDebug>,
    /// The streamed step's per-SM timeline layout (dumped by `profile_step` when
    /// HAYAI_STREAM_TIMELINE names a file).
    stream_timeline: Option<stream::StreamTimeline>,
    /// Its launch with timing on, the operations' labels and the timing buffer ([ops][2] u64).
    step_profile: Option<(Launch, Vec<&'static str>, u64)>,
    /// Resident GEMV blocks per SM by dynamic shared memory size (persistent grid sizing).
    gemv_occupancy: std::cell::RefCell<Vec<(&'static str, usize, usize)>>,
    len: usize,
    /// What `step_io` holds on the device, when known: (token, position).
    dev_io: Option<(u32, usize)>,
    logits_host: Vec<f32>,
}

// SAFETY: the runner owns its context, stream, graph and buffers exclusively; it is used by
// one thread at a time (`&mut self`) and binds the context to the calling thread first.
unsafe impl Send for CudaRunner {}

impl CudaRunner {
    /// The runner for `model` with `opts`; with [`StreamedStep::Auto`], the streamed step where
    /// it runs here (else the launch plan, and [`CudaRunner::launch_plan_reason`] says why).
    pub fn new(model: Arc<Model>, opts: CudaOptions) -> Result<CudaRunner, CudaError> {
        if opts.streamed_step != StreamedStep::Auto {
            return Self::build(model, opts, false);
        }
        let off = CudaOptions {
            streamed_step: StreamedStep::Off,
            ..opts.clone()
        };
        let why = match opts.launch_plan_variant() {
            Some(flag) => format!("{flag} is a launch-plan variant"),
            None => {
                let on = CudaOptions {
                    streamed_step: StreamedStep::On,
                    ..opts
                };
                // Any failure (its ring, its cells, the memory for the weights' second copy)
                // leaves the launch plan, which has its own checks.
                match Self::build(model.clone(), on, true) {
                    Ok(r) => return Ok(r),
                    Err(e) => e.to_string(),
                }
            }
        };
        let mut r = Self::build(model, off, false)?;
        // The backend's description says which step runs and why (the server logs it).
        r.info.backend = format!(
            "{}, launch plan: {why})",
            r.info.backend.trim_end_matches(')')
        );
        r.launch_plan_reason = Some(why);
        Ok(r)
    }

    /// `auto`: the streamed step asked for by `Auto` (its deepest ring only: `stream_config`).
    fn build(
        model: Arc<Model>,
        mut opts: CudaOptions,
        auto: bool,
    ) -> Result<CudaRunner, CudaError> {
        let spec = &model.spec;
        spec.validate().map_err(ModelError::Config)?;
        // The output head's int8 blocks where asked for (or, `Auto`, where the model has them),
        // decided before the streamed step's shared memory is (its scale ring).
        let head8 = opts
            .lm_head
            .int8_blocks(opts.quant, model.weights.lm_head())?;
        if head8.is_some() && (opts.single_kernel || opts.persistent_gemv) {
            return Err(CudaError::Unsupported(
                "this model's output head is int8 (the file's Q8_0), which the single-kernel step \
                 and the persistent GEMV do not take: add --lm-head quant for its bf16 rounding"
                    .into(),
            ));
        }
        opts.lm_head = if head8.is_some() {
            LmHead::Int8
        } else {
            LmHead::Quant
        };
        check_supported(spec)?;
        if let Some(c) = opts.conflict() {
            return Err(CudaError::Unsupported(c));
        }
        if opts.single_kernel && opts.streamed() {
            return Err(CudaError::Unsupported(
                "the single-kernel and the streamed step are alternatives: choose one".into(),
            ));
        }
        let gpu = Gpu::new(opts.device_ordinal)?.with_pdl(opts.pdl);
        gpu.bind()?;
        // The widest GEMV input (the weights' width; fused matrices share theirs).
        let max_cols = gemv_max_cols(&model);
        // Before any upload: where the streamed step cannot run, say so at once.
        let stream_cfg = if opts.streamed() {
            Some(stream::stream_config(
                &gpu,
                spec,
                opts.quant,
                opts.uses_int8_activations(),
                max_cols,
                auto,
                head8.is_some(),
            )?)
        } else {
            None
        };
        let max_ctx = opts
            .max_context
            .unwrap_or(spec.max_context.min(8192))
            .min(spec.max_context)
            .max(1);
        let w = &model.weights;
        let q = opts.quant;
        let sm = gpu.sm_count as usize;
        let oct = opts.single_kernel;

        let mut layers = Vec::with_capacity(spec.n_layers());
        for (i, (ls, lw)) in spec.layers.iter().zip(&w.layers).enumerate() {
            let own = ls.owns_kv(i);
            let qkv = if own {
                let (k, v) = (lw.k.as_ref(), lw.v.as_ref());
                let (k, v) = k.zip(v).ok_or_else(|| {
                    CudaError::Model(ModelError::MissingTensor(format!("layers.{i}.k/v")))
                })?;
                upload_mats(&gpu, &[&lw.q, k, v], false, q, oct)?
            } else {
                upload_mats(&gpu, &[&lw.q], false, q, oct)?
            };
            let cap = if ls.sliding {
                (spec.sliding_window + RING_SLACK).min(max_ctx)
            } else {
                max_ctx
            };
            let kv = if own {
                let n = ls.n_kv_heads * cap * ls.head_dim * 4;
                Some((gpu.alloc(n)?, gpu.alloc(n)?))
            } else {
                None
            };
            let max_keys = if ls.sliding {
                spec.sliding_window.min(max_ctx)
            } else {
                max_ctx
            };
            let (ple_gate, ple_proj, ple_post) = match &lw.ple {
                Some(p) => (
                    Some(upload_mats(&gpu, &[&p.gate], false, q, oct)?),
                    Some(upload_mats(&gpu, &[&p.proj], false, q, oct)?),
                    Some(gpu.upload(&p.post_norm)?),
                ),
                None => (None, None, None),
            };
            layers.push(DevLayer {
                qkv,
                o: upload_mats(&gpu, &[&lw.o], false, q, oct)?,
                gateup: upload_mats(&gpu, &[&lw.gate, &lw.up], true, q, oct)?,
                down: upload_mats(&gpu, &[&lw.down], false, q, oct)?,
                ple_gate,
                ple_proj,
                attn_norm: gpu.upload(&lw.attn_norm)?,
                q_norm: gpu.upload(&lw.q_norm)?,
                k_norm: lw.k_norm.as_ref().map(|k| gpu.upload(k)).transpose()?,
                post_attn: gpu.upload(&lw.post_attn_norm)?,
                pre_ffn: gpu.upload(&lw.pre_ffn_norm)?,
                post_ffn: gpu.upload(&lw.post_ffn_norm)?,
                ple_post,
                inv_freq: gpu.upload(&ls.rope.inv_freq(ls.head_dim))?,
                kv,
                cap,
                attn_splits: max_keys.div_ceil(32).clamp(1, ATTN_MAX_SPLITS),
            });
        }
        let embed_bits = to_bf16_bits(&w.embed);
        let embed = gpu.upload(&embed_bits)?;
        drop(embed_bits);
        let lm_head = match (&w.lm_head, q) {
            (None, Quant::Bf16) => DevMat {
                w: embed.ptr(),
                scales: 0,
                scales_oct: 0,
                rows: w.embed.rows,
                cols: w.embed.cols,
                int4: false,
                bytes: w.embed.rows * w.embed.cols * 2,
                _bufs: Vec::new(),
            },
            (None, Quant::Int4) => upload_mats(&gpu, &[&w.embed], false, q, oct)?,
            (Some(h), _) => upload_mats(&gpu, &[h], false, q, oct)?,
        };
        let lm_head_int8 = if let Some(m) = &head8 {
            let bytes = m.n_bytes();
            let qb = gpu.upload(&m.q)?;
            let sb = gpu.upload(&m.scales)?;
            Some(DevMat {
                w: qb.ptr(),
                scales: sb.ptr(),
                scales_oct: 0,
                rows: m.rows,
                cols: m.cols,
                int4: false,
                bytes,
                _bufs: vec![qb, sb],
            })
        } else {
            None
        };
        let (ple_table, ple_model, ple_norm) = match &w.ple {
            Some(p) => (
                Some(gpu.upload(&to_bf16_bits(&p.table))?),
                Some(upload_mats(&gpu, &[&p.model_proj], false, q, oct)?),
                Some(gpu.upload(&p.proj_norm)?),
            ),
            None => (None, None, None),
        };
        let final_norm = gpu.upload(&w.final_norm)?;

        // Scratch sized for the largest layer.
        let h = spec.hidden;
        let max_qkv = layers.iter().map(|l| l.qkv.rows).max().unwrap_or(0);
        let max_q = spec.layers.iter().map(|l| l.q_dim()).max().unwrap_or(0);
        let max_im = spec
            .layers
            .iter()
            .map(|l| l.intermediate)
            .max()
            .unwrap_or(0);
        let max_attn = spec
            .layers
            .iter()
            .zip(&layers)
            .map(|(l, d)| l.n_heads * d.attn_splits)
            .max()
            .unwrap_or(0)
            // The streamed step's attention indexes its ranges' partials per head up to
            // ATTN_MAX_SPLITS whatever the layer's split count (2 MB at E4B's widest).
            .max(spec.layers.iter().map(|l| l.n_heads).max().unwrap_or(0) * ATTN_MAX_SPLITS);
        let max_hd = spec.layers.iter().map(|l| l.head_dim).max().unwrap_or(0);
        let ple_w = spec.ple.as_ref().map_or(0, |p| p.dim * spec.n_layers());
        let ple_d = spec.ple.as_ref().map_or(0, |p| p.dim);
        let f = 4usize;
        let scratch = Scratch {
            h: [gpu.alloc(h * f)?, gpu.alloc(h * f)?],
            qkv_part: gpu.alloc(MAX_SPLITS * max_qkv * f)?,
            qkv_fin: gpu.alloc(max_qkv * f)?,
            o_fin: gpu.alloc(h * f)?,
            down_fin: gpu.alloc(h * f)?,
            pg_fin: gpu.alloc(ple_d.max(1) * f)?,
            pp_fin: gpu.alloc(h * f)?,
            plp_fin: gpu.alloc(ple_w.max(1) * f)?,
            attn_counters: gpu
                .alloc(spec.layers.iter().map(|l| l.n_heads).max().unwrap_or(1) * 4)?,
            gu_part: gpu.alloc(MAX_SPLITS * 2 * max_im * f)?,
            // One counter per 8-row octet of the tallest matrix.
            counters: gpu
                .alloc((spec.vocab.max(2 * max_im).max(max_qkv).max(ple_w) / 8 + 64) * 4)?,
            q: gpu.alloc(max_q * f)?,
            attn_ml: gpu.alloc(max_attn * 2 * f)?,
            attn_acc: gpu.alloc(max_attn * max_hd * f)?,
            attn_out: gpu.alloc(max_q * f)?,
            o_part: gpu.alloc(MAX_SPLITS * h * f)?,
            ffn_act: gpu.alloc(max_im * f)?,
            down_part: gpu.alloc(MAX_SPLITS * h * f)?,
            pg_part: gpu.alloc(MAX_SPLITS * ple_d.max(1) * f)?,
            pp_part: gpu.alloc(MAX_SPLITS * h * f)?,
            plp_part: gpu.alloc(MAX_SPLITS * ple_w.max(1) * f)?,
            ple_out: gpu.alloc(ple_w.max(1) * f)?,
            logits: gpu.alloc(spec.vocab * f)?,
            blk_val: gpu.alloc(ARGMAX_BLOCKS * f)?,
            blk_idx: gpu.alloc(ARGMAX_BLOCKS * f)?,
            step_io: gpu.alloc(8)?,
            out_tok: gpu.alloc(4)?,
            tok_slots: gpu.token_slots()?,
            pair_barrier: gpu.alloc(8)?,
        };
        // Norms (and so the prologue's constants) only ever sit on hidden-width inputs.
        let smem = (max_cols * 4).max(gemv_smem(h, false, true)) + GEMV_XS_OFFSET_BYTES;
        if smem > 48 * 1024 - 256 {
            if smem + 256 > gpu.max_smem_optin()? {
                return Err(CudaError::Unsupported(format!(
                    "GEMV width {max_cols} needs more shared memory than the GPU has"
                )));
            }
            gpu.set_max_dynamic_smem("gemv", smem)?;
            gpu.set_max_dynamic_smem("gemv_persistent", smem)?;
            gpu.set_max_dynamic_smem("gemv_pair", smem)?;
            gpu.set_max_dynamic_smem("gemv_u8", smem)?;
        }
        if opts.uses_tensor_cores() {
            let mma =
                gemv_mma_smem(max_cols, false, max_cols / 128).max(gemv_mma_smem(h, true, h / 128));
            if mma > gpu.max_smem_optin()? {
                return Err(CudaError::Unsupported(format!(
                    "GEMV width {max_cols} on tensor cores needs more shared memory than the GPU has"
                )));
            }
            if mma > 48 * 1024 - 256 {
                gpu.set_max_dynamic_smem("gemv_mma", mma)?;
                gpu.set_max_dynamic_smem("gemv_mma_u4", mma)?;
                gpu.set_max_dynamic_smem("gemv_mma_kw", mma)?;
                gpu.set_max_dynamic_smem("gemv_mma_kw_u4", mma)?;
                gpu.set_max_dynamic_smem("gemv_mma_a8", mma)?;
                gpu.set_max_dynamic_smem("gemv_mma_kw_a8", mma)?;
            }
            if opts.tensor_core_ring {
                let ring = gemv_mma_ring_smem(max_cols, false, max_cols / 128)
                    .max(gemv_mma_ring_smem(h, true, h / 128));
                if ring > gpu.max_smem_optin()? {
                    return Err(CudaError::Unsupported(format!(
                        "GEMV width {max_cols} with a weight ring needs more shared memory than the GPU has"
                    )));
                }
                gpu.set_max_dynamic_smem("gemv_mma_ring", ring)?;
            }
        }
        if opts.uses_int8_activations() && !opts.uses_tensor_cores() {
            let a8 = gemv_smem(max_cols, true, false).max(gemv_smem(h, true, true));
            if a8 > gpu.max_smem_optin()? {
                return Err(CudaError::Unsupported(format!(
                    "GEMV width {max_cols} with int8 activations needs more shared memory than the GPU has"
                )));
            }
            if a8 > 48 * 1024 - 256 {
                gpu.set_max_dynamic_smem("gemv_a8", a8)?;
            }
        }

        let info = RunnerInfo {
            vocab_size: spec.vocab,
            max_context: max_ctx,
            eos_token_ids: spec.eos_token_ids.clone(),
            backend: format!(
                "cuda:{} ({}{}{})",
                gpu.name,
                q.name(),
                if opts.streamed() {
                    ", streamed step"
                } else {
                    ""
                },
                if lm_head_int8.is_some() {
                    ", int8 output head"
                } else {
                    ""
                }
            ),
        };
        let mut r = CudaRunner {
            graph: None,
            plan: Vec::new(),
            prefill: None,
            scratch,
            layers,
            embed,
            lm_head,
            lm_head_int8,
            ple_table,
            ple_model,
            ple_norm,
            final_norm,
            info,
            quant: q,
            use_graph: opts.use_graph,
            persistent: opts.persistent_gemv,
            fuse_ple: opts.fuse_ple,
            tiled_gemv: if opts.gemv_unroll8 { "gemv_u8" } else { "gemv" },
            attn_prefetch: opts.attn_prefetch,
            attn_by_head_dim: opts.uses_head_dim_attention(),
            attn_warp_values: opts.attn_warp_values,
            attn_min_keys: opts.attn_min_keys,
            attn_tile_dims: Vec::new(),
            int8_act: opts.uses_int8_activations(),
            tc_gemv: opts.uses_tensor_cores(),
            tc_ring: opts.uses_tensor_cores() && opts.tensor_core_ring,
            tc_kwarps: opts.uses_tensor_cores()
                && opts.tensor_core_kwarps
                && !opts.tensor_core_ring,
            step_kernel: None,
            stream_debug: None,
            stream_timeline: None,
            step_profile: None,
            step_bufs: Vec::new(),
            gemv_occupancy: Default::default(),
            opts: opts.clone(),
            launch_plan_reason: None,
            probe_skip: Vec::new(),
            probe_marked: false,
            len: 0,
            dev_io: None,
            logits_host: vec![0.0; spec.vocab],
            model,
            gpu,
        };
        if opts.single_kernel {
            r.step_kernel = Some(r.step_config(max_cols)?);
        }
        if let Some(cfg) = stream_cfg {
            r.step_kernel = Some(cfg);
        }
        if opts.attn_smem_tile {
            // Each head dim whose K/V tile (2 x 32 rows) fits beside the static shared memory.
            let optin = r.gpu.max_smem_optin()?;
            let mut dims: Vec<usize> = r.model.spec.layers.iter().map(|l| l.head_dim).collect();
            dims.sort_unstable();
            dims.dedup();
            dims.retain(|&hd| attn_tile_smem(hd) + 8 * 1024 <= optin);
            if let Some(&big) = dims.last() {
                r.gpu
                    .set_max_dynamic_smem("attn_split_tile", attn_tile_smem(big))?;
            }
            r.attn_tile_dims = dims;
        }
        // The streamed step's K splits are its stream layout's, for the SMs it runs on.
        let plan_sm = match (&r.step_kernel, r.opts.streamed()) {
            (Some(k), true) => k.grid,
            _ => sm,
        };
        r.plan = r.build_plan(plan_sm)?;
        link_prefetches(
            &mut r.plan,
            opts.l2_prefetch,
            opts.l2_prefetch_own,
            PrefetchFrom::Every,
        );
        link_prefetches(
            &mut r.plan,
            opts.l2_prefetch_attn,
            false,
            PrefetchFrom::Attention,
        );
        if r.opts.streamed() {
            r.plan = vec![r.stream_launch(head8.as_ref())?];
        } else if r.step_kernel.is_some() {
            r.plan = vec![r.step_launch()?];
        }
        if opts.batched_prefill {
            r.prefill = Some(r.alloc_prefill(opts.precise_prefill)?);
        }
        gpu_sync(&r.gpu)?;
        Ok(r)
    }

    /// The options in effect ([`StreamedStep::Auto`] decided: `On` or `Off`).
    pub fn options(&self) -> &CudaOptions {
        &self.opts
    }

    /// Why [`StreamedStep::Auto`] kept the launch plan, in words (None where it was not asked
    /// for or the streamed step runs).
    pub fn launch_plan_reason(&self) -> Option<&str> {
        self.launch_plan_reason.as_deref()
    }

    /// A streamed-step timing probe is in effect (`HAYAI_STREAM_PROBE_SKIP`, `_NOWAIT` or
    /// `_NOPROLOGUE`): the steps' outputs are wrong by design, and with the wait left out not
    /// even repeatable.
    pub fn timing_probe(&self) -> bool {
        !self.probe_skip.is_empty() || self.probe_marked
    }

    pub fn quant(&self) -> Quant {
        self.quant
    }

    pub fn gpu_name(&self) -> &str {
        &self.gpu.name
    }

    /// Kernel launches per decode step.
    pub fn kernels_per_step(&self) -> usize {
        self.plan.len()
    }

    /// Bytes of projection weights streamed per decode step (the two gathered table rows
    /// excluded: they are a few KB), without those of the operations the timing probe leaves
    /// out (`HAYAI_STREAM_PROBE_SKIP`).
    pub fn weight_bytes_per_token(&self) -> usize {
        let head = self.lm_head_int8.as_ref().unwrap_or(&self.lm_head);
        // A matrix's bytes under its operation's label, none where the probe skips it.
        let streamed = |label: &str, mat: Option<&DevMat>| match mat {
            Some(mat) if !self.probe_skip.iter().any(|s| s == label) => mat.bytes,
            _ => 0,
        };
        let mut b = streamed("gemv.lm_head", Some(head))
            + streamed("gemv.ple_model", self.ple_model.as_ref());
        for l in &self.layers {
            b += streamed("gemv.qkv", Some(&l.qkv)) + streamed("gemv.o", Some(&l.o));
            b += streamed("gemv.gate_up", Some(&l.gateup)) + streamed("gemv.down", Some(&l.down));
            b += streamed("gemv.ple_gate", l.ple_gate.as_ref())
                + streamed("gemv.ple_proj", l.ple_proj.as_ref());
        }
        b
    }

    fn ensure_graph(&mut self) -> Result<(), CudaError> {
        if !self.use_graph || self.graph.is_some() {
            return Ok(());
        }
        self.graph = Some(capture_graph(&self.gpu, &self.plan)?);
        Ok(())
    }

    /// Run one decode step for `token` at position `self.len` (asynchronous).
    fn step(&mut self, token: u32) -> Result<(), CudaError> {
        if self.dev_io != Some((token, self.len)) {
            let io = [token as i32, self.len as i32];
            self.gpu.write(self.scratch.step_io.ptr(), &io)?;
        }
        self.launch_step()?;
        self.len += 1;
        self.dev_io = None;
        Ok(())
    }

    /// One step's launches (the graph, or the plan eagerly), inputs as `step_io` holds them.
    fn launch_step(&self) -> Result<(), CudaError> {
        match &self.graph {
            Some(g) => g.launch().map_err(drv)?,
            None => {
                for l in &self.plan {
                    l.run(&self.gpu)?;
                }
            }
        }
        Ok(())
    }

    /// `n` greedy steps from `token` with no host read between them: each step takes the token
    /// its predecessor's argmax left in `step_io`, and only the last one's comes back. The same
    /// tokens as `n` calls of `greedy_step`; the benchmark times it to show what the per-token
    /// read (and the host's turn around it) costs a step.
    pub(crate) fn greedy_chain(&mut self, token: u32, n: usize) -> Result<u32, ModelError> {
        hayai_model::runner::check_feed(&self.info, self.len + n.saturating_sub(1), &[token])?;
        self.gpu.bind()?;
        self.ensure_graph()?;
        self.step(token)?;
        for _ in 1..n {
            self.launch_step()?;
            self.len += 1;
        }
        let mut out = [0i32; 1];
        self.gpu.read(self.scratch.out_tok.ptr(), &mut out)?;
        let t = out[0] as u32;
        self.dev_io = Some((t, self.len));
        Ok(t)
    }

    /// Run the step's kernels one by one, timing each with events: (label, ms) in plan order.
    pub(crate) fn profile_step(
        &mut self,
        token: u32,
    ) -> Result<Vec<(&'static str, f32)>, CudaError> {
        use cudarc::driver::result::event;
        self.gpu.bind()?;
        hayai_model::runner::check_feed(&self.info, self.len, &[token])?;
        let io = [token as i32, self.len as i32];
        self.gpu.write(self.scratch.step_io.ptr(), &io)?;
        if let Some((launch, labels, timing)) = &self.step_profile {
            // One kernel: its operations timed inside it (block 0's start of each operation,
            // the last block's arrival at the barrier after it).
            // Slots per operation (kernels/step.cu STEP_STAMPS): 0 block 0 starts, 1-3 its
            // GEMV prologue (inputs gathered, residual pass, done), 5 the last block done,
            // 6-7 attention (block 0's first item: norms and RoPE done, tile done); the next
            // start minus slot 5 is the barrier.
            const S: usize = STEP_STAMPS;
            let n = labels.len();
            let dump = std::env::var("HAYAI_STREAM_TIMELINE").ok();
            let words = match (&dump, &self.stream_timeline) {
                (Some(_), Some(tl)) => tl.words,
                _ => S * n,
            };
            self.gpu.write(*timing, &vec![0u64; words])?;
            launch.run(&self.gpu)?;
            self.gpu.sync()?;
            let mut t = vec![0u64; words];
            self.gpu.read(*timing, &mut t)?;
            if let (Some(path), Some(tl)) = (&dump, &self.stream_timeline) {
                // Raw little-endian u64 stamps and their layout (scripts/stream_timeline.py).
                let bytes: Vec<u8> = t.iter().flat_map(|w| w.to_le_bytes()).collect();
                let io = |e: std::io::Error| CudaError::Unsupported(format!("{path}: {e}"));
                std::fs::write(path, bytes).map_err(io)?;
                std::fs::write(format!("{path}.json"), &tl.meta).map_err(io)?;
            }
            t.truncate(S * n);
            let ms = |a: u64, b: u64| b.saturating_sub(a) as f32 * 1e-6;
            let mut out = Vec::with_capacity(4 * n);
            for (k, label) in labels.iter().enumerate() {
                let o = &t[S * k..S * (k + 1)];
                if o[3] > o[0] {
                    out.push(("prologue: inputs", ms(o[0], o[1])));
                    out.push(("prologue: residual", ms(o[1], o[2])));
                    out.push(("prologue: norm", ms(o[2], o[3])));
                    out.push((*label, ms(o[3], o[5])));
                } else if o[1] > o[6] && o[7] > o[1] && o[6] > o[0] {
                    // The streamed step's attention (kernels/stream_step.cu `ssa_op`).
                    out.push(("attention: inputs", ms(o[0], o[6])));
                    if o[2] > o[6] {
                        out.push(("attention: scores+softmax", ms(o[6], o[2])));
                        out.push(("attention: p.V+rest", ms(o[2], o[1])));
                    } else {
                        // A warp per head (`SSA_WARP_HEAD`, the default) stamps no phase
                        // between scores and p.V.
                        out.push(("attention: items", ms(o[6], o[1])));
                    }
                    out.push(("attention: ranges barrier", ms(o[1], o[7])));
                    out.push(("attention: merge", ms(o[7], o[5])));
                } else if o[7] > o[6] && o[6] > o[0] {
                    out.push(("attention: norms+rope", ms(o[0], o[6])));
                    out.push(("attention: tile", ms(o[6], o[7])));
                    out.push(("attention: merge+rest", ms(o[7], o[5])));
                } else {
                    out.push((*label, ms(o[0], o[5])));
                }
                if k + 1 < n {
                    out.push(("barrier", ms(o[5], t[S * (k + 1)])));
                }
            }
            self.len += 1;
            self.dev_io = None;
            return Ok(out);
        }
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let evs: Vec<sys::CUevent> = (0..=self.plan.len())
            .map(|_| event::create(flags))
            .collect::<Result<_, _>>()
            .map_err(drv)?;
        let stream = self.gpu.stream.cu_stream();
        unsafe { event::record(evs[0], stream) }.map_err(drv)?;
        for (i, l) in self.plan.iter().enumerate() {
            l.run(&self.gpu)?;
            unsafe { event::record(evs[i + 1], stream) }.map_err(drv)?;
        }
        self.gpu.sync()?;
        let mut out = Vec::with_capacity(self.plan.len());
        for (i, l) in self.plan.iter().enumerate() {
            let ms = unsafe { event::elapsed(evs[i], evs[i + 1]) }.map_err(drv)?;
            out.push((l.label, ms));
        }
        for e in evs {
            unsafe {
                let _ = event::destroy(e);
            }
        }
        self.len += 1;
        self.dev_io = None;
        Ok(out)
    }

    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

fn gpu_sync(gpu: &Gpu) -> Result<(), CudaError> {
    gpu.sync()
}

impl Runner for CudaRunner {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            self.dev_io = None;
        }
    }

    fn forward(
        &mut self,
        tokens: &[u32],
        rows: Rows,
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        hayai_model::runner::check_feed(&self.info, self.len, tokens)?;
        self.gpu.bind()?;
        self.ensure_graph()?;
        let n = tokens.len();
        let mut first_step = 0;
        if self.prefill.is_some() && n >= 2 {
            if rows == Rows::All {
                return self.prefill(tokens, Some(sink));
            }
            // Every token but the last in batches; the last through the decode graph, which
            // leaves its logits (and argmax) where a decode step does.
            self.prefill(&tokens[..n - 1], None)?;
            first_step = n - 1;
        }
        for (i, &t) in tokens.iter().enumerate().skip(first_step) {
            self.step(t)?;
            if rows == Rows::All || i + 1 == n {
                let mut logits = std::mem::take(&mut self.logits_host);
                let r = self.gpu.read(self.scratch.logits.ptr(), &mut logits);
                self.logits_host = logits;
                r?;
                sink(i, &self.logits_host);
            }
        }
        Ok(())
    }

    fn greedy_step(&mut self, token: u32) -> Result<u32, ModelError> {
        hayai_model::runner::check_feed(&self.info, self.len, &[token])?;
        self.gpu.bind()?;
        self.ensure_graph()?;
        self.step(token)?;
        let mut out = [0i32; 1];
        self.gpu.read(self.scratch.out_tok.ptr(), &mut out)?;
        let t = out[0] as u32;
        self.dev_io = Some((t, self.len));
        Ok(t)
    }

    /// One step ahead of the host: step k + 1 (fed step k's argmax on the device) is queued
    /// before step k's token is read, so the GPU never waits for the host's turn between
    /// steps; the argmax stores each token into a mapped host slot by its position's parity,
    /// so no copy or event sits between them either. A step run ahead past a refusal is
    /// dropped (`len` not advanced by it).
    fn greedy_decode(
        &mut self,
        token: u32,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, ModelError> {
        if max == 0 {
            return Ok(0);
        }
        hayai_model::runner::check_feed(&self.info, self.len, &[token])?;
        self.gpu.bind()?;
        self.ensure_graph()?;
        // A step dropped by an earlier call may still be about to store into a slot.
        self.gpu.sync()?;
        let stream = self.gpu.stream.cu_stream();
        let slot = |len: usize| len % 2;
        self.scratch.tok_slots.clear(slot(self.len));
        self.step(token)?;
        let mut n = 0;
        loop {
            // Another step follows if `on_token` accepts this one; queue it now when it fits.
            // The slot it fills is step k - 1's, read in the last round.
            let more = n + 1 < max;
            let ahead = more && self.len < self.info.max_context;
            if ahead {
                self.scratch.tok_slots.clear(slot(self.len));
                self.launch_step()?;
                self.len += 1;
            }
            let k_pos = self.len - 1 - usize::from(ahead);
            let t = self.scratch.tok_slots.wait(slot(k_pos), stream)? as u32;
            n += 1;
            let go = on_token(t);
            if !(go && more) {
                if ahead {
                    // The step ahead fed t; it is not kept (step_io holds its argmax now).
                    self.len -= 1;
                    self.dev_io = None;
                } else {
                    self.dev_io = Some((t, self.len));
                }
                return Ok(n);
            }
            if !ahead {
                // Accepted, but the cache is full: what `greedy_step` would say.
                self.dev_io = Some((t, self.len));
                hayai_model::runner::check_feed(&self.info, self.len, &[t])?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_shapes() {
        use hayai_model::Arch;
        check_supported(&crate::synth::e4b_spec()).unwrap();
        check_supported(&crate::synth::small_spec(Arch::Gemma3)).unwrap();
        // The CPU tests' toy spec has 16-wide heads: refused with a clear error.
        let e = check_supported(&hayai_model::random::tiny_spec(Arch::Gemma4)).unwrap_err();
        assert!(e.to_string().contains("head dim"), "{e}");
    }

    #[test]
    fn param_structs_match_the_kernels() {
        assert_eq!(std::mem::size_of::<GemvParams>(), 184);
        assert_eq!(std::mem::offset_of!(GemvParams, kwarps), 148);
        assert_eq!(std::mem::offset_of!(GemvParams, pf), 152);
        assert_eq!(std::mem::size_of::<GemvPairParams>(), 376);
        assert_eq!(gemv_a8_smem(2560), 10240 + 2560 + 20 * 20);
        // 128 columns: 660 bytes of x and int8 x, padded to 672 before the constants.
        assert_eq!(gemv_smem(128, true, true), 672 + 3 * 512);
        assert_eq!(gemv_smem(2560, false, true), 4 * 10240);
        assert_eq!(gemv_smem(10240, false, false), 40960);
        assert_eq!(std::mem::size_of::<AttnParams>(), 184);
        assert_eq!(std::mem::size_of::<StepParams>(), 40);
        assert_eq!(std::mem::size_of::<StreamParams>(), 112);
        assert_eq!(std::mem::size_of::<crate::stream_layout::SmShare>(), 36);
        assert_eq!(std::mem::size_of::<ArgmaxParams>(), 64);
        assert_eq!(std::mem::size_of::<PleParams>(), 72);
    }

    #[test]
    fn step_splits_never_leave_a_split_empty_and_balance_the_warps() {
        for rows in [8, 256, 2560, 3072, 10_752, 20_480, 262_144] {
            for units in [1, 2, 16, 20, 80, 320] {
                for warps in [1, 640, 1056, 2112] {
                    let s = step_splits(rows, units, warps);
                    let per = units.div_ceil(s);
                    assert!((1..=MAX_SPLITS).contains(&s));
                    assert!((s - 1) * per < units, "rows {rows} units {units} split {s}");
                }
            }
        }
        // E4B gate/up (int4) on 1,056 warps: 2,560 octets of 20 groups; splitting must not
        // leave the busiest warp worse off than no split.
        let s = step_splits(20_480, 20, 1056);
        let busiest = |s: usize| (2560 * s).div_ceil(1056) * (20usize.div_ceil(s) + 2);
        assert!(busiest(s) <= busiest(1));
        // Few rows, many groups: split so every warp gets work.
        assert!(step_splits(2560, 80, 1056) > 1);
    }

    #[test]
    fn octet_layout_groups_eight_rows_per_16_bytes() {
        // 10 rows x 3 groups, value = 100 * row + group.
        let rows = 10;
        let groups = 3;
        let s: Vec<u16> = (0..rows * groups)
            .map(|i| (100 * (i / groups) + i % groups) as u16)
            .collect();
        let o = octet_layout(&s, rows, groups);
        assert_eq!(o.len(), 2 * groups * 8);
        for r in 0..rows {
            for g in 0..groups {
                assert_eq!(o[((r / 8) * groups + g) * 8 + r % 8], (100 * r + g) as u16);
            }
        }
        // Padding rows 10..16 are zero.
        for g in 0..groups {
            for r in 10..16 {
                assert_eq!(o[(groups + g) * 8 + r % 8], 0);
            }
        }
    }

    #[test]
    fn splits_fill_the_gpu_without_tiny_slices() {
        // E4B down projection, int4: 2560 rows, 80 groups.
        for w in [16, 32] {
            // 2560 rows: 320 warps of 8 rows.
            let s = splits_for(320, 80, 132, w);
            assert!((4..=16).contains(&s));
            // lm_head-like: plenty of rows, no split.
            assert_eq!(splits_for(262_144 / 8, 20, 132, w), 1);
            // Narrow input: never below 4 groups per slice.
            assert_eq!(splits_for(320, 2, 132, w), 1);
        }
    }
}
