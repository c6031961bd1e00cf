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
/// Bytes `gemv` leaves free at the start of its dynamic shared memory (kernels/gemv.cu
/// `GEMV_XS_OFFSET` floats): its launches ask for this much more.
pub(crate) const GEMV_XS_OFFSET_BYTES: usize = 16;

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
/// `by_warp` its p.V phase by warps (another summation order), and with `by_warp` and
/// `min_keys` 8 or 32 only as many splits as give each at least that many keys (`attn_item`'s
/// MINK; other values: all splits); other head dims: `attn_split`.
pub(crate) fn attn_kernel(hd: usize, by_warp: bool, min_keys: usize) -> &'static str {
    match (hd, by_warp, min_keys) {
        (256, false, _) => "attn_split_hd256",
        (512, false, _) => "attn_split_hd512",
        (256, true, 8) => "attn_split_wv_hd256_k8",
        (512, true, 8) => "attn_split_wv_hd512_k8",
        (256, true, 32) => "attn_split_wv_hd256_k32",
        (512, true, 32) => "attn_split_wv_hd512_k32",
        (256, true, _) => "attn_split_wv_hd256",
        (512, true, _) => "attn_split_wv_hd512",
        _ => "attn_split",
    }
}

/// The attention kernels' `window` for a layer: the sliding window's keys, 0 for a global layer
/// (every key).
pub(crate) fn attn_window(spec: &hayai_model::ModelSpec, ls: &hayai_model::LayerSpec) -> i32 {
    if ls.sliding {
        spec.sliding_window as i32
    } else {
        0
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

/// K splits of `gemv_mma` for `rows` rows of `units` 128-column groups on `sm_count` SMs.
pub(crate) fn gemv_mma_splits(rows: usize, units: usize, sm_count: usize) -> usize {
    splits_for(rows.div_ceil(16), units, sm_count, gemv_mma_warps_per_sm())
}

/// Largest matrix (weights and scales) that `gemv_mma_kw` takes when it is on: measured on the
/// H200 (E4B shapes, µs per launch against `gemv_mma`), the PLE gate 5.5 -> 4.3, O 4.5 -> 4.0,
/// QKV 7.4 -> 7.0, but down (13.5 MB) 9.3 -> 12.1 and the lm_head 112 -> 126: the in-block K
/// sum saves split-K's fixed cost, which only dominates small matrices. Larger ones as
/// `gemv_mma_kw` with K splits across blocks (down, then gate/up too) measured 398.9 / 396.2
/// against 406-409 tok/s (seventh session; the switch was removed).
pub(crate) const KWARPS_MAX_BYTES: usize = 8 << 20;

/// The `gemv_mma_kw` instance (`HAYAI_MMA_U` as for `gemv_mma_kernel`).
pub(crate) fn gemv_mma_kw_kernel() -> &'static str {
    match std::env::var("HAYAI_MMA_U").as_deref() {
        Ok("4") => "gemv_mma_kw_u4",
        _ => "gemv_mma_kw",
    }
}

/// Warps sharing each 16-row tile of `gemv_mma_kw` along K: the power of two (1..8, never more
/// than the matrix's `units` 128-column groups) that brings the warps of the unsplit grid
/// closest to, not under, `gemv_mma_warps_per_sm()` per SM where the rows allow it.
pub(crate) fn mma_kwarps(rows: usize, units: usize, sm_count: usize) -> usize {
    let want = (sm_count * gemv_mma_warps_per_sm()).div_ceil(rows.div_ceil(16).max(1));
    let mut kw = want.next_power_of_two().min(8);
    while kw > 1 && kw > units {
        kw /= 2;
    }
    kw
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
    fn kwarps_fill_the_gpu_without_split_k() {
        // E4B on 132 SMs (16 warps per SM): QKV (3,072 rows, 20 groups) and O (2,560 rows,
        // 16 groups) and down (2,560 rows, 80 groups) 8 warps per tile, gate/up (20,480 rows)
        // 2, the lm_head 1, the PLE projection (K = 256: 2 groups) 2.
        assert_eq!(mma_kwarps(3072, 20, 132), 8);
        assert_eq!(mma_kwarps(2560, 80, 132), 8);
        assert_eq!(mma_kwarps(20480, 20, 132), 2);
        assert_eq!(mma_kwarps(262144, 20, 132), 1);
        assert_eq!(mma_kwarps(2560, 2, 132), 2);
        assert_eq!(mma_kwarps(256, 20, 132), 8);
        let known = |k: &str| crate::device::KERNELS.iter().any(|&(n, _)| n == k);
        assert!(known(gemv_mma_kw_kernel()) && known(gemv_mma_kernel()));
        for rows in [1, 16, 100, 5000, 70000] {
            for units in [1, 2, 3, 7, 80] {
                let kw = mma_kwarps(rows, units, 132);
                assert!(kw.is_power_of_two() && kw <= 8 && (kw == 1 || kw <= units));
            }
        }
    }

    #[test]
    fn attention_kernels_by_head_dim() {
        assert_eq!(attn_kernel(256, false, 0), "attn_split_hd256");
        assert_eq!(attn_kernel(512, false, 8), "attn_split_hd512");
        assert_eq!(attn_kernel(256, true, 0), "attn_split_wv_hd256");
        assert_eq!(attn_kernel(512, true, 0), "attn_split_wv_hd512");
        assert_eq!(attn_kernel(256, true, 8), "attn_split_wv_hd256_k8");
        assert_eq!(attn_kernel(512, true, 32), "attn_split_wv_hd512_k32");
        assert_eq!(attn_kernel(256, true, 5), "attn_split_wv_hd256");
        // Other head dims run the run-time kernel, with or without the warp p.V phase asked for.
        assert_eq!(attn_kernel(128, true, 8), "attn_split");
        assert_eq!(attn_kernel(384, false, 0), "attn_split");
        // Every name is a kernel of the fatbin's table.
        for hd in [128, 256, 384, 512] {
            for w in [false, true] {
                for m in [0, 8, 32] {
                    let k = attn_kernel(hd, w, m);
                    assert!(crate::device::KERNELS.iter().any(|(n, _)| *n == k), "{k}");
                }
            }
        }
    }
}
