#!/usr/bin/env bash
# The main job: build hayai, download the default real model (Gemma 3 270M) once, start our
# OpenAI-compatible server on it (GPU if one is present, else CPU), run the challenge benchmark
# and the endpoint perplexity against it, and print the summary. Results land in results/.
# Sized to a few minutes on a CPU; the full 128 prompts x 512 tokens on a GPU.
# Extra arguments go to `hayai demo` (e.g. --model DIR, --quant int4, --num-prompts N).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
cargo build --release -p hayai
target/release/hayai fetch-model >/dev/null
exec target/release/hayai demo "$@"
