//! Batched prefill: a prompt is processed in chunks of up to [`PREFILL_CHUNK`] tokens, the
//! projections as tensor-core GEMMs (kernels/prefill.cu), instead of one decode step per token.
//!
//! Data flow per chunk (n tokens at positions p0..p0+n): the residual stream `x` [n][hidden] is
//! f32; every GEMM input is written as bf16 into `xb` by the kernel before it (row norm, GeGLU,
//! attention); GEMM outputs land in `y` (f32). The K/V of the chunk are appended to the same
//! caches the decode step reads, so decoding continues where the prompt ends.
//!
//! The chunk size keeps sliding layers exact: a ring of `window + RING_SLACK` slots still holds
//! every key a chunk's queries need after the whole chunk has been appended. A chunk that ends
//! within the smallest ring writes no slot twice, so it may be longer (`chunk_len`): a prompt
//! that fits the ring is one chunk, whatever its length up to the buffers'.

use hayai_model::ModelError;

use super::shapes::attn_window;
use super::{CudaRunner, DevMat, RING_SLACK};
use crate::device::DevBuf;
use crate::CudaError;

/// Tokens per prefill chunk anywhere in the context.
pub const PREFILL_CHUNK: usize = 256;
const _: () = assert!(PREFILL_CHUNK <= RING_SLACK + 1);
/// Tokens per chunk at most, where the chunk ends within every ring (the buffers' rows).
pub const PREFILL_MAX_CHUNK: usize = 1024;
/// K parts a GEMM is cut into at most, and the fewest 32-column K tiles a part takes.
const MAX_GEMM_PARTS: usize = 4;
const MIN_PART_KTILES: usize = 8;

/// Parts a prefill GEMM's K is cut into: doubled while a row tile's `col_tiles` output tiles
/// leave some of the `sms` SMs idle, each part a run of at least [`MIN_PART_KTILES`] of its
/// `ktiles` (an even cut), at most `cap` (the parts buffer). The matrix alone decides, not the
/// chunk's rows: a row's sums are then the same however a prompt is cut into chunks. `force` (a
/// measurement's setting) replaces the doubling, the other limits kept.
fn gemm_parts(
    col_tiles: usize,
    ktiles: usize,
    sms: usize,
    cap: usize,
    force: Option<usize>,
) -> usize {
    let fits =
        |s: usize| s <= MAX_GEMM_PARTS.min(cap) && ktiles % s == 0 && ktiles / s >= MIN_PART_KTILES;
    let mut s = 1;
    while fits(2 * s) && force.map_or(col_tiles * s < sms, |f| 2 * s <= f) {
        s *= 2;
    }
    s
}

/// Where the wide GEMM (`pf_gemm_w`) runs instead of `pf_gemm`. Measured on
/// the H200 (E4B shapes, 272 tokens): bf16 weights 32.0 -> 27.2 ms a prefill all wide; int4
/// weights dequantized to bf16 rows first (`pf_dequant`, once a GEMM) 34.1 -> 28.3 (2,048
/// tokens: 218.4 -> 200.7); the 270M's shapes 3.5 -> 3.7 (60-80 blocks of 256 columns leave SMs
/// idle). So by default (`Filling`): GEMMs whose wide blocks fill the SMs, where two blocks fit
/// an SM's shared memory as on the H200 (an A10G's 100 KB holds one: unmeasured there, so
/// `Never`). `HAYAI_PREFILL_GEMM_WIDE=0|1`: never or always (measurements; always only where a
/// block fits at all, int4 weights in the kernel's own tiles where they are not dequantized).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WideGemm {
    Never,
    Filling,
    Always,
}

impl WideGemm {
    /// From the setting (`HAYAI_PREFILL_GEMM_WIDE`), a block's opt-in shared memory and an
    /// SM's.
    fn choose(setting: Option<i32>, optin: usize, per_sm: usize) -> WideGemm {
        let fits = gemm_w_smem(true) <= optin;
        let two_per_sm = 2 * (gemm_w_smem(false) + 1024) <= per_sm;
        match setting {
            _ if !fits => WideGemm::Never,
            Some(0) => WideGemm::Never,
            Some(1) => WideGemm::Always,
            _ if two_per_sm => WideGemm::Filling,
            _ => WideGemm::Never,
        }
    }

    /// Whether a GEMM of `blocks` wide blocks takes the wide kernel (an int4 one by default
    /// only with its rows dequantized first).
    fn takes(self, blocks: usize, sms: usize) -> bool {
        match self {
            WideGemm::Never => false,
            WideGemm::Filling => blocks >= sms,
            WideGemm::Always => true,
        }
    }
}

/// Dynamic shared memory of `pf_gemm_w`: A's and W's tiles (64 and 256 rows of 40 bf16) double
/// buffered, and A's remainders' in precise mode.
fn gemm_w_smem(precise: bool) -> usize {
    let a = 2 * 64 * 40 * 2;
    2 * 256 * 40 * 2 + a + if precise { a } else { 0 }
}

/// Tokens the next chunk takes at position `p0` with `left` to go: `base` anywhere, more while
/// `p0 + n` stays within the smallest KV ring (`min_cap`: no slot is written twice, so every
/// key stays where it is), up to `max`.
fn chunk_len(left: usize, p0: usize, base: usize, min_cap: usize, max: usize) -> usize {
    left.min(base.max(min_cap.saturating_sub(p0).min(max)))
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PfRowsParams {
    x: u64,
    tok: u64,
    table: u64,
    add: u64,
    add_w: u64,
    out: u64,
    out_lo: u64,
    norm_w: u64,
    cols: i32,
    add_ld: i32,
    add_parts: i32,
    part_stride: i32,
    table_scale: f32,
    scalar: f32,
    eps: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PfActParams {
    input: u64,
    mult: u64,
    out: u64,
    out_lo: u64,
    n: i32,
    cols: i32,
    glu: i32,
    mult_ld: i32,
    in_parts: i32,
    part_stride: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PfPleParams {
    tok: u64,
    table: u64,
    ctx: u64,
    norm_w: u64,
    out: u64,
    dim: i32,
    tok_scale: f32,
    ctx_scale: f32,
    mix_scale: f32,
    eps: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PfQkvParams {
    qkv: u64,
    q: u64,
    k_cache: u64,
    v_cache: u64,
    q_norm: u64,
    k_norm: u64,
    inv_freq: u64,
    ld: i32,
    p0: i32,
    nh: i32,
    nkv: i32,
    hd: i32,
    cap: i32,
    v_norm: i32,
    eps: f32,
    parts: i32,
    part_stride: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PfAttnParams {
    q: u64,
    k_cache: u64,
    v_cache: u64,
    out: u64,
    out_lo: u64,
    n: i32,
    p0: i32,
    nh: i32,
    nkv: i32,
    hd: i32,
    cap: i32,
    window: i32,
    scale: f32,
    softcap: f32,
    groups: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct PfDequantParams {
    w: u64,
    scales: u64,
    out: u64,
    n: i32,
    k: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PfGemmParams {
    a: u64,
    a_lo: u64,
    w: u64,
    scales: u64,
    c: u64,
    m: i32,
    n: i32,
    k: i32,
    ldc: i32,
    int4: i32,
    softcap: f32,
}

/// Device buffers of the prefill path, sized for one chunk.
pub(super) struct PrefillScratch {
    /// Tokens per chunk anywhere (and with every row's logits: `logits` holds that many rows).
    chunk: usize,
    /// Tokens per chunk at most (the other buffers' rows), and the smallest KV ring's slots.
    max_chunk: usize,
    min_cap: usize,
    tok: DevBuf,
    x: DevBuf,
    xb: DevBuf,
    /// Precise mode: the bf16 remainders of `xb` (see `CudaOptions::precise_prefill`).
    xb_lo: Option<DevBuf>,
    y: DevBuf,
    /// Floats a row of `y` holds (a K-split GEMM's parts lie in it, row-major each).
    y_cols: usize,
    q: DevBuf,
    ple_out: DevBuf,
    /// A measurement's setting of the GEMMs' K parts (`HAYAI_PREFILL_KSPLIT`: a positive
    /// integer; 1 keeps every GEMM in one part).
    ksplit_env: Option<usize>,
    /// Which GEMMs run as `pf_gemm_w` (64 x 256 block tiles, ldmatrix fragments, cp.async
    /// copies) instead of `pf_gemm` (64 x 128), bit-identical outputs: [`WideGemm`].
    gemm_wide: WideGemm,
    /// Wherever the wide GEMM runs (off with `HAYAI_PREFILL_INT4_DEQUANT=0`, a measurement's
    /// setting): bf16 rows for the int4 weights of a GEMM the wide kernel takes, dequantized
    /// once a GEMM by `pf_dequant`, and the elements they hold (the layers' largest int4
    /// matrix; a larger one, lm_head, keeps `pf_gemm`).
    dequant: Option<(DevBuf, usize)>,
    /// The attention's warp groups per layer ([`attn_groups`]; at most 1 with
    /// `HAYAI_PREFILL_ATTN_GROUPS=1`, a measurement's setting).
    attn_groups: Vec<usize>,
    /// [chunk][vocab] f32, allocated on the first request for every row's logits.
    logits: Option<DevBuf>,
    logits_host: Vec<f32>,
}

/// Receives (row index, logits) for every prompt row.
type RowSink<'a> = &'a mut dyn FnMut(usize, &[f32]);

/// Shared memory of one `pf_attention` warp group's tile: a K and a V tile of 16 positions, f32.
fn attn_smem(hd: usize) -> usize {
    2 * 16 * hd * 4
}

/// `pf_attention`'s warp groups at head dim `hd`: two (each walking every other key tile, which
/// halves the longest walk) where their tiles fit the shared memory a block may opt into, else
/// one (E4B's head dim 512 on an A10G's 99 KB). `cap` 1 keeps one everywhere.
fn attn_groups(hd: usize, optin: usize, cap: usize) -> usize {
    if cap >= 2 && 2 * attn_smem(hd) <= optin {
        2
    } else {
        1
    }
}

impl CudaRunner {
    /// The matrices the prefill's GEMMs take (lm_head aside): every layer's QKV, O, gate/up,
    /// down and per-layer-embedding gate and projection, and the PLE model projection.
    fn prefill_mats(&self) -> impl Iterator<Item = &DevMat> {
        self.layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.o, &l.gateup, &l.down])
            .chain(self.layers.iter().filter_map(|l| l.ple_gate.as_ref()))
            .chain(self.layers.iter().filter_map(|l| l.ple_proj.as_ref()))
            .chain(self.ple_model.as_ref())
    }

    pub(super) fn alloc_prefill(&self, precise: bool) -> Result<PrefillScratch, CudaError> {
        let spec = &self.model.spec;
        let chunk = PREFILL_CHUNK.min(self.info.max_context).max(1);
        let min_cap = self.layers.iter().map(|l| l.cap).min().unwrap_or(0);
        // Longer chunks only where a prompt can end within every ring (HAYAI_PREFILL_WHOLE=0:
        // never, the measurement's other side).
        let whole = std::env::var("HAYAI_PREFILL_WHOLE").as_deref() != Ok("0");
        let max_chunk = if whole {
            PREFILL_MAX_CHUNK.min(min_cap).max(chunk)
        } else {
            chunk
        };
        let rows = max_chunk;
        let h = spec.hidden;
        let max_q = spec.layers.iter().map(|l| l.q_dim()).max().unwrap_or(0);
        let max_im = spec
            .layers
            .iter()
            .map(|l| l.intermediate)
            .max()
            .unwrap_or(0);
        let max_hd = spec.layers.iter().map(|l| l.head_dim).max().unwrap_or(0);
        let ple_w = spec.ple.as_ref().map_or(0, |p| p.dim * spec.n_layers());
        let ple_d = spec.ple.as_ref().map_or(0, |p| p.dim);
        let max_rows = self.prefill_mats().map(|m| m.rows).max().unwrap_or(0);
        let xb_w = h.max(max_q).max(max_im).max(ple_d);
        let optin = self.gpu.max_smem_optin()?;
        let attn_groups_cap = match super::stream::env_i32("HAYAI_PREFILL_ATTN_GROUPS") {
            Some(1) => 1,
            _ => 2,
        };
        let groups: Vec<usize> = spec
            .layers
            .iter()
            .map(|l| attn_groups(l.head_dim, optin, attn_groups_cap))
            .collect();
        let smem = spec
            .layers
            .iter()
            .zip(&groups)
            .map(|(l, g)| g * attn_smem(l.head_dim))
            .max()
            .unwrap_or(0);
        if smem > 48 * 1024 {
            if smem > optin {
                return Err(CudaError::Unsupported(format!(
                    "prefill attention for head dim {max_hd} needs more shared memory than the GPU has"
                )));
            }
            self.gpu.set_max_dynamic_smem("pf_attention", smem)?;
        }
        let gemm_wide = WideGemm::choose(
            super::stream::env_i32("HAYAI_PREFILL_GEMM_WIDE"),
            optin,
            self.gpu.max_smem_per_sm()?,
        );
        if gemm_wide != WideGemm::Never {
            self.gpu
                .set_max_dynamic_smem("pf_gemm_w", gemm_w_smem(true))?;
        }
        let int4_elems = self
            .prefill_mats()
            .filter(|m| m.int4)
            .map(|m| m.rows * m.cols)
            .max()
            .unwrap_or(0);
        let dequant = if gemm_wide != WideGemm::Never
            && int4_elems > 0
            && super::stream::env_i32("HAYAI_PREFILL_INT4_DEQUANT") != Some(0)
        {
            Some((self.gpu.alloc(int4_elems * 2)?, int4_elems))
        } else {
            None
        };
        Ok(PrefillScratch {
            chunk,
            max_chunk,
            min_cap,
            tok: self.gpu.alloc(rows * 4)?,
            x: self.gpu.alloc(rows * h * 4)?,
            xb: self.gpu.alloc(rows * xb_w * 2)?,
            xb_lo: if precise {
                Some(self.gpu.alloc(rows * xb_w * 2)?)
            } else {
                None
            },
            y: self.gpu.alloc(rows * max_rows * 4)?,
            y_cols: max_rows,
            q: self.gpu.alloc(rows * max_q * 4)?,
            gemm_wide,
            dequant,
            ksplit_env: super::stream::env_i32("HAYAI_PREFILL_KSPLIT")
                .filter(|&n| n >= 1)
                .map(|n| n as usize),
            attn_groups: groups,
            ple_out: self.gpu.alloc(rows * ple_w.max(1) * 4)?,
            logits: None,
            logits_host: Vec::new(),
        })
    }

    /// Feed `tokens` at the current position through the batched path; when `sink` is given,
    /// hand it every position's logits (index relative to `tokens`).
    pub(super) fn prefill(
        &mut self,
        tokens: &[u32],
        mut sink: Option<RowSink<'_>>,
    ) -> Result<(), ModelError> {
        let (chunk, max_chunk, min_cap) = match &self.prefill {
            Some(p) => (p.chunk, p.max_chunk, p.min_cap),
            None => return Err(CudaError::Driver("batched prefill is off".into()).into()),
        };
        let vocab = self.model.spec.vocab;
        if sink.is_some() {
            let need = self.prefill.as_ref().is_some_and(|p| p.logits.is_none());
            if need {
                let buf = self.gpu.alloc(chunk * vocab * 4)?;
                let pf = self.prefill.as_mut().expect("checked above");
                pf.logits = Some(buf);
                pf.logits_host = vec![0.0; chunk * vocab];
            }
        }
        // Every row's logits: chunks of `chunk` rows (the logits buffer's).
        let max = if sink.is_some() { chunk } else { max_chunk };
        let mut done = 0;
        while done < tokens.len() {
            let n = chunk_len(tokens.len() - done, self.len, chunk, min_cap, max);
            let part = &tokens[done..done + n];
            self.prefill_chunk(part, sink.is_some())?;
            self.len += n;
            self.dev_io = None;
            if let Some(sink) = sink.as_mut() {
                let pf = self.prefill.as_mut().expect("checked above");
                let dev = pf.logits.as_ref().expect("allocated above").ptr();
                let host = &mut pf.logits_host[..n * vocab];
                self.gpu.read(dev, host)?;
                for (r, row) in host.chunks(vocab).enumerate() {
                    sink(done + r, row);
                }
            }
            done += n;
        }
        Ok(())
    }

    /// `c = a . m^T` for `n_tok` rows, in one part.
    fn gemm(
        &self,
        a: (u64, u64),
        m: &DevMat,
        c: u64,
        n_tok: usize,
        softcap: f32,
    ) -> Result<(), CudaError> {
        self.gemm_in_parts(a, m, c, n_tok, softcap, 1)
    }

    /// `c = a . m^T` whose reader sums K parts (a row kernel's `add`, pf_qkv, the PLE gate's
    /// activation): cut along K where a row tile's output tiles leave SMs idle
    /// ([`gemm_parts`]); returns the parts' count.
    fn gemm_summed(
        &self,
        a: (u64, u64),
        m: &DevMat,
        c: u64,
        n_tok: usize,
    ) -> Result<i32, CudaError> {
        let pf = self.prefill.as_ref().expect("prefill scratch");
        let cap = pf.y_cols / m.rows.max(1);
        let parts = gemm_parts(
            m.rows.div_ceil(128),
            m.cols / 32,
            self.gpu.sm_count.max(1) as usize,
            cap,
            pf.ksplit_env,
        );
        self.gemm_in_parts(a, m, c, n_tok, 0.0, parts)?;
        Ok(parts as i32)
    }

    fn gemm_in_parts(
        &self,
        (a, a_lo): (u64, u64),
        m: &DevMat,
        c: u64,
        n_tok: usize,
        softcap: f32,
        parts: usize,
    ) -> Result<(), CudaError> {
        let mut p = PfGemmParams {
            a,
            a_lo,
            w: m.w,
            scales: m.scales,
            c,
            m: n_tok as i32,
            n: m.rows as i32,
            k: m.cols as i32,
            ldc: m.rows as i32,
            int4: m.int4 as i32,
            softcap,
        };
        let m_tiles = n_tok.div_ceil(64);
        let sms = self.gpu.sm_count.max(1) as usize;
        let wide_blocks = m.rows.div_ceil(256) * m_tiles * parts;
        let pf = self.prefill.as_ref();
        let wide_form = pf.map_or(WideGemm::Never, |pf| pf.gemm_wide);
        let takes_wide = wide_form.takes(wide_blocks, sms);
        // int4 weights as bf16 rows for the wide kernel where they fit the buffer: the values
        // pf_gemm's int4 tiles hold, so the same sums.
        let dequant = pf.and_then(|pf| {
            pf.dequant
                .as_ref()
                .filter(|(_, cap)| takes_wide && m.int4 && m.rows * m.cols <= *cap)
        });
        if let Some((d, _)) = dequant {
            let dp = PfDequantParams {
                w: m.w,
                scales: m.scales,
                out: d.ptr(),
                n: m.rows as i32,
                k: m.cols as i32,
            };
            let words = m.rows * m.cols / 8;
            let blocks = words.div_ceil(256) as u32;
            self.gpu
                .launch(self.gpu.func("pf_dequant"), (blocks, 1, 1), 256, 0, &dp)?;
            p.w = d.ptr();
            p.scales = 0;
            p.int4 = 0;
        }
        // int4 weights in the wide kernel's own tiles only when asked (`Always`).
        let wide = takes_wide && (!m.int4 || dequant.is_some() || wide_form == WideGemm::Always);
        let (kernel, cols, smem) = if wide {
            ("pf_gemm_w", 256, gemm_w_smem(a_lo != 0))
        } else {
            ("pf_gemm", 128, 0)
        };
        let grid = (m.rows.div_ceil(cols) as u32, m_tiles as u32, parts as u32);
        self.gpu
            .launch(self.gpu.func(kernel), grid, 256, smem as u32, &p)
    }

    fn rows(&self, n: usize, p: PfRowsParams) -> Result<(), CudaError> {
        let h = self.model.spec.hidden;
        let p = PfRowsParams {
            out_lo: if p.out != 0 { self.xb_lo() } else { 0 },
            cols: h as i32,
            // Every added vector is hidden-wide; a K-split GEMM's parts lie n x hidden apart.
            part_stride: (n * h) as i32,
            eps: self.model.spec.rms_eps,
            scalar: if p.scalar == 0.0 { 1.0 } else { p.scalar },
            ..p
        };
        self.gpu
            .launch(self.gpu.func("pf_rows"), (n as u32, 1, 1), 256, 0, &p)
    }

    fn act(&self, n: usize, p: PfActParams) -> Result<(), CudaError> {
        let p = PfActParams {
            out_lo: self.xb_lo(),
            ..p
        };
        let total = n * p.cols as usize;
        let blocks = total.div_ceil(256).min(4096) as u32;
        self.gpu
            .launch(self.gpu.func("pf_act"), (blocks, 1, 1), 256, 0, &p)
    }

    /// The remainder buffer in precise mode, else 0.
    fn xb_lo(&self) -> u64 {
        self.prefill
            .as_ref()
            .and_then(|p| p.xb_lo.as_ref())
            .map_or(0, |b| b.ptr())
    }

    /// One chunk (at most `chunk_len` tokens) at position `self.len`; with `logits`, the
    /// final norm and lm_head (with the final softcap) for every row.
    fn prefill_chunk(&self, tokens: &[u32], logits: bool) -> Result<(), CudaError> {
        let spec = &self.model.spec;
        let pf = self.prefill.as_ref().expect("prefill scratch");
        let n = tokens.len();
        let p0 = self.len;
        let h = spec.hidden;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        self.gpu.write(pf.tok.ptr(), &ids)?;
        let (x, xb, y) = (pf.x.ptr(), pf.xb.ptr(), pf.y.ptr());
        // The GEMM input: bf16 values and, in precise mode, their remainders.
        let a = (xb, self.xb_lo());

        // Token embeddings (and, with per-layer embeddings, their combination per layer).
        let ple = match (&self.ple_model, &self.ple_table, &self.ple_norm, &spec.ple) {
            (Some(pm), Some(table), Some(pn), Some(ps)) => Some((pm, table, pn, ps)),
            _ => None,
        };
        self.rows(
            n,
            PfRowsParams {
                x,
                tok: pf.tok.ptr(),
                table: self.embed.ptr(),
                table_scale: spec.embed_scale,
                out: if ple.is_some() { xb } else { 0 },
                ..Default::default()
            },
        )?;
        if let Some((pm, table, pn, ps)) = ple {
            self.gemm(a, pm, y, n, 0.0)?;
            let p = PfPleParams {
                tok: pf.tok.ptr(),
                table: table.ptr(),
                ctx: y,
                norm_w: pn.ptr(),
                out: pf.ple_out.ptr(),
                dim: ps.dim as i32,
                tok_scale: (ps.dim as f32).sqrt(),
                ctx_scale: (h as f32).powf(-0.5),
                mix_scale: std::f32::consts::FRAC_1_SQRT_2,
                eps: spec.rms_eps,
            };
            self.gpu.launch(
                self.gpu.func("pf_ple"),
                (n as u32, spec.n_layers() as u32, 1),
                ps.dim as u32,
                0,
                &p,
            )?;
        }

        // The branch output still to be added to the residual: (vector, its K parts, norm
        // weight, scalar).
        let mut pending: Option<(u64, i32, u64, f32)> = None;
        for (i, (ls, dl)) in spec.layers.iter().zip(&self.layers).enumerate() {
            let (add, add_parts, add_w, scalar) = pending.unwrap_or((0, 1, 0, 1.0));
            self.rows(
                n,
                PfRowsParams {
                    x,
                    add,
                    add_parts,
                    add_w,
                    add_ld: h as i32,
                    scalar,
                    norm_w: dl.attn_norm.ptr(),
                    out: xb,
                    ..Default::default()
                },
            )?;
            // QKV cut along K too (its 80-120 blocks on E4B leave SMs idle), the parts summed
            // by pf_qkv.
            let qkv_parts = self.gemm_summed(a, &dl.qkv, y, n)?;

            let src = &self.layers[ls.kv_source];
            let (kc, vc) = self.kv_caches(i, ls.kv_source)?;
            let own = ls.owns_kv(i);
            let qp = PfQkvParams {
                qkv: y,
                q: pf.q.ptr(),
                k_cache: kc,
                v_cache: vc,
                q_norm: dl.q_norm.ptr(),
                k_norm: dl.k_norm.as_ref().map_or(0, |b| b.ptr()),
                inv_freq: dl.inv_freq.ptr(),
                ld: dl.qkv.rows as i32,
                p0: p0 as i32,
                nh: ls.n_heads as i32,
                nkv: ls.n_kv_heads as i32,
                hd: ls.head_dim as i32,
                cap: src.cap as i32,
                v_norm: spec.v_norm as i32,
                eps: spec.rms_eps,
                parts: qkv_parts,
                part_stride: (n * dl.qkv.rows) as i32,
            };
            let heads = ls.n_heads + if own { 2 * ls.n_kv_heads } else { 0 };
            self.gpu.launch(
                self.gpu.func("pf_qkv"),
                (n as u32, heads as u32, 1),
                128,
                0,
                &qp,
            )?;
            let groups = pf.attn_groups[i];
            let ap = PfAttnParams {
                q: pf.q.ptr(),
                k_cache: kc,
                v_cache: vc,
                out: xb,
                out_lo: self.xb_lo(),
                n: n as i32,
                p0: p0 as i32,
                nh: ls.n_heads as i32,
                nkv: ls.n_kv_heads as i32,
                hd: ls.head_dim as i32,
                cap: src.cap as i32,
                window: attn_window(spec, ls),
                scale: spec.attn_scale,
                softcap: spec.attn_softcap.unwrap_or(0.0),
                groups: groups as i32,
            };
            self.gpu.launch(
                self.gpu.func("pf_attention"),
                (n.div_ceil(16) as u32, ls.n_heads as u32, 1),
                256 * groups as u32,
                (groups * attn_smem(ls.head_dim)) as u32,
                &ap,
            )?;
            let o_parts = self.gemm_summed(a, &dl.o, y, n)?;
            self.rows(
                n,
                PfRowsParams {
                    x,
                    add: y,
                    add_parts: o_parts,
                    add_w: dl.post_attn.ptr(),
                    add_ld: h as i32,
                    norm_w: dl.pre_ffn.ptr(),
                    out: xb,
                    ..Default::default()
                },
            )?;
            self.gemm(a, &dl.gateup, y, n, 0.0)?;
            self.act(
                n,
                PfActParams {
                    input: y,
                    out: xb,
                    n: n as i32,
                    cols: (dl.gateup.rows / 2) as i32,
                    glu: 1,
                    ..Default::default()
                },
            )?;
            let down_parts = self.gemm_summed(a, &dl.down, y, n)?;
            let scalar = self.model.weights.layers[i].layer_scalar;
            match (&dl.ple_gate, &dl.ple_proj, &dl.ple_post, &spec.ple) {
                (Some(pg), Some(pp), Some(post), Some(ps)) => {
                    self.rows(
                        n,
                        PfRowsParams {
                            x,
                            add: y,
                            add_parts: down_parts,
                            add_w: dl.post_ffn.ptr(),
                            add_ld: h as i32,
                            out: xb,
                            ..Default::default()
                        },
                    )?;
                    // The gate (256 rows: two output tiles a row tile; 10 blocks on E4B) cut
                    // along K too, its parts summed by the activation.
                    let gate_parts = self.gemm_summed(a, pg, y, n)?;
                    self.act(
                        n,
                        PfActParams {
                            input: y,
                            mult: pf.ple_out.at::<f32>(i * ps.dim),
                            out: xb,
                            n: n as i32,
                            cols: ps.dim as i32,
                            glu: 0,
                            mult_ld: (ps.dim * spec.n_layers()) as i32,
                            out_lo: 0,
                            in_parts: gate_parts,
                            part_stride: (n * ps.dim) as i32,
                        },
                    )?;
                    let parts = self.gemm_summed(a, pp, y, n)?;
                    pending = Some((y, parts, post.ptr(), scalar));
                }
                _ => pending = Some((y, down_parts, dl.post_ffn.ptr(), scalar)),
            }
        }
        if logits {
            let (add, add_parts, add_w, scalar) = pending.expect("at least one layer");
            self.rows(
                n,
                PfRowsParams {
                    x,
                    add,
                    add_parts,
                    add_w,
                    add_ld: h as i32,
                    scalar,
                    norm_w: self.final_norm.ptr(),
                    out: xb,
                    ..Default::default()
                },
            )?;
            let out = pf.logits.as_ref().expect("logits buffer").ptr();
            self.gemm(a, &self.lm_head, out, n, spec.final_softcap.unwrap_or(0.0))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_grow_only_where_no_ring_slot_is_written_twice() {
        // A 768-slot ring (window 512 + RING_SLACK): a 271-token prompt is one chunk, up to
        // the ring's 768 tokens, no further than the buffers.
        assert_eq!(chunk_len(271, 0, 256, 768, 1024), 271);
        assert_eq!(chunk_len(2000, 0, 256, 768, 1024), 768);
        assert_eq!(chunk_len(2000, 0, 256, 768, 512), 512);
        // From position 700, 68 more tokens end within the ring; beyond it, 256 (each key a
        // chunk's queries need is still in a ring of window + RING_SLACK slots).
        assert_eq!(chunk_len(100, 700, 256, 768, 1024), 100);
        assert_eq!(chunk_len(300, 700, 256, 768, 1024), 256);
        assert_eq!(chunk_len(300, 768, 256, 768, 1024), 256);
        assert_eq!(chunk_len(10, 5000, 256, 768, 1024), 10);
        // Every row's logits (max = base), or a context shorter than a chunk.
        assert_eq!(chunk_len(271, 0, 256, 768, 256), 256);
        assert_eq!(chunk_len(100, 0, 64, 64, 1024), 64);
    }

    #[test]
    fn gemm_parts_fill_idle_sms_with_even_runs_of_k() {
        // The 270M's O (640 rows: 5 output tiles a row tile) on 132 SMs, K 1,024 (32 tiles):
        // four parts; E4B's down (2,560 rows: 20 tiles, K 10,240): four too.
        assert_eq!(gemm_parts(5, 32, 132, 6, None), 4);
        assert_eq!(gemm_parts(20, 320, 132, 4, None), 4);
        // E4B's PLE gate (256 rows, K 2,560): two output tiles a row tile, four parts.
        assert_eq!(gemm_parts(2, 80, 132, 4, None), 4);
        // Enough tiles already, or K too short for parts of 8 tiles, or no even cut beyond two.
        assert_eq!(gemm_parts(80, 64, 132, 4, None), 2);
        assert_eq!(gemm_parts(140, 320, 132, 4, None), 1);
        assert_eq!(gemm_parts(2, 12, 132, 4, None), 1);
        assert_eq!(gemm_parts(2, 18, 132, 4, None), 2);
        // The parts buffer and the measurement's setting.
        assert_eq!(gemm_parts(5, 32, 132, 3, None), 2);
        assert_eq!(gemm_parts(5, 32, 132, 6, Some(1)), 1);
        assert_eq!(gemm_parts(5, 32, 132, 6, Some(2)), 2);
        assert_eq!(gemm_parts(140, 64, 132, 6, Some(4)), 4);
    }

    #[test]
    fn the_wide_gemm_takes_gemms_whose_blocks_fill_the_sms() {
        let f = WideGemm::Filling;
        // E4B, 272 tokens (5 row tiles), 132 SMs: gate/up (20,480 rows: 80 x 5 blocks) and
        // O/down in four K parts (10 x 5 x 4) wide (int4 ones as dequantized rows).
        assert!(f.takes(80 * 5, 132));
        assert!(f.takes(10 * 5 * 4, 132));
        // The 270M's gate/up (4,096 rows: 16 x 5) and its PLE-less O/down (3 x 5 x 4): narrow.
        assert!(!f.takes(16 * 5, 132));
        assert!(!f.takes(3 * 5 * 4, 132));
        assert!(WideGemm::Always.takes(1, 132));
        // The H200 (227 KB a block, 228 an SM) by default; an A10G (99 / 100 KB: one block an
        // SM) only when asked; a GPU whose block cannot hold it never.
        assert_eq!(WideGemm::choose(None, 227 << 10, 228 << 10), f);
        assert_eq!(WideGemm::choose(None, 99 << 10, 100 << 10), WideGemm::Never);
        assert_eq!(
            WideGemm::choose(Some(1), 99 << 10, 100 << 10),
            WideGemm::Always
        );
        assert_eq!(
            WideGemm::choose(Some(0), 227 << 10, 228 << 10),
            WideGemm::Never
        );
        assert_eq!(
            WideGemm::choose(Some(1), 48 << 10, 64 << 10),
            WideGemm::Never
        );
        assert!(!WideGemm::Never.takes(1000, 132));
    }

    #[test]
    fn attention_walks_in_two_groups_where_their_tiles_fit() {
        // The H200 (227 KB a block): two groups at head dims 256 and 512; an A10G (99 KB): two
        // at 256 (64 KB), one at 512 (two would be 128 KB); the measurement's cap keeps one.
        assert_eq!(attn_groups(256, 227 * 1024, 2), 2);
        assert_eq!(attn_groups(512, 227 * 1024, 2), 2);
        assert_eq!(attn_groups(256, 99 * 1024, 2), 2);
        assert_eq!(attn_groups(512, 99 * 1024, 2), 1);
        assert_eq!(attn_groups(256, 227 * 1024, 1), 1);
    }

    #[test]
    fn param_structs_match_the_kernels() {
        // Sizes of the C structs in kernels/prefill.cu (pointers 8 bytes, ints and floats 4).
        assert_eq!(std::mem::size_of::<PfRowsParams>(), 96);
        assert_eq!(std::mem::size_of::<PfActParams>(), 56);
        assert_eq!(std::mem::size_of::<PfPleParams>(), 64);
        assert_eq!(std::mem::size_of::<PfQkvParams>(), 96);
        assert_eq!(std::mem::size_of::<PfAttnParams>(), 80);
        assert_eq!(std::mem::size_of::<PfGemmParams>(), 64);
        assert_eq!(std::mem::size_of::<PfDequantParams>(), 32);
    }
}
