//! safetensors reader/writer tests: round trips, sharded checkpoints, hostile
//! headers, truncation and random mutations.

use std::collections::BTreeMap;
use std::path::Path;

use hayai_core::safetensors::{SafetensorsWriter, INDEX_FILE};
use hayai_core::{write_safetensors, DType, FormatError, SafeTensors};
use proptest::prelude::*;

fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Builds a raw file from a header string and data bytes.
fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(data);
    b
}

fn err(bytes: Vec<u8>) -> String {
    match SafeTensors::from_bytes(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn sample_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("model.safetensors");
    let a = f32b(&[1.0, -2.0, 3.5, 0.25, 5.0, 6.0]);
    let bf: Vec<u8> = [0x3f80u16, 0xc0a0, 0x0000]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let hf: Vec<u8> = [0x3c00u16, 0xc000]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let i32s: Vec<u8> = [7i32, -1].iter().flat_map(|x| x.to_le_bytes()).collect();
    let i64s: Vec<u8> = [1i64 << 40].iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    write_safetensors(
        &path,
        &[
            ("a".into(), DType::F32, vec![2, 3], &a),
            ("b".into(), DType::BF16, vec![3], &bf),
            ("c".into(), DType::F16, vec![2, 1], &hf),
            ("d".into(), DType::I32, vec![2], &i32s),
            ("e".into(), DType::I64, vec![1], &i64s),
            ("f".into(), DType::U8, vec![3], &[1, 2, 255]),
            ("g".into(), DType::Bool, vec![2], &[0, 1]),
            ("h".into(), DType::I8, vec![1], &[0xff]),
            ("s".into(), DType::F64, vec![], &2.5f64.to_le_bytes()),
            ("z".into(), DType::F32, vec![0, 4], &[]),
        ],
        Some(meta),
    )
    .unwrap();
    path
}

#[test]
fn round_trip_all_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample_file(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(n % 8, 0, "header padded to 8 bytes");
    assert!(bytes[8..8 + n as usize].ends_with(b"}") || bytes[8 + n as usize - 1] == b' ');

    for st in [
        SafeTensors::open(&path).unwrap(),
        SafeTensors::open(dir.path()).unwrap(),
    ] {
        assert_eq!(st.len(), 10);
        assert_eq!(
            st.names().collect::<Vec<_>>(),
            vec!["a", "b", "c", "d", "e", "f", "g", "h", "s", "z"]
        );
        assert_eq!(st.metadata().get("format").map(String::as_str), Some("pt"));
        let a = st.get("a").unwrap();
        assert_eq!((a.dtype, a.shape.clone()), (DType::F32, vec![2, 3]));
        assert_eq!(
            a.to_f32_vec().unwrap(),
            vec![1.0, -2.0, 3.5, 0.25, 5.0, 6.0]
        );
        assert_eq!(a.to_bf16_bits().unwrap()[0], 0x3f80);
        let b = st.get("b").unwrap();
        assert_eq!(b.to_f32_vec().unwrap(), vec![1.0, -5.0, 0.0]);
        assert_eq!(b.to_bf16_bits().unwrap(), vec![0x3f80, 0xc0a0, 0]);
        assert_eq!(st.get("c").unwrap().to_f32_vec().unwrap(), vec![1.0, -2.0]);
        assert_eq!(st.get("d").unwrap().to_i32_vec().unwrap(), vec![7, -1]);
        assert_eq!(st.get("e").unwrap().to_i64_vec().unwrap(), vec![1 << 40]);
        assert_eq!(
            st.get("f").unwrap().to_f32_vec().unwrap(),
            vec![1.0, 2.0, 255.0]
        );
        assert_eq!(st.get("g").unwrap().to_i32_vec().unwrap(), vec![0, 1]);
        assert_eq!(st.get("h").unwrap().to_i32_vec().unwrap(), vec![-1]);
        let s = st.get("s").unwrap();
        assert!(s.shape.is_empty());
        assert_eq!(s.n_elements(), 1);
        assert_eq!(s.to_f32_vec().unwrap(), vec![2.5]);
        assert!(st.get("z").unwrap().data.is_empty());
        assert!(st.get("d").unwrap().to_bf16_bits().is_err());
        assert!(st.get("a").unwrap().to_i32_vec().is_err());
        assert!(st.get("missing").is_none());
        assert!(matches!(
            st.require("missing").unwrap_err(),
            FormatError::TensorNotFound { .. }
        ));
    }
}

#[test]
fn f8_conversions() {
    let st = SafeTensors::from_bytes(raw(
        r#"{"x":{"dtype":"F8_E4M3","shape":[5],"data_offsets":[0,5]},"y":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[5,7]}}"#,
        &[0x38, 0x7e, 0x01, 0xb8, 0x7f, 0x3c, 0xc0],
    ))
    .unwrap();
    let x = st.get("x").unwrap().to_f32_vec().unwrap();
    assert_eq!(&x[..4], &[1.0, 448.0, 2f32.powi(-9), -1.0]);
    assert!(x[4].is_nan());
    assert_eq!(st.get("y").unwrap().to_f32_vec().unwrap(), vec![1.0, -2.0]);
}

fn write_sharded(dir: &Path) {
    write_safetensors(
        &dir.join("model-00001-of-00002.safetensors"),
        &[("layer.0.w".into(), DType::F32, vec![2], &f32b(&[1.0, 2.0]))],
        None,
    )
    .unwrap();
    write_safetensors(
        &dir.join("model-00002-of-00002.safetensors"),
        &[
            ("layer.1.w".into(), DType::F32, vec![1], &f32b(&[3.0])),
            ("lm_head".into(), DType::F32, vec![1], &f32b(&[4.0])),
        ],
        None,
    )
    .unwrap();
}

fn write_index(dir: &Path, map: &[(&str, &str)]) {
    let wm: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
        .collect();
    let idx = serde_json::json!({"metadata": {"total_size": 16}, "weight_map": wm});
    std::fs::write(dir.join(INDEX_FILE), idx.to_string()).unwrap();
}

#[test]
fn sharded_checkpoint_with_index() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path());
    write_index(
        dir.path(),
        &[
            ("layer.0.w", "model-00001-of-00002.safetensors"),
            ("layer.1.w", "model-00002-of-00002.safetensors"),
            ("lm_head", "model-00002-of-00002.safetensors"),
        ],
    );
    let st = SafeTensors::open(dir.path()).unwrap();
    assert_eq!(st.len(), 3);
    assert_eq!(
        st.get("layer.0.w").unwrap().to_f32_vec().unwrap(),
        vec![1.0, 2.0]
    );
    assert_eq!(st.get("lm_head").unwrap().to_f32_vec().unwrap(), vec![4.0]);
    assert!(st
        .file_of("lm_head")
        .unwrap()
        .ends_with("model-00002-of-00002.safetensors"));
    assert_eq!(
        st.metadata().get("total_size").map(String::as_str),
        Some("16")
    );
}

#[test]
fn directory_without_index_merges_all_files() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path());
    let st = SafeTensors::open(dir.path()).unwrap();
    assert_eq!(st.len(), 3);
    let empty = tempfile::tempdir().unwrap();
    assert!(SafeTensors::open(empty.path())
        .unwrap_err()
        .to_string()
        .contains("no *.safetensors"));
}

#[test]
fn bad_indexes_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path());
    write_index(
        dir.path(),
        &[("layer.0.w", "model-00002-of-00002.safetensors")],
    );
    let e = SafeTensors::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("layer.0.w") && e.contains("not in shard"), "{e}");
    write_index(dir.path(), &[("x", "../etc/passwd")]);
    let e = SafeTensors::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("invalid shard file name"), "{e}");
    write_index(dir.path(), &[("x", "missing.safetensors")]);
    let e = SafeTensors::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::Io { .. }), "{e}");
    std::fs::write(dir.path().join(INDEX_FILE), "{not json").unwrap();
    assert!(matches!(
        SafeTensors::open(dir.path()).unwrap_err(),
        FormatError::Json { .. }
    ));
    std::fs::write(dir.path().join(INDEX_FILE), "{}").unwrap();
    assert!(SafeTensors::open(dir.path())
        .unwrap_err()
        .to_string()
        .contains("weight_map"));
}

#[test]
fn duplicate_names_across_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    for n in ["a.safetensors", "b.safetensors"] {
        write_safetensors(
            &dir.path().join(n),
            &[("w".into(), DType::U8, vec![1], &[1])],
            None,
        )
        .unwrap();
    }
    let e = SafeTensors::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("more than one file"), "{e}");
}

#[test]
fn hostile_headers_are_rejected() {
    let ok = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    SafeTensors::from_bytes(raw(ok, &[0; 8])).unwrap();

    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend(b"{}");
    assert!(err(huge).contains("limit"));
    let mut past = 1000u64.to_le_bytes().to_vec();
    past.extend(b"{}");
    assert!(err(past).contains("exceeds the file"));
    assert!(err(vec![1, 2, 3]).contains("too short"));
    assert!(err(raw("[1,2]", &[])).contains("not a JSON object"));
    assert!(err(raw("{\"w\":", &[])).contains("invalid JSON"));
    let cases = [
        (
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            4usize,
            "outside",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
            "needs 12 bytes",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#,
            8,
            "outside",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}}"#,
            8,
            "data_offsets",
        ),
        (
            r#"{"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}"#,
            8,
            "unsupported dtype",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
            8,
            "invalid dimension",
        ),
        (
            r#"{"w":{"dtype":"F32","data_offsets":[0,8]}}"#,
            8,
            "missing `shape`",
        ),
        (
            r#"{"w":{"shape":[2],"data_offsets":[0,8]}}"#,
            8,
            "missing `dtype`",
        ),
        (r#"{"w":3}"#, 8, "not an object"),
        (
            r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}"#,
            8,
            "overflows",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}}"#,
            8,
            "outside",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            12,
            "overlap",
        ),
        (r#"{"__metadata__":{"k":1}}"#, 0, "not a string"),
        (r#"{"__metadata__":[]}"#, 0, "not an object"),
    ];
    for (h, data_len, msg) in cases {
        let e = err(raw(h, &vec![0; data_len]));
        assert!(e.contains(msg), "header {h}: error `{e}` lacks `{msg}`");
    }
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(sample_file(dir.path())).unwrap();
    SafeTensors::from_bytes(bytes.clone()).unwrap();
    for len in 0..bytes.len() {
        assert!(
            SafeTensors::from_bytes(bytes[..len].to_vec()).is_err(),
            "prefix {len}"
        );
    }
}

#[test]
fn streaming_writer_checks_order_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    let specs = vec![
        ("x".to_string(), DType::F32, vec![2]),
        ("y".to_string(), DType::BF16, vec![1]),
    ];
    let mut w = SafetensorsWriter::create(&p, &specs, None).unwrap();
    assert!(w.write_tensor("y", &[0, 0]).is_err());
    assert!(w.write_tensor("x", &[0; 4]).is_err());
    w.write_tensor("x", &f32b(&[1.0, 2.0])).unwrap();
    let w2 = SafetensorsWriter::create(&dir.path().join("v.safetensors"), &specs, None).unwrap();
    assert!(w2.finish().unwrap_err().to_string().contains("0 of 2"));
    w.write_tensor("y", &[0x80, 0x3f]).unwrap();
    assert!(w.write_tensor("z", &[]).is_err());
    w.finish().unwrap();
    let st = SafeTensors::open(&p).unwrap();
    assert_eq!(st.get("y").unwrap().to_f32_vec().unwrap(), vec![1.0]);
    let dup = vec![("x".to_string(), DType::U8, vec![1]); 2];
    assert!(SafetensorsWriter::create(&p, &dup, None).is_err());
    let missing = SafeTensors::open(&dir.path().join("nope.safetensors")).unwrap_err();
    assert!(matches!(missing, FormatError::Io { .. }));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn random_mutations_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}}"#;
        let mut b = raw(h, &[7; 24]);
        for (i, v) in edits {
            let at = i.index(b.len());
            b[at] = v;
        }
        if do_cut {
            b.truncate(cut.index(b.len()));
        }
        if let Ok(st) = SafeTensors::from_bytes(b) {
            for n in st.names() {
                let t = st.get(n).unwrap();
                prop_assert_eq!(t.data.len(), t.n_elements() * t.dtype.size());
                let _ = t.to_f32_vec();
            }
        }
    }
}

#[test]
fn empty_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.safetensors");
    std::fs::write(&p, b"").unwrap();
    assert!(SafeTensors::open(&p)
        .unwrap_err()
        .to_string()
        .contains("too short"));
}
