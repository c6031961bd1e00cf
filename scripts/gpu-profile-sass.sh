#!/usr/bin/env bash
# Where one decode kernel spends its time, instruction by instruction (run on the GPU machine):
# Nsight Compute's source counters (warp stall samples and executed instructions per SASS line)
# for one launch of the kernels matching KERNEL_REGEX in a short E4B-shaped bench-engine run.
#   scripts/gpu-profile-sass.sh [KERNEL_REGEX] [QUANT] [extra bench-engine flags...]
#   -> $OUT/sass-QUANT.csv (per SASS line), $OUT/sass-QUANT.txt (sections)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"; mkdir -p "$out"
k="${1:-attn_split}"; q="${2:-int4}"; shift 2 || shift $#
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu_bin" ] || { echo "no ncu on this machine" >&2; exit 2; }
rep="$out/sass-$q"
# The launch plan's kernels are profiled in the launch plan (the default step is the streamed
# step where it runs); the streamed step's (decode_stream*) with the flags given.
step=(--no-streamed-step)
case "$k" in decode_stream*) step=() ;; esac
# A 128-token prompt: decode attention then has the split count of a real context.
HAYAI_QUIET=1 timeout "${NCU_TIMEOUT:-200}" "$ncu_bin" --clock-control none -f -o "$rep" \
  -k "regex:^($k)" --launch-skip "${SKIP:-300}" --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section InstructionStats --section SpeedOfLight \
  .gpu/hayai bench-engine --model synth:e4b --device cuda --quant "$q" --prompt-len 128 --gen 16 "${step[@]}" "$@" \
  > "$out/sass-$q.log" 2>&1
echo "ncu rc=$?"
"$ncu_bin" --import "$rep.ncu-rep" --page details > "$rep.txt" 2>&1
"$ncu_bin" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2>&1
echo "details $(wc -l < "$rep.txt") lines, sass $(wc -l < "$rep.csv") lines"
