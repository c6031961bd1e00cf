//! Tests against the real Gemma 3 270M Q4_K_M GGUF. The path comes from
//! `HAYAI_MODEL_GGUF` (default: the hayai model cache). CI downloads the model
//! first, so a missing file is a failure, not a skip.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use hayai_core::dequant::{dequantize, tensor_rows_f32};
use hayai_core::{tensor_f32, GgmlType, GgufFile};

fn model_path() -> PathBuf {
    let p = hayai_core::cache::real_model_path();
    assert!(
        p.is_file(),
        "real-model test needs the Gemma 3 270M GGUF at {} (set HAYAI_MODEL_GGUF to override)",
        p.display()
    );
    p
}

fn open() -> GgufFile {
    GgufFile::open(&model_path()).expect("real model parses")
}

#[test]
fn real_model_metadata() {
    let f = open();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.architecture(), Some("gemma3"));
    assert_eq!(f.get_u32("gemma3.block_count"), Some(18));
    assert_eq!(f.get_u32("gemma3.embedding_length"), Some(640));
    assert_eq!(f.get_u32("gemma3.attention.head_count"), Some(4));
    assert_eq!(f.get_u32("gemma3.attention.head_count_kv"), Some(1));
    assert_eq!(f.get_u32("gemma3.attention.key_length"), Some(256));
    assert!(f.get_f32("gemma3.rope.freq_base").unwrap() > 0.0);
    assert!(
        f.get_f32("gemma3.attention.layer_norm_rms_epsilon")
            .unwrap()
            > 0.0
    );
    assert_eq!(f.get_str("tokenizer.ggml.model"), Some("llama"));
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 262_144);
    assert_eq!(&tokens[..4], &["<pad>", "<eos>", "<bos>", "<unk>"]);
    assert_eq!(
        f.get_f32_array("tokenizer.ggml.scores").unwrap().len(),
        262_144
    );
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        262_144
    );
    assert_eq!(f.get_u32("tokenizer.ggml.bos_token_id"), Some(2));
    assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id"), Some(1));
    assert_eq!(f.get_bool("tokenizer.ggml.add_bos_token"), Some(true));
    assert_eq!(f.metadata().len(), 33);
}

#[test]
fn real_model_tensor_infos() {
    let f = open();
    assert_eq!(f.tensors().len(), 236);
    let mut by_type = BTreeMap::new();
    for t in f.tensors() {
        *by_type.entry(t.ggml_type).or_insert(0) += 1;
        assert_eq!(f.tensor_data(t).unwrap().len() as u64, t.n_bytes);
    }
    let expected: BTreeMap<_, _> = [
        (GgmlType::F32, 109),
        (GgmlType::Q5_0, 81),
        (GgmlType::Q4_K, 27),
        (GgmlType::Q8_0, 10),
        (GgmlType::Q6_K, 9),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_type, expected);
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, vec![640, 262_144]);
    assert_eq!(emb.shape(), vec![262_144, 640]);
    assert_eq!(emb.ggml_type, GgmlType::Q8_0);
    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.shape(), vec![1024, 640]);
    assert_eq!(q.ggml_type, GgmlType::Q5_0);
    let down = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.shape(), vec![640, 2048]);
    assert_eq!(down.ggml_type, GgmlType::Q6_K);
    // The last tensor's data ends within the file.
    let end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.n_bytes)
        .max()
        .unwrap();
    assert!(end <= f.as_bytes().len() as u64);
}

#[test]
fn real_model_rows_match_reference_dequantizer() {
    let f = open();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/real_model_ref.json"
    );
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for entry in fixture.as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        let t = f.tensor(name).unwrap();
        assert_eq!(
            t.ggml_type.name().to_uppercase(),
            entry["type"].as_str().unwrap()
        );
        let row_len = entry["row_len"].as_u64().unwrap() as usize;
        assert_eq!(row_len, t.row_len());
        for (row, vals) in entry["rows"].as_object().unwrap() {
            let r: usize = row.parse().unwrap();
            let got = tensor_rows_f32(&f, name, r..r + 1).unwrap();
            let head = vals["head"].as_array().unwrap();
            let tail = vals["tail"].as_array().unwrap();
            let tail_start = row_len - tail.len();
            for (i, b) in head.iter().enumerate() {
                assert_eq!(
                    got[i].to_bits() as u64,
                    b.as_u64().unwrap(),
                    "{name} row {r} [{i}]"
                );
            }
            for (i, b) in tail.iter().enumerate() {
                let j = tail_start + i;
                assert_eq!(
                    got[j].to_bits() as u64,
                    b.as_u64().unwrap(),
                    "{name} row {r} [{j}]"
                );
            }
            checked += head.len() + tail.len();
        }
    }
    assert!(checked > 3000, "checked {checked} values");
}

fn stats(v: &[f32]) -> (f64, f64, f32) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    let max = v.iter().fold(0f32, |m, &x| m.max(x.abs()));
    (mean, var.sqrt(), max)
}

#[test]
fn real_model_tensor_statistics_are_plausible() {
    let f = open();
    // Embedding rows: Q8_0, small centred values.
    let rows = tensor_rows_f32(&f, "token_embd.weight", 1000..1010).unwrap();
    assert_eq!(rows.len(), 6400);
    let (mean, std, max) = stats(&rows);
    assert!(
        mean.abs() < 0.02 && std > 1e-3 && std < 1.0 && max < 10.0,
        "{mean} {std} {max}"
    );
    for name in [
        "blk.0.attn_q.weight",      // Q5_0
        "blk.0.attn_output.weight", // Q4_K
        "blk.0.ffn_down.weight",    // Q6_K
        "blk.0.attn_v.weight",      // Q8_0
    ] {
        let (shape, v) = tensor_f32(&f, name).unwrap();
        assert_eq!(shape.iter().product::<usize>(), v.len());
        assert!(v.iter().all(|x| x.is_finite()), "{name}");
        let (mean, std, max) = stats(&v);
        assert!(
            mean.abs() < 0.01 && std > 1e-3 && std < 0.5 && max < 20.0,
            "{name}: mean {mean} std {std} max {max}"
        );
    }
    // Gemma stores norm weights as offsets from 1 (applied as 1 + w).
    let (shape, norm) = tensor_f32(&f, "output_norm.weight").unwrap();
    assert_eq!(shape, vec![640]);
    assert!(norm.iter().all(|x| x.is_finite()));
}

#[test]
fn real_model_dequantizes_completely() {
    let f = open();
    let max = f.tensors().iter().map(|t| t.n_elements).max().unwrap() as usize;
    let mut buf = vec![0f32; max];
    let start = Instant::now();
    let mut total = 0u64;
    for t in f.tensors() {
        let n = t.n_elements as usize;
        let out = &mut buf[..n];
        dequantize(t.ggml_type, f.tensor_data(t).unwrap(), n, out).unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "{}", t.name);
        total += t.n_elements;
    }
    eprintln!(
        "dequantized {total} elements of {} tensors in {:?} (including finiteness checks)",
        f.tensors().len(),
        start.elapsed()
    );
    assert!(total > 250_000_000);
}
