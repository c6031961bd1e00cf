//! Dequantization of ggml tensor types to f32, bit-exact to ggml's reference
//! `dequantize_row_*` routines (same bit layouts and the same order of f32
//! operations, so results match to the last bit).

use std::ops::Range;

use rayon::prelude::*;

use crate::convert::{bf16_to_f32, f16_to_f32};
use crate::ggml_type::{GgmlType, QK_K};
use crate::gguf::GgufFile;
use crate::FormatError;

/// Below this many elements a tensor is dequantized on the calling thread.
const PAR_MIN_ELEMENTS: usize = 1 << 16;
/// Blocks handed to one rayon task.
const PAR_BLOCKS_PER_TASK: usize = 1024;

/// `kvalues_iq4nl`: the non-linear 4-bit codebook of IQ4_NL / IQ4_XS.
const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// `kvalues_mxfp4`: e2m1 values doubled (the scale is halved to compensate).
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Whether [`dequantize`] handles `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    block_fn(ty).is_some()
}

type BlockFn = fn(&[u8], &mut [f32]);

fn block_fn(ty: GgmlType) -> Option<BlockFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        F16 => |b, o| o[0] = f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        BF16 => |b, o| o[0] = bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        F64 => |b, o| o[0] = f64::from_le_bytes(b.try_into().unwrap()) as f32,
        I8 => |b, o| o[0] = b[0] as i8 as f32,
        I16 => |b, o| o[0] = i16::from_le_bytes([b[0], b[1]]) as f32,
        I32 => |b, o| o[0] = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
        I64 => |b, o| o[0] = i64::from_le_bytes(b.try_into().unwrap()) as f32,
        Q4_0 => block_q4_0,
        Q4_1 => block_q4_1,
        Q5_0 => block_q5_0,
        Q5_1 => block_q5_1,
        Q8_0 => block_q8_0,
        Q2_K => block_q2_k,
        Q3_K => block_q3_k,
        Q4_K => block_q4_k,
        Q5_K => block_q5_k,
        Q6_K => block_q6_k,
        Q8_K => block_q8_k,
        IQ4_NL => block_iq4_nl,
        IQ4_XS => block_iq4_xs,
        MXFP4 => block_mxfp4,
        TQ2_0 => block_tq2_0,
        _ => return None,
    })
}

/// Dequantizes `n_elements` values of type `ty` from `data` into `out`.
///
/// `data` must be exactly the bytes of `n_elements` values and `out` exactly
/// `n_elements` long; `n_elements` must be a whole number of blocks.
pub fn dequantize(
    ty: GgmlType,
    data: &[u8],
    n_elements: usize,
    out: &mut [f32],
) -> Result<(), FormatError> {
    let size_err = |msg: String| FormatError::Size {
        op: "dequantize".into(),
        ty: ty.name().into(),
        msg,
    };
    let f = block_fn(ty).ok_or_else(|| FormatError::Unsupported {
        ty: ty.name().into(),
        op: "dequantize".into(),
    })?;
    let bs = ty.block_size();
    let ts = ty.type_size();
    if !n_elements.is_multiple_of(bs) {
        return Err(size_err(format!(
            "{n_elements} elements is not a multiple of the block size {bs}"
        )));
    }
    let n_blocks = n_elements / bs;
    if n_blocks.checked_mul(ts) != Some(data.len()) {
        return Err(size_err(format!(
            "{} bytes of data for {n_elements} elements (expected {n_blocks} blocks of {ts} bytes)",
            data.len()
        )));
    }
    if out.len() != n_elements {
        return Err(size_err(format!(
            "output has {} slots for {n_elements} elements",
            out.len()
        )));
    }
    let run = |d: &[u8], o: &mut [f32]| {
        for (b, y) in d.chunks_exact(ts).zip(o.chunks_exact_mut(bs)) {
            f(b, y);
        }
    };
    if n_elements < PAR_MIN_ELEMENTS {
        run(data, out);
    } else {
        data.par_chunks(ts * PAR_BLOCKS_PER_TASK)
            .zip(out.par_chunks_mut(bs * PAR_BLOCKS_PER_TASK))
            .for_each(|(d, o)| run(d, o));
    }
    Ok(())
}

/// Allocating form of [`dequantize`].
pub fn dequantize_to_vec(
    ty: GgmlType,
    data: &[u8],
    n_elements: usize,
) -> Result<Vec<f32>, FormatError> {
    if !is_supported(ty) {
        return Err(FormatError::Unsupported {
            ty: ty.name().into(),
            op: "dequantize".into(),
        });
    }
    // Bound the allocation by the data actually present.
    let max = data.len() / ty.type_size() * ty.block_size();
    if n_elements > max {
        return Err(FormatError::Size {
            op: "dequantize".into(),
            ty: ty.name().into(),
            msg: format!("{} bytes cannot hold {n_elements} elements", data.len()),
        });
    }
    let mut out = vec![0f32; n_elements];
    dequantize(ty, data, n_elements, &mut out)?;
    Ok(out)
}

/// Dequantizes a whole GGUF tensor. Returns the row-major shape (outermost
/// first, see [`crate::GgufTensorInfo::shape`]) and the values.
pub fn tensor_f32(file: &GgufFile, name: &str) -> Result<(Vec<usize>, Vec<f32>), FormatError> {
    let t = file.require_tensor(name)?;
    let data = file.tensor_data(t)?;
    let v = dequantize_to_vec(t.ggml_type, data, t.n_elements as usize)
        .map_err(|e| with_tensor(file, name, e))?;
    Ok((t.shape(), v))
}

/// Dequantizes rows `rows` of a GGUF tensor (e.g. a few embedding rows
/// without expanding the whole table). Returns `rows.len() * row_len` values.
pub fn tensor_rows_f32(
    file: &GgufFile,
    name: &str,
    rows: Range<usize>,
) -> Result<Vec<f32>, FormatError> {
    let t = file.require_tensor(name)?;
    let data = file.tensor_rows_data(t, rows.clone())?;
    dequantize_to_vec(t.ggml_type, data, rows.len() * t.row_len())
        .map_err(|e| with_tensor(file, name, e))
}

fn with_tensor(file: &GgufFile, name: &str, e: FormatError) -> FormatError {
    FormatError::Invalid(format!("{}: tensor `{name}`: {e}", file.origin()))
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0f) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0f) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        let x0 = ((qs[j] as u32 & 0x0f) | xh0) as i32 - 16;
        let x1 = ((qs[j] as u32 >> 4) | xh1) as i32 - 16;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        let x0 = (qs[j] as u32 & 0x0f) | xh0;
        let x1 = (qs[j] as u32 >> 4) | xh1;
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}

fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = q as i8 as f32 * d;
    }
}

fn block_q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *o = d * q as i8 as f32;
    }
}

/// Q2_K: scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin.
fn block_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for n in 0..2 {
        for j in 0..4 {
            let shift = 2 * j;
            for half in 0..2 {
                let sc = scales[n * 8 + j * 2 + half];
                let dl = d * (sc & 0x0f) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let base = n * 128 + j * 32 + half * 16;
                for l in 0..16 {
                    let q = (qs[n * 32 + half * 16 + l] >> shift) & 3;
                    y[base + l] = dl * q as f32 - ml;
                }
            }
        }
    }
}

/// Q3_K: hmask[32], qs[64], 6-bit scales packed in 12 bytes, d.
fn block_q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let packed = &b[96..108];
    let d = f16_at(b, 108);
    let mut scales = [0i32; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 {
            packed[i] & 0x0f
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i32 - 32;
    }
    for n in 0..2 {
        for j in 0..4 {
            let shift = 2 * j;
            let m = 1u8 << (n * 4 + j);
            for half in 0..2 {
                let dl = d * scales[n * 8 + j * 2 + half] as f32;
                let base = n * 128 + j * 32 + half * 16;
                for l in 0..16 {
                    let li = half * 16 + l;
                    let q = ((qs[n * 32 + li] >> shift) & 3) as i32;
                    let h = if hmask[li] & m != 0 { 0 } else { 4 };
                    y[base + l] = dl * (q - h) as f32;
                }
            }
        }
    }
}

/// The 6-bit (scale, min) pair `j` of a Q4_K/Q5_K super-block
/// (`get_scale_min_k4`).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: d, dmin, scales[12], qs[128].
fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let q = &qs[j * 32..j * 32 + 32];
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let out = &mut y[j * 64..j * 64 + 64];
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0f) as f32 - min1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

/// Q5_K: d, dmin, scales[12], qh[32], qs[128].
fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..4 {
        let ql = &qs[j * 32..j * 32 + 32];
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let u1 = 1u8 << (2 * j);
        let u2 = 2u8 << (2 * j);
        let out = &mut y[j * 64..j * 64 + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - min1;
            out[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - min2;
        }
    }
}

/// Q6_K: ql[128], qh[64], scales[16] (i8), d.
fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for n in 0..2 {
        let ql = &b[n * 64..n * 64 + 64];
        let qh = &b[128 + n * 32..128 + n * 32 + 32];
        let sc = &b[192 + n * 8..192 + n * 8 + 8];
        let out = &mut y[n * 128..n * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            out[l] = d * sc[is] as i8 as f32 * q1 as f32;
            out[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            out[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            out[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

fn block_iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = d * KVALUES_IQ4NL[(qs[j] & 0x0f) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
    }
}

/// IQ4_XS: d, scales_h (u16), scales_l[4], qs[128].
fn block_iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for ib in 0..QK_K / 32 {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32
            | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
        let dl = d * (ls - 32) as f32;
        let q = &qs[ib * 16..ib * 16 + 16];
        let out = &mut y[ib * 32..ib * 32 + 32];
        for j in 0..16 {
            out[j] = dl * KVALUES_IQ4NL[(q[j] & 0x0f) as usize] as f32;
            out[j + 16] = dl * KVALUES_IQ4NL[(q[j] >> 4) as usize] as f32;
        }
    }
}

/// `ggml_e8m0_to_fp32_half`: 2^(e-127) / 2, exact including subnormals.
#[inline]
fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

fn block_mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    let qs = &b[1..17];
    for j in 0..16 {
        y[j] = KVALUES_MXFP4[(qs[j] & 0x0f) as usize] as f32 * d;
        y[j + 16] = KVALUES_MXFP4[(qs[j] >> 4) as usize] as f32 * d;
    }
}

/// TQ2_0: qs[64] (2-bit ternary + 1), d.
fn block_tq2_0(b: &[u8], y: &mut [f32]) {
    let qs = &b[0..64];
    let d = f16_at(b, 64);
    for j in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                let q = ((qs[j * 32 + m] >> (2 * l)) & 3) as i32 - 1;
                y[j * 128 + l * 32 + m] = q as f32 * d;
            }
        }
    }
}
