#!/usr/bin/env bash
# Installs the CUDA 13.0 compiler from PyPI into ./.venv (gitignored) so build.rs can compile
# the kernels on machines without a CUDA toolkit. Idempotent: returns at once when nvcc is there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
pkgs=(
  "nvidia-cuda-nvcc==13.0.*"
  "nvidia-cuda-crt==13.0.*"
  "nvidia-cuda-runtime==13.0.*"
  "nvidia-cuda-cccl==13.0.*"
  "nvidia-nvvm==13.0.*"
)
find_nvcc() {
  local n
  for n in "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc; do
    [ -x "$n" ] && { echo "$n"; return 0; }
  done
  return 1
}
if nvcc="$(find_nvcc)" && "$nvcc" --version >/dev/null 2>&1; then
  echo "nvcc present: $nvcc"
  exit 0
fi
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pkgs[@]}"
nvcc="$(find_nvcc)" || { echo "error: nvcc not found under $venv after install" >&2; exit 1; }
"$nvcc" --version | tail -n 2
echo "nvcc installed: $nvcc"
