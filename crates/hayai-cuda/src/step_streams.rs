//! The streamed decode step's weights (docs/streamed-step.md, step 1): every GEMV of a decode
//! step, fused as the GPU stores it (`runner::fuse_host`: QKV concatenated, gate/up interleaved
//! row by row, int4 or bf16), in the order the step runs them, laid out as per-SM streams by
//! [`stream_layout::build`]; the streamed step (`runner/stream.rs`) uploads them. The tests hold
//! every operation to the model's own matrices.

use hayai_model::Model;

use crate::runner::{fuse_host, HostMat};
use crate::stream_layout::{self, StreamOp, Streams, Weights};
use crate::{CudaError, Quant};

/// The step's GEMVs: their labels (the launch plan's names) and per-SM streams.
pub struct StepStreams {
    pub labels: Vec<&'static str>,
    pub streams: Streams,
}

/// The decode step's GEMVs in the order it runs them (the launch plan's): the per-layer-embedding
/// model projection (Gemma 4), per layer QKV (Q alone on KV-shared layers), O, gate/up (GeGLU),
/// down and, with per-layer embeddings, their gate and projection; lm_head last.
fn step_mats(model: &Model, quant: Quant) -> Result<Vec<(&'static str, HostMat, bool)>, CudaError> {
    let spec = &model.spec;
    let w = &model.weights;
    let mut out = Vec::new();
    if let Some(p) = &w.ple {
        out.push((
            "gemv.ple_model",
            fuse_host(&[&p.model_proj], false, quant)?,
            false,
        ));
    }
    for (i, (ls, lw)) in spec.layers.iter().zip(&w.layers).enumerate() {
        let qkv = if ls.owns_kv(i) {
            let (k, v) = lw.k.as_ref().zip(lw.v.as_ref()).ok_or_else(|| {
                CudaError::Model(hayai_model::ModelError::MissingTensor(format!(
                    "layers.{i}.k/v"
                )))
            })?;
            fuse_host(&[&lw.q, k, v], false, quant)?
        } else {
            fuse_host(&[&lw.q], false, quant)?
        };
        out.push(("gemv.qkv", qkv, false));
        out.push(("gemv.o", fuse_host(&[&lw.o], false, quant)?, false));
        out.push((
            "gemv.gate_up",
            fuse_host(&[&lw.gate, &lw.up], true, quant)?,
            true,
        ));
        out.push(("gemv.down", fuse_host(&[&lw.down], false, quant)?, false));
        if let Some(p) = &lw.ple {
            out.push(("gemv.ple_gate", fuse_host(&[&p.gate], false, quant)?, false));
            out.push(("gemv.ple_proj", fuse_host(&[&p.proj], false, quant)?, false));
        }
    }
    // Whole along K: the argmax reads one logit vector.
    out.push((
        "gemv.lm_head",
        fuse_host(&[w.lm_head()], false, quant)?,
        true,
    ));
    Ok(out)
}

/// The most K splits a streamed GEMV may take (0: as [`stream_layout::k_splits`] chooses), by
/// its label; the launch plan takes the same caps. A GEMV's consumers read every split's partial
/// vector, which `k_splits` does not weigh. Default: the O projection at most 2 (on E4B
/// `k_splits` would take 4; 2 measured 0.1-0.6% faster, 1 1.1% slower: docs/performance.md,
/// thirty-second session). `HAYAI_STREAM_SPLITS_CAP="gemv.down=2,gemv.qkv=1"` (a measurement
/// setting) sets caps by label, 0 lifting one.
pub fn splits_cap(label: &str) -> usize {
    if let Ok(spec) = std::env::var("HAYAI_STREAM_SPLITS_CAP") {
        for item in spec.split(',') {
            if let Some((l, v)) = item.split_once('=') {
                if l.trim() == label {
                    if let Ok(v) = v.trim().parse() {
                        return v;
                    }
                }
            }
        }
    }
    if label == "gemv.o" {
        2
    } else {
        0
    }
}

/// Every SM's stream of the step's GEMVs for `n_sm` SMs of `warps` consumer warps. All of them
/// must take one cell format: int4 needs every width a multiple of 128 (else a clear error).
/// `head_int8`: the output head as these int8 blocks instead (int8 cells in a bf16 stream,
/// [`CudaOptions::lm_head`]). `skip`: labels of GEMVs left out (the streamed step's timing
/// probe, `HAYAI_STREAM_PROBE_SKIP`).
///
/// [`CudaOptions::lm_head`]: crate::CudaOptions::lm_head
pub fn step_streams(
    model: &Model,
    quant: Quant,
    n_sm: usize,
    warps: usize,
    head_int8: Option<&crate::quant::Int8Matrix>,
    skip: &[String],
) -> Result<StepStreams, CudaError> {
    let mut mats = step_mats(model, quant)?;
    mats.retain(|(label, _, _)| !skip.iter().any(|s| s == label));
    let ops: Vec<StreamOp> = mats
        .iter()
        .map(|(label, m, whole)| {
            let weights = match m {
                _ if *label == "gemv.lm_head" && head_int8.is_some() => {
                    Weights::Int8(head_int8.expect("checked"))
                }
                HostMat::Int4(q) => Weights::Int4(q),
                HostMat::Bf16 { rows, cols, bits } => Weights::Bf16 {
                    rows: *rows,
                    cols: *cols,
                    bits,
                },
            };
            StreamOp {
                weights,
                whole: *whole,
                // The projection runs right after its gate (the launch plan's order).
                after_prev: *label == "gemv.ple_proj",
                max_splits: splits_cap(label),
            }
        })
        .collect();
    let streams = stream_layout::build(&ops, n_sm, warps)
        .map_err(|e| CudaError::Unsupported(format!("streamed step: {e}")))?;
    Ok(StepStreams {
        labels: mats.iter().map(|(l, _, _)| *l).collect(),
        streams,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{quantize_int4, to_bf16_bits};
    use crate::stream_layout::walk;
    use crate::synth::{random_model_bf16, small_spec};
    use hayai_model::spec::Arch;
    use hayai_model::weights::Matrix;

    /// `m x` of one model matrix as the step stores it (int4: dequantized RTN; bf16: rounded).
    fn product(m: &Matrix, x: &[f32], quant: Quant) -> Vec<f32> {
        let w = match quant {
            Quant::Int4 => quantize_int4(m).dequantize(),
            Quant::Bf16 => Matrix::from_bf16_bits(m.rows, m.cols, to_bf16_bits(m)),
        };
        let mut y = vec![0.0; w.rows];
        w.matvec(x, &mut y);
        y
    }

    fn input(n: usize) -> Vec<f32> {
        (0..n).map(|i| (0.29 * i as f32).cos() - 0.2).collect()
    }

    #[test]
    fn step_streams_hold_every_gemv_of_the_model_in_plan_order() {
        let mut spec = small_spec(Arch::Gemma4);
        spec.vocab = 1024; // lm_head rows: whole 16-row cells
        if let Some(p) = spec.ple.as_mut() {
            p.vocab = 1024;
        }
        let model = random_model_bf16(&spec, 5);
        let w = &model.weights;
        for quant in [Quant::Int4, Quant::Bf16] {
            let st = step_streams(&model, quant, 13, 12, None, &[]).unwrap();
            // The model's own matrices, fused the way each operation's rows are.
            let mut want: Vec<(&str, Vec<f32>)> = Vec::new();
            let mut check = |label: &'static str, y: Vec<f32>| want.push((label, y));
            let ple = w.ple.as_ref().unwrap();
            let x = input(ple.model_proj.cols);
            check("gemv.ple_model", product(&ple.model_proj, &x, quant));
            for (i, (ls, lw)) in spec.layers.iter().zip(&w.layers).enumerate() {
                let x = input(lw.q.cols);
                let mut y = product(&lw.q, &x, quant);
                if ls.owns_kv(i) {
                    y.extend(product(lw.k.as_ref().unwrap(), &x, quant));
                    y.extend(product(lw.v.as_ref().unwrap(), &x, quant));
                }
                check("gemv.qkv", y);
                check("gemv.o", product(&lw.o, &input(lw.o.cols), quant));
                let x = input(lw.gate.cols);
                let (g, u) = (product(&lw.gate, &x, quant), product(&lw.up, &x, quant));
                let p = lw.ple.as_ref().unwrap();
                let gu: Vec<f32> = g.iter().zip(&u).flat_map(|(a, b)| [*a, *b]).collect();
                check("gemv.gate_up", gu);
                check("gemv.down", product(&lw.down, &input(lw.down.cols), quant));
                check(
                    "gemv.ple_gate",
                    product(&p.gate, &input(p.gate.cols), quant),
                );
                check(
                    "gemv.ple_proj",
                    product(&p.proj, &input(p.proj.cols), quant),
                );
            }
            check(
                "gemv.lm_head",
                product(w.lm_head(), &input(w.embed.cols), quant),
            );

            assert_eq!(st.labels, want.iter().map(|(l, _)| *l).collect::<Vec<_>>());
            for (i, (label, y)) in want.iter().enumerate() {
                let plan = &st.streams.ops[i];
                let x = input(plan.k);
                let got = walk(&st.streams, i, &x);
                let rel = crate::check::compare_rows(&[got], std::slice::from_ref(y)).2;
                assert!(rel < 1e-5, "{quant:?} op {i} ({label}): rel L2 {rel}");
            }
        }
    }

    #[test]
    fn widths_int4_cannot_store_are_an_error() {
        // A model whose per-layer-embedding width is not a multiple of 128 leaves that matrix
        // bf16 under int4, and a stream holds one cell format.
        let mut spec = small_spec(Arch::Gemma4);
        spec.vocab = 1024;
        if let Some(p) = spec.ple.as_mut() {
            p.vocab = 1024;
            p.dim = 64;
        }
        let model = random_model_bf16(&spec, 6);
        let err = step_streams(&model, Quant::Int4, 13, 12, None, &[])
            .err()
            .expect("an error");
        assert!(err.to_string().contains("cell format"), "{err}");
    }
}
