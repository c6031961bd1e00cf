//! GGUF reader tests on hand-built files: round trips, hostile inputs,
//! truncation at every byte and random mutations.

use hayai_core::gguf::value_type as vt;
use hayai_core::{FormatError, GgmlType, GgufFile, GgufWriter, MetaArray, MetaValue};
use proptest::prelude::*;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A small file exercising every value type, nested arrays and two tensors.
fn sample_writer() -> GgufWriter {
    GgufWriter::new()
        .meta("general.architecture", MetaValue::String("gemma3".into()))
        .meta("u8", MetaValue::U8(200))
        .meta("i8", MetaValue::I8(-5))
        .meta("u16", MetaValue::U16(60000))
        .meta("i16", MetaValue::I16(-30000))
        .meta("u32", MetaValue::U32(4_000_000_000))
        .meta("i32", MetaValue::I32(-7))
        .meta("u64", MetaValue::U64(1 << 40))
        .meta("i64", MetaValue::I64(-(1 << 40)))
        .meta("f32", MetaValue::F32(1.5))
        .meta("f64", MetaValue::F64(-2.25))
        .meta("bool", MetaValue::Bool(true))
        .meta(
            "tokens",
            MetaValue::Array(MetaArray::String(vec![
                "<pad>".into(),
                "▁hi".into(),
                "".into(),
            ])),
        )
        .meta(
            "scores",
            MetaValue::Array(MetaArray::F32(vec![0.0, -1.5, 2.0])),
        )
        .meta("types", MetaValue::Array(MetaArray::I32(vec![3, 1, 1])))
        .meta(
            "flags",
            MetaValue::Array(MetaArray::Bool(vec![true, false])),
        )
        .meta(
            "nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::U8(vec![1, 2]),
                MetaArray::String(vec!["x".into()]),
                MetaArray::Array(vec![MetaArray::I64(vec![-1])]),
            ])),
        )
        .meta("empty", MetaValue::Array(MetaArray::U64(vec![])))
        .tensor(
            "a.weight",
            &[3, 2],
            GgmlType::F32,
            f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        )
        // Last tensor is exactly 32 bytes so the file ends with tensor data
        // (no trailing padding): every strict prefix must then be invalid.
        .tensor(
            "b.weight",
            &[8],
            GgmlType::F32,
            f32_bytes(&[0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]),
        )
}

fn sample_bytes() -> Vec<u8> {
    sample_writer().to_bytes().unwrap()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle present")
}

/// Position just after the name of tensor `name` in its info record.
fn tensor_info_pos(bytes: &[u8], name: &str) -> usize {
    // The tensor infos follow the metadata, so search from the end.
    let n = name.as_bytes();
    let pos = bytes
        .windows(n.len())
        .rposition(|w| w == n)
        .expect("tensor name present");
    pos + n.len()
}

fn err_string(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn round_trip_all_value_types() {
    for version in [2, 3] {
        let f = GgufFile::from_bytes(sample_writer().version(version).to_bytes().unwrap()).unwrap();
        assert_eq!(f.version(), version);
        assert_eq!(f.architecture(), Some("gemma3"));
        assert_eq!(f.get("u8"), Some(&MetaValue::U8(200)));
        assert_eq!(f.get("i8"), Some(&MetaValue::I8(-5)));
        assert_eq!(f.get("u16"), Some(&MetaValue::U16(60000)));
        assert_eq!(f.get("i16"), Some(&MetaValue::I16(-30000)));
        assert_eq!(f.get_u32("u32"), Some(4_000_000_000));
        assert_eq!(f.get("i32"), Some(&MetaValue::I32(-7)));
        assert_eq!(f.get_u64("u64"), Some(1 << 40));
        assert_eq!(f.get_i64("i64"), Some(-(1 << 40)));
        assert_eq!(f.get_f32("f32"), Some(1.5));
        assert_eq!(f.get_f64("f64"), Some(-2.25));
        assert_eq!(f.get_bool("bool"), Some(true));
        assert_eq!(f.get_str_array("tokens").unwrap(), vec!["<pad>", "▁hi", ""]);
        assert_eq!(f.get_f32_array("scores").unwrap(), &[0.0, -1.5, 2.0]);
        assert_eq!(f.get_i32_array("types").unwrap(), &[3, 1, 1]);
        assert_eq!(
            f.get_array("flags").unwrap().as_bool().unwrap(),
            &[true, false]
        );
        let nested = f.get_array("nested").unwrap();
        assert_eq!(
            nested,
            &MetaArray::Array(vec![
                MetaArray::U8(vec![1, 2]),
                MetaArray::String(vec!["x".into()]),
                MetaArray::Array(vec![MetaArray::I64(vec![-1])]),
            ])
        );
        assert!(f.get_array("empty").unwrap().is_empty());
        assert_eq!(f.metadata().len(), 18);
    }
}

#[test]
fn integer_getters_accept_any_width_that_fits() {
    let f = GgufFile::from_bytes(sample_bytes()).unwrap();
    assert_eq!(f.get_u32("u8"), Some(200));
    assert_eq!(f.get_u64("u16"), Some(60000));
    assert_eq!(f.get_i64("i8"), Some(-5));
    assert_eq!(f.get_u32("i32"), None, "negative does not fit u32");
    assert_eq!(f.get_u32("u64"), None, "2^40 does not fit u32");
    assert_eq!(f.get_u32("f32"), None, "float is not an integer");
    assert_eq!(f.get_f32("f64"), Some(-2.25));
    assert_eq!(f.get_str("u8"), None);
    assert_eq!(f.get_f32_array("types"), None);
    assert_eq!(f.get("missing"), None);
}

#[test]
fn require_getters_report_key_and_type() {
    let f = GgufFile::from_bytes(sample_bytes()).unwrap();
    assert_eq!(f.require_u32("u32").unwrap(), 4_000_000_000);
    let e = f.require_u32("missing.key").unwrap_err();
    assert!(matches!(e, FormatError::MissingKey { .. }));
    assert!(e.to_string().contains("missing.key"));
    let e = f.require_str("f32").unwrap_err().to_string();
    assert!(e.contains("`f32`") && e.contains("expected string"), "{e}");
    assert!(f
        .require_tensor("nope")
        .unwrap_err()
        .to_string()
        .contains("nope"));
}

#[test]
fn tensor_infos_and_data() {
    let bytes = sample_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.tensors().len(), 2);
    let a = f.tensor("a.weight").unwrap();
    assert_eq!(a.dims, vec![3, 2]);
    assert_eq!(a.shape(), vec![2, 3]);
    assert_eq!(a.n_elements, 6);
    assert_eq!(a.n_bytes, 24);
    assert_eq!(a.offset, 0);
    assert_eq!((a.row_len(), a.n_rows(), a.row_bytes()), (3, 2, 12));
    assert_eq!(a.ggml_type, GgmlType::F32);
    assert_eq!(
        f.tensor_data(a).unwrap(),
        &f32_bytes(&[1., 2., 3., 4., 5., 6.])[..]
    );
    assert_eq!(
        f.tensor_rows_data(a, 1..2).unwrap(),
        &f32_bytes(&[4., 5., 6.])[..]
    );
    assert!(f.tensor_rows_data(a, 1..3).is_err());
    let b = f.tensor("b.weight").unwrap();
    assert_eq!(b.offset, 32, "second tensor aligned to 32");
    assert_eq!(b.shape(), vec![8]);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.data_offset() as usize + 64, bytes.len());
    assert_eq!(f.alignment(), 32);
    assert!(f.tensor("c").is_none());

    // An info that is not from this file is rejected, not a panic.
    let mut foreign = b.clone();
    foreign.offset = 1 << 40;
    assert!(f.tensor_data(&foreign).is_err());
}

#[test]
fn custom_alignment_is_honoured() {
    let bytes = GgufWriter::new()
        .meta("general.alignment", MetaValue::U32(64))
        .tensor("x", &[2], GgmlType::F32, f32_bytes(&[1.0, 2.0]))
        .tensor("y", &[32], GgmlType::Q8_0, vec![0u8; 34])
        .to_bytes()
        .unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor("y").unwrap().offset, 64);
    assert_eq!(f.tensor("y").unwrap().n_bytes, 34);
}

#[test]
fn file_without_tensors_and_open_from_disk() {
    let bytes = GgufWriter::new()
        .meta("k", MetaValue::String("v".into()))
        .to_bytes()
        .unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.get_str("k"), Some("v"));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    sample_writer().write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert!(f.origin().contains("t.gguf"));
    let e = GgufFile::open(&dir.path().join("missing.gguf")).unwrap_err();
    assert!(matches!(e, FormatError::Io { .. }));
    assert!(e.to_string().contains("missing.gguf"));
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let bytes = sample_bytes();
    GgufFile::from_bytes(bytes.clone()).unwrap();
    for len in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        assert!(r.is_err(), "prefix of {len}/{} bytes parsed", bytes.len());
    }
}

#[test]
fn bad_magic_and_versions() {
    let mut b = sample_bytes();
    b[0] = b'X';
    assert!(err_string(b).contains("magic"));
    for (v, msg) in [
        (1u32, "version 1"),
        (4, "unsupported GGUF version 4"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut b = sample_bytes();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        let e = err_string(b);
        assert!(e.contains(msg), "{e}");
    }
}

#[test]
fn huge_counts_are_rejected_before_allocation() {
    // Tensor count, then KV count.
    for at in [8usize, 16] {
        for huge in [u64::MAX, 1 << 40, 1_000_000] {
            let mut b = sample_bytes();
            b[at..at + 8].copy_from_slice(&huge.to_le_bytes());
            let e = err_string(b);
            assert!(e.contains("cannot fit"), "{e}");
        }
    }
}

#[test]
fn huge_string_and_array_lengths_are_rejected() {
    // Key length of the first KV.
    let mut b = sample_bytes();
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_string(b).contains("cannot fit"));

    // Count of the `tokens` array: key, type(4)=ARRAY, elem type(4), count(8).
    let mut b = sample_bytes();
    let p = find(&b, b"tokens") + 6 + 8;
    assert_eq!(&b[p - 8..p - 4], &vt::ARRAY.to_le_bytes());
    assert_eq!(&b[p - 4..p], &vt::STRING.to_le_bytes());
    b[p..p + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let e = err_string(b);
    assert!(e.contains("cannot fit") && e.contains("tokens"), "{e}");

    // Length of the first token string.
    let mut b = sample_bytes();
    let p = find(&b, b"tokens") + 6 + 16;
    b[p..p + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(err_string(b).contains("cannot fit"));
}

#[test]
fn bad_value_types_are_rejected() {
    // Value type of `u8`.
    let mut b = sample_bytes();
    let p = find(&b, b"\x02\x00\x00\x00\x00\x00\x00\x00u8") + 10;
    b[p..p + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(err_string(b).contains("unknown value type 13"));

    // Element type of `scores`.
    let mut b = sample_bytes();
    let p = find(&b, b"scores") + 6 + 4;
    assert_eq!(&b[p..p + 4], &vt::F32.to_le_bytes());
    b[p..p + 4].copy_from_slice(&99u32.to_le_bytes());
    assert!(err_string(b).contains("unknown array element type 99"));

    // Bool byte other than 0/1.
    let mut b = sample_bytes();
    let p = find(&b, b"bool") + 4 + 4;
    assert_eq!(b[p], 1);
    b[p] = 2;
    assert!(err_string(b).contains("invalid bool"));

    // Invalid UTF-8 in a string value.
    let mut b = sample_bytes();
    let p = find(&b, b"gemma3");
    b[p] = 0xff;
    assert!(err_string(b).contains("UTF-8"));
}

#[test]
fn deep_nesting_is_bounded() {
    let mut a = MetaArray::U8(vec![1]);
    for _ in 0..20 {
        a = MetaArray::Array(vec![a]);
    }
    let b = GgufWriter::new()
        .meta("deep", MetaValue::Array(a))
        .to_bytes()
        .unwrap();
    assert!(err_string(b).contains("nested deeper"));
}

#[test]
fn duplicates_are_rejected() {
    let b = GgufWriter::new()
        .meta("k", MetaValue::U8(1))
        .meta("k", MetaValue::U8(2))
        .to_bytes()
        .unwrap();
    assert!(err_string(b).contains("duplicate metadata key `k`"));
    let b = GgufWriter::new()
        .tensor("t", &[1], GgmlType::F32, vec![0; 4])
        .tensor("t", &[1], GgmlType::F32, vec![0; 4])
        .to_bytes()
        .unwrap();
    assert!(err_string(b).contains("duplicate tensor name `t`"));
}

#[test]
fn bad_alignment_is_rejected() {
    for v in [
        MetaValue::U32(0),
        MetaValue::U32(24),
        MetaValue::String("32".into()),
        MetaValue::I32(-32),
    ] {
        let b = GgufWriter::new()
            .meta("general.alignment", v)
            .to_bytes()
            .unwrap();
        assert!(err_string(b).contains("general.alignment"));
    }
}

#[test]
fn bad_tensor_infos_are_rejected() {
    // Layout after the name: n_dims u32, dims u64 x n, type u32, offset u64.
    let base = sample_bytes();
    let p = tensor_info_pos(&base, "a.weight");
    assert_eq!(&base[p..p + 4], &2u32.to_le_bytes());
    let dims0 = p + 4;
    let ty = p + 4 + 16;
    let off = ty + 4;

    let patch = |at: usize, v: &[u8]| {
        let mut b = base.clone();
        b[at..at + v.len()].copy_from_slice(v);
        err_string(b)
    };
    let e = patch(p, &5u32.to_le_bytes());
    assert!(e.contains("5 dims") && e.contains("a.weight"), "{e}");
    let e = patch(ty, &4u32.to_le_bytes());
    assert!(
        e.contains("unknown ggml type id 4") && e.contains("a.weight"),
        "{e}"
    );
    let e = patch(ty, &1000u32.to_le_bytes());
    assert!(e.contains("unknown ggml type"), "{e}");
    // 3 elements per row is not a multiple of Q8_0's 32.
    let e = patch(ty, &GgmlType::Q8_0.id().to_le_bytes());
    assert!(e.contains("block size"), "{e}");
    let e = patch(off, &4u64.to_le_bytes());
    assert!(e.contains("alignment"), "{e}");
    let e = patch(off, &(1u64 << 20).to_le_bytes());
    assert!(e.contains("past the end"), "{e}");
    // Offset + size overflows u64.
    let e = patch(off, &(u64::MAX - 31).to_le_bytes());
    assert!(e.contains("past the end"), "{e}");
    let e = patch(dims0, &u64::MAX.to_le_bytes());
    assert!(e.contains("too large"), "{e}");
    // Product of dims overflows.
    let mut b = base.clone();
    b[dims0..dims0 + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    b[dims0 + 8..dims0 + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(err_string(b).contains("overflows"));
    // Large but non-overflowing dims: out of file bounds.
    let e = patch(dims0, &(1u64 << 30).to_le_bytes());
    assert!(e.contains("past the end"), "{e}");
}

#[test]
fn zero_sized_dims_are_allowed() {
    let b = GgufWriter::new()
        .tensor("z", &[0, 4], GgmlType::F32, vec![])
        .tensor("w", &[1], GgmlType::F32, vec![0; 4])
        .to_bytes()
        .unwrap();
    let f = GgufFile::from_bytes(b).unwrap();
    let z = f.tensor("z").unwrap();
    assert_eq!(z.n_elements, 0);
    assert!(f.tensor_data(z).unwrap().is_empty());
}

#[test]
fn writer_rejects_wrong_data_length() {
    let r = GgufWriter::new()
        .tensor("t", &[32], GgmlType::Q8_0, vec![0; 33])
        .to_bytes();
    assert!(r.is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_byte_mutations_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let mut b = sample_bytes();
        for (i, v) in edits {
            let at = i.index(b.len());
            b[at] = v;
        }
        if let Ok(f) = GgufFile::from_bytes(b) {
            // Whatever parsed must be internally consistent.
            for t in f.tensors() {
                prop_assert_eq!(f.tensor_data(t).unwrap().len() as u64, t.n_bytes);
            }
        }
    }

    #[test]
    fn random_word_mutations_never_panic(
        at in any::<prop::sample::Index>(),
        word in prop_oneof![Just(u64::MAX), Just(1u64 << 63), Just(1u64 << 32), any::<u64>()],
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut b = sample_bytes();
        let at = at.index(b.len() - 8);
        b[at..at + 8].copy_from_slice(&word.to_le_bytes());
        if do_cut {
            b.truncate(cut.index(b.len()));
        }
        let _ = GgufFile::from_bytes(b);
    }

    #[test]
    fn random_bytes_never_panic(mut b in prop::collection::vec(any::<u8>(), 0..256)) {
        if b.len() >= 8 {
            b[..4].copy_from_slice(b"GGUF");
            b[4..8].copy_from_slice(&3u32.to_le_bytes());
        }
        let _ = GgufFile::from_bytes(b);
    }
}

#[test]
fn empty_file_and_directory_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.gguf");
    std::fs::write(&p, b"").unwrap();
    assert!(GgufFile::open(&p)
        .unwrap_err()
        .to_string()
        .contains("truncated"));
    assert!(GgufFile::open(dir.path()).is_err());
    let mut b = sample_bytes();
    b[4..8].copy_from_slice(&0u32.to_le_bytes());
    assert!(err_string(b).contains("unsupported GGUF version 0"));
}

#[test]
fn tensor_f32_method_dequantizes() {
    let f = GgufFile::from_bytes(sample_bytes()).unwrap();
    let (shape, v) = f.tensor_f32("a.weight").unwrap();
    assert_eq!(shape, vec![2, 3]);
    assert_eq!(v, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn foreign_tensor_info_with_inconsistent_dims_is_an_error() {
    let f = GgufFile::from_bytes(sample_bytes()).unwrap();
    let mut t = f.tensor("a.weight").unwrap().clone();
    t.dims = vec![3, 100]; // claims 100 rows, data holds 2
    assert!(f.tensor_rows_data(&t, 50..60).is_err());
}
