#!/usr/bin/env bash
# The test command: set-up, the real model, every Rust test (unit, property, integration,
# real-model checks against llama.cpp and transformers fixtures), lint, the GPU prototypes'
# compilation, and the official `openai` Python client against a live hayai server on the real
# model.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
cargo fmt --all -- --check
cargo build --release -p hayai
target/release/hayai fetch-model --verify
cargo test --release --workspace
cargo clippy --release --workspace --all-targets -- -D warnings
# (with HAYAI_NO_CUDA=1 there is no nvcc, and no kernel is compiled either)
[ "${HAYAI_NO_CUDA:-0}" = "1" ] || scripts/check-protos.sh

# The official OpenAI client against our server on the real model.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp)
target/release/hayai serve --device cpu --port "$port" --served-model-name gemma-3-270m >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "http://127.0.0.1:$port/v1/models" 2>/dev/null && break
  kill -0 $server 2>/dev/null || { cat "$log"; echo "server died" >&2; exit 1; }
  sleep 0.5
done
scripts/test-openai-client.sh "http://127.0.0.1:$port/v1"
echo "all checks passed"
