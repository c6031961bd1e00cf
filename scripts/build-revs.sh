#!/usr/bin/env bash
# Release binaries of earlier commits, for A/B runs beside the current one on the same GPU machine
# (machines of one kind differ by ~1%, so compare builds only within one run; docs/performance.md).
#   scripts/build-revs.sh REV [REV ...]
#   -> .gpurun/hayai-REV.gz for each REV (stripped, compressed: ~6 MB each) and .gpurun/hayai.gz
#      for the working tree; carry .gpurun and there, e.g.:
#        cd .gpurun && for f in *.gz; do gunzip -c $f > ${f%.gz}; chmod +x ${f%.gz}; done
#        for b in hayai-REV hayai; do ./$b bench-engine --model synth:e4b --device cuda --quant int4; done
# Builds in a temporary git worktree with its own target directory (the first build compiles
# every crate: a few minutes on two cores; later ones, also in later runs, are incremental).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ $# -ge 1 ] || { echo "usage: scripts/build-revs.sh REV [REV ...]" >&2; exit 2; }
out="$root/.gpurun"
mkdir -p "$out"
wt="${TMPDIR:-/tmp}/hayai-revs"
target="${TMPDIR:-/tmp}/hayai-revs-target"
[ -d "$wt" ] || git worktree add -f --detach "$wt" HEAD >/dev/null
ln -sfn "$root/.venv" "$wt/.venv"
for rev in "$@"; do
  short=$(git rev-parse --short "$rev")
  git -C "$wt" checkout -q --detach "$short"
  CARGO_TARGET_DIR="$target" cargo build --release -p hayai --manifest-path "$wt/Cargo.toml" 2>&1 | tail -1
  cp "$target/release/hayai" "$out/hayai-$short"
  strip "$out/hayai-$short" 2>/dev/null || true
  gzip -9 -f "$out/hayai-$short"
  echo "$out/hayai-$short.gz"
done
cargo build --release -p hayai 2>&1 | tail -1
cp target/release/hayai "$out/hayai"
strip "$out/hayai" 2>/dev/null || true
gzip -9 -f "$out/hayai"
echo "$out/hayai.gz"
# The worktree goes; its target directory stays, so a later run at the same path is incremental.
git worktree remove --force "$wt"
