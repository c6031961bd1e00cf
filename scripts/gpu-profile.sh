#!/usr/bin/env bash
# Per-kernel profile of decode steps with Nsight Compute (run on the GPU machine, where `ncu`
# reads the hardware counters; clocks left alone). Each kernel of the step runs serialized under
# ncu, so the sum of durations is the step without launch gaps or PDL overlap: the difference to
# the bench's ms/token is what the kernel boundaries cost.
#   scripts/gpu-profile.sh [QUANT] [extra bench-engine flags...]   -> $OUT/ncu-QUANT.csv
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"; mkdir -p "$out"
q="${1:-int4}"; shift || true
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu_bin" ] || { echo "no ncu on this machine" >&2; exit 2; }
metrics=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
# Skip the warm-up's steps; one full step (299 kernels on E4B) is what is kept.
HAYAI_QUIET=1 timeout "${NCU_TIMEOUT:-240}" "$ncu_bin" --clock-control none \
  -k 'regex:^(gemv|attn_split|argmax|ple_combine|decode_step)' \
  --launch-skip "${SKIP:-1200}" --launch-count "${COUNT:-299}" \
  --metrics "$metrics" --csv --page raw \
  .gpu/hayai bench-engine --model synth:e4b --device cuda --quant "$q" --prompt-len 16 --gen 8 --no-streamed-step "$@" \
  > "$out/ncu-$q.csv" 2> "$out/ncu-$q.err"
echo "ncu rc=$? rows=$(grep -c '^"' "$out/ncu-$q.csv")"
# Stall reasons and issue rates of the first kernels of one step (one layer), as text.
if [ -n "${DETAIL:-}" ]; then
  HAYAI_QUIET=1 timeout "${NCU_TIMEOUT:-240}" "$ncu_bin" --clock-control none \
    -k 'regex:^(gemv|attn_split)' --launch-skip "${SKIP:-1200}" --launch-count "$DETAIL" \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis \
    .gpu/hayai bench-engine --model synth:e4b --device cuda --quant "$q" --prompt-len 16 --gen 8 --no-streamed-step "$@" \
    > "$out/ncu-$q-detail.txt" 2>&1
  echo "ncu detail rc=$?"
fi
