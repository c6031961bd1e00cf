#!/usr/bin/env bash
# End to end on a GPU machine that has no network (the lent H200): the release binary and a
# tokenizer-only GGUF are carried in .gpu/ (see docs/performance.md for the exact call).
#   1. the GPU parity tests (small Gemma 3 / Gemma 4, bf16 and int4, graph vs eager);
#   2. `hayai synth --preset $PRESET` (E4B shapes by default), then `hayai serve` on it with the
#      CUDA backend, and the harness against that server: bench, endpoint PPL, two greedy
#      captures compared with `identity`;
#   3. the engine benchmark on the same shapes.
# Logs and result files go to $OUT (default ./out).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"; mkdir -p "$out"
B="$root/.gpu/hayai"; TOK="$root/.gpu/tok-gemma3.gguf"
PRESET="${PRESET:-e4b}"; QUANT="${QUANT:-int4}"
NP="${NP:-16}"; LEN="${LEN:-256}"; PPLN="${PPLN:-8}"
export HAYAI_QUIET=1
step() { echo "== $* ($(date -u +%T))" | tee -a "$out/e2e.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee -a "$out/e2e.log"
step info; "$B" info --json | tee "$out/info.json"
step parity-tests
"$root/.gpu/gpu-tests" --include-ignored --skip real_gemma3_270m --test-threads 1 2>&1 | tail -25 | tee -a "$out/e2e.log"
step "synth $PRESET"
/usr/bin/time -f "synth %e s" "$B" synth --preset "$PRESET" --seed 0 --out /tmp/model 2>&1 | tail -2 | tee -a "$out/e2e.log"
step "serve ($QUANT)"
"$B" serve --model /tmp/model --tokenizer "$TOK" --device cuda --quant "$QUANT" --port 8000 \
  --served-model-name hayai >"$out/server.log" 2>&1 &
srv=$!
for i in $(seq 1 600); do
  curl -sf http://127.0.0.1:8000/v1/models >/dev/null && break
  kill -0 $srv 2>/dev/null || { echo "server died"; tail -20 "$out/server.log"; break; }
  sleep 0.5
done
echo "ready after ~$((i / 2)) s" | tee -a "$out/e2e.log"
step "bench $NP x $LEN"
"$B" bench --base-url http://127.0.0.1:8000 --dataset data/challenge/eval_prompts_sharegpt.json \
  --num-prompts "$NP" --output-len "$LEN" --no-progress --output-dir "$out/bench" 2>&1 | tail -16 | tee -a "$out/e2e.log"
step "ppl $PPLN records"
"$B" ppl --base-url http://127.0.0.1:8000 --records data/challenge/ppl_ground_truth_tokens.jsonl \
  --limit "$PPLN" --output-dir "$out/ppl" 2>&1 | tail -3 | tee -a "$out/e2e.log"
step "capture x2 + identity"
for c in 1 2; do
  "$B" capture --base-url http://127.0.0.1:8000 --prompts data/challenge/eval_prompts_sharegpt.json \
    --tokenizer "$TOK" --num-prompts 4 --max-tokens 64 --no-progress --output-dir "$out/cap$c" 2>&1 | tail -2 | tee -a "$out/e2e.log"
done
"$B" identity "$out/cap1" "$out/cap2" 2>&1 | tail -4 | tee -a "$out/e2e.log"
curl -s http://127.0.0.1:8000/metrics | grep -E "^hayai_(requests_total|generation_tokens_total|recent)" | head -8 | tee -a "$out/e2e.log"
kill $srv; wait $srv 2>/dev/null
step "bench-engine $PRESET $QUANT"
"$B" bench-engine --model "synth:$PRESET" --device cuda --quant "$QUANT" --prompt-len 128 --gen 512 2>&1 | tail -30 | tee -a "$out/e2e.log"
step done
