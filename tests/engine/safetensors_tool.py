#!/usr/bin/python3
"""Reads safetensors files with numpy alone and compares them.

  safetensors_tool.py compare A B [--rtol R]   max relative difference per tensor; exit 1 if > R
  safetensors_tool.py compare A B --model-norm [--rtol R]
                          judge ||A - B|| / ||B|| over all tensors together instead (a single
                          element off, e.g. a ReLU input within f32 rounding of zero routing
                          one gradient differently, does not fail it; a wrong tensor does)
  safetensors_tool.py losses LOG_A LOG_B ... --rtol R   compare 'step N loss L' lines
"""
import json
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    body = data[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": np.float32, "F64": np.float64}[info["dtype"]]
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(body[b:e], dtype=dt).reshape(info["shape"])
    return out


def compare(a, b, rtol, model_norm=False):
    ta, tb = load(a), load(b)
    if sorted(ta) != sorted(tb):
        print(f"tensor names differ: {sorted(ta)} vs {sorted(tb)}")
        return 1
    worst = dd = yy = 0.0
    for name in sorted(ta):
        x, y = ta[name].astype(np.float64), tb[name].astype(np.float64)
        if x.shape != y.shape:
            print(f"{name}: shape {x.shape} vs {y.shape}")
            return 1
        d = float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
        worst = max(worst, d)
        dd += float(np.sum((x - y) ** 2))
        yy += float(np.sum(y ** 2))
        print(f"{name:28s} {str(x.shape):18s} max rel diff {d:.3e}")
    if model_norm:
        d = (dd / max(yy, 1e-300)) ** 0.5
        print(f"weights max rel diff {worst:.3e}; all tensors together ||a - b|| / ||b|| {d:.3e} "
              f"(tolerance {rtol:g})")
        return 0 if d <= rtol else 1
    print(f"weights max rel diff {worst:.3e} (tolerance {rtol:g})")
    return 0 if worst <= rtol else 1


def losses(paths, rtol):
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append([float(l.split()[3]) for l in f if l.startswith("step ")])
    n = min(len(r) for r in runs)
    if n == 0:
        print("no 'step N loss L' lines")
        return 1
    worst = 0.0
    for i in range(n):
        ref = runs[0][i]
        for r in runs[1:]:
            worst = max(worst, abs(r[i] - ref) / max(abs(ref), 1e-30))
    print(f"{n} steps, first loss {runs[0][0]:.6f}, last {runs[0][n-1]:.6f}; "
          f"max rel diff across runs {worst:.3e} (tolerance {rtol:g})")
    return 0 if worst <= rtol else 1


def main(argv):
    rtol = 1e-5
    if "--rtol" in argv:
        i = argv.index("--rtol")
        rtol = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    model_norm = "--model-norm" in argv
    argv = [a for a in argv if a != "--model-norm"]
    if len(argv) >= 4 and argv[1] == "compare":
        return compare(argv[2], argv[3], rtol, model_norm)
    if len(argv) >= 4 and argv[1] == "losses":
        return losses(argv[2:], rtol)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
