//! Opens a GGUF file, prints a summary and times dequantizing every tensor.
//!
//! usage: cargo run --release -p hayai-core --example gguf_dequant_all -- MODEL.gguf

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use hayai_core::{dequantize, GgufFile};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .ok_or("usage: gguf_dequant_all MODEL.gguf")?;
    let t0 = Instant::now();
    let f = GgufFile::open(&path)?;
    let open_time = t0.elapsed();
    println!(
        "{}: GGUF v{}, {} metadata keys, {} tensors, data at {} (parsed in {:?})",
        path.display(),
        f.version(),
        f.metadata().len(),
        f.tensors().len(),
        f.data_offset(),
        open_time
    );
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let e = by_type.entry(t.ggml_type.to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    for (ty, (n, bytes)) in &by_type {
        println!("  {ty:>6}: {n:4} tensors, {bytes:>12} bytes");
    }
    let max = f.tensors().iter().map(|t| t.n_elements).max().unwrap_or(0) as usize;
    let mut buf = vec![0f32; max];
    // Touch the buffer and the mapping once so the timing measures
    // dequantization, not page faults of a cold file.
    for t in f.tensors() {
        std::hint::black_box(f.tensor_data(t)?.iter().step_by(4096).count());
    }
    for run in 0..3 {
        let t0 = Instant::now();
        let mut total = 0u64;
        for t in f.tensors() {
            let n = t.n_elements as usize;
            dequantize(t.ggml_type, f.tensor_data(t)?, n, &mut buf[..n])?;
            total += t.n_elements;
        }
        let dt = t0.elapsed();
        println!(
            "run {run}: dequantized {total} elements in {dt:?} ({:.2} Gelem/s, {} threads)",
            total as f64 / dt.as_secs_f64() / 1e9,
            rayon::current_num_threads()
        );
    }
    Ok(())
}
