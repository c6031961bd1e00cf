//! Dequantization tests: hand-built blocks with hand-computed values, and an
//! exact cross-check against fixtures produced by the `gguf` Python package
//! (scripts/gen_dequant_fixture.py).

use hayai_core::convert::f32_to_f16;
use hayai_core::dequant::{dequantize_to_vec, is_supported, tensor_rows_f32};
use hayai_core::{dequantize, tensor_f32, FormatError, GgmlType, GgufFile, GgufWriter};

fn h(x: f32) -> [u8; 2] {
    f32_to_f16(x).to_le_bytes()
}

fn deq(ty: GgmlType, data: &[u8], n: usize) -> Vec<f32> {
    dequantize_to_vec(ty, data, n).unwrap()
}

#[test]
fn q8_0_block() {
    let mut b = h(0.5).to_vec();
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let y = deq(GgmlType::Q8_0, &b, 32);
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, (i as f32 - 16.0) * 0.5);
    }
}

#[test]
fn q4_0_and_q4_1_blocks() {
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let mut b = h(2.0).to_vec();
    b.extend(&qs);
    let y = deq(GgmlType::Q4_0, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], (j as f32 - 8.0) * 2.0);
        assert_eq!(y[j + 16], (7.0 - j as f32) * 2.0);
    }
    let mut b = h(0.5).to_vec();
    b.extend(h(-3.0));
    b.extend(&qs);
    let y = deq(GgmlType::Q4_1, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], j as f32 * 0.5 - 3.0);
        assert_eq!(y[j + 16], (15 - j) as f32 * 0.5 - 3.0);
    }
}

#[test]
fn q5_0_and_q5_1_high_bits() {
    // qh bit i is the 5th bit of element i.
    for (qh, lo_hi, hi_hi) in [(0xFFFF_0000u32, 0, 16), (0x0000_FFFF, 16, 0)] {
        let mut b = h(1.0).to_vec();
        b.extend(qh.to_le_bytes());
        b.extend([0x31u8; 16]); // low nibble 1, high nibble 3
        let y = deq(GgmlType::Q5_0, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], (1 + lo_hi) as f32 - 16.0);
            assert_eq!(y[j + 16], (3 + hi_hi) as f32 - 16.0);
        }
        let mut b = h(0.25).to_vec();
        b.extend(h(1.0));
        b.extend(qh.to_le_bytes());
        b.extend([0x31u8; 16]);
        let y = deq(GgmlType::Q5_1, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], (1 + lo_hi) as f32 * 0.25 + 1.0);
            assert_eq!(y[j + 16], (3 + hi_hi) as f32 * 0.25 + 1.0);
        }
    }
}

#[test]
fn q4_k_block_with_chosen_scales_and_mins() {
    // 8 (scale, min) pairs packed in 12 bytes; bytes 0..4 also carry the top
    // 2 bits of scales 4..7 and bytes 4..8 the top bits of mins 4..7.
    let scales: [u8; 12] = [
        0x41, 2, 3, 4, // scales 0..3 = 1,2,3,4; 0x40 -> scale 4 += 16
        5, 6, 7, 0x88, // mins 0..3 = 5,6,7,8; 0x80 -> min 7 += 32
        0x21, 0x43, 0x65, 0x87, // low nibble: scales 4..7, high: mins 4..7
    ];
    let sc = [1.0f32, 2., 3., 4., 17., 3., 5., 7.];
    let mn = [5.0f32, 6., 7., 8., 2., 4., 6., 40.];
    let mut b = h(1.0).to_vec();
    b.extend(h(0.5));
    b.extend(scales);
    let qs: Vec<u8> = (0..128)
        .map(|i| (i % 16) as u8 | ((15 - (i % 16) as u8) << 4))
        .collect();
    b.extend(&qs);
    let y = deq(GgmlType::Q4_K, &b, 256);
    for j in 0..4 {
        for l in 0..32 {
            let lo = (l % 16) as f32;
            assert_eq!(y[j * 64 + l], sc[2 * j] * lo - 0.5 * mn[2 * j], "j{j} l{l}");
            assert_eq!(
                y[j * 64 + 32 + l],
                sc[2 * j + 1] * (15.0 - lo) - 0.5 * mn[2 * j + 1],
                "j{j} l{l}"
            );
        }
    }
}

#[test]
fn q6_k_block_by_hand() {
    // ql nibbles all 0, qh = 0b11_10_01_00: quarter k of each 128 gets high
    // bits k, i.e. q = 16*k - 32. Scales: element e uses scale index
    // 8*(e/128) + 2*((e%128)/32) + (e%32)/16.
    let mut b = vec![0u8; 128];
    b.extend([0b1110_0100u8; 64]);
    let scales: [i8; 16] = [1, -2, 3, -4, 5, -6, 7, -8, 2, 4, 6, 8, -1, -3, -5, -7];
    b.extend(scales.iter().map(|s| *s as u8));
    b.extend(h(0.25));
    let y = deq(GgmlType::Q6_K, &b, 256);
    for (e, v) in y.iter().enumerate() {
        let quarter = (e % 128) / 32;
        let s = scales[8 * (e / 128) + 2 * quarter + (e % 32) / 16] as f32;
        let q = 16.0 * quarter as f32 - 32.0;
        assert_eq!(*v, 0.25 * s * q, "element {e}");
    }
    // Spot checks written out by hand.
    assert_eq!(y[0], 0.25 * 1.0 * -32.0);
    assert_eq!(y[16], 0.25 * -2.0 * -32.0);
    assert_eq!(y[32], 0.25 * 3.0 * -16.0);
    assert_eq!(y[127], 0.25 * -8.0 * 16.0);
    assert_eq!(y[128 + 64], 0.0); // scale -1 times q = 0
}

#[test]
fn q8_k_block() {
    let mut b = 0.125f32.to_le_bytes().to_vec();
    b.extend((0..256).map(|i| (i as u8).wrapping_sub(128)));
    b.extend([0u8; 32]); // bsums, unused by dequantization
    let y = deq(GgmlType::Q8_K, &b, 256);
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, 0.125 * (i as i32 - 128) as f32);
    }
}

#[test]
fn plain_types() {
    let b: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert_eq!(deq(GgmlType::F32, &b, 2), vec![1.5, -2.0]);
    assert_eq!(
        deq(GgmlType::F16, &[0x00, 0x3c, 0x00, 0xc0], 2),
        vec![1.0, -2.0]
    );
    assert_eq!(
        deq(GgmlType::BF16, &[0x80, 0x3f, 0xa0, 0xc0], 2),
        vec![1.0, -5.0]
    );
    assert_eq!(deq(GgmlType::I8, &[0xff, 7], 2), vec![-1.0, 7.0]);
    assert_eq!(deq(GgmlType::I32, &(-9i32).to_le_bytes(), 1), vec![-9.0]);
    assert_eq!(deq(GgmlType::F64, &0.5f64.to_le_bytes(), 1), vec![0.5]);
}

#[test]
fn size_mismatches_and_unsupported_types_are_errors() {
    let mut out = vec![0f32; 32];
    let e = dequantize(GgmlType::Q8_0, &[0u8; 33], 32, &mut out).unwrap_err();
    assert!(matches!(e, FormatError::Size { .. }), "{e}");
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], 31, &mut out[..31]).is_err());
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], 32, &mut out[..16]).is_err());
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], 32, &mut out).is_ok());
    let e = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], 256, &mut [0f32; 256]).unwrap_err();
    assert!(matches!(e, FormatError::Unsupported { .. }), "{e}");
    assert!(!is_supported(GgmlType::IQ2_XXS));
    // A hostile element count cannot force a huge allocation.
    assert!(dequantize_to_vec(GgmlType::F32, &[0u8; 8], usize::MAX / 2).is_err());
    for t in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(is_supported(t), "{t}");
    }
}

#[test]
fn parallel_path_matches_block_by_block() {
    // Large enough to take the rayon path; compare with per-block calls.
    let n_blocks = 3000;
    let mut data = Vec::with_capacity(n_blocks * 34);
    let mut state = 12345u32;
    for i in 0..n_blocks {
        data.extend(h(0.001 * (i % 97) as f32 - 0.03));
        for _ in 0..32 {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            data.push((state >> 16) as u8);
        }
    }
    let all = deq(GgmlType::Q8_0, &data, n_blocks * 32);
    for (i, block) in data.chunks_exact(34).enumerate() {
        assert_eq!(
            &all[i * 32..i * 32 + 32],
            &deq(GgmlType::Q8_0, block, 32)[..]
        );
    }
}

struct Case {
    ty: GgmlType,
    n: usize,
    data: Vec<u8>,
    expected: Vec<f32>,
}

fn load_fixture() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/dequant_ref.bin"
    );
    let b = std::fs::read(path).expect("fixture present");
    assert_eq!(&b[..4], b"HYDQ");
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap()) as usize;
    let n_cases = u32_at(4);
    let mut p = 8;
    let mut cases = Vec::new();
    for _ in 0..n_cases {
        let ty = GgmlType::from_id(u32_at(p) as u32).unwrap();
        let n = u32_at(p + 4);
        let nb = u32_at(p + 8);
        p += 12;
        let data = b[p..p + nb].to_vec();
        p += nb;
        let expected = b[p..p + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        p += 4 * n;
        cases.push(Case {
            ty,
            n,
            data,
            expected,
        });
    }
    assert_eq!(p, b.len());
    cases
}

#[test]
fn matches_reference_fixture_bit_exactly() {
    let cases = load_fixture();
    assert!(cases.len() >= 17);
    for c in &cases {
        let y = deq(c.ty, &c.data, c.n);
        for (i, (a, e)) in y.iter().zip(&c.expected).enumerate() {
            assert!(
                a.to_bits() == e.to_bits() || (a.is_nan() && e.is_nan()),
                "{} element {i}: got {a:e}, reference {e:e}",
                c.ty
            );
        }
    }
    let types: Vec<_> = cases.iter().map(|c| c.ty).collect();
    for t in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q5_K,
    ] {
        assert!(types.contains(&t), "fixture covers {t}");
    }
}

#[test]
fn tensor_helpers_on_a_gguf() {
    let mut q8 = Vec::new();
    for r in 0..3 {
        q8.extend(h(r as f32 + 1.0));
        q8.extend((0..32).map(|i| i as u8));
    }
    let f32s: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let bytes = GgufWriter::new()
        .tensor("emb", &[32, 3], GgmlType::Q8_0, q8)
        .tensor("m", &[3, 2], GgmlType::F32, f32s)
        .to_bytes()
        .unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    let (shape, v) = tensor_f32(&f, "emb").unwrap();
    assert_eq!(shape, vec![3, 32]);
    assert_eq!(v[32 + 5], 2.0 * 5.0);
    assert_eq!(v[64 + 31], 3.0 * 31.0);
    let row = tensor_rows_f32(&f, "emb", 2..3).unwrap();
    assert_eq!(row, v[64..96].to_vec());
    let (shape, v) = tensor_f32(&f, "m").unwrap();
    assert_eq!(shape, vec![2, 3]);
    assert_eq!(v, vec![0., 1., 2., 3., 4., 5.]);
    assert!(tensor_rows_f32(&f, "m", 1..3).is_err());
    assert!(matches!(
        tensor_f32(&f, "nope").unwrap_err(),
        FormatError::TensorNotFound { .. }
    ));
}

mod random_blocks {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Any bytes of a whole number of blocks dequantize without panic;
        /// any other length is an error.
        #[test]
        fn any_bytes_any_type(
            ty in prop::sample::select(GgmlType::ALL.to_vec()),
            n_blocks in 0usize..5,
            extra in 0usize..3,
            seed in any::<u64>(),
        ) {
            let len = n_blocks * ty.type_size() + extra;
            let mut s = seed | 1;
            let data: Vec<u8> = (0..len).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s as u8 }).collect();
            let n = n_blocks * ty.block_size();
            let r = dequantize_to_vec(ty, &data, n);
            if !is_supported(ty) || extra != 0 {
                prop_assert!(r.is_err());
            } else {
                prop_assert_eq!(r.unwrap().len(), n);
            }
        }
    }
}
