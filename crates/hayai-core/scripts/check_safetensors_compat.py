#!/usr/bin/env python3
"""Checks that safetensors files written by hayai-core load in the Python
`safetensors` package (numpy API), and that a file written by Python loads in
hayai-core. Run from the repository root after `pip install safetensors numpy`.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from safetensors import safe_open

EXAMPLE = ["cargo", "run", "-q", "-p", "hayai-core", "--example", "safetensors_sample", "--"]

with tempfile.TemporaryDirectory() as d:
    ours = Path(d) / "ours.safetensors"
    subprocess.run(EXAMPLE + [str(ours)], check=True)
    # numpy has no bfloat16, so load every other tensor by name.
    with safe_open(str(ours), "np") as f:
        assert f.metadata() == {"format": "pt"}
        assert "bf16" in f.keys()
        t = {k: f.get_tensor(k) for k in f.keys() if k != "bf16"}
    raw = ours.read_bytes()
    assert b"\x80\x3f\xa0\xc0" in raw  # bf16 payload 1.0, -5.0
    assert t["f32"].shape == (2, 3) and t["f32"].dtype == np.float32
    assert t["f32"].tolist() == [[1.0, -2.5, 3.25], [0.0, 5.0, 6.0]]
    assert t["f16"].dtype == np.float16 and t["f16"].reshape(-1).tolist() == [1.0, -2.0, 0.5]
    assert t["i32"].tolist() == [7, -1] and t["i64"].tolist() == [-3]
    assert t["u8"].tolist() == [1, 2, 255] and t["i8"].tolist() == [-2]
    assert t["bool"].tolist() == [True, False]
    assert t["f64"].shape == () and float(t["f64"]) == 0.5
    print("python safetensors reads hayai-core output: OK")

    theirs = Path(d) / "theirs.safetensors"
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3),
               "h": np.array([1.5, -1], dtype=np.float16),
               "i": np.array([[1, 2]], dtype=np.int64)}, str(theirs), metadata={"k": "v"})
    out = subprocess.run(EXAMPLE + ["--read", str(theirs)], check=True,
                         capture_output=True, text=True).stdout
    print(out, end="")
    assert "w F32 [2, 3] [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]" in out
    assert "h F16 [2] [1.5, -1.0]" in out
    assert "i I64 [1, 2] [1.0, 2.0]" in out
    assert "meta k=v" in out
    print("hayai-core reads python safetensors output: OK")
sys.exit(0)
