//! What a [`super::CudaRunner`] is built with: the weight format and the decode-kernel choices.

use crate::CudaError;

/// Weight format of the projections on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    Bf16,
    /// int4, group 128, bf16 scales (matrices whose width is not a multiple of 128 stay bf16).
    Int4,
}

impl Quant {
    pub fn name(&self) -> &'static str {
        match self {
            Quant::Bf16 => "bf16",
            Quant::Int4 => "int4",
        }
    }
}

impl std::str::FromStr for Quant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bf16" => Ok(Quant::Bf16),
            "int4" => Ok(Quant::Int4),
            _ => Err(format!(
                "unknown quantization `{s}` (expected bf16 or int4)"
            )),
        }
    }
}

/// Whether the decode step runs as the streamed step ([`CudaOptions::streamed_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamedStep {
    /// The launch plan: one kernel per operation, replayed as a CUDA graph.
    Off,
    /// The streamed step where it can run here as measured, else the launch plan: no
    /// launch-plan variant asked for ([`CudaOptions::launch_plan_variant`]), its deepest ring
    /// (the one measured against the launch plan) fits this GPU's shared memory, and the runner
    /// with it builds (the weights' second copy fits, every matrix has whole cells).
    /// [`super::CudaRunner::new`] decides; [`super::CudaRunner::options`] says how.
    Auto,
    /// The streamed step, or an error saying why it cannot run here.
    On,
}

/// The decode step's output head ([`CudaOptions::lm_head`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmHead {
    /// In the weights' format (`--quant`): bf16-rounded, or int4.
    Quant,
    /// int8 blocks of 32 with f16 scales (GGML's Q8_0), the model's own values where its head
    /// is exactly so (a GGUF file's Q8_0 `token_embd`: the real Gemma 3 270M's); `--quant bf16`
    /// only; an error where the head has no such form.
    Int8,
    /// [`LmHead::Int8`] where it applies (`--quant bf16` and a head exactly int8), else
    /// [`LmHead::Quant`]: the file's values where it stores them so. With a step that has no
    /// int8 head (the single-kernel step, the persistent GEMV) and a head that is int8, an error
    /// (greedy output must not depend on the step's kind). [`super::CudaRunner::new`] decides;
    /// [`super::CudaRunner::options`] says how.
    Auto,
}

impl LmHead {
    /// The int8 blocks of `head` this choice takes for `quant` (None: the head in the weights'
    /// format), or an error where `Int8` is asked of a head without them.
    pub fn int8_blocks(
        self,
        quant: Quant,
        head: &hayai_model::Matrix,
    ) -> Result<Option<crate::quant::Int8Matrix>, CudaError> {
        match self {
            LmHead::Quant => Ok(None),
            LmHead::Auto if quant != Quant::Bf16 => Ok(None),
            LmHead::Auto => Ok(crate::quant::int8_exact(head)),
            LmHead::Int8 => crate::quant::int8_exact(head).map(Some).ok_or_else(|| {
                CudaError::Unsupported(
                    "--lm-head int8: the model's output head is not int8 blocks of 32 with f16 \
                     scales exactly (a GGUF file's Q8_0 tensor is)"
                        .into(),
                )
            }),
        }
    }
}

#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub quant: Quant,
    /// Longest sequence; default `min(spec.max_context, 8192)`.
    pub max_context: Option<usize>,
    pub device_ordinal: usize,
    /// Replay the step as a CUDA graph (default); off launches kernels one by one (for checks).
    pub use_graph: bool,
    /// Programmatic dependent launch on sm_90+ (default): a decode kernel may start while the
    /// previous one finishes, requesting its weights before it waits for the previous results.
    /// Ignored on older GPUs.
    pub pdl: bool,
    /// GEMV kernel: persistent (grid the GPU holds at once, prologue once per block, warps loop
    /// over row octets) or tiled (one 64-row tile per block).
    pub persistent_gemv: bool,
    /// Per-layer-embedding gate and projection GEMVs as one launch with a grid-wide barrier
    /// (`gemv_pair`): 42 fewer launches per E4B step, same arithmetic. Off until measured.
    pub fuse_ple: bool,
    /// Tiled GEMV with 8 instead of 4 16-byte loads in flight per lane (`gemv_u8`): fewer
    /// dependent round trips per row, more registers; same arithmetic. Off until measured.
    pub gemv_unroll8: bool,
    /// Decode attention pulls its first K/V tile into L2 before waiting for the previous kernel
    /// (a prefetch hint; results unchanged). Off until measured.
    pub attn_prefetch: bool,
    /// Decode attention copies its K/V tile into shared memory with cp.async before waiting for
    /// the previous kernel (`attn_split_tile`; same arithmetic, bit-identical results), so the
    /// cache reads overlap the QKV GEMV's tail and the query norm. Off until measured.
    pub attn_smem_tile: bool,
    /// Decode attention compiled for the head dim (`attn_split_hd256` / `attn_split_hd512`;
    /// 80 / 128 registers against 159): the same arithmetic without the guards and
    /// predicated-off lanes of the dims a head does not have; other head dims use the run-time
    /// kernel. `None` (the default): by quantization, see [`CudaOptions::uses_head_dim_attention`].
    pub attn_by_head_dim: Option<bool>,
    /// With `attn_by_head_dim`: the p.V phase by warps (`attn_split_wv_hd256/512`: each warp a
    /// quarter of the keys with float4 rows, the four sums added at the end) instead of one
    /// thread per dimension over every key. Sums in another order (tolerance, not bit
    /// identity). On by default (measured +1.2% on top of `attn_by_head_dim`).
    pub attn_warp_values: bool,
    /// With `attn_warp_values`, 8 or 32 (0: off): of the plan's splits (the longest context's
    /// keys / 32, up to 128) only as many take part as give each at least this many keys of the
    /// current context (`attn_split_wv_hd*_k8` / `_k32`), so a server sized for 8,192 tokens
    /// does not cut a 300-token context into 128 pieces of 2-3 keys and merge them all. Split
    /// boundaries then depend on the context only, not on `max_context` (sums in another order:
    /// tolerance). 32 by default: measured on the H200 (E4B int4, server plan of 8,192 tokens)
    /// 392.1 -> 403.4 tok/s (8: 401.6); on the benchmark's own 640-token plan 405.1 against
    /// 406.1-409.0 (docs/performance.md, seventh session).
    pub attn_min_keys: usize,
    /// int4 GEMVs with the activation quantized to int8 per 128 columns: on tensor cores
    /// (the default) `gemv_mma_a8` / `gemv_mma_kw_a8` (integer mma, exact int32 sums), with
    /// `tensor_core_gemv` off `gemv_a8` (DP4A on CUDA cores). Changes the arithmetic: its CPU
    /// reference is `MatmulInputs::Int8 { group: 128 }` (PPL cost on the real 270M: +0.23%,
    /// docs/performance.md). Off: measured on the H200 410.4 (tensor cores) and 411.7 (DP4A)
    /// against 409.8 tok/s, not worth the arithmetic change.
    pub int8_activations: bool,
    /// int4 GEMVs on tensor cores (`gemv_mma`, kernels/gemv_mma.cu): nibble pairs turned into
    /// exact bf16 pairs, x entering as a bf16 pair (16 significant bits, relative error
    /// <= 2^-17), ~1.4 instead of ~3.4 instructions per weight. Its CPU twin is
    /// `MatmulInputs::Bf16Pair`. On by default (measured +15% on E4B shapes, H200); any other
    /// GEMV variant asked for (persistent, single kernel, int8 activations, 8 loads in flight,
    /// fused PLE) takes precedence: see [`CudaOptions::uses_tensor_cores`].
    pub tensor_core_gemv: bool,
    /// With tensor cores: stream the weights through a 3-stage cp.async ring in shared memory
    /// (`gemv_mma_ring`, 6 groups ahead: 48 KB per block, 2 blocks per SM) instead of a 2-deep register
    /// pipeline. Same products in the same order (bit-identical). Off until measured.
    pub tensor_core_ring: bool,
    /// With tensor cores: matrices up to 8 MB that would be split along K (E4B: QKV, O, the PLE
    /// gate) run with 16-row tiles shared by up to 8 warps along K (`gemv_mma_kw`), the block's
    /// rows 128 / k, K summed inside the block and never split across blocks — no partial
    /// stores, counter or second pass. Same products, another order of the K sums
    /// (tolerance). On by default.
    pub tensor_core_kwarps: bool,
    /// The whole decode step as one persistent kernel (kernels/step.cu): grid-wide barriers
    /// between operations, each warp streaming its share of every GEMV's weights through a
    /// shared-memory ring ahead of the computation. Its K splits differ from the launch plan's,
    /// so its sums are ordered differently (same tolerance to the CPU reference).
    pub single_kernel: bool,
    /// The whole decode step as the streamed step (kernels/stream_step.cu, docs/streamed-step.md):
    /// one block per SM whose producer warp streams the SM's share of every GEMV's weights (laid
    /// out per SM at load, a second copy of the weights) into a shared-memory ring while its
    /// consumer warps run the single-kernel step's operations (attention its own way: by KV head,
    /// keys staged before the wait), each waiting for every SM to finish the one before. int4
    /// with int8 activations (W4A8, with [`CudaOptions::int8_activations`]), int4 times x as a
    /// 23-bit fixed point per 128 columns on the integer tensor cores (W4A16, without it: each
    /// x within 2^-22 of its group's largest |x|), or bf16 weights times float activations on
    /// the CUDA cores (the CPU reference's arithmetic in another summation order); its K splits
    /// are the stream layout's. `Off` in this library's default (callers choose; the `hayai`
    /// commands default to `Auto`: docs/performance.md measures it faster in every format).
    pub streamed_step: StreamedStep,
    /// Each kernel of the decode step pulls into L2 the weights of the `l2_prefetch`-th GEMV
    /// after it (0: off; matrices over 32 MB, the int4/bf16 lm_head, are never prefetched), so
    /// DRAM streams the next matrix while the dependent chain of the current kernel runs. A
    /// hint: results unchanged.
    pub l2_prefetch: usize,
    /// Each GEMV's blocks pull the whole matrix into L2 (split among them) before waiting for
    /// the previous kernel, so its later weight batches hit L2 instead of each costing a DRAM
    /// round trip (`l2_prefetch` 0 only; same 32 MB limit). A hint: results unchanged.
    pub l2_prefetch_own: bool,
    /// Each decode attention launch pulls into L2 the weights of the `l2_prefetch_attn`-th GEMV
    /// after it (0: off; 2: the gate/up projection, after O), before it waits for QKV: attention
    /// reads almost nothing from DRAM, so the gate/up weights could arrive while attention and
    /// O run. A hint: results unchanged. Off until measured.
    pub l2_prefetch_attn: usize,
    /// Feed prompts through the batched tensor-core path (`prefill.rs`) instead of one decode
    /// step per token. Its logits agree with the decode path to bf16 rounding, not bit for bit.
    pub batched_prefill: bool,
    /// The output head ([`LmHead`]). As int8 with an f16 scale per 32 columns where the model's
    /// head is exactly so (a GGUF file's Q8_0 `token_embd`: the real Gemma 3 270M's) instead of
    /// rounded to bf16: the file's own values, 178 instead of 335 MB a step on the 270M (real
    /// 270M, H200: the streamed step 2,116-2,124 -> 2,248-2,253 tok/s, the launch plan 1,609 ->
    /// 1,635; docs/performance.md, forty-fifth session). With `--quant bf16`, in the launch plan
    /// (`gemv_q8`) and the streamed step (int8 cells in the bf16 stream, their scales copied
    /// beside each ring chunk); the batched prefill keeps the bf16 head, as its GEMMs round
    /// every weight to bf16. The library's default is [`LmHead::Quant`]; the `hayai` commands'
    /// is [`LmHead::Auto`].
    pub lm_head: LmHead,
    /// Batched prefill with each GEMM input split into two bf16 parts (value and remainder):
    /// 16 significant bits per activation (relative error <= 2^-17) at twice the tensor-core
    /// work. For checks (its CPU twin is `MatmulInputs::Bf16Pair`); off by default.
    pub precise_prefill: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            quant: Quant::Int4,
            max_context: None,
            device_ordinal: 0,
            use_graph: true,
            pdl: true,
            // Measured on the H200 (docs/performance.md): the tiled kernel is ~7% faster.
            persistent_gemv: false,
            fuse_ple: false,
            gemv_unroll8: false,
            attn_prefetch: false,
            attn_smem_tile: false,
            attn_by_head_dim: None,
            attn_warp_values: true,
            // Measured on the H200: the server's plan 392.1 -> 403.4 tok/s.
            attn_min_keys: 32,
            int8_activations: false,
            // Measured on the H200: 384.7 against 334.2 tok/s (docs/performance.md).
            tensor_core_gemv: true,
            tensor_core_ring: false,
            // Measured on the H200: 385 -> 393 tok/s (docs/performance.md).
            tensor_core_kwarps: true,
            single_kernel: false,
            streamed_step: StreamedStep::Off,
            l2_prefetch: 0,
            l2_prefetch_own: false,
            l2_prefetch_attn: 0,
            batched_prefill: true,
            precise_prefill: false,
            lm_head: LmHead::Quant,
        }
    }
}

impl CudaOptions {
    /// Whether the step runs as the streamed step (`On`; `Auto` is decided by
    /// [`super::CudaRunner::new`], and until then these methods answer for the launch plan).
    pub fn streamed(&self) -> bool {
        self.streamed_step == StreamedStep::On
    }

    /// The first launch-plan variant these options ask for (an option away from its default
    /// that only the launch plan honours), as its command-line flag: with one, `Auto` keeps the
    /// launch plan. None: none asked for.
    pub fn launch_plan_variant(&self) -> Option<&'static str> {
        let d = CudaOptions::default();
        [
            (!self.pdl, "--no-pdl"),
            (self.persistent_gemv, "--persistent-gemv"),
            (self.fuse_ple, "--fuse-ple"),
            (self.gemv_unroll8, "--gemv-unroll8"),
            (self.attn_prefetch, "--attn-prefetch"),
            (self.attn_smem_tile, "--attn-tile"),
            (
                self.attn_by_head_dim.is_some(),
                "--attn-runtime-hd / --attn-hd-kernels",
            ),
            (
                self.attn_warp_values != d.attn_warp_values,
                "--no-attn-warp-values",
            ),
            (self.attn_min_keys != d.attn_min_keys, "--attn-min-keys"),
            (self.tensor_core_gemv != d.tensor_core_gemv, "--no-tc-gemv"),
            (self.tensor_core_ring, "--tc-ring"),
            (
                self.tensor_core_kwarps != d.tensor_core_kwarps,
                "--no-tc-kwarps",
            ),
            (self.single_kernel, "--single-kernel"),
            (self.l2_prefetch != d.l2_prefetch, "--l2-prefetch"),
            (self.l2_prefetch_own, "--l2-prefetch-own"),
            (
                self.l2_prefetch_attn != d.l2_prefetch_attn,
                "--l2-prefetch-attn",
            ),
        ]
        .into_iter()
        .find_map(|(on, flag)| on.then_some(flag))
    }

    /// Whether the int4 decode GEMVs run on tensor cores (`gemv_mma`): asked for, int4, and no
    /// other GEMV variant asked for (those are explicit choices; the tensor-core one is a
    /// default).
    pub fn uses_tensor_cores(&self) -> bool {
        self.tensor_core_gemv
            && self.quant == Quant::Int4
            && !(self.persistent_gemv
                || self.single_kernel
                || self.streamed()
                || self.gemv_unroll8
                || self.fuse_ple)
    }

    /// Whether decode attention runs compiled for its head dim ([`CudaOptions::attn_by_head_dim`]).
    /// By default for int4 only: measured on the H200 (E4B shapes), int4 368.9 -> 386.6 tok/s with
    /// p.V by warps, bf16 187.3 -> 177.4 (the same builds otherwise, one machine).
    pub fn uses_head_dim_attention(&self) -> bool {
        self.attn_by_head_dim.unwrap_or(self.quant == Quant::Int4)
    }

    /// Whether the int4 decode GEMVs take int8 activations (`gemv_mma_a8` on tensor cores,
    /// else `gemv_a8`).
    pub fn uses_int8_activations(&self) -> bool {
        self.quant == Quant::Int4
            && self.int8_activations
            && !(self.persistent_gemv || self.single_kernel)
    }

    /// A combination of options the decode step cannot run as asked, in words (None: none).
    /// `fuse_ple` runs the PLE gate and projection as `gemv_pair`, which has no int8-activation
    /// form, so with int8 activations those two products would not be what the CPU twin
    /// (`check::decode_matmul_inputs`: int8 for every product) computes.
    pub fn conflict(&self) -> Option<String> {
        if self.lm_head == LmHead::Int8 {
            if self.quant != Quant::Bf16 {
                return Some("--lm-head int8 is for --quant bf16".into());
            }
            if self.single_kernel || self.persistent_gemv {
                return Some(
                    "--lm-head int8 runs in the launch plan's tiled GEMV and the streamed step: \
                     not with --single-kernel or --persistent-gemv"
                        .into(),
                );
            }
        }
        (self.fuse_ple && self.uses_int8_activations() && !self.streamed()).then(|| {
            "--fuse-ple (the PLE gate and projection as one launch, gemv_pair) has no int8 \
             activations: not with --quant int4-a8 / --int8-activations"
                .to_string()
        })
    }

    /// The decode GEMV in use, in words (benchmark reports).
    pub fn gemv_name(&self) -> &'static str {
        if self.streamed() && self.quant == Quant::Bf16 {
            "streamed step (bf16 weights, float activations)"
        } else if self.streamed() && self.uses_int8_activations() {
            "streamed step (W4A8, integer mma)"
        } else if self.streamed() {
            "streamed step (int4 weights, 23-bit fixed-point activations, integer mma)"
        } else if self.single_kernel {
            "single-kernel step"
        } else if self.persistent_gemv {
            "persistent"
        } else if self.uses_tensor_cores() && self.uses_int8_activations() {
            "tiled, tensor cores, int8 activations (W4A8, integer mma)"
        } else if self.uses_tensor_cores() && self.tensor_core_ring {
            "tiled, tensor cores, cp.async ring"
        } else if self.uses_tensor_cores() && self.tensor_core_kwarps {
            "tiled, tensor cores (bf16-pair activations; small matrices: K shared by warps)"
        } else if self.uses_tensor_cores() {
            "tiled, tensor cores (bf16-pair activations)"
        } else if self.uses_int8_activations() {
            "tiled, int8 activations (DP4A)"
        } else if self.gemv_unroll8 {
            "tiled, 8 loads in flight"
        } else {
            "tiled"
        }
    }
}

/// Extra ring slots of sliding layers beyond the window, so a rollback ([`Runner::truncate`]) of
/// up to this many positions keeps the window intact.
pub const RING_SLACK: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_cores_are_the_int4_default_and_yield_to_explicit_variants() {
        let o = CudaOptions::default();
        assert!(o.uses_tensor_cores());
        assert_eq!(
            o.gemv_name(),
            "tiled, tensor cores (bf16-pair activations; small matrices: K shared by warps)"
        );
        let split_k = CudaOptions {
            tensor_core_kwarps: false,
            ..o.clone()
        };
        // Attention compiled for the head dim: the int4 default, not bf16's, unless asked.
        assert!(o.uses_head_dim_attention());
        let b = |hd| CudaOptions {
            quant: Quant::Bf16,
            attn_by_head_dim: hd,
            ..o.clone()
        };
        assert!(!b(None).uses_head_dim_attention() && b(Some(true)).uses_head_dim_attention());
        assert_eq!(
            split_k.gemv_name(),
            "tiled, tensor cores (bf16-pair activations)"
        );
        let bf16 = CudaOptions {
            quant: Quant::Bf16,
            ..o.clone()
        };
        assert!(!bf16.uses_tensor_cores());
        let a8 = CudaOptions {
            int8_activations: true,
            ..o.clone()
        };
        // int8 activations run on the integer tensor cores unless those are turned off.
        assert!(a8.uses_tensor_cores() && a8.uses_int8_activations());
        assert_eq!(
            a8.gemv_name(),
            "tiled, tensor cores, int8 activations (W4A8, integer mma)"
        );
        let a8_dp4a = CudaOptions {
            tensor_core_gemv: false,
            ..a8.clone()
        };
        assert!(!a8_dp4a.uses_tensor_cores() && a8_dp4a.uses_int8_activations());
        assert_eq!(a8_dp4a.gemv_name(), "tiled, int8 activations (DP4A)");
        for v in [
            CudaOptions {
                persistent_gemv: true,
                ..o.clone()
            },
            CudaOptions {
                single_kernel: true,
                ..o.clone()
            },
            CudaOptions {
                gemv_unroll8: true,
                ..o.clone()
            },
            CudaOptions {
                fuse_ple: true,
                ..o.clone()
            },
        ] {
            assert!(!v.uses_tensor_cores(), "{}", v.gemv_name());
        }
        let cuda_cores = CudaOptions {
            tensor_core_gemv: false,
            ..o
        };
        assert!(!cuda_cores.uses_tensor_cores());
        assert_eq!(cuda_cores.gemv_name(), "tiled");
    }

    #[test]
    fn auto_keeps_the_launch_plan_for_its_variants_only() {
        let d = CudaOptions::default();
        assert_eq!(d.launch_plan_variant(), None);
        // Neither the format, the step's own choices nor the context size are launch-plan
        // variants.
        let o = CudaOptions {
            quant: Quant::Bf16,
            int8_activations: true,
            max_context: Some(4096),
            use_graph: false,
            streamed_step: StreamedStep::Auto,
            batched_prefill: false,
            ..d.clone()
        };
        assert_eq!(o.launch_plan_variant(), None);
        assert!(!o.streamed(), "Auto is undecided until the runner builds");
        for (o, flag) in [
            (
                CudaOptions {
                    pdl: false,
                    ..d.clone()
                },
                "--no-pdl",
            ),
            (
                CudaOptions {
                    persistent_gemv: true,
                    ..d.clone()
                },
                "--persistent-gemv",
            ),
            (
                CudaOptions {
                    tensor_core_gemv: false,
                    ..d.clone()
                },
                "--no-tc-gemv",
            ),
            (
                CudaOptions {
                    attn_min_keys: 8,
                    ..d.clone()
                },
                "--attn-min-keys",
            ),
            (
                CudaOptions {
                    attn_by_head_dim: Some(true),
                    ..d.clone()
                },
                "--attn-runtime-hd / --attn-hd-kernels",
            ),
            (
                CudaOptions {
                    l2_prefetch_attn: 2,
                    ..d.clone()
                },
                "--l2-prefetch-attn",
            ),
            (
                CudaOptions {
                    single_kernel: true,
                    ..d.clone()
                },
                "--single-kernel",
            ),
        ] {
            assert_eq!(o.launch_plan_variant(), Some(flag));
        }
        let on = CudaOptions {
            streamed_step: StreamedStep::On,
            ..d
        };
        assert!(on.streamed() && !on.uses_tensor_cores());
    }

    #[test]
    fn the_fused_ple_launch_refuses_int8_activations() {
        let fused = CudaOptions {
            fuse_ple: true,
            ..CudaOptions::default()
        };
        assert!(fused.conflict().is_none());
        let a8 = CudaOptions {
            int8_activations: true,
            ..fused.clone()
        };
        assert!(a8.conflict().unwrap().contains("--fuse-ple"));
        // The streamed step (its own PLE operations) and int4-a8 without fusion are fine.
        for ok in [
            CudaOptions {
                streamed_step: StreamedStep::On,
                ..a8.clone()
            },
            CudaOptions {
                fuse_ple: false,
                ..a8.clone()
            },
            CudaOptions {
                quant: Quant::Bf16,
                ..a8
            },
        ] {
            assert!(ok.conflict().is_none());
        }
    }

    /// `LmHead` decides by the head's values: int8 blocks only where every block of 32 is
    /// exactly `q * d` (an f16 d), `Auto` only with bf16 weights, `Int8` an error otherwise.
    #[test]
    fn the_head_is_int8_only_where_its_blocks_are_exact() {
        let d = half::f16::from_f32(0.01).to_f32();
        let exact: Vec<f32> = (0..2 * 64)
            // Each block's largest |q| is 127, as Q8_0's quantization makes it.
            .map(|i| {
                if i % 32 == 0 {
                    127.0 * d
                } else {
                    ((i * 37 % 255) as f32 - 127.0) * d
                }
            })
            .collect();
        let exact = hayai_model::Matrix::from_f32(2, 64, exact);
        let mut off = exact.to_f32();
        off[5] += 1e-4;
        let off = hayai_model::Matrix::from_f32(2, 64, off);
        // Inexact in the last row only (past the first row's early refusal).
        let mut late = exact.to_f32();
        late[127] += 1e-4;
        let late = hayai_model::Matrix::from_f32(2, 64, late);
        let q = |h: LmHead, quant, m| h.int8_blocks(quant, m).map(|b| b.is_some());
        assert!(q(LmHead::Auto, Quant::Bf16, &exact).unwrap());
        assert!(q(LmHead::Int8, Quant::Bf16, &exact).unwrap());
        assert!(!q(LmHead::Auto, Quant::Int4, &exact).unwrap());
        assert!(!q(LmHead::Quant, Quant::Bf16, &exact).unwrap());
        assert!(!q(LmHead::Auto, Quant::Bf16, &off).unwrap());
        assert!(!q(LmHead::Auto, Quant::Bf16, &late).unwrap());
        let e = q(LmHead::Int8, Quant::Bf16, &off).unwrap_err().to_string();
        assert!(e.contains("not int8 blocks"), "{e}");
    }

    #[test]
    fn the_int8_head_is_for_bf16_in_the_launch_plan_and_the_streamed_step() {
        let o = CudaOptions {
            quant: Quant::Bf16,
            lm_head: LmHead::Int8,
            streamed_step: StreamedStep::Auto,
            ..CudaOptions::default()
        };
        assert!(o.conflict().is_none());
        // Not a launch-plan variant: `Auto` may take the streamed step with it.
        assert_eq!(o.launch_plan_variant(), None);
        let streamed = CudaOptions {
            streamed_step: StreamedStep::On,
            ..o.clone()
        };
        assert!(streamed.conflict().is_none());
        let int4 = CudaOptions {
            quant: Quant::Int4,
            ..o.clone()
        };
        assert!(int4.conflict().unwrap().contains("--quant bf16"));
        // Auto decides with the model (`LmHead::int8_blocks`): no conflict of its own.
        let auto = CudaOptions {
            lm_head: LmHead::Auto,
            single_kernel: true,
            ..int4.clone()
        };
        assert!(auto.conflict().is_none());
        for other in [
            CudaOptions {
                single_kernel: true,
                ..o.clone()
            },
            CudaOptions {
                persistent_gemv: true,
                ..o
            },
        ] {
            assert!(other
                .conflict()
                .unwrap()
                .contains("not with --single-kernel"));
        }
    }
}
