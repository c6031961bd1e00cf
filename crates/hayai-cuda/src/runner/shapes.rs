//! Launch shapes of the decode kernels: dynamic shared memory and split-K choices.

use super::MAX_SPLITS;

/// Dynamic shared memory of `gemv_a8` for width `cols`: x in f32, x in int8, and per 128-column
/// group four lane sums and a scale.
pub(crate) fn gemv_a8_smem(cols: usize) -> usize {
    cols * 4 + cols + (cols / 128) * 20
}

/// Rows per block of `gemv_mma` (kernels/gemv_mma.cu `GMMA_ROWS`).
pub(crate) const GEMV_MMA_ROWS: usize = 128;

/// Dynamic shared memory of `gemv_mma`: as the f32 tiled GEMV's, then the B fragments of x for
/// the block's `groups` 128-column groups (512 bytes each).
pub(crate) fn gemv_mma_smem(cols: usize, norms: bool, groups: usize) -> usize {
    gemv_smem(cols, false, norms) + groups * 512
}

/// Stages x groups per stage of `gemv_mma_ring`'s weight ring (kernels/gemv_mma.cu `GMMA_RING`,
/// `GMMA_RING_U`).
const GEMV_MMA_RING: usize = 3 * 2;

/// Dynamic shared memory of `gemv_mma_ring`: `gemv_mma`'s, the block's group scales
/// ([128 rows][groups] bf16) and the ring (per thread and group slot, 16 bytes of two rows).
pub(crate) fn gemv_mma_ring_smem(cols: usize, norms: bool, groups: usize) -> usize {
    gemv_mma_smem(cols, norms, groups) + GEMV_MMA_ROWS * groups * 2 + GEMV_MMA_RING * 2 * 256 * 16
}

/// Split-K of `gemv_mma_ring` for `tiles` row tiles: as many splits as keep the grid within the
/// blocks the GPU holds at once (`resident`), never under 4 groups per split.
pub(crate) fn ring_splits(tiles: usize, units: usize, resident: usize) -> usize {
    (resident / tiles.max(1))
        .clamp(1, MAX_SPLITS)
        .min((units / 4).max(1))
}

/// Dynamic shared memory of the tiled GEMVs (kernels/gemv.cu `gemv_cst_offset`): x (for
/// `gemv_a8` also its int8 copy, 16-byte aligned), then with `norms` (a residual or input norm
/// in the prologue) three more vectors: the residual input and both norm weights.
pub(crate) fn gemv_smem(cols: usize, a8: bool, norms: bool) -> usize {
    let base = if a8 {
        gemv_a8_smem(cols).next_multiple_of(16)
    } else {
        cols * 4
    };
    base + if norms { 3 * cols * 4 } else { 0 }
}

/// The decode attention kernel for head dim `hd`: compiled for 256 or 512 (the same arithmetic
/// as the run-time `attn_split`, without the guards of the dims a head does not have), with
/// `by_warp` its p.V phase by warps (another summation order); other head dims: `attn_split`.
pub(crate) fn attn_kernel(hd: usize, by_warp: bool) -> &'static str {
    match (hd, by_warp) {
        (256, false) => "attn_split_hd256",
        (512, false) => "attn_split_hd512",
        (256, true) => "attn_split_wv_hd256",
        (512, true) => "attn_split_wv_hd512",
        _ => "attn_split",
    }
}

/// Dynamic shared memory of `attn_split_tile` for head dim `hd`: K and V rows of one 32-key tile.
pub(crate) fn attn_tile_smem(hd: usize) -> usize {
    2 * 32 * hd * 4
}

/// Launch shape of the single-kernel step (kernels/step.cu).
pub(crate) struct StepConfig {
    pub(crate) kernel: &'static str,
    pub(crate) grid: usize,
    pub(crate) smem: usize,
    pub(crate) x_floats: usize,
    /// Warps of the whole grid (the GEMV work is dealt out over them).
    pub(crate) warps: usize,
}

/// K splits of a GEMV in the single-kernel step, whose `warps` each take items (octet, split) in
/// turn: the split that minimizes the busiest warp's work (units, plus ~2 units' worth per item
/// for its reduction and store, plus the consumer's extra partial reads), never an empty split.
pub(crate) fn step_splits(rows: usize, units: usize, warps: usize) -> usize {
    let octets = rows.div_ceil(8).max(1);
    let mut best = (usize::MAX, 1);
    for s in 1..=MAX_SPLITS.min(units.max(1)) {
        let per = units.div_ceil(s);
        if (s - 1) * per >= units {
            continue;
        }
        let cost = (octets * s).div_ceil(warps) * (per + 2) * 4 + s;
        if cost < best.0 {
            best = (cost, s);
        }
    }
    best.1
}

/// Warps per SM the split-K choice aims at: 32 for int4, 16 for bf16 (H200, E4B shapes:
/// int4 316.7 / 330.3 / 334.2 tok/s at 16 / 24 / 32, bf16 230.1 / 229.9 / 222.9; an int4 row
/// carries a quarter of the bytes, so it takes more warps to keep as many in flight).
/// HAYAI_GEMV_WARPS_PER_SM overrides both, for measurements.
pub(crate) fn gemv_warps_per_sm(int4: bool) -> usize {
    warps_per_sm_env("HAYAI_GEMV_WARPS_PER_SM").unwrap_or(if int4 { 32 } else { 16 })
}

/// Split-K target of `gemv_mma` (16 rows per warp, 80 registers: 3 blocks per SM): two blocks'
/// worth keeps the grid within one wave. `HAYAI_MMA_WARPS_PER_SM` overrides it (measurements).
pub(crate) fn gemv_mma_warps_per_sm() -> usize {
    warps_per_sm_env("HAYAI_MMA_WARPS_PER_SM").unwrap_or(16)
}

/// The `gemv_mma` instance: two groups in flight per lane, or four with `HAYAI_MMA_U=4`
/// (measurements).
pub(crate) fn gemv_mma_kernel() -> &'static str {
    match std::env::var("HAYAI_MMA_U").as_deref() {
        Ok("4") => "gemv_mma_u4",
        _ => "gemv_mma",
    }
}

fn warps_per_sm_env(var: &str) -> Option<usize> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&w: &usize| (1..=64).contains(&w))
}

/// Split-K factor for a GEMV whose rows take `warps` warps: enough warps to fill the GPU, never
/// under 4 units (16-byte loads per lane) per split. Every block recomputes the GEMV prologue, so
/// more blocks than the GPU holds at once cost more than they gain (measured: forcing one load
/// batch per lane ran slower).
pub(crate) fn splits_for(
    warps: usize,
    units: usize,
    sm_count: usize,
    warps_per_sm: usize,
) -> usize {
    let want = (sm_count * warps_per_sm).div_ceil(warps.max(1));
    want.clamp(1, MAX_SPLITS).min((units / 4).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_splits_keep_the_grid_within_the_resident_blocks() {
        // E4B on 132 SMs at 2 blocks each: gate/up (160 row tiles) unsplit, down (20 tiles,
        // 80 groups) 13 splits, a 2-tile matrix limited by its 20 groups (4 per split).
        assert_eq!(ring_splits(160, 20, 264), 1);
        assert_eq!(ring_splits(20, 80, 264), 13);
        assert_eq!(ring_splits(2, 20, 264), 5);
        for (tiles, units) in [(1, 8), (7, 160), (300, 20), (20, 2)] {
            let s = ring_splits(tiles, units, 264);
            assert!((1..=MAX_SPLITS).contains(&s));
            assert!(s == 1 || tiles * s <= 264, "{tiles} tiles x {s} splits");
            assert!(s == 1 || units / s >= 4, "{units} groups / {s} splits");
        }
    }

    #[test]
    fn attention_kernels_by_head_dim() {
        assert_eq!(attn_kernel(256, false), "attn_split_hd256");
        assert_eq!(attn_kernel(512, false), "attn_split_hd512");
        assert_eq!(attn_kernel(256, true), "attn_split_wv_hd256");
        assert_eq!(attn_kernel(512, true), "attn_split_wv_hd512");
        // Other head dims run the run-time kernel, with or without the warp p.V phase asked for.
        assert_eq!(attn_kernel(128, true), "attn_split");
        assert_eq!(attn_kernel(384, false), "attn_split");
        // Every name is a kernel of the fatbin's table.
        for hd in [128, 256, 384, 512] {
            for w in [false, true] {
                let k = attn_kernel(hd, w);
                assert!(crate::device::KERNELS.iter().any(|(n, _)| *n == k), "{k}");
            }
        }
    }
}
