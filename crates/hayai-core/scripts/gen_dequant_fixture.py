#!/usr/bin/env python3
"""Generate tests/fixtures/dequant_ref.bin: random quantized blocks and their
dequantized values computed by the `gguf` Python package (pip install gguf),
an implementation independent of ours.

Format (little-endian): b"HYDQ", u32 n_cases, then per case:
u32 ggml type id, u32 n_elements, u32 n_bytes, raw bytes, f32 x n_elements.
"""
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

rng = np.random.default_rng(20261129)

# Byte offsets of f16 scale fields inside one block.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0], T.TQ2_0: [64],
}


def random_f16_bits(n):
    """Finite f16 bit patterns (normals, subnormals, zeros, both signs)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    exp = (bits >> 10) & 0x1F
    bits = np.where(exp == 0x1F, bits & ~np.uint32(0x4000), bits)  # no inf/nan
    return bits.astype(np.uint16)


def blocks_for(t, n_blocks):
    bs, ts = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in F16_FIELDS.get(t, []):
        raw[:, off:off + 2] = random_f16_bits(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if t == T.MXFP4:
        e = rng.integers(90, 160, size=n_blocks, dtype=np.uint8)
        e[:3] = [0, 1, 2]  # exercise the subnormal branch of the e8m0 scale
        raw[:, 0] = e
    return raw.reshape(-1), n_blocks * bs


def main(out_path):
    cases = []
    for t, n_blocks in [
        (T.Q4_0, 8), (T.Q4_1, 8), (T.Q5_0, 8), (T.Q5_1, 8), (T.Q8_0, 8),
        (T.IQ4_NL, 8), (T.MXFP4, 8),
        (T.Q2_K, 3), (T.Q3_K, 3), (T.Q4_K, 3), (T.Q5_K, 3), (T.Q6_K, 3),
        (T.IQ4_XS, 3), (T.TQ2_0, 3),
    ]:
        raw, n = blocks_for(t, n_blocks)
        cases.append((t, n, raw, quants.dequantize(raw, t).reshape(-1).astype(np.float32)))
    f16 = random_f16_bits(64)
    cases.append((T.F16, 64, f16.view(np.uint8), f16.view(np.float16).astype(np.float32)))
    bf = rng.integers(0, 1 << 16, size=64, dtype=np.uint32).astype(np.uint16)
    bf = np.where((bf & 0x7F80) == 0x7F80, bf & 0xBFFF, bf).astype(np.uint16)  # finite
    cases.append((T.BF16, 64, bf.view(np.uint8), quants.dequantize(bf.view(np.uint8), T.BF16).reshape(-1)))
    f32 = rng.standard_normal(64).astype(np.float32)
    cases.append((T.F32, 64, f32.view(np.uint8), f32))

    buf = bytearray(b"HYDQ")
    buf += struct.pack("<I", len(cases))
    for t, n, raw, ref in cases:
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        ref = np.ascontiguousarray(ref, dtype="<f4")
        assert ref.size == n, (t, ref.size, n)
        buf += struct.pack("<III", int(t), n, raw.size)
        buf += raw.tobytes()
        buf += ref.tobytes()
    Path(out_path).write_bytes(bytes(buf))
    print(f"wrote {out_path}: {len(cases)} cases, {len(buf)} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else
         str(Path(__file__).resolve().parent.parent / "tests/fixtures/dequant_ref.bin"))
