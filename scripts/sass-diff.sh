#!/usr/bin/env bash
# Whether the decode kernels compile to the same machine code as at another commit (no GPU needed):
# a change to a default kernel's source is either measured on the GPU or shown here to leave its
# SASS unchanged (docs/decisions.md, "Default kernels keep their measured SASS").
#   scripts/sass-diff.sh REV [ARCH] [KERNEL ...]
#   REV: the commit to compare with (e.g. the last build measured on the GPU); ARCH: sm_90 (default)
#   or sm_80/86/89; KERNELS: default the decode path's (gemv, gemv_mma, gemv_mma_kw, attention);
#   `all`: every kernel in either build (for changes to shared device code).
# Prints, per kernel, "same", "new" or "DIFFERS" with the instruction counts; exit 1 if any differs.
# Instruction text is compared without addresses, so moved code with the same instructions is the same.
# HAYAI_SASS_OLD_DEFINES="-DX=1 ..." compiles REV with those switches (a measurement build made the
# default: the new code must be the build that was measured).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
rev="${1:?usage: scripts/sass-diff.sh REV [ARCH] [KERNEL ...]}"
arch="${2:-sm_90}"
shift $(( $# >= 2 ? 2 : 1 ))
kernels=("$@")
[ ${#kernels[@]} -eq 0 ] && kernels=(gemv gemv_mma gemv_mma_kw attn_split attn_split_wv_hd256 attn_split_wv_hd512 argmax_stage1 argmax_stage2 ple_combine)

site=$(ls -d "$root"/.venv/lib/python3*/site-packages 2>/dev/null | head -1)
nvcc="${HAYAI_NVCC:-$site/nvidia/cu13/bin/nvcc}"
[ -x "$nvcc" ] || { echo "no nvcc: run scripts/setup-cuda.sh" >&2; exit 2; }
# cuobjdump and nvdisasm are not part of the compiler wheel; fetch them into .venv once.
tools="$site/nvidia/cu13/bin"
if [ ! -x "$tools/cuobjdump" ] || [ ! -x "$tools/nvdisasm" ]; then
  # (PyPI has no 13.0 builds of these; later ones read 13.0 cubins.)
  "$root/.venv/bin/pip" install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm ||
    { echo "could not install cuobjdump/nvdisasm" >&2; exit 2; }
fi
export PATH="$tools:$PATH"
command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null ||
  { echo "cuobjdump/nvdisasm not found in $tools" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cubin() {  # $1: kernels directory, $2: output cubin, then extra nvcc flags
  local unit="$work/unit-$(basename "$2").cu" f
  : > "$unit"
  for f in "$1"/*.cu; do echo "#include \"$f\"" >> "$unit"; done
  "$nvcc" -cubin -O3 -std=c++17 -I "$1" -gencode="arch=compute_${arch#sm_},code=$arch" "${@:3}" -o "$2" "$unit"
}
mkdir -p "$work/old"
git archive "$rev" crates/hayai-cuda/kernels | tar -x -C "$work/old" || exit 2
read -ra old_defines <<< "${HAYAI_SASS_OLD_DEFINES:-}"
cubin "$work/old/crates/hayai-cuda/kernels" "$work/old.cubin" "${old_defines[@]}" || exit 2
cubin "$root/crates/hayai-cuda/kernels" "$work/new.cubin" || exit 2

sass() {  # instruction text of kernel $2 in cubin $1, one per line, without addresses
  cuobjdump -sass -fun "$2" "$1" 2>/dev/null | grep -E '^\s+/\*[0-9a-f]{4,}\*/' |
    sed -E 's#/\*[0-9a-f]+\*/##g; s/[[:space:]]+/ /g'
}
if [ "${kernels[*]}" = "all" ]; then
  mapfile -t kernels < <( { cuobjdump -sass "$work/old.cubin"; cuobjdump -sass "$work/new.cubin"; } 2>/dev/null |
    sed -nE 's/.*Function : ([A-Za-z0-9_]+).*/\1/p' | sort -u)
fi
status=0
for k in "${kernels[@]}"; do
  sass "$work/old.cubin" "$k" > "$work/a"
  sass "$work/new.cubin" "$k" > "$work/b"
  na=$(wc -l < "$work/a"); nb=$(wc -l < "$work/b")
  if [ "$na" -eq 0 ] && [ "$nb" -eq 0 ]; then
    printf '%-24s absent in both\n' "$k"
  elif [ "$na" -eq 0 ]; then
    printf '%-24s new (%d instructions)\n' "$k" "$nb"
  elif cmp -s "$work/a" "$work/b"; then
    printf '%-24s same (%d instructions)\n' "$k" "$na"
  else
    printf '%-24s DIFFERS (%d -> %d instructions)\n' "$k" "$na" "$nb"
    status=1
  fi
done
exit $status
