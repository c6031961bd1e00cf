//! Writes a small safetensors file with every dtype (used by
//! scripts/check_safetensors_compat.py), or dumps one given with `--read`.
//!
//! usage: safetensors_sample OUT.safetensors | safetensors_sample --read IN

use std::collections::BTreeMap;
use std::path::Path;

use hayai_core::{write_safetensors, DType, SafeTensors};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, path] if flag == "--read" => {
            let st = SafeTensors::open(Path::new(path))?;
            for name in st.names() {
                let t = st.get(name).ok_or("vanished")?;
                println!("{name} {} {:?} {:?}", t.dtype, t.shape, t.to_f32_vec()?);
            }
            for (k, v) in st.metadata() {
                println!("meta {k}={v}");
            }
        }
        [path] => {
            let f: Vec<u8> = [1.0f32, -2.5, 3.25, 0.0, 5.0, 6.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            let bf: Vec<u8> = [0x3f80u16, 0xc0a0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            let hf: Vec<u8> = [0x3c00u16, 0xc000, 0x3800]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            let i32s: Vec<u8> = [7i32, -1].iter().flat_map(|x| x.to_le_bytes()).collect();
            let i64s: Vec<u8> = [-3i64].iter().flat_map(|x| x.to_le_bytes()).collect();
            let f64s: Vec<u8> = [0.5f64].iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut meta = BTreeMap::new();
            meta.insert("format".to_string(), "pt".to_string());
            write_safetensors(
                Path::new(path),
                &[
                    ("f32".into(), DType::F32, vec![2, 3], &f),
                    ("bf16".into(), DType::BF16, vec![2], &bf),
                    ("f16".into(), DType::F16, vec![3, 1], &hf),
                    ("i32".into(), DType::I32, vec![2], &i32s),
                    ("i64".into(), DType::I64, vec![1], &i64s),
                    ("u8".into(), DType::U8, vec![3], &[1, 2, 255]),
                    ("i8".into(), DType::I8, vec![1], &[0xfe]),
                    ("bool".into(), DType::Bool, vec![2], &[1, 0]),
                    ("f64".into(), DType::F64, vec![], &f64s),
                ],
                Some(meta),
            )?;
        }
        _ => return Err("usage: safetensors_sample OUT | --read IN".into()),
    }
    Ok(())
}
