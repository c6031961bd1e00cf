//! Per-SM weight streams for the streamed decode step (docs/streamed-step.md).
//!
//! Every GEMV of the step is cut into units (a 16-row tile's K slice), the units dealt out to the
//! SMs in contiguous ranges (over all SMs, or over those the GEMV before it leaves without units
//! when it follows that one directly and can: [`StreamOp::after_prev`]), and each SM's cells
//! written one after another in exactly the order its consumer warps take them, so that one
//! producer warp per SM can stream them with bulk copies. The engine's loader builds it from its
//! own weights (`step_streams`) for the streamed step's kernel (kernels/stream_step.cu; its
//! standalone prototype is `proto/stream_step.cu`). [`walk`] computes a GEMV back from the streams
//! through the device's position formula and fragment order, which is what the tests hold the
//! layout to. [`Streams::sm_shares`] gives each SM its share of every operation (units, input
//! slices, first pass, first cell) so the kernel need not work them out per operation; [`walk`]
//! reads through those shares.

use crate::quant::{Int4Matrix, Int8Matrix, GROUP};
use rayon::prelude::*;

/// Rows per cell (one `mma` tile).
pub const CELL_ROWS: usize = 16;
/// An SM's stream starts on a multiple of this many cells: 128-byte aligned for both formats
/// (bulk copies from unaligned sources stream ~20% slower, proto/stream_rate.cu).
pub const ALIGN_CELLS: usize = 8;
/// Cells per ring chunk of the streamed step (kernels/stream_step.cu `SS_CH`): the producer
/// copies a chunk's int8 scales with its cells.
pub const CHUNK_CELLS: usize = 16;
/// Scale bytes per int8 cell in [`Streams::scale_bytes`]: 8 entries of 16 bytes, entry g the f16
/// scales of the cell's 4 column blocks for row g, then for row g + 8 (lane (g, c)'s 16 bytes).
pub const SCALE_CELL_BYTES: usize = 128;

/// How a cell stores its 16 rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellFormat {
    /// 16 x 128 int4 in the integer `mma.m16n8k32` fragment order (1,024 bytes), then the 16
    /// rows' bf16 group scales.
    Int4,
    /// 16 x 64 bf16 in the `mma.m16n8k16` A-fragment order.
    Bf16,
    /// 16 x 128 int8 (2,048 bytes, a bf16 cell's size, so both kinds share a ring): lane
    /// (g, c) loads 16 bytes at [t * 32 + lane], t = 0..3, word j of which holds columns
    /// 32 t + 16 (j / 2) + 4 c .. + 3 of row g + 8 (j % 2); column block t of the cell is one
    /// block of 32 of the matrix's f16 scales, which go in a stream of their own beside the
    /// cells ([`Streams::scale_bytes`], [`SCALE_CELL_BYTES`] a cell: what lane (g, c) needs of
    /// a cell is one 16-byte load). A quarter warp's x reads (4 c floats apart) stay
    /// conflict-free in this order.
    Int8,
}

impl CellFormat {
    pub fn bytes(self) -> usize {
        match self {
            CellFormat::Int4 => 1056,
            CellFormat::Bf16 | CellFormat::Int8 => 2048,
        }
    }
    /// Columns per cell.
    pub fn cols(self) -> usize {
        match self {
            CellFormat::Int4 => GROUP,
            CellFormat::Bf16 => 64,
            CellFormat::Int8 => 128,
        }
    }
}

/// A GEMV's weights as the GPU holds them.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    Int4(&'a Int4Matrix),
    /// Row-major bf16 bits.
    Bf16 {
        rows: usize,
        cols: usize,
        bits: &'a [u16],
    },
    /// int8 with f16 scales per 32 columns ([`CellFormat::Int8`]; in a bf16 stream).
    Int8(&'a Int8Matrix),
}

impl Weights<'_> {
    fn shape(&self) -> (usize, usize) {
        match self {
            Weights::Int4(m) => (m.rows, m.cols),
            Weights::Bf16 { rows, cols, .. } => (*rows, *cols),
            Weights::Int8(m) => (m.rows, m.cols),
        }
    }
    fn format(&self) -> CellFormat {
        match self {
            Weights::Int4(_) => CellFormat::Int4,
            Weights::Bf16 { .. } => CellFormat::Bf16,
            Weights::Int8(_) => CellFormat::Int8,
        }
    }
}

/// One GEMV of the chain: its weights and whether its rows must stay whole along K (interleaved
/// (gate, up) pairs: the GeGLU needs full sums; lm_head: the argmax reads one logit vector).
#[derive(Clone, Copy, Debug)]
pub struct StreamOp<'a> {
    pub weights: Weights<'a>,
    pub whole: bool,
    /// It runs right after the previous GEMV, with no operation between: its units go to the SMs
    /// the previous one leaves without units where that costs no SM a longer pass ([`build`]).
    pub after_prev: bool,
    /// At most this many K splits (0: as [`k_splits`] chooses).
    pub max_splits: usize,
}

/// How one GEMV is cut and dealt out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpPlan {
    pub rows: usize,
    /// The input's length (K).
    pub k: usize,
    pub format: CellFormat,
    /// Cells per tile (K / cell columns).
    pub groups: usize,
    /// K slices per tile; unit `u` is slice `u / tiles` of tile `u % tiles` (slice-major, so an
    /// SM's few units of an operation share one or two slices).
    pub splits: usize,
    /// The SMs its units are dealt over, ascending (empty: all of them).
    pub sms: Vec<usize>,
}

impl OpPlan {
    /// Row tiles (the units before K splits).
    pub fn tiles(&self) -> usize {
        self.rows / CELL_ROWS
    }
    pub fn units(&self) -> usize {
        self.tiles() * self.splits
    }
    /// Cells per unit.
    pub fn unit_groups(&self) -> usize {
        self.groups / self.splits
    }
    /// SM `s`'s units: `[first, first + count)` (in order over `sms`; an SM outside them has
    /// none, its `first` where the next one's begins).
    pub fn sm_units(&self, n_sm: usize, s: usize) -> (usize, usize) {
        let u = self.units();
        if self.sms.is_empty() {
            let first = u * s / n_sm;
            return (first, u * (s + 1) / n_sm - first);
        }
        let m = self.sms.len();
        match self.sms.binary_search(&s) {
            Ok(r) => {
                let first = u * r / m;
                (first, u * (r + 1) / m - first)
            }
            Err(r) => (u * r / m, 0),
        }
    }
    /// The most rounds (cells a warp takes in turn) of any SM's first pass, and whether some SM
    /// needs a second pass.
    fn longest_pass(&self, n_sm: usize, warps: usize) -> (usize, bool) {
        let gu = self.unit_groups();
        (0..n_sm).fold((0, false), |(r, two), s| {
            let nt = self.sm_units(n_sm, s).1;
            if nt == 0 {
                return (r, two);
            }
            (r.max(pass_of(nt, 0, gu, warps).rounds), two || nt > warps)
        })
    }
}

/// The K splits of a GEMV: the smallest of 1-4 whose largest per-SM share of cells is within 2%
/// of the best (GeGLU rows: 1). Whole tiles leave some SMs up to 1.65x the average (E4B's down
/// projection: 160 tiles on 132 SMs), and every operation waits for its slowest SM.
pub fn k_splits(rows: usize, groups: usize, whole: bool, n_sm: usize) -> usize {
    k_splits_capped(rows, groups, whole, n_sm, 0)
}

/// [`k_splits`] among at most `max` splits (0: up to 4). A GEMV's consumers read each of its
/// splits' partial vectors, which the largest share does not weigh.
pub fn k_splits_capped(rows: usize, groups: usize, whole: bool, n_sm: usize, max: usize) -> usize {
    let tiles = rows / CELL_ROWS;
    let mut best: Option<(usize, usize)> = None; // (largest share, splits)
    for s in 1..=4 {
        if groups % s != 0 || (whole && s > 1) || (max > 0 && s > max) {
            continue;
        }
        let share = (tiles * s).div_ceil(n_sm) * (groups / s);
        match best {
            Some((b, _)) if share * 100 >= b * 98 => {}
            _ => best = Some((share, s)),
        }
    }
    best.map_or(1, |(_, s)| s)
}

/// A pass of an SM's units: `np` units taken together, `kw` warps per unit (`kw > 1` only when
/// the SM has fewer units left than warps), each warp taking groups `r kw + slice` in round `r`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pass {
    np: usize,
    kw: usize,
    rounds: usize,
}

fn pass_of(nt: usize, p: usize, groups: usize, warps: usize) -> Pass {
    let np = (nt - p * warps).min(warps);
    let kw = warps / np;
    Pass {
        np,
        kw,
        rounds: groups.div_ceil(kw),
    }
}

/// The whole step's streams.
#[derive(Clone, Debug)]
pub struct Streams {
    pub format: CellFormat,
    pub n_sm: usize,
    /// Consumer warps per SM the order was made for.
    pub warps: usize,
    pub ops: Vec<OpPlan>,
    /// All SMs' cells; SM `s`'s stream starts at cell `sm_base[s]` (`n_sm + 1` entries; padding
    /// cells between streams are zero).
    pub bytes: Vec<u8>,
    pub sm_base: Vec<usize>,
    /// The int8 cells' scales ([`SCALE_CELL_BYTES`] a cell), per SM from the first chunk
    /// ([`CHUNK_CELLS`]) that holds an int8 cell to the end of its stream (so a chunk's scales
    /// are one copy; cells of other formats in those chunks get zeros). Empty without int8 cells.
    pub scale_bytes: Vec<u8>,
    /// Per SM: the first chunk with scales (`u32::MAX`: none) and where its scales start in
    /// `scale_bytes` (in 16-byte units).
    pub sc_from: Vec<u32>,
    pub sc_base: Vec<u64>,
}

/// Builds every SM's stream for `ops` (one cell format for all of them) on `n_sm` SMs with
/// `warps` consumer warps each.
pub fn build(ops: &[StreamOp], n_sm: usize, warps: usize) -> Result<Streams, String> {
    let first = ops.first().ok_or("no operations")?;
    let format = first.weights.format();
    if n_sm == 0 || warps == 0 {
        return Err("no SMs or no warps".into());
    }
    let mut plans: Vec<OpPlan> = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let (rows, cols) = op.weights.shape();
        let f = op.weights.format();
        // int8 cells share the bf16 cells' ring (the same size).
        if f != format && !(f == CellFormat::Int8 && format == CellFormat::Bf16) {
            return Err(format!(
                "operation {i}: every operation needs the same cell format"
            ));
        }
        let mut plan = {
            if rows == 0 || rows % CELL_ROWS != 0 || cols == 0 || cols % f.cols() != 0 {
                return Err(format!(
                    "operation {i}: {rows} x {cols} is not whole {CELL_ROWS} x {} cells",
                    f.cols()
                ));
            }
            let groups = cols / f.cols();
            OpPlan {
                rows,
                k: cols,
                format: f,
                groups,
                splits: k_splits_capped(rows, groups, op.whole, n_sm, op.max_splits),
                sms: Vec::new(),
            }
        };
        if let (true, Some(prev)) = (op.after_prev, plans.last()) {
            plan.sms = away_from(prev, &plan, n_sm, warps);
        }
        plans.push(plan);
    }
    // Each SM's cells in order, then the SMs' streams encoded in parallel (each its own slice,
    // padded to whole ALIGN_CELLS; encoding E4B's int4 streams cell by cell on one core took
    // seconds a load).
    let cell = format.bytes();
    let orders: Vec<Vec<(usize, usize, usize)>> = (0..n_sm)
        .into_par_iter()
        .map(|s| {
            plans
                .iter()
                .enumerate()
                .flat_map(|(o, plan)| {
                    sm_order(plan, n_sm, warps, s)
                        .into_iter()
                        .map(move |(tile, group)| (o, tile, group))
                })
                .collect()
        })
        .collect();
    let mut sm_base = Vec::with_capacity(n_sm + 1);
    let mut total = 0;
    for o in &orders {
        sm_base.push(total);
        total += o.len().next_multiple_of(ALIGN_CELLS);
    }
    sm_base.push(total);
    let mut bytes = vec![0u8; total * cell];
    let mut slices = Vec::with_capacity(n_sm);
    let mut rest = &mut bytes[..];
    for o in &orders {
        let (mine, tail) = rest.split_at_mut(o.len().next_multiple_of(ALIGN_CELLS) * cell);
        slices.push(mine);
        rest = tail;
    }
    slices
        .into_par_iter()
        .zip(&orders)
        .for_each(|(out, order)| {
            for (c, &(o, tile, group)) in order.iter().enumerate() {
                encode_cell(
                    &ops[o].weights,
                    tile,
                    group,
                    &mut out[c * cell..(c + 1) * cell],
                );
            }
        });
    let (scale_bytes, sc_from, sc_base) = scale_stream(ops, &orders);
    Ok(Streams {
        format,
        n_sm,
        warps,
        ops: plans,
        bytes,
        sm_base,
        scale_bytes,
        sc_from,
        sc_base,
    })
}

/// The int8 cells' scale stream of [`Streams::scale_bytes`] from each SM's cell order (operation,
/// tile, group), with each SM's first chunk holding scales and its offset in 16-byte units.
fn scale_stream(
    ops: &[StreamOp],
    orders: &[Vec<(usize, usize, usize)>],
) -> (Vec<u8>, Vec<u32>, Vec<u64>) {
    let is_int8 = |o: usize| matches!(ops[o].weights, Weights::Int8(_));
    let mut bytes = Vec::new();
    let (mut from, mut base) = (Vec::new(), Vec::new());
    for order in orders {
        let Some(first) = order.iter().position(|&(o, _, _)| is_int8(o)) else {
            from.push(u32::MAX);
            base.push(0);
            continue;
        };
        let c0 = first / CHUNK_CELLS;
        from.push(c0 as u32);
        base.push((bytes.len() / 16) as u64);
        for &(o, tile, group) in &order[c0 * CHUNK_CELLS..] {
            let mut cell = [0u8; SCALE_CELL_BYTES];
            if let Weights::Int8(m) = ops[o].weights {
                let blocks = m.cols / 32;
                for g in 0..8 {
                    for (half, rr) in [g, g + 8].into_iter().enumerate() {
                        let row = tile * CELL_ROWS + rr;
                        for t in 0..4 {
                            let v = m.scales[row * blocks + group * 4 + t];
                            let at = g * 16 + half * 8 + t * 2;
                            cell[at..at + 2].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
            bytes.extend_from_slice(&cell);
        }
    }
    (bytes, from, base)
}

/// The SMs `prev` leaves without units, if dealing `plan` over them alone costs no SM a second
/// pass or a longer one than over all SMs; else none (all SMs). The SMs that publish an operation
/// last are the last ready for the next: from the end of their work they pay the release's fence
/// (~0.7 us), then the poll, and a small GEMV after a partial one (the PLE projection after its
/// gate: 64 of 132 SMs on E4B) waited ~1.8 us for them (docs/performance.md, twenty-fourth
/// session). Which SM multiplies a unit changes no sum: the K slices are added in slice order.
fn away_from(prev: &OpPlan, plan: &OpPlan, n_sm: usize, warps: usize) -> Vec<usize> {
    let idle: Vec<usize> = (0..n_sm)
        .filter(|&s| prev.sm_units(n_sm, s).1 == 0)
        .collect();
    if idle.is_empty() || idle.len() == n_sm {
        return Vec::new();
    }
    let (r_all, _) = plan.longest_pass(n_sm, warps);
    let away = OpPlan {
        sms: idle,
        ..plan.clone()
    };
    match away.longest_pass(n_sm, warps) {
        (r, false) if r <= r_all => away.sms,
        _ => Vec::new(),
    }
}

/// SM `s`'s cells of one operation as (tile, group within the row) in the order its warps take
/// them: passes of up to `warps` units, rounds, units, warp slices.
fn sm_order(plan: &OpPlan, n_sm: usize, warps: usize, s: usize) -> Vec<(usize, usize)> {
    let (u0, nt) = plan.sm_units(n_sm, s);
    let gu = plan.unit_groups();
    let mut out = Vec::with_capacity(nt * gu);
    let mut p = 0;
    while p * warps < nt {
        let q = pass_of(nt, p, gu, warps);
        for r in 0..q.rounds {
            for ti in 0..q.np {
                for sl in 0..q.kw {
                    let g = r * q.kw + sl;
                    if g < gu {
                        let u = u0 + p * warps + ti;
                        out.push((u % plan.tiles(), u / plan.tiles() * gu + g));
                    }
                }
            }
        }
        p += 1;
    }
    out
}

/// Writes cell (tile, group) of `w` in its fragment order.
fn encode_cell(w: &Weights, tile: usize, group: usize, out: &mut [u8]) {
    match w {
        Weights::Int4(m) => {
            // Column k of the cell, row rr: word w = 2 (k / 32) + (k % 32) / 16 of lane
            // 4 (rr % 8) + (k % 16) / 4, byte k % 4; rows 0-7 in the low nibble, 8-15 in the high.
            for rr in 0..CELL_ROWS {
                let row = tile * CELL_ROWS + rr;
                for k in 0..GROUP {
                    let (t, kk) = (k / 32, k % 32);
                    let (word, lane) = (2 * t + kk / 16, 4 * (rr % 8) + (kk % 16) / 4);
                    let byte = ((word / 4) * 32 + lane) * 16 + (word % 4) * 4 + kk % 4;
                    let nib = (m.q(row, group * GROUP + k) + 8) as u8;
                    out[byte] |= nib << (4 * (rr / 8));
                }
                let scale = m.scales[row * (m.cols / GROUP) + group];
                out[1024 + 2 * rr..1024 + 2 * rr + 2].copy_from_slice(&scale.to_le_bytes());
            }
        }
        Weights::Int8(m) => {
            // Column k, row rr: load k / 32 of lane 4 (rr % 8) + (k % 16) / 4, word
            // 2 ((k % 32) / 16) + rr / 8, byte k % 4.
            for rr in 0..CELL_ROWS {
                let row = tile * CELL_ROWS + rr;
                for k in 0..128 {
                    let (t, kk) = (k / 32, k % 32);
                    let lane = 4 * (rr % 8) + (kk % 16) / 4;
                    let word = 2 * (kk / 16) + rr / 8;
                    let byte = (t * 32 + lane) * 16 + word * 4 + kk % 4;
                    out[byte] = m.q[row * m.cols + group * 128 + k] as u8;
                }
            }
        }
        Weights::Bf16 { cols, bits, .. } => {
            // Column k, row rr: step k / 16 of lane 4 (rr % 8) + (k % 8) / 2, register
            // rr / 8 + 2 ((k % 16) / 8), half k % 2.
            for rr in 0..CELL_ROWS {
                let row = tile * CELL_ROWS + rr;
                for k in 0..64 {
                    let (st, kk) = (k / 16, k % 16);
                    let lane = 4 * (rr % 8) + (kk % 8) / 2;
                    let reg = rr / 8 + 2 * (kk / 8);
                    let byte = (st * 32 + lane) * 16 + reg * 4 + (kk % 2) * 2;
                    let v = bits[row * cols + group * 64 + k];
                    out[byte..byte + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// What one SM needs of one operation, worked out on the host so that the kernel's
/// per-operation path divides nothing and loads nothing it could have been given (the
/// prototype's `SmOp`, `OPSMEM` in proto/stream_step.cu: 3.66 -> 3.21 µs per link). 32-bit
/// fields in a fixed order: uploaded as is, one array per SM.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmShare {
    /// The SM's units: `[first_unit, first_unit + units)`.
    pub first_unit: u32,
    pub units: u32,
    /// The K slices those units read, `first_slice..=last_slice` (the input groups the SM builds
    /// when its input needs no norm over the whole vector).
    pub first_slice: u32,
    pub last_slice: u32,
    /// The first pass: `np` units, `kw` warps per unit, `rounds` rounds.
    pub np: u32,
    pub kw: u32,
    pub rounds: u32,
    /// The first unit's tile within its slice (`first_unit % tiles`).
    pub first_tile: u32,
    /// The operation's first cell, counted from the start of the SM's stream.
    pub first_cell: u32,
}

/// Unit `first_unit + idx`'s (K slice, tile), found by stepping from the first unit's as the
/// kernel does (slice-major numbering: the slice advances each time the tile passes `tiles`).
pub fn unit_at(share: &SmShare, tiles: usize, idx: usize) -> (usize, usize) {
    let mut slice = share.first_slice as usize;
    let mut tile = share.first_tile as usize + idx;
    while tile >= tiles {
        tile -= tiles;
        slice += 1;
    }
    (slice, tile)
}

impl Streams {
    /// Cells in SM `s`'s stream, its alignment padding left out: what its producer copies. A
    /// kernel is given this (the prototype counting it on the device cost 144 µs per launch).
    pub fn sm_cells(&self, s: usize) -> usize {
        self.ops
            .iter()
            .map(|plan| plan.sm_units(self.n_sm, s).1 * plan.unit_groups())
            .sum()
    }

    /// SM `s`'s share of every operation, in operation order.
    pub fn sm_shares(&self, s: usize) -> Vec<SmShare> {
        let mut cell = 0usize;
        self.ops
            .iter()
            .map(|plan| {
                let (u0, nt) = plan.sm_units(self.n_sm, s);
                let gu = plan.unit_groups();
                let tiles = plan.tiles();
                let q = if nt > 0 {
                    pass_of(nt, 0, gu, self.warps)
                } else {
                    Pass {
                        np: 0,
                        kw: 0,
                        rounds: 0,
                    }
                };
                let share = SmShare {
                    first_unit: u0 as u32,
                    units: nt as u32,
                    first_slice: (u0 / tiles) as u32,
                    last_slice: ((u0 + nt.max(1) - 1) / tiles) as u32,
                    np: q.np as u32,
                    kw: q.kw as u32,
                    rounds: q.rounds as u32,
                    first_tile: (u0 % tiles) as u32,
                    first_cell: cell as u32,
                };
                cell += nt * gu;
                share
            })
            .collect()
    }
}

/// `W x` of operation `op` (rows before any GeGLU), computed from the streams alone: every SM's
/// cells found where the device's position formula puts them, each decoded through the
/// registers a lane reads, the units' K slices added in slice order. f32 products of the cells'
/// values (int4: `q * scale`) with `x`.
pub fn walk(st: &Streams, op: usize, x: &[f32]) -> Vec<f32> {
    let plan = &st.ops[op];
    let cell = plan.format.bytes();
    let cols = plan.format.cols();
    let gu = plan.unit_groups();
    assert_eq!(x.len(), plan.k, "input length");
    let mut parts = vec![0.0f32; plan.splits * plan.rows];
    for s in 0..st.n_sm {
        // Everything per SM from its share, as the kernel gets it: no divisions below.
        let share = st.sm_shares(s)[op];
        let base = st.sm_base[s] + share.first_cell as usize;
        let nt = share.units as usize;
        let mut p = 0;
        while p * st.warps < nt {
            let q = if p == 0 {
                Pass {
                    np: share.np as usize,
                    kw: share.kw as usize,
                    rounds: share.rounds as usize,
                }
            } else {
                pass_of(nt, p, gu, st.warps)
            };
            let pb = base + p * st.warps * gu;
            for warp in 0..q.np * q.kw {
                let (ti, sl) = (warp / q.kw, warp % q.kw);
                let (slice, tile) = unit_at(&share, plan.tiles(), p * st.warps + ti);
                // The kernel builds only the input groups of its units' slices.
                assert!(
                    (share.first_slice..=share.last_slice).contains(&(slice as u32)),
                    "unit outside the SM's input slices"
                );
                for r in 0..q.rounds {
                    let g = r * q.kw + sl;
                    if g >= gu {
                        break;
                    }
                    // The kernel's position of round r's cell for this warp.
                    let cnt = q.kw.min(gu - r * q.kw);
                    let pos = pb + r * q.np * q.kw + ti * cnt + sl;
                    let bytes = &st.bytes[pos * cell..(pos + 1) * cell];
                    let xg = &x[(slice * gu + g) * cols..][..cols];
                    let mut rows = decode_cell(plan.format, bytes);
                    if plan.format == CellFormat::Int8 {
                        // Each 32-column block times its row's scale, from the scale stream where
                        // the producer's copy puts it beside the cell.
                        let c0 = st.sc_from[s] as usize * CHUNK_CELLS;
                        let local = pos - st.sm_base[s];
                        assert!(local >= c0, "an int8 cell before its SM's scales");
                        let at = st.sc_base[s] as usize * 16 + (local - c0) * SCALE_CELL_BYTES;
                        let sc = &st.scale_bytes[at..at + SCALE_CELL_BYTES];
                        for (rr, vals) in rows.iter_mut().enumerate() {
                            let e = (rr % 8) * 16 + (rr / 8) * 8;
                            for (k, v) in vals.iter_mut().enumerate() {
                                let b = e + (k / 32) * 2;
                                let bits = u16::from_le_bytes([sc[b], sc[b + 1]]);
                                *v *= half::f16::from_bits(bits).to_f32();
                            }
                        }
                    }
                    for (rr, vals) in rows.iter().enumerate() {
                        let dot: f32 = vals.iter().zip(xg).map(|(w, v)| w * v).sum();
                        parts[slice * plan.rows + tile * CELL_ROWS + rr] += dot;
                    }
                }
            }
            p += 1;
        }
    }
    (0..plan.rows)
        .map(|r| (0..plan.splits).map(|j| parts[j * plan.rows + r]).sum())
        .collect()
}

/// A cell's 16 rows of values, read the way the kernel's lanes read them.
fn decode_cell(format: CellFormat, b: &[u8]) -> Vec<Vec<f32>> {
    let word = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
    let mut rows = vec![vec![0.0f32; format.cols()]; CELL_ROWS];
    for lane in 0..32 {
        let (g, c) = (lane / 4, lane % 4);
        match format {
            CellFormat::Int4 => {
                // Lane (g, c) loads 16 bytes at [lane] and [32 + lane]: words ws[0..8]; word
                // 2t + h, byte i: column 32 t + 16 h + 4 c + i of rows g (low nibble) and g + 8.
                let ws: Vec<u32> = (0..8)
                    .map(|w| word(((w / 4) * 32 + lane) * 4 + w % 4))
                    .collect();
                for (w, &v) in ws.iter().enumerate() {
                    for i in 0..4 {
                        let col = 32 * (w / 2) + 16 * (w % 2) + 4 * c + i;
                        let byte = (v >> (8 * i)) & 0xFF;
                        rows[g][col] = ((byte & 0xF) as i32 - 8) as f32;
                        rows[g + 8][col] = ((byte >> 4) as i32 - 8) as f32;
                    }
                }
            }
            CellFormat::Int8 => {
                // Load t, word j: row g + 8 (j % 2), columns 32 t + 16 (j / 2) + 4 c + i
                // (the q values; the scales are applied by the caller).
                for t in 0..4 {
                    for j in 0..4 {
                        let v = word((t * 32 + lane) * 4 + j);
                        for i in 0..4 {
                            let col = 32 * t + 16 * (j / 2) + 4 * c + i;
                            rows[g + 8 * (j % 2)][col] = ((v >> (8 * i)) & 0xFF) as u8 as i8 as f32;
                        }
                    }
                }
            }
            CellFormat::Bf16 => {
                // Step s: registers a0..a3 = (row g, k 2c..), (g + 8, 2c..), (g, 8 + 2c..),
                // (g + 8, 8 + 2c..) of columns 16 s + k.
                for s in 0..4 {
                    for reg in 0..4 {
                        let v = word((s * 32 + lane) * 4 + reg);
                        let row = g + 8 * (reg % 2);
                        let col = 16 * s + 8 * (reg / 2) + 2 * c;
                        rows[row][col] = f32::from_bits((v & 0xFFFF) << 16);
                        rows[row][col + 1] = f32::from_bits(v & 0xFFFF_0000);
                    }
                }
            }
        }
    }
    if format == CellFormat::Int4 {
        for (rr, row) in rows.iter_mut().enumerate() {
            let sc = u16::from_le_bytes([b[1024 + 2 * rr], b[1025 + 2 * rr]]);
            let s = f32::from_bits((sc as u32) << 16);
            row.iter_mut().for_each(|v| *v *= s);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_int4;
    use hayai_model::Matrix;

    fn matrix(rows: usize, cols: usize, seed: u64) -> Matrix {
        let mut h = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let data = (0..rows * cols)
            .map(|_| {
                h ^= h << 13;
                h ^= h >> 7;
                h ^= h << 17;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect();
        Matrix::from_f32(rows, cols, data)
    }

    fn input(n: usize) -> Vec<f32> {
        (0..n).map(|i| (0.37 * i as f32).sin() + 0.1).collect()
    }

    fn gemv(w: &Matrix, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0; w.rows];
        w.matvec(x, &mut y);
        y
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        crate::check::compare_rows(&[a.to_vec()], &[b.to_vec()]).2 < 1e-5
    }

    // Shapes that exercise every path: one unit per SM or several, passes with kw > 1 warps per
    // unit and a partial last round, K splits, a GeGLU op, SMs without units.
    const SHAPES: [(usize, usize, bool); 5] = [
        (160, 1280, false),
        (48, 512, false),
        (320, 256, true),
        (16, 384, false),
        (96, 2048, false),
    ];

    fn int4_mats(seed: u64) -> Vec<Int4Matrix> {
        SHAPES
            .iter()
            .enumerate()
            .map(|(i, &(r, c, _))| quantize_int4(&matrix(r, c, i as u64 + seed)))
            .collect()
    }

    // Every other operation marked as following the one before it (dealt over the SMs that one
    // leaves idle where the shapes allow).
    fn int4_ops(mats: &[Int4Matrix]) -> Vec<StreamOp<'_>> {
        mats.iter()
            .zip(SHAPES)
            .enumerate()
            .map(|(i, (m, (_, _, glu)))| StreamOp {
                weights: Weights::Int4(m),
                whole: glu,
                after_prev: i % 2 == 1,
                max_splits: 0,
            })
            .collect()
    }

    #[test]
    fn int4_streams_walk_back_to_the_plain_gemv() {
        let mats = int4_mats(1);
        let ops = int4_ops(&mats);
        let mut away = 0;
        for (n_sm, warps) in [(7, 4), (13, 12), (40, 8)] {
            let st = build(&ops, n_sm, warps).unwrap();
            assert!(st.sm_base.iter().all(|b| b % ALIGN_CELLS == 0));
            assert!(st.ops.iter().any(|p| p.splits > 1), "no K splits walked");
            away += st.ops.iter().filter(|p| !p.sms.is_empty()).count();
            for (i, m) in mats.iter().enumerate() {
                let x = input(m.cols);
                let got = walk(&st, i, &x);
                let want = gemv(&m.dequantize(), &x);
                assert!(close(&got, &want), "op {i}, {n_sm} SMs x {warps} warps");
            }
        }
        assert!(away > 0, "no dealing over idle SMs walked");
    }

    /// A cell loop by steps: a warp's full rounds np kw cells apart, then the last partial round
    /// worked out once, give the same cells in the same order as the round formula `walk`
    /// checks against the layout (the kernel's `ss_gemv` steps so for kw = 1; every kw was
    /// measured slower with the dp4a cells, docs/decisions.md).
    /// The parallel build lays out the bytes of the cell-by-cell loop it replaced: every SM's
    /// cells in order, each SM padded to whole `ALIGN_CELLS`.
    #[test]
    fn parallel_build_matches_cell_by_cell_encoding() {
        let mats = int4_mats(3);
        let ops = int4_ops(&mats);
        for (n_sm, warps) in [(7, 4), (13, 12)] {
            let st = build(&ops, n_sm, warps).unwrap();
            let cell = st.format.bytes();
            let mut bytes = Vec::new();
            for s in 0..n_sm {
                assert_eq!(st.sm_base[s], bytes.len() / cell);
                for (op, plan) in ops.iter().zip(&st.ops) {
                    for (tile, group) in sm_order(plan, n_sm, warps, s) {
                        let at = bytes.len();
                        bytes.resize(at + cell, 0);
                        encode_cell(&op.weights, tile, group, &mut bytes[at..]);
                    }
                }
                bytes.resize((bytes.len() / cell).next_multiple_of(ALIGN_CELLS) * cell, 0);
            }
            assert_eq!(st.sm_base[n_sm], bytes.len() / cell);
            assert!(st.bytes == bytes, "{n_sm} SMs");
        }
    }

    #[test]
    fn stepped_cell_positions_match_the_round_formula() {
        for warps in [4, 8, 11, 12] {
            for gu in 1..=24 {
                for nt in 1..=3 * warps {
                    let mut p = 0;
                    while p * warps < nt {
                        let q = pass_of(nt, p, gu, warps);
                        let pb = p * warps * gu;
                        for warp in 0..q.np * q.kw {
                            let (ti, sl) = (warp / q.kw, warp % q.kw);
                            let formula: Vec<(usize, usize)> = (0..q.rounds)
                                .map(|r| (r, r * q.kw + sl))
                                .take_while(|&(_, g)| g < gu)
                                .map(|(r, g)| {
                                    let cnt = q.kw.min(gu - r * q.kw);
                                    (pb + r * q.np * q.kw + ti * cnt + sl, g)
                                })
                                .collect();
                            let stride = q.np * q.kw;
                            // At most one wrap of the ring's slot a step: the smallest ring
                            // (decode_stream_r2) holds 2 chunks of 16 cells.
                            assert!(stride < 2 * 16, "stride {stride}");
                            let full = gu / q.kw;
                            let mut stepped: Vec<(usize, usize)> = (0..full)
                                .map(|r| (pb + ti * q.kw + sl + r * stride, r * q.kw + sl))
                                .collect();
                            if full * q.kw + sl < gu {
                                let cnt = gu - full * q.kw;
                                stepped
                                    .push((pb + full * stride + ti * cnt + sl, full * q.kw + sl));
                            }
                            assert_eq!(
                                stepped, formula,
                                "{warps} warps, gu {gu}, nt {nt}, warp {warp}"
                            );
                        }
                        p += 1;
                    }
                }
            }
        }
    }

    /// The dp4a form of a cell (kernels/stream_step.cu `ss_cell`, sm_90): lane (g, c) dots the
    /// words of its fragment against the int8 input words it reads from the quantized group's
    /// B-fragment layout (`ss_store_group`), low nibbles alone and whole bytes (low + 16 high);
    /// the kernel scales each lane's dots apart and adds the quad's sums once a pass. The quad's
    /// integer dots (lane c = 0 taking the nibbles' offset) must be both rows' exact dots.
    #[test]
    fn dp4a_cell_lanes_give_the_exact_integer_dots() {
        let m = quantize_int4(&matrix(16, 256, 5));
        let mut h = 0x2545_F491_4F6C_DD1Du64;
        for group in 0..2 {
            let mut cell = vec![0u8; CellFormat::Int4.bytes()];
            encode_cell(&Weights::Int4(&m), 0, group, &mut cell);
            let x: Vec<i8> = (0..GROUP)
                .map(|_| {
                    h ^= h << 13;
                    h ^= h >> 7;
                    h ^= h << 17;
                    (h % 255) as i8 // -127 ..= 127 after the wrap
                })
                .map(|v| if v == i8::MIN { 0 } else { v })
                .collect();
            // Quantization lane l's four values (columns 4l ..) as the kernel stores them.
            let mut xf = [0u32; 64];
            for l in 0..32 {
                let w = (0..4).fold(0u32, |w, i| w | (x[4 * l + i] as u8 as u32) << (8 * i));
                xf[((l >> 3) * 4 + (l & 3)) * 2 + ((l >> 2) & 1)] = w;
            }
            let dp4a = |a: u32, b: u32, c: i32| {
                (0..4).fold(c, |s, i| {
                    s + ((a >> (8 * i)) & 255) as i32 * ((b >> (8 * i)) as u8 as i8) as i32
                })
            };
            let word = |lane: usize, j: usize| {
                let o = ((j / 4) * 32 + lane) * 16 + (j % 4) * 4;
                u32::from_le_bytes(cell[o..o + 4].try_into().unwrap())
            };
            let (mut da, mut dw) = ([0i32; 32], [0i32; 32]);
            for lane in 0..32 {
                let c = lane & 3;
                for t in 0..4 {
                    let (bx, by) = (xf[(t * 4 + c) * 2], xf[(t * 4 + c) * 2 + 1]);
                    let (w0, w1) = (word(lane, 2 * t), word(lane, 2 * t + 1));
                    da[lane] = dp4a(w1 & 0x0F0F_0F0F, by, dp4a(w0 & 0x0F0F_0F0F, bx, da[lane]));
                    dw[lane] = dp4a(w1, by, dp4a(w0, bx, dw[lane]));
                }
            }
            let xs8: i32 = x.iter().map(|&v| v as i32).sum();
            for g in 0..8 {
                let a: i32 = (0..4).map(|c| da[4 * g + c]).sum();
                let w: i32 = (0..4).map(|c| dw[4 * g + c]).sum();
                let dot = |r: usize| -> i32 {
                    (0..GROUP)
                        .map(|k| m.q(r, group * GROUP + k) as i32 * x[k] as i32)
                        .sum()
                };
                assert_eq!(a - 8 * xs8, dot(g), "group {group} row {g}");
                assert_eq!(
                    ((w - a) >> 4) - 8 * xs8,
                    dot(g + 8),
                    "group {group} row {}",
                    g + 8
                );
            }
        }
    }

    #[test]
    fn bf16_streams_walk_back_to_the_plain_gemv() {
        let mats: Vec<(usize, usize, Vec<u16>)> = SHAPES
            .iter()
            .enumerate()
            .map(|(i, &(r, c, _))| {
                (
                    r,
                    c,
                    crate::quant::to_bf16_bits(&matrix(r, c, i as u64 + 11)),
                )
            })
            .collect();
        let ops: Vec<StreamOp> = mats
            .iter()
            .zip(SHAPES)
            .map(|((rows, cols, bits), (_, _, glu))| StreamOp {
                weights: Weights::Bf16 {
                    rows: *rows,
                    cols: *cols,
                    bits,
                },
                whole: glu,
                after_prev: false,
                max_splits: 0,
            })
            .collect();
        let st = build(&ops, 13, 12).unwrap();
        for (i, (rows, cols, bits)) in mats.iter().enumerate() {
            let x = input(*cols);
            let w = Matrix::from_bf16_bits(*rows, *cols, bits.clone());
            assert!(close(&walk(&st, i, &x), &gemv(&w, &x)), "op {i}");
        }
    }

    /// An int8 matrix (Q8_0-like blocks: int8 q, one f16 scale per 32 columns) from `seed`.
    fn int8_mat(rows: usize, cols: usize, seed: u64) -> crate::quant::Int8Matrix {
        let mut h = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = || {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            h
        };
        crate::quant::Int8Matrix {
            rows,
            cols,
            q: (0..rows * cols).map(|_| next() as u8 as i8).collect(),
            scales: (0..rows * cols / 32)
                .map(|_| half::f16::from_f32(1e-3 * (1 + next() % 16) as f32).to_bits())
                .collect(),
        }
    }

    /// int8 cells in a bf16 stream (the output head after bf16 layers): each operation walks
    /// back to its plain GEMV, the int8 one with its scales from beside the stream, whole rows
    /// (the argmax's) or cut along K, on several SM counts; a first operation in int8 or int8
    /// among int4 cells is refused.
    #[test]
    fn int8_cells_share_a_bf16_stream_and_walk_back_to_the_plain_gemv() {
        let bf = crate::quant::to_bf16_bits(&matrix(96, 512, 5));
        let bf16_op = StreamOp {
            weights: Weights::Bf16 {
                rows: 96,
                cols: 512,
                bits: &bf,
            },
            whole: false,
            after_prev: false,
            max_splits: 0,
        };
        for whole in [true, false] {
            for (rows, cols) in [(160, 512), (48, 1280)] {
                let m8 = int8_mat(rows, cols, rows as u64);
                let ops = [
                    bf16_op,
                    StreamOp {
                        weights: Weights::Int8(&m8),
                        whole,
                        after_prev: false,
                        max_splits: 0,
                    },
                ];
                for n_sm in [5, 13, 40] {
                    let st = build(&ops, n_sm, 12).unwrap();
                    assert_eq!(st.ops[1].format, CellFormat::Int8);
                    assert_eq!(st.ops[1].groups, cols / 128);
                    assert!(!whole || st.ops[1].splits == 1);
                    // Every SM with int8 cells has their scales from a chunk boundary on.
                    for sm in 0..n_sm {
                        let has = st.sm_shares(sm)[1].units > 0;
                        assert_eq!(st.sc_from[sm] != u32::MAX, has, "SM {sm}");
                    }
                    let w0 = Matrix::from_bf16_bits(96, 512, bf.clone());
                    assert!(close(&walk(&st, 0, &input(512)), &gemv(&w0, &input(512))));
                    let x = input(cols);
                    let w = m8.dequantize();
                    assert!(
                        close(&walk(&st, 1, &x), &gemv(&w, &x)),
                        "{rows} x {cols} whole {whole} on {n_sm} SMs"
                    );
                }
            }
        }
        let m8 = int8_mat(16, 128, 1);
        let first = StreamOp {
            weights: Weights::Int8(&m8),
            whole: true,
            after_prev: false,
            max_splits: 0,
        };
        assert!(build(&[first, bf16_op], 5, 12).is_err());
        let q4 = quantize_int4(&matrix(16, 128, 2));
        let int4_op = StreamOp {
            weights: Weights::Int4(&q4),
            ..bf16_op
        };
        assert!(build(&[int4_op, first], 5, 12).is_err());
    }

    #[test]
    fn sm_shares_agree_with_the_division_forms() {
        let mats = int4_mats(21);
        let ops = int4_ops(&mats);
        for (n_sm, warps) in [(7, 4), (13, 12), (40, 8), (132, 12)] {
            let st = build(&ops, n_sm, warps).unwrap();
            for s in 0..n_sm {
                let shares = st.sm_shares(s);
                let mut cell = 0;
                for (plan, sh) in st.ops.iter().zip(&shares) {
                    let (u0, nt) = plan.sm_units(n_sm, s);
                    assert_eq!((sh.first_unit as usize, sh.units as usize), (u0, nt));
                    assert_eq!(sh.first_cell as usize, cell);
                    cell += nt * plan.unit_groups();
                    if nt == 0 {
                        continue;
                    }
                    let q = pass_of(nt, 0, plan.unit_groups(), warps);
                    assert_eq!(
                        (sh.np, sh.kw, sh.rounds),
                        (q.np as u32, q.kw as u32, q.rounds as u32)
                    );
                    for idx in 0..nt {
                        let u = u0 + idx;
                        let (slice, tile) = unit_at(sh, plan.tiles(), idx);
                        assert_eq!((slice, tile), (u / plan.tiles(), u % plan.tiles()));
                        assert!((sh.first_slice as usize..=sh.last_slice as usize).contains(&slice));
                    }
                    assert_eq!(sh.last_slice as usize, (u0 + nt - 1) / plan.tiles());
                }
                // The shares account for the whole stream but its alignment padding.
                let len = st.sm_base[s + 1] - st.sm_base[s];
                assert!(
                    cell <= len && len - cell < ALIGN_CELLS,
                    "SM {s}: {cell} cells, stream {len}"
                );
                assert_eq!(st.sm_cells(s), cell, "SM {s}");
            }
        }
    }

    #[test]
    fn a_gemv_after_a_partial_one_takes_the_sms_it_leaves_idle() {
        // On 13 SMs of 4 warps: 10 units of the first leave SMs 0, 4 and 8 idle (u * s / 13).
        let first = quantize_int4(&matrix(160, 1280, 31));
        let fits = quantize_int4(&matrix(96, 256, 32)); // 12 units of one cell: 4 an idle SM
        let longer = quantize_int4(&matrix(96, 512, 33)); // 12 units of 2 cells: 2 rounds there
        let op = |m, after_prev| StreamOp {
            weights: Weights::Int4(m),
            whole: false,
            after_prev,
            max_splits: 0,
        };
        let (n_sm, warps) = (13, 4);
        let st = build(&[op(&first, false), op(&fits, true)], n_sm, warps).unwrap();
        let idle: Vec<usize> = (0..n_sm)
            .filter(|&s| st.ops[0].sm_units(n_sm, s).1 == 0)
            .collect();
        assert_eq!(idle, [0, 4, 8]);
        assert_eq!(st.ops[1].sms, idle);
        let mut units = 0;
        for s in 0..n_sm {
            let nt = st.ops[1].sm_units(n_sm, s).1;
            assert_eq!(nt > 0, idle.contains(&s), "SM {s}");
            assert!(nt <= warps);
            units += nt;
            assert_eq!(st.sm_shares(s)[1].units as usize, nt);
        }
        assert_eq!(units, st.ops[1].units());
        for (i, m) in [&first, &fits].into_iter().enumerate() {
            let x = input(m.cols);
            assert!(
                close(&walk(&st, i, &x), &gemv(&m.dequantize(), &x)),
                "op {i}"
            );
        }
        // Where the idle SMs would take more rounds than all of them, all of them.
        let st = build(&[op(&first, false), op(&longer, true)], n_sm, warps).unwrap();
        assert!(st.ops[1].sms.is_empty());
        let x = input(longer.cols);
        assert!(close(&walk(&st, 1, &x), &gemv(&longer.dequantize(), &x)));
        // Without the flag, all of them.
        let st = build(&[op(&first, false), op(&fits, false)], n_sm, warps).unwrap();
        assert!(st.ops[1].sms.is_empty());
        // E4B's PLE gate (2,560 -> 256: 64 units) and projection on 132 SMs of 11 warps: the
        // projection's 320 units go to the 68 SMs without a gate unit, at most 5 each.
        let gate = quantize_int4(&matrix(256, 2560, 34));
        let proj = quantize_int4(&matrix(2560, 256, 35));
        let st = build(&[op(&gate, false), op(&proj, true)], 132, 11).unwrap();
        assert_eq!((st.ops[0].units(), st.ops[1].units()), (64, 320));
        assert_eq!(st.ops[1].sms.len(), 68);
        assert!((0..132).all(|s| st.ops[1].sm_units(132, s).1 <= 5));
        let x = input(proj.cols);
        assert!(close(&walk(&st, 1, &x), &gemv(&proj.dequantize(), &x)));
    }

    #[test]
    fn k_splits_even_out_the_shares() {
        // E4B's down projection on 132 SMs: 160 tiles leave 28 SMs two; 4 slices of 20 groups
        // bring the largest share from 160 to 100 cells (the average is 97).
        assert_eq!(k_splits(2560, 80, false, 132), 4);
        assert_eq!(k_splits(20480, 20, true, 132), 1); // GeGLU rows stay whole
        assert_eq!(k_splits(262144, 20, false, 132), 1); // lm_head: already within 2%
        assert_eq!(k_splits(2560, 16, false, 132), 4); // O: 32 -> 20 cells
        assert_eq!(k_splits_capped(2560, 16, false, 132, 2), 2); // 24 cells
        assert_eq!(k_splits_capped(2560, 80, false, 132, 1), 1);
    }

    #[test]
    fn bad_shapes_and_mixed_formats_are_errors() {
        let m = quantize_int4(&matrix(24, 128, 3));
        let op = StreamOp {
            weights: Weights::Int4(&m),
            whole: false,
            after_prev: false,
            max_splits: 0,
        };
        assert!(build(&[op], 4, 4).is_err()); // 24 rows: not whole tiles
        let a = quantize_int4(&matrix(16, 128, 4));
        let bits = vec![0u16; 16 * 64];
        let mixed = [
            StreamOp {
                weights: Weights::Int4(&a),
                whole: false,
                after_prev: false,
                max_splits: 0,
            },
            StreamOp {
                weights: Weights::Bf16 {
                    rows: 16,
                    cols: 64,
                    bits: &bits,
                },
                whole: false,
                after_prev: false,
                max_splits: 0,
            },
        ];
        assert!(build(&mixed, 4, 4).is_err());
        assert!(build(&[], 4, 4).is_err());
    }
}
