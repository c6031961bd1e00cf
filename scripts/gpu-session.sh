#!/usr/bin/env bash
# Everything a GPU session checks and measures, in two halves: `prepare` here (no GPU: builds the
# binaries and splits the real model into parts small enough to carry), `run` there.
#
# Here:   scripts/gpu-session.sh prepare   (or `measure`: only the check binaries a kernel
#         measurement carries, with MEASURE's builds; see measure())
#   -> .gpu/hayai, .gpu/gpu-tests, .gpu/tok-gemma3.gguf (needs it already: scripts/extract-tokenizer-gguf.py),
#      target/release/examples/gpu_check, .m0/part .. .m4/part (the real 270M GGUF in 51 MB parts).
# There:  carry .m0 .. .m3 one per call (each call must come within the machine's idle window so
#         earlier parts survive), then carry .m4 with .gpu/hayai.gz .gpu/gpu-tests.gz .gpu/model.md5
#         (64 MiB per call) for `run real demo ppl`; without the model, carry .gpz (the check
#         binaries compressed; `run` unpacks them) and run
#           scripts/gpu-session.sh run [STAGE ...]
#         STAGES (default: all but pending* and ptx): checks tc fuse single prefill real bench demo ppl
#         (real: the GPU tests, REAL_FILTER a name filter; bench / demo: the default step and
#         --no-streamed-step each; bench-real, not by default: the real 270M's bench-engine both ways,
#         and bf16 with its int8 output head against --lm-head quant);
#         (ppl: the batched prefill's bf16 and int4, then scored one decode step per token: int4
#         (W4A16) and int4-a8 (W4A8) through the launch plan and the streamed step, bf16 through
#         the launch plan and the streamed step; ~90 s each);
#         ptx: the parity checks with a binary of compute_80 PTX only (the A10G's code paths on
#         the H200; carry .gpu/gpu_check_ptx, ~3 min with the driver's first compilation);
#         vparity: `gpu_check stream` (parity) of the measurement builds named in PARITY (.gpu/gpu_check_NAME);
#         rotate: `gpu_check bench-stream` of the default and of the builds in ROTATE (paths, e.g.
#         .gpu/gpu_check_old from .gpz/gpu_check_old.gz, or VAR=VALUE: the default binary with
#         that setting, e.g. HAYAI_STREAM_ATTN_TK=8, or VAR=VALUE@PATH: that binary with it, e.g.
#         HAYAI_STREAM_RING=2@.gpu/gpu_check_old) alternated, ROUNDS rounds (2), no run
#         begun after ROTATE_BUDGET s (~50 s a run); the lengths are gpu_check's
#         HAYAI_BENCH_PROMPT / HAYAI_BENCH_GEN (128 / 512): ROTATE_ENV (e.g.
#         "HAYAI_BENCH_PROMPT=2048 HAYAI_BENCH_GEN=256") applies to every run of the rotation,
#         ROTATE_STAGE (bench-stream; bench-stream-w4 / bench-stream-bf16: the int4 W4A16 / bf16
#         streamed step) is what each runs;
#         long: the streamed step at a long context through `hayai bench-engine` (carry
#         .gpu/hayai.gz; LONG_PROMPT tokens, 2048, + 256), the default alternated with each
#         VAR=VALUE setting in LONG_ENV, LONG_ROUNDS rounds (1);
#         link: proto/link_rate.cu built there and run (one link's cost by scheme: the counter
#         split into 2-32 words, reduction links by integer atomics and bulk reductions,
#         staggered pollers, a release per warp, the hand-over inside a thread-block cluster;
#         ~1 min); LINK_ARGS: extra arguments (e.g.
#         "--stagger-only --cyc 900");
#         prefill-ab: the batched prefill's forms (the wide GEMM, int4 dequantized to bf16
#         rows for it, every GEMM in one K part) by bench-engine's prefill ms at 272 tokens (bf16 both models, int4 E4B),
#         and Nsight Compute's per-kernel times of one chunk (NCU_ENV: a setting; NCU_COUNT launches: 163 the one-chunk form of the 270M; NCU_COUNT_E4B: 718,
#         E4B's int4; carry .gpu/hayai.gz, and .gpu/gpu-tests.gz for the parity runs first;
#         ~7 min);
#         profile-stream: Nsight Compute's stall samples per SASS line for one streamed step
#         (scripts/gpu-profile-sass.sh, summarized by scripts/sass_hotspots.py; carry
#         .gpu/hayai.gz; PROFILE_QUANT: int4-a8 (default), int4 or bf16; ~2 min);
#         timeline: every SM's view of one profiled streamed step (SS_TIMELINE=1 build, carried
#         as .gpz/gpu_check_tl.gz, or the builds in TL_BINS; scripts/stream_timeline.py prints the
#         critical path, and with several builds each one's tables against the first's; TL_STAGE: the
#         gpu_check stage profiled, bench-stream (W4A8) or bench-stream-w4 / bench-stream-bf16; ~1 min each);
#         pending: the streamed-step prototype's defaults re-measured (W4A8 on the 11-chunk ring,
#         with attention, with the real step's input phases (REAL), --tiny, --skew, the cell rate,
#         bf16, and the not-yet-run greedy token (ARGMAX); scripts/proto-stream.sh; nvcc there,
#         ~1 min); pending-stream: the engine's streamed step (gpu_check stream, the same with one
#         key row per attention tile, stream-ops, bench-stream / bench / bench-stream; ~8 min;
#         stream-parity: only its checks); pending-ab: bench-engine A/B of the current defaults (the server's
#         plan with and without --attn-min-keys, bf16; ~2 min)
#         Logs go to $OUT (or ./out); every stage has its own time limit.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Measurement builds, one after another in one target directory (only the kernels rebuild),
# each kept as .gpz/gpu_check_NAME.gz (`run` unpacks it to .gpu/gpu_check_NAME): MEASURE lists
# them as NAME=DEFINES, ';' between (e.g. MEASURE="laneacc=-DSS_LANE_ACC=1"); parity with `run
# vparity`, speed with `run rotate`.
measure_builds() {
  mkdir -p .gpz
  local v builds
  IFS=';' read -ra builds <<< "${MEASURE:-}"
  for v in "${builds[@]}"; do
    v="${v# }"
    [ -n "$v" ] || continue
    CARGO_TARGET_DIR=target/var HAYAI_CUDA_DEFINES="${v#*=}" cargo build --release -p hayai-cuda --example gpu_check
    cp target/var/release/examples/gpu_check "/tmp/gpu_check_${v%%=*}"
    strip "/tmp/gpu_check_${v%%=*}" 2>/dev/null || true
    gzip -6 -c "/tmp/gpu_check_${v%%=*}" > ".gpz/gpu_check_${v%%=*}.gz"
  done
}

# Only what a kernel measurement carries (the whole of `prepare` also builds the CLI, the GPU
# tests, the PTX-only checks and the model's parts): the default gpu_check (.gpz/gpu_check.gz),
# its SS_TIMELINE build (.gpz/gpu_check_tl.gz; not with TL=0) and the MEASURE builds. Other
# .gpz/*.gz left from earlier sessions are listed: `run` unpacks whatever is there, so remove
# what the call does not need (each is ~4 MB of the 64-MiB carry).
measure() {
  set -e
  scripts/setup-cuda.sh
  mkdir -p .gpz
  cargo build --release -p hayai-cuda --example gpu_check
  strip -o /tmp/gpu_check target/release/examples/gpu_check
  gzip -6 -c /tmp/gpu_check > .gpz/gpu_check.gz
  if [ "${TL:-1}" != 0 ]; then
    CARGO_TARGET_DIR=target/tl HAYAI_CUDA_DEFINES=-DSS_TIMELINE=1 cargo build --release -p hayai-cuda --example gpu_check
    strip -o /tmp/gpu_check_tl target/tl/release/examples/gpu_check
    gzip -6 -c /tmp/gpu_check_tl > .gpz/gpu_check_tl.gz
  fi
  measure_builds
  ls -la .gpz
}

prepare() {
  set -e
  # The check binary, its timeline build and MEASURE's builds (.gpz), as `measure` makes them.
  TL=1 measure
  # Two builds: `--example` with several packages builds only their examples, not the binary.
  cargo build --release -p hayai
  # The checks again with only compute_80 PTX embedded: on the H200 every kernel then takes its
  # sm_80-89 code path (the A10G's); a target directory of its own keeps the two builds apart.
  CARGO_TARGET_DIR=target/ptx HAYAI_CUDA_PTX_ONLY=1 cargo build --release -p hayai-cuda --example gpu_check
  local t
  t=$(cargo test --release -p hayai-cuda --test gpu --no-run 2>&1 | grep -o "target/release/deps/gpu-[a-f0-9]*" | head -1)
  mkdir -p .gpu
  cp "$t" .gpu/gpu-tests
  cp target/release/hayai .gpu/hayai
  cp target/ptx/release/examples/gpu_check .gpu/gpu_check_ptx
  strip .gpu/hayai .gpu/gpu-tests .gpu/gpu_check_ptx target/release/examples/gpu_check 2>/dev/null || true
  # Compressed copies: the last model part fits beside the binaries in one carry only so, and the
  # check binaries (~12 MB each) travel as .gpz/*.gz (carry .gpz; `run` unpacks them).
  gzip -9 -k -f .gpu/hayai .gpu/gpu-tests
  gzip -6 -c .gpu/gpu_check_ptx > .gpz/gpu_check_ptx.gz
  [ -f .gpu/tok-gemma3.gguf ] || echo "note: .gpu/tok-gemma3.gguf missing (scripts/extract-tokenizer-gguf.py)"
  local model
  model=$(target/release/hayai fetch-model | tail -1)
  rm -rf .m0 .m1 .m2 .m3 .m4 /tmp/hayai-parts && mkdir -p /tmp/hayai-parts
  split -b 51M -d -a 1 "$model" /tmp/hayai-parts/p
  for i in 0 1 2 3 4; do mkdir -p ".m$i"; mv "/tmp/hayai-parts/p$i" ".m$i/part"; done
  md5sum "$model" | tee .gpu/model.md5
  ls -la .gpu target/release/examples/gpu_check .m*/part
}

run() {
  local out="${OUT:-$root/out}"
  mkdir -p "$out"
  export HAYAI_QUIET=1
  local G=/tmp/gemma-3-270m-q4_k_m.gguf
  local b
  for b in hayai gpu-tests; do
    [ -x ".gpu/$b" ] || [ ! -f ".gpu/$b.gz" ] || { gunzip -c ".gpu/$b.gz" > ".gpu/$b" && chmod +x ".gpu/$b"; }
  done
  # Check binaries carried compressed (.gpz, from prepare): gpu_check to its build path, the
  # others (measurement builds, e.g. gpu_check_old) into .gpu.
  local z
  for z in .gpz/*.gz; do
    [ -f "$z" ] || continue
    b=$(basename "$z" .gz)
    local d=".gpu/$b"
    [ "$b" = gpu_check ] && { mkdir -p target/release/examples; d=target/release/examples/gpu_check; }
    mkdir -p .gpu && gunzip -c "$z" > "$d" && chmod +x "$d"
  done
  local want=("$@")
  [ ${#want[@]} -eq 0 ] && want=(checks tc fuse single prefill real bench demo ppl)
  has() { local w; for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
  stage() { echo "== $1 ($(date -u +%T))" | tee -a "$out/session.log"; }
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee -a "$out/session.log"
  local C=target/release/examples/gpu_check
  if has pending; then
    # The streamed-step prototype's defaults re-measured (docs/performance.md, "The streamed step,
    # tenth session"): the W4A8 chain on the 11-chunk ring (full chain, stream only, cells only),
    # with attention (ctx 640), --tiny, --skew, the cell rate, bf16 with and without attention,
    # and the mbarrier ring (RINGFLAGS=0) as the reference; one parallel build first.
    stage "streamed-step prototype"
    BUILDS="A8=1 A8=1,RINGFLAGS=0,PFD=0 W16=1,CH_CELLS=16 A8=1,REAL=1 A8=1,ARGMAX=1 A8=1,REAL=1,ARGMAX=1" PROTO_BUILD_ONLY=1 timeout 300 \
      scripts/proto-stream.sh > "$out/proto.log" 2>&1 || echo "proto builds failed" >> "$out/proto.log"
    export PROTO_REUSE=1
    BUILDS="A8=1 A8=1,RINGFLAGS=0,PFD=0 A8=1" PROTO_MODES=024 timeout 300 scripts/proto-stream.sh --iters 20 --chunks 11 >> "$out/proto.log" 2>&1
    BUILDS="A8=1" PROTO_MODES=0 timeout 120 scripts/proto-stream.sh --iters 20 --chunks 8 --ctx 640 >> "$out/proto.log" 2>&1
    BUILDS="A8=1,REAL=1" PROTO_MODES=0 timeout 120 scripts/proto-stream.sh --iters 20 --chunks 10 >> "$out/proto.log" 2>&1
    BUILDS="A8=1,REAL=1" PROTO_MODES=0 timeout 120 scripts/proto-stream.sh --iters 20 --chunks 8 --ctx 640 >> "$out/proto.log" 2>&1
    # Written after the tenth session's device time ran out: the greedy token at the end of the
    # chain (ARGMAX; A/B/A against the default; its check prints "argmax: ... PASS").
    BUILDS="A8=1 A8=1,ARGMAX=1 A8=1" PROTO_MODES=0 timeout 200 scripts/proto-stream.sh --iters 20 --chunks 11 >> "$out/proto.log" 2>&1
    BUILDS="A8=1,REAL=1,ARGMAX=1" PROTO_MODES=0 timeout 120 scripts/proto-stream.sh --iters 20 --chunks 8 --ctx 640 >> "$out/proto.log" 2>&1
    # REAL's QKV waits twice as long for the PLE projection (0.95 against 0.48 µs): which SMs publish it last.
    BUILDS="A8=1,REAL=1" PROTO_MODES=0 timeout 120 scripts/proto-stream.sh --iters 10 --chunks 10 --skew >> "$out/proto.log" 2>&1
    BUILDS="A8=1" PROTO_MODES=0 timeout 120 scripts/proto-stream.sh --iters 20 --chunks 11 --tiny >> "$out/proto.log" 2>&1
    BUILDS="A8=1" PROTO_MODES=0 timeout 120 scripts/proto-stream.sh --iters 10 --chunks 11 --skew >> "$out/proto.log" 2>&1
    BUILDS="A8=1 W16=1,CH_CELLS=16" timeout 120 scripts/proto-stream.sh --cell-rate >> "$out/proto.log" 2>&1
    BUILDS="W16=1,CH_CELLS=16" PROTO_MODES=0 timeout 200 scripts/proto-stream.sh --iters 10 --chunks 4 >> "$out/proto.log" 2>&1
    BUILDS="W16=1,CH_CELLS=16" PROTO_MODES=0 timeout 200 scripts/proto-stream.sh --iters 10 --chunks 4 --ctx 640 >> "$out/proto.log" 2>&1
    echo "rc=$?" >> "$out/proto.log"
    grep -vE "^device|^operations|^read band|^last SM|^SM clock" "$out/proto.log" | tee -a "$out/session.log"
  fi
  if has pending-stream || has stream-parity; then
    # The engine's streamed step (docs/performance.md, twelfth session): parity on the small
    # models and E4B shapes, again with one key row per attention tile (HAYAI_STREAM_ATTN_TK=1:
    # the several-tile and several-ranges-per-SM paths on short contexts), where it parts from
    # the launch plan operation by operation, and the E4B benchmark with its per-operation
    # profile against the default's, A/B/A.
    # Carry target/release/examples/gpu_check (scripts/gpu-session.sh prepare builds it).
    stage "streamed step"
    timeout 200 "$C" stream 2>&1 | grep -E "PASS|FAIL|INFO" | tee -a "$out/session.log"
    HAYAI_STREAM_ATTN_TK=1 timeout 200 "$C" stream 2>&1 | grep -E "PASS|FAIL" | sed 's/^/TK=1 /' | tee -a "$out/session.log"
    timeout 120 "$C" stream-ops 2>&1 | grep -vE "^build|^gpu:" | tee -a "$out/session.log"
    # bf16 through the streamed step (thirty-fifth session): its CPU reference and the launch plan.
    timeout 200 "$C" stream-bf16 2>&1 | grep -E "PASS|FAIL" | tee -a "$out/session.log"
    # int4 W4A16 through the streamed step (thirty-sixth session): the same, x as a bf16 pair.
    timeout 200 "$C" stream-w4 2>&1 | grep -E "PASS|FAIL" | tee -a "$out/session.log"
  fi
  if has pending-stream; then
    # (gpu_check runs its stages once each, in its own order: `bench` is the persistent and the
    # default launch plans, so the streamed runs come from separate calls around it.)
    local b
    for b in bench-stream bench bench-stream; do
      timeout 120 "$C" "$b" 2>&1 | grep -E "decode:|^  " | tee -a "$out/session.log"
    done
  fi
  if has vparity; then
    # The streamed step's parity of measurement builds (PARITY="NAME ...": .gpu/gpu_check_NAME,
    # unpacked from .gpz), ~90 s each; VPARITY_TIMEOUT: the limit per build (150 s; a compute_80
    # PTX-only build compiles at its first load first); VPARITY_STAGE: the gpu_check stage
    # (stream, W4A8; stream-w4 or stream-bf16 for the other forms).
    stage "streamed step parity (${VPARITY_STAGE:-stream}): ${PARITY:-}"
    local v
    for v in ${PARITY:-}; do
      timeout "${VPARITY_TIMEOUT:-150}" ".gpu/gpu_check_$v" "${VPARITY_STAGE:-stream}" 2>&1 | grep -E "PASS|FAIL|rror|panic" | cut -c1-220 | sed "s/^/$v /" |
        tee -a "$out/session.log"
    done
  fi
  if has rotate; then
    # Several measurement builds against the default in one rotation (ROTATE="bin ...", ROUNDS
    # rounds, default 2): D A B C ... D A B C ..., every build's runs spread over the call.
    stage "streamed step: rotation of the default and ${ROTATE:-}${ROTATE_ENV:+ (${ROTATE_ENV})}"
    local r c t0=$SECONDS
    for ((r = 0; r < ${ROUNDS:-2}; r++)); do
      for c in "$C" ${ROTATE:-}; do
        # ROTATE_BUDGET: no run begins after that many seconds of the stage (a call's limit).
        [ "$SECONDS" -lt "$((t0 + ${ROTATE_BUDGET:-100000}))" ] || break 2
        echo "-- $c" | tee -a "$out/session.log"
        if [[ "$c" =~ ^([A-Za-z_][A-Za-z0-9_]*=[^@]*)@(.+)$ ]]; then
          # VAR=VALUE@BINARY: a measurement build with that setting.
          env ${ROTATE_ENV:-} "${BASH_REMATCH[1]}" timeout 100 "${BASH_REMATCH[2]}" "${ROTATE_STAGE:-bench-stream}" 2>&1 |
            grep -E "decode:" | tee -a "$out/session.log"
        elif [[ "$c" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
          env ${ROTATE_ENV:-} "$c" timeout 100 "$C" "${ROTATE_STAGE:-bench-stream}" 2>&1 | grep -E "decode:" | tee -a "$out/session.log"
        else
          env ${ROTATE_ENV:-} timeout 100 "$c" "${ROTATE_STAGE:-bench-stream}" 2>&1 | grep -E "decode:" | tee -a "$out/session.log"
        fi
      done
    done
  fi
  if has long; then
    # The streamed step where the attention's ranges are capped by the SM count on every rule
    # (docs/performance.md, twenty-first session's next steps).
    stage "streamed step, ${LONG_PROMPT:-2048} + 256 tokens: the default and ${LONG_ENV:-}"
    local r e
    for ((r = 0; r < ${LONG_ROUNDS:-1}; r++)); do
      for e in "" ${LONG_ENV:-}; do
        echo "-- ${e:-default}" | tee -a "$out/session.log"
        env ${e:+"$e"} timeout 150 .gpu/hayai bench-engine --model synth:e4b --device cuda --quant int4-a8 \
          --streamed-step --prompt-len "${LONG_PROMPT:-2048}" --gen 256 2>&1 | grep -E "tok/s|rror" |
          tee -a "$out/session.log"
      done
    done
  fi
  if has link; then
    # What one hand-over costs (proto/link_rate.cu; ninth session: 2.06 us with one counter at
    # 2,560 floats), the counter split so no word takes all 132 SMs' adds, and reduction links
    # (split-K partials summed by the L2's integer atomics or bulk reductions).
    stage "link rate (proto/link_rate.cu)"
    local nv
    nv=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    if "$nv" -O3 -std=c++17 -arch=sm_90 -o /tmp/link_rate crates/hayai-cuda/proto/link_rate.cu > "$out/link.log" 2>&1; then
      timeout 120 /tmp/link_rate --n 2560 ${LINK_ARGS:-} 2>&1 | tee -a "$out/session.log"
      timeout 120 /tmp/link_rate --n 10240 ${LINK_ARGS:-} 2>&1 | tee -a "$out/session.log"
    else
      echo "link_rate.cu: build failed ($out/link.log)" | tee -a "$out/session.log"
    fi
  fi
  if has profile-stream; then
    # Where the streamed step's warps stall, line by line: one launch (the ninth decode step) of
    # `bench-engine --quant Q --streamed-step` under ncu's source counters (PROFILE_QUANT: Q,
    # int4-a8; int4 for the W4A16 form, bf16).
    local pq="${PROFILE_QUANT:-int4-a8}"
    stage "streamed step ($pq): ncu source counters"
    OUT="$out" SKIP=8 NCU_TIMEOUT=300 scripts/gpu-profile-sass.sh decode_stream "$pq" --streamed-step 2>&1 | tee -a "$out/session.log"
    python3 scripts/sass_hotspots.py "$out/sass-$pq.csv" 2>&1 | tee -a "$out/session.log"
    grep -E "Duration|Warp Cycles Per Issued|Executed Instructions  " "$out/sass-$pq.txt" | tee -a "$out/session.log"
  fi
  if has timeline; then
    # Every SM's view of one profiled streamed step (SS_TIMELINE=1; scripts/stream_timeline.py).
    # Carry .gpz (gpu_check_tl.gz, from `prepare` or `measure`).
    stage "streamed step timeline (SS_TIMELINE=1)"
    # TL_BINS: the timeline builds to run (default .gpu/gpu_check_tl; e.g. a measurement build's
    # made with -DSS_TIMELINE=1 by `MEASURE=... prepare` or `measure`, .gpu/gpu_check_NAME); TL_TIMEOUT: the
    # limit per build in s (120; a compute_80 PTX-only build compiles at its first load first).
    local tb n=0
    for tb in ${TL_BINS:-.gpu/gpu_check_tl}; do
      echo "-- $tb" | tee -a "$out/session.log"
      HAYAI_STREAM_TIMELINE="$out/tl$n.bin" timeout "${TL_TIMEOUT:-120}" "$tb" "${TL_STAGE:-bench-stream}" 2>&1 | grep -E "decode:" | tee -a "$out/session.log"
      python3 scripts/stream_timeline.py "$out/tl$n.bin" 2>&1 | tee -a "$out/session.log"
      n=$((n + 1))
    done
    # Several builds: each one's main tables against the first's.
    local i
    for ((i = 1; i < n; i++)); do
      echo "-- timeline $i against timeline 0" | tee -a "$out/session.log"
      python3 scripts/stream_timeline.py --compare "$out/tl0.bin" "$out/tl$i.bin" 2>&1 | tee -a "$out/session.log"
    done
  fi
  if has pending-ab; then
    stage "A/B on E4B shapes (default first and last)"
    local e4b=(bench-engine --model synth:e4b --device cuda --prompt-len 128 --gen 512)
    local ab=("--quant int4 --no-streamed-step" "--quant int4 --max-context 8192 --no-streamed-step"
      "--quant int4 --max-context 8192 --attn-min-keys 0" "--quant bf16 --no-streamed-step" "--quant int4 --no-streamed-step")
    local v
    for v in "${ab[@]}"; do
      local e=() f=$v
      if [[ $v == HAYAI_* ]]; then e=("${v%% *}"); f=${v#* }; fi
      echo "-- ${e[*]} $f" | tee -a "$out/session.log"
      timeout 120 env "${e[@]}" .gpu/hayai "${e4b[@]}" $f 2>&1 | sed -n '/^decode/p;/per operation/,$p' | tee -a "$out/session.log"
    done
  fi
  if has ptx; then
    # The A10G's code paths on the H200 (docs/cuda.md): the default and streamed steps' parity
    # with a binary holding only compute_80 PTX (the driver compiles it at the first load; PDL
    # off). Carry .gpu/gpu_check_ptx.
    stage "gpu_check parity stream stream-w4 stream-bf16 single lm-head-int8 (compute_80 PTX only)"
    timeout 560 .gpu/gpu_check_ptx parity stream stream-w4 stream-bf16 single lm-head-int8 > "$out/ptx.log" 2>&1
    grep -E "PASS|FAIL|INFO|rror|panic" "$out/ptx.log" | tee -a "$out/session.log"
  fi
  if has checks; then stage "gpu_check parity"; timeout 300 "$C" parity > "$out/parity.log" 2>&1; grep -E "PASS|FAIL" "$out/parity.log" | tee -a "$out/session.log"; fi
  if has tc; then stage "gpu_check tc a8 bench-tc bench-a8"; timeout 400 "$C" tc a8 bench-tc bench-a8 > "$out/tc.log" 2>&1; grep -E "PASS|FAIL|decode:|quant:" "$out/tc.log" | tee -a "$out/session.log"; fi
  if has fuse; then stage "gpu_check fuse bench"; timeout 300 "$C" fuse bench > "$out/fuse.log" 2>&1; grep -E "PASS|FAIL|decode:|quant:" "$out/fuse.log" | tee -a "$out/session.log"; fi
  if has single; then stage "gpu_check single bench-single"; timeout 300 "$C" single bench-single > "$out/single.log" 2>&1; grep -E "PASS|FAIL|decode:|quant:|^  " "$out/single.log" | tee -a "$out/session.log"; fi
  if has prefill; then stage "gpu_check prefill prefill-e4b"; timeout 300 "$C" prefill prefill-e4b > "$out/prefill.log" 2>&1; grep -E "PASS|FAIL" "$out/prefill.log" | tee -a "$out/session.log"; fi
  if has real || has demo || has ppl; then
    cat .m0/part .m1/part .m2/part .m3/part .m4/part > "$G" 2>/dev/null
    md5sum "$G" | tee -a "$out/session.log"; cat .gpu/model.md5 2>/dev/null | tee -a "$out/session.log"
    export HAYAI_MODEL_GGUF="$G"
  fi
  # REAL_FILTER: only the GPU tests whose names contain it (e.g. "streamed"; default: all).
  if has real; then stage "gpu-tests (${REAL_FILTER:-all, incl. the real 270M})"; timeout 400 .gpu/gpu-tests --include-ignored --test-threads 1 ${REAL_FILTER:-} > "$out/gpu-tests.log" 2>&1; grep -E "^test |test result|panicked|assert" "$out/gpu-tests.log" | tee -a "$out/session.log"; fi
  # The engine benchmark with the default step (the streamed step where it runs) and the launch
  # plan (--no-streamed-step): E4B shapes in `bench`, the real 270M in `bench-real`.
  if has bench; then
    stage "bench-engine synth:e4b"
    for q in int4 bf16; do
      for v in "" --no-streamed-step; do
        echo "-- --quant $q $v" | tee -a "$out/session.log"
        timeout 120 .gpu/hayai bench-engine --model synth:e4b --device cuda --quant "$q" $v --prompt-len 128 --gen 512 2>&1 | tee "$out/bench-$q$v.log" | grep -E "quant|launch plan|prefill|decode|achieved|kernels" | tee -a "$out/session.log"
      done
    done
  fi
  # The batched prefill's forms against each other (prefill ms of `bench-engine`, one chunk of
  # 271 tokens + the first decode step; each variable set to another form in turn), then where
  # its kernel time
  # goes (Nsight Compute, summed by scripts/ncu_kernel_times.py).
  if has prefill-ab; then
    stage "prefill A/B (synth:gemma3-270m and synth:e4b, bf16, 272-token prompt)"
    local m v
    # The forms not yet the default checked first (carry .gpu/gpu-tests.gz too).
    if [ -x .gpu/gpu-tests ]; then
      timeout 120 .gpu/gpu-tests --include-ignored --test-threads 1 prefill_gemm_wide_is_bit_identical 2>&1 | grep -E "^test |test result" | tee -a "$out/session.log"
      for v in HAYAI_PREFILL_GEMM_WIDE=1 "HAYAI_PREFILL_GEMM_WIDE=1 HAYAI_PREFILL_INT4_DEQUANT=0"; do
        echo "-- parity with $v" | tee -a "$out/session.log"
        env $v timeout 120 .gpu/gpu-tests --include-ignored --test-threads 1 batched_prefill_matches_cpu --exact 2>&1 | grep -E "^test |test result" | tee -a "$out/session.log"
      done
    fi
    local mq vs
    for mq in synth:gemma3-270m/bf16 synth:e4b/bf16 synth:e4b/int4; do
      vs=("" HAYAI_PREFILL_GEMM_WIDE=1 HAYAI_PREFILL_KSPLIT=1 "" HAYAI_PREFILL_GEMM_WIDE=1)
      [ "${mq#*/}" = int4 ] && vs=("" HAYAI_PREFILL_INT4_DEQUANT=0 HAYAI_PREFILL_GEMM_WIDE=0 "" HAYAI_PREFILL_INT4_DEQUANT=0)
      for v in "${vs[@]}"; do
        echo "-- $mq ${v:-(defaults)}" | tee -a "$out/session.log"
        env $v timeout 120 .gpu/hayai bench-engine --model "${mq%/*}" --device cuda --quant "${mq#*/}" --prompt-len 272 --gen 16 2>&1 | grep -E "^prefill" | tee -a "$out/session.log"
      done
    done
    # int4 at 2,048 tokens: the dequantized rows cost once a GEMM, the in-tile dequantization
    # once a 64-row tile.
    for v in "" HAYAI_PREFILL_INT4_DEQUANT=0; do
      echo "-- synth:e4b/int4 2048 ${v:-(defaults)}" | tee -a "$out/session.log"
      env $v timeout 120 .gpu/hayai bench-engine --model synth:e4b --device cuda --quant int4 --prompt-len 2048 --gen 16 2>&1 | grep -E "^prefill" | tee -a "$out/session.log"
    done
    # NCU_ENV: a setting for both profiles (e.g. HAYAI_PREFILL_GEMM_WIDE=1).
    env ${NCU_ENV:-} timeout 120 ncu --clock-control none -k regex:pf_ -c "${NCU_COUNT:-163}" --metrics gpu__time_duration.sum --csv --log-file "$out/ncu-prefill.csv" \
      .gpu/hayai bench-engine --model synth:gemma3-270m --device cuda --quant bf16 --prompt-len 272 --gen 4 > /dev/null 2>&1
    python3 scripts/ncu_kernel_times.py "$out/ncu-prefill.csv" | tee -a "$out/session.log"
    # E4B's chunk: 13 launches a layer x 42 + 3 before the first, and a pf_dequant before QKV,
    # O, gate/up, down and the PLE model projection: 17 x 42 + 4 (718; 549 with
    # NCU_ENV=HAYAI_PREFILL_INT4_DEQUANT=0).
    env ${NCU_ENV:-} timeout 150 ncu --clock-control none -k regex:pf_ -c "${NCU_COUNT_E4B:-718}" --metrics gpu__time_duration.sum --csv --log-file "$out/ncu-prefill-e4b.csv" \
      .gpu/hayai bench-engine --model synth:e4b --device cuda --quant int4 --prompt-len 272 --gen 4 > /dev/null 2>&1
    python3 scripts/ncu_kernel_times.py "$out/ncu-prefill-e4b.csv" | tee -a "$out/session.log"
  fi
  if has bench-real; then
    stage "bench-engine real 270M"
    for q in bf16 int4; do
      for v in "" --no-streamed-step; do
        echo "-- --quant $q $v" | tee -a "$out/session.log"
        timeout 120 .gpu/hayai bench-engine --model "$G" --device cuda --quant "$q" $v --prompt-len 128 --gen 512 2>&1 | grep -E "quant|launch plan|prefill|decode|achieved|kernels" | tee -a "$out/session.log"
      done
    done
    # bf16 with the file's int8 output head (the default, --lm-head auto) against its bf16
    # rounding (--lm-head quant), each step, alternated.
    for v in "" "--lm-head quant" "" "--lm-head quant" "--no-streamed-step" "--no-streamed-step --lm-head quant"; do
      echo "-- --quant bf16 ${v:-(--lm-head auto)}" | tee -a "$out/session.log"
      timeout 120 .gpu/hayai bench-engine --model "$G" --device cuda --quant bf16 $v --prompt-len 128 --gen 512 2>&1 | grep -E "^decode|bytes/token" | tee -a "$out/session.log"
    done
  fi
  # The main job with the default step and with the launch plan.
  if has demo; then
    local v
    for v in "" --no-streamed-step; do
      stage "demo ${v:-(default step)} (real 270M, 128 x 512 + PPL)"
      timeout 300 .gpu/hayai demo --model "$G" --device cuda $v > "$out/demo$v.log" 2>&1
      tail -14 "$out/demo$v.log" | tee -a "$out/session.log"
    done
  fi
  if has ppl; then
    stage "ppl (real 270M, 128 records, in-process)"
    /usr/bin/time -f "wall %e s, cpu %U s" timeout 300 .gpu/hayai ppl --model "$G" --device cuda --records data/challenge/ppl_ground_truth_tokens.jsonl --json 2>&1 | tail -3 | tee -a "$out/session.log"
    # int4 scored token by token through the decode step (`--prefill stepwise`; the batched
    # prefill scores on tensor-core GEMMs, not the decode step): int4 (W4A16) and int4-a8 (W4A8)
    # through the launch plan and the streamed step: the PPL gate's view of each form.
    local v
    for v in "--quant int4" "--quant int4 --prefill stepwise --no-streamed-step" "--quant int4 --prefill stepwise --streamed-step" \
      "--quant int4-a8 --prefill stepwise --no-streamed-step" \
      "--quant int4-a8 --prefill stepwise --streamed-step" "--quant bf16 --prefill stepwise --no-streamed-step" \
      "--quant bf16 --prefill stepwise --streamed-step"; do
      echo "-- $v" | tee -a "$out/session.log"
      timeout 300 .gpu/hayai ppl --model "$G" --device cuda $v --records data/challenge/ppl_ground_truth_tokens.jsonl --json 2>&1 | tail -3 | tee -a "$out/session.log"
    done
  fi
  stage done
}

case "${1:-}" in
  prepare) prepare ;;
  measure) measure ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 prepare | measure | run [pending] [pending-stream] [stream-parity] [vparity] [rotate] [link] [profile-stream] [timeline] [pending-ab] [ptx] [checks] [tc] [fuse] [single] [prefill] [real] [bench] [bench-real] [demo] [ppl]" >&2; exit 2 ;;
esac
