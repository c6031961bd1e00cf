//! The decode step's launch plan: every kernel of one token's forward pass, in order, with its
//! parameter block (GEMV shapes and split-K choices, attention, per-layer embeddings, lm_head
//! and argmax). Recorded once per runner and replayed as a CUDA graph.

use super::*;

/// A GEMV's output as its consumer reads it: `splits` partial vectors `ld` apart, added in
/// order; `glu`: interleaved (gate, up) rows, combined as gelu(gate) * up.
#[derive(Clone, Copy)]
struct Act {
    ptr: u64,
    splits: usize,
    ld: usize,
    glu: bool,
}

impl Act {
    fn whole(ptr: u64, len: usize) -> Act {
        Act {
            ptr,
            splits: 1,
            ld: len,
            glu: false,
        }
    }

    /// Make `p`'s prologue read this vector.
    fn feed(&self, p: &mut GemvParams) {
        p.input = self.ptr;
        p.in_splits = self.splits as i32;
        p.in_ld = self.ld as i32;
        p.in_glu = self.glu as i32;
    }
}

impl CudaRunner {
    /// `p` completed for matrix `m`: weights, shapes, outputs, split-K bookkeeping.
    fn gemv_params(
        &self,
        m: &DevMat,
        (out, fin): (u64, u64),
        splits: usize,
        mut p: GemvParams,
    ) -> GemvParams {
        p.out_final = fin;
        p.counters = self.scratch.counters.ptr();
        p.w = m.w;
        p.scales = m.scales;
        p.out = out;
        p.rows = m.rows as i32;
        p.cols = m.cols as i32;
        p.splits = splits as i32;
        p.int4 = m.int4 as i32;
        p.eps = self.model.spec.rms_eps;
        if p.res_scalar == 0.0 {
            p.res_scalar = 1.0;
        }
        p
    }

    fn gemv(
        &self,
        label: &'static str,
        m: &DevMat,
        (out, fin): (u64, u64),
        splits: usize,
        p: GemvParams,
    ) -> (Launch, Act) {
        if self.step_kernel.is_some() {
            // The single-kernel step: partials stay in `out` ([splits][rows]) for the consumer's
            // prologue; GeGLU is applied there too (`in_glu`); octet-layout scales. The launch
            // is never run: `step_launch` turns its parameters into an operation record.
            let glu = p.glu != 0;
            let mut p = self.gemv_params(m, (out, 0), splits, p);
            p.counters = 0;
            p.glu = 0;
            p.scales = m.scales_oct;
            let l = Launch::new(&self.gpu, label, "gemv", (1, 1, 1), 256, 0, &p);
            let act = Act {
                ptr: out,
                splits,
                ld: m.rows,
                glu,
            };
            return (l, act);
        }
        let p = self.gemv_params(m, (out, fin), splits, p);
        let grid = (
            m.rows.div_ceil(GEMV_ROWS_PER_BLOCK) as u32,
            splits as u32,
            1,
        );
        let smem = m.cols * 4;
        let l = if self.persistent {
            let items = m.rows.div_ceil(8) * splits;
            let resident = self.gpu.sm_count as usize * self.blocks_per_sm("gemv_persistent", smem);
            let blocks = items.div_ceil(8).min(resident).max(1);
            let grid = (blocks as u32, 1, 1);
            Launch::new(
                &self.gpu,
                label,
                "gemv_persistent",
                grid,
                256,
                smem as u32,
                &p,
            )
        } else if self.tc_gemv && m.int4 {
            let norms = p.res_in != 0 || p.norm_w != 0;
            let per = (m.cols / 128).div_ceil(splits);
            if let Some((kw, _)) = self.mma_kwarps_for(m) {
                // The block's warps share its 16-row tiles along K; no K split across blocks
                // (`mat_splits` gives 1 for these matrices).
                debug_assert_eq!(splits, 1, "{label}");
                let mut p = p;
                p.kwarps = kw as i32;
                let grid = (m.rows.div_ceil(GEMV_MMA_ROWS / kw) as u32, splits as u32, 1);
                let smem = gemv_mma_smem(m.cols, norms, per);
                Launch::new(
                    &self.gpu,
                    label,
                    if self.int8_act {
                        "gemv_mma_kw_a8"
                    } else {
                        gemv_mma_kw_kernel()
                    },
                    grid,
                    256,
                    smem as u32,
                    &p,
                )
            } else {
                let grid = (m.rows.div_ceil(GEMV_MMA_ROWS) as u32, splits as u32, 1);
                let (kernel, smem) = if self.ring_for(m) {
                    ("gemv_mma_ring", gemv_mma_ring_smem(m.cols, norms, per))
                } else if self.int8_act {
                    // Same shared memory: the int8 fragments take less than the bf16 pairs.
                    ("gemv_mma_a8", gemv_mma_smem(m.cols, norms, per))
                } else {
                    (gemv_mma_kernel(), gemv_mma_smem(m.cols, norms, per))
                };
                Launch::new(&self.gpu, label, kernel, grid, 256, smem as u32, &p)
            }
        } else {
            let a8 = self.int8_act && m.int4;
            let norms = p.res_in != 0 || p.norm_w != 0;
            let kernel = if a8 { "gemv_a8" } else { self.tiled_gemv };
            let offset = if kernel == "gemv" {
                GEMV_XS_OFFSET_BYTES
            } else {
                0
            };
            Launch::new(
                &self.gpu,
                label,
                kernel,
                grid,
                256,
                (gemv_smem(m.cols, a8, norms) + offset) as u32,
                &p,
            )
        };
        let mut l = l;
        let wb = if m.int4 { m.rows * m.cols / 2 } else { m.bytes };
        l.reads = [(m.w, wb), (m.scales, m.bytes - wb)];
        if !self.persistent {
            l.prefetch_at = Some(std::mem::offset_of!(GemvParams, pf));
        }
        // Split launches leave the finished vector in `fin`, unsplit ones in `out`.
        let ptr = if splits > 1 { fin } else { out };
        let rows = if p.glu != 0 { m.rows / 2 } else { m.rows };
        (l, Act::whole(ptr, rows))
    }

    /// A GEMV of int8 weights with f16 scales per 32 columns (`gemv_q8`; the output head of
    /// [`CudaOptions::lm_head`]), unsplit: the tiled GEMV's rows, prologue and output.
    fn gemv_int8(&self, label: &'static str, m: &DevMat, out: u64, p: GemvParams) -> Launch {
        let p = self.gemv_params(m, (out, 0), 1, p);
        let norms = p.res_in != 0 || p.norm_w != 0;
        let grid = (m.rows.div_ceil(GEMV_ROWS_PER_BLOCK) as u32, 1, 1);
        let smem = gemv_smem(m.cols, false, norms);
        let mut l = Launch::new(&self.gpu, label, "gemv_q8", grid, 256, smem as u32, &p);
        l.reads = [
            (m.w, m.rows * m.cols),
            (m.scales, m.bytes - m.rows * m.cols),
        ];
        l.prefetch_at = Some(std::mem::offset_of!(GemvParams, pf));
        l
    }

    /// `label`: the GEMV's stream label (the streamed step's split caps are by label).
    fn mat_splits(&self, m: &DevMat, sm: usize, label: &str) -> usize {
        let units = if m.int4 { m.cols / 128 } else { m.cols / 32 };
        if self.opts.streamed() {
            // The stream layout's own K splits under its caps (its gate/up: 1, at the call site),
            // over its cells' groups (int4: 128 columns, bf16: 64).
            let cap = crate::step_streams::splits_cap(label);
            let format = if m.int4 {
                crate::stream_layout::CellFormat::Int4
            } else {
                crate::stream_layout::CellFormat::Bf16
            };
            return crate::stream_layout::k_splits_capped(
                m.rows,
                m.cols / format.cols(),
                false,
                sm,
                cap,
            );
        }
        if let Some(k) = &self.step_kernel {
            return step_splits(m.rows, units, k.warps);
        }
        if self.persistent {
            // Enough (octet, split) items for every resident warp.
            let warps = sm * self.blocks_per_sm("gemv_persistent", m.cols * 4) * 8;
            let octets = m.rows.div_ceil(8).max(1);
            return warps
                .div_ceil(octets)
                .clamp(1, MAX_SPLITS)
                .min((units / 4).max(1));
        }
        if self.ring_for(m) {
            // Two blocks per SM if this split's shared memory allows it, else what it allows.
            let tiles = m.rows.div_ceil(GEMV_MMA_ROWS);
            let mut splits = ring_splits(tiles, units, 2 * sm);
            let smem = gemv_mma_ring_smem(m.cols, true, units.div_ceil(splits));
            let blocks = self.blocks_per_sm("gemv_mma_ring", smem);
            if blocks < 2 {
                splits = ring_splits(tiles, units, blocks * sm);
            }
            return splits;
        }
        if let Some((_, splits)) = self.mma_kwarps_for(m) {
            return splits;
        }
        if self.tc_gemv && m.int4 {
            return gemv_mma_splits(m.rows, units, sm);
        }
        splits_for(m.rows.div_ceil(8), units, sm, gemv_warps_per_sm(m.int4))
    }

    /// Warps per 16-row tile and K splits (always 1) when `m` runs as `gemv_mma_kw`
    /// ([`CudaOptions::tensor_core_kwarps`]): int4 matrices of at most [`KWARPS_MAX_BYTES`]
    /// that `gemv_mma` would split along K and whose tiles take more than one warp.
    fn mma_kwarps_for(&self, m: &DevMat) -> Option<(usize, usize)> {
        if !(self.tc_kwarps && m.int4 && m.bytes <= KWARPS_MAX_BYTES) || self.ring_for(m) {
            return None;
        }
        let (sm, units) = (self.gpu.sm_count as usize, m.cols / 128);
        let kw = mma_kwarps(m.rows, units, sm);
        (kw > 1 && gemv_mma_splits(m.rows, units, sm) > 1).then_some((kw, 1))
    }

    /// Whether `m` streams its weights through `gemv_mma_ring` ([`CudaOptions::tensor_core_ring`];
    /// not with int8 activations). Only gate/up, or gate/up and down, that way measured 364.1 /
    /// 351.7 against 406-409 tok/s (seventh session; that switch was removed).
    fn ring_for(&self, m: &DevMat) -> bool {
        m.int4 && !self.int8_act && self.tc_ring
    }

    /// Resident 256-thread blocks of `kernel` per SM with `smem` bytes of dynamic shared memory.
    fn blocks_per_sm(&self, kernel: &'static str, smem: usize) -> usize {
        if let Some(&(_, _, b)) = self
            .gemv_occupancy
            .borrow()
            .iter()
            .find(|(k, s, _)| *k == kernel && *s == smem)
        {
            return b;
        }
        let b = unsafe {
            cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
                self.gpu.func(kernel),
                256,
                smem,
            )
        }
        .map(|b| b.max(1) as usize)
        .unwrap_or(1);
        self.gemv_occupancy.borrow_mut().push((kernel, smem, b));
        b
    }

    /// K and V cache pointers that layer `i` reads (its own or its donor's).
    pub(super) fn kv_caches(&self, i: usize, source: usize) -> Result<(u64, u64), CudaError> {
        self.layers[source]
            .kv
            .as_ref()
            .map(|(k, v)| (k.ptr(), v.ptr()))
            .ok_or_else(|| CudaError::Unsupported(format!("layer {i}: KV donor owns no cache")))
    }

    /// The decode step as a fixed list of launches (see the module docs for the data flow).
    pub(super) fn build_plan(&self, sm: usize) -> Result<Vec<Launch>, CudaError> {
        let spec = &self.model.spec;
        let s = &self.scratch;
        let h = spec.hidden;
        let tok_ptr = s.step_io.ptr();
        let pos_ptr = s.step_io.at::<i32>(1);
        let mut plan = Vec::new();
        let mut cur = 0usize;
        // The branch output still to be added to the residual: (output, norm, scalar).
        let mut pending: Option<(Act, u64, f32)> = None;

        let gather = GemvParams {
            gather_tok: tok_ptr,
            gather_table: self.embed.ptr(),
            gather_scale: spec.embed_scale,
            res_out: s.h[0].ptr(),
            ..Default::default()
        };
        let mut first_input_gathered = false;
        if let (Some(pm), Some(table), Some(pn), Some(ps)) =
            (&self.ple_model, &self.ple_table, &self.ple_norm, &spec.ple)
        {
            let sp = self.mat_splits(pm, sm, "gemv.ple_model");
            let (l, ctx_act) = self.gemv(
                "gemv.ple_model",
                pm,
                (s.plp_part.ptr(), s.plp_fin.ptr()),
                sp,
                gather,
            );
            plan.push(l);
            first_input_gathered = true;
            let p = PleParams {
                tok: tok_ptr,
                table: table.ptr(),
                ctx: ctx_act.ptr,
                norm_w: pn.ptr(),
                out: s.ple_out.ptr(),
                splits: ctx_act.splits as i32,
                ld: pm.rows as i32,
                dim: ps.dim as i32,
                tok_scale: (ps.dim as f32).sqrt(),
                ctx_scale: (h as f32).powf(-0.5),
                mix_scale: std::f32::consts::FRAC_1_SQRT_2,
                eps: spec.rms_eps,
            };
            plan.push(Launch::new(
                &self.gpu,
                "ple_combine",
                "ple_combine",
                (spec.n_layers() as u32, 1, 1),
                ps.dim as u32,
                0,
                &p,
            ));
        }

        for (i, (ls, dl)) in spec.layers.iter().zip(&self.layers).enumerate() {
            // QKV with the previous layer's residual epilogue and this layer's input norm.
            let mut p = GemvParams {
                norm_w: dl.attn_norm.ptr(),
                ..Default::default()
            };
            match pending {
                Some((a, nw, scalar)) => {
                    a.feed(&mut p);
                    p.res_in = s.h[cur].ptr();
                    p.res_out = s.h[cur ^ 1].ptr();
                    p.res_w = nw;
                    p.res_scalar = scalar;
                    cur ^= 1;
                }
                None if first_input_gathered => {
                    p.input = s.h[0].ptr();
                    p.in_splits = 1;
                    p.in_ld = h as i32;
                }
                None => {
                    p = GemvParams {
                        norm_w: dl.attn_norm.ptr(),
                        ..gather
                    };
                }
            }
            let sq = self.mat_splits(&dl.qkv, sm, "gemv.qkv");
            let (l, qkv) = self.gemv(
                "gemv.qkv",
                &dl.qkv,
                (s.qkv_part.ptr(), s.qkv_fin.ptr()),
                sq,
                p,
            );
            plan.push(l);

            let src = &self.layers[ls.kv_source];
            let (kc, vc) = self.kv_caches(i, ls.kv_source)?;
            let own = ls.owns_kv(i);
            let ap = AttnParams {
                q: s.q.ptr(),
                counters: s.attn_counters.ptr(),
                k_cache: kc,
                v_cache: vc,
                part_ml: s.attn_ml.ptr(),
                part_acc: s.attn_acc.ptr(),
                out: s.attn_out.ptr(),
                pos: pos_ptr,
                nh: ls.n_heads as i32,
                nkv: ls.n_kv_heads as i32,
                hd: ls.head_dim as i32,
                cap: src.cap as i32,
                window: attn_window(spec, ls),
                splits: dl.attn_splits as i32,
                scale: spec.attn_scale,
                softcap: spec.attn_softcap.unwrap_or(0.0),
                qkv: qkv.ptr,
                qkv_splits: qkv.splits as i32,
                qkv_ld: qkv.ld as i32,
                q_norm: dl.q_norm.ptr(),
                k_norm: dl.k_norm.as_ref().map_or(0, |b| b.ptr()),
                inv_freq: dl.inv_freq.ptr(),
                own_kv: own as i32,
                v_norm: spec.v_norm as i32,
                eps: spec.rms_eps,
                prefetch: self.attn_prefetch as i32,
                pf: L2Prefetch::default(),
            };
            let tile = self.attn_tile_dims.contains(&ls.head_dim) && self.step_kernel.is_none();
            let mut l = Launch::new(
                &self.gpu,
                "attention",
                if tile {
                    "attn_split_tile"
                } else if self.attn_by_head_dim && self.step_kernel.is_none() {
                    attn_kernel(ls.head_dim, self.attn_warp_values, self.attn_min_keys)
                } else {
                    "attn_split"
                },
                (dl.attn_splits as u32, ls.n_heads as u32, 1),
                128,
                if tile {
                    attn_tile_smem(ls.head_dim) as u32
                } else {
                    0
                },
                &ap,
            );
            l.prefetch_at = Some(std::mem::offset_of!(AttnParams, pf));
            plan.push(l);

            let so = self.mat_splits(&dl.o, sm, "gemv.o");
            let p = GemvParams {
                input: s.attn_out.ptr(),
                in_splits: 1,
                in_ld: 0,
                ..Default::default()
            };
            let (l, o) = self.gemv("gemv.o", &dl.o, (s.o_part.ptr(), s.o_fin.ptr()), so, p);
            plan.push(l);

            let mut p = GemvParams {
                res_in: s.h[cur].ptr(),
                res_out: s.h[cur ^ 1].ptr(),
                res_w: dl.post_attn.ptr(),
                norm_w: dl.pre_ffn.ptr(),
                glu: 1,
                ..Default::default()
            };
            o.feed(&mut p);
            cur ^= 1;
            // The tiled kernel's GeGLU epilogue needs whole sums: no split there (measured best
            // for `gemv`). `gemv_mma` has half as many blocks per matrix and splits it, the GeGLU
            // applied by the last block of each row tile after the split sum.
            let tc = self.tc_gemv && dl.gateup.int4;
            let sgu = if self.opts.streamed() {
                1
            } else if self.persistent || self.step_kernel.is_some() || tc {
                self.mat_splits(&dl.gateup, sm, "gemv.gate_up")
            } else {
                1
            };
            let (l, act) = self.gemv(
                "gemv.gate_up",
                &dl.gateup,
                (s.gu_part.ptr(), s.ffn_act.ptr()),
                sgu,
                p,
            );
            plan.push(l);

            let sd = self.mat_splits(&dl.down, sm, "gemv.down");
            let mut p = GemvParams::default();
            act.feed(&mut p);
            let (l, down) = self.gemv(
                "gemv.down",
                &dl.down,
                (s.down_part.ptr(), s.down_fin.ptr()),
                sd,
                p,
            );
            plan.push(l);
            let scalar = self.model.weights.layers[i].layer_scalar;

            match (&dl.ple_gate, &dl.ple_proj, &dl.ple_post, &spec.ple) {
                (Some(pg), Some(pp), Some(post), Some(ps)) => {
                    let sg = self.mat_splits(pg, sm, "gemv.ple_gate");
                    let spp = self.mat_splits(pp, sm, "gemv.ple_proj");
                    // Gate input: the residual after the FFN (no norm of its own).
                    let mut pa = GemvParams {
                        res_in: s.h[cur].ptr(),
                        res_out: s.h[cur ^ 1].ptr(),
                        res_w: dl.post_ffn.ptr(),
                        ..Default::default()
                    };
                    down.feed(&mut pa);
                    cur ^= 1;
                    let act_mult = s.ple_out.at::<f32>(i * ps.dim);
                    let proj = if self.fuse_ple && self.step_kernel.is_none() {
                        // Gate and projection in one launch (gemv_pair): the gate's split-K
                        // partials are added by the projection's prologue after a grid barrier.
                        let mut a = self.gemv_params(pg, (s.pg_part.ptr(), 0), sg, pa);
                        a.counters = 0;
                        let pb = GemvParams {
                            input: s.pg_part.ptr(),
                            in_splits: sg as i32,
                            in_ld: pg.rows as i32,
                            act_mult,
                            ..Default::default()
                        };
                        let b = self.gemv_params(pp, (s.pp_part.ptr(), s.pp_fin.ptr()), spp, pb);
                        let smem = pg.cols.max(pp.cols) * 4;
                        let items = (pg.rows.div_ceil(8) * sg).max(pp.rows.div_ceil(8) * spp);
                        let resident = sm * self.blocks_per_sm("gemv_pair", smem);
                        let blocks = items.div_ceil(8).min(resident).max(1);
                        let pair = GemvPairParams {
                            a,
                            b,
                            barrier: s.pair_barrier.ptr(),
                        };
                        plan.push(Launch::new(
                            &self.gpu,
                            "gemv.ple_pair",
                            "gemv_pair",
                            (blocks as u32, 1, 1),
                            256,
                            smem as u32,
                            &pair,
                        ));
                        Act::whole(
                            if spp > 1 {
                                s.pp_fin.ptr()
                            } else {
                                s.pp_part.ptr()
                            },
                            pp.rows,
                        )
                    } else {
                        let (l, gate) = self.gemv(
                            "gemv.ple_gate",
                            pg,
                            (s.pg_part.ptr(), s.pg_fin.ptr()),
                            sg,
                            pa,
                        );
                        plan.push(l);
                        let mut pb = GemvParams {
                            act_mult,
                            ..Default::default()
                        };
                        gate.feed(&mut pb);
                        let (l, proj) = self.gemv(
                            "gemv.ple_proj",
                            pp,
                            (s.pp_part.ptr(), s.pp_fin.ptr()),
                            spp,
                            pb,
                        );
                        plan.push(l);
                        proj
                    };
                    pending = Some((proj, post.ptr(), scalar));
                }
                _ => pending = Some((down, dl.post_ffn.ptr(), scalar)),
            }
        }

        let (a, nw, scalar) = pending.expect("at least one layer");
        let mut p = GemvParams {
            res_in: s.h[cur].ptr(),
            res_out: s.h[cur ^ 1].ptr(),
            res_w: nw,
            res_scalar: scalar,
            norm_w: self.final_norm.ptr(),
            ..Default::default()
        };
        a.feed(&mut p);
        let l = match &self.lm_head_int8 {
            Some(m) => self.gemv_int8("gemv.lm_head", m, s.logits.ptr(), p),
            None => {
                self.gemv("gemv.lm_head", &self.lm_head, (s.logits.ptr(), 0), 1, p)
                    .0
            }
        };
        plan.push(l);
        let ap = ArgmaxParams {
            logits: s.logits.ptr(),
            blk_val: s.blk_val.ptr(),
            blk_idx: s.blk_idx.ptr(),
            step_io: s.step_io.ptr(),
            out_tok: s.out_tok.ptr(),
            host_tok: s.tok_slots.dev(),
            n: spec.vocab as i32,
            blocks: ARGMAX_BLOCKS as i32,
            softcap: spec.final_softcap.unwrap_or(0.0),
            own: 0,
        };
        plan.push(Launch::new(
            &self.gpu,
            "argmax",
            "argmax_stage1",
            (ARGMAX_BLOCKS as u32, 1, 1),
            256,
            0,
            &ap,
        ));
        plan.push(Launch::new(
            &self.gpu,
            "argmax",
            "argmax_stage2",
            (1, 1, 1),
            256,
            0,
            &ap,
        ));
        Ok(plan)
    }
}
