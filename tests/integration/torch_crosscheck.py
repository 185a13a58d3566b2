#!/usr/bin/python3
"""Cross-checks distdl-verify's gathered dumps against PyTorch (Debian's python3-torch).

Usage: torch_crosscheck.py MPIRUN_PREFIX... -- VERIFY_BIN
Runs a set of distributed layer cases with "dump", recomputes each in PyTorch from the
dumped x (x0, x1, ... for add and concat), parameters and dy, and compares y and every gradient (f64, tolerance 1e-10).
Exits 7 (skip) when torch is not installed.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    print("skipped: python3-torch / python3-numpy not installed")
    sys.exit(7)

torch.set_default_dtype(torch.float64)

P4 = {"ranks": [0, 1, 2, 3], "shape": [1, 1, 2, 2]}
CASES = [
    ("conv2d feature k5 s2 p2", 4, {"op": "conv2d", "P_x": P4, "x_global_shape": [2, 5, 10, 10],
     "out_channels": 7, "kernel": [5, 5], "stride": [2, 2], "padding": [2, 2], "dilation": [1, 1], "bias": True}),
    ("conv2d channel co2 ci2", 4, {"op": "conv2d", "P_x": {"ranks": [0, 1], "shape": [1, 2, 1, 1]},
     "P_y": {"ranks": [2, 3], "shape": [1, 2, 1, 1]}, "P_w": {"ranks": [0, 1, 2, 3], "shape": [2, 2, 1, 1]},
     "x_global_shape": [2, 6, 7, 7], "out_channels": 5, "kernel": [3, 3], "padding": [1, 1], "bias": True}),
    ("conv1d feature dilation 2", 3, {"op": "conv1d", "P_x": {"ranks": [0, 1, 2], "shape": [1, 1, 3]},
     "x_global_shape": [2, 3, 20], "out_channels": 4, "kernel": [3], "dilation": [2], "padding": [1], "bias": False}),
    ("linear 12->6 on [3,4]", 4, {"op": "linear", "P_x": {"ranks": [0, 1], "shape": [1, 2]},
     "P_y": {"ranks": [2, 3], "shape": [1, 2]}, "P_w": {"ranks": [0, 1, 2, 3], "shape": [2, 2]},
     "x_global_shape": [5, 12], "out_features": 6, "bias": True}),
    ("maxpool2d k3 s2 p1", 4, {"op": "maxpool2d", "P_x": P4, "x_global_shape": [2, 3, 11, 9],
     "kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
    ("avgpool2d k2", 4, {"op": "avgpool2d", "P_x": P4, "x_global_shape": [2, 3, 10, 8], "kernel": [2, 2]}),
    ("batchnorm training", 4, {"op": "batchnorm", "P_x": {"ranks": [0, 1, 2, 3], "shape": [2, 2, 1, 1]},
     "x_global_shape": [4, 6, 3, 5]}),
    ("upsample linear x2 align", 4, {"op": "upsample", "P_x": P4, "x_global_shape": [1, 2, 5, 7],
     "mode": "linear", "align_corners": True, "scale_factor": 2}),
    ("upsample nearest size", 4, {"op": "upsample", "P_x": P4, "x_global_shape": [1, 2, 5, 7],
     "mode": "nearest", "size": [8, 3]}),
    ("add 3 operands", 4, {"op": "add", "n": 3, "P_x": P4, "x_global_shape": [2, 3, 6, 5]}),
    ("concat channels", 4, {"op": "concat", "P_x": {"ranks": [0, 1, 2, 3], "shape": [2, 1, 1, 2]},
     "x_global_shapes": [[2, 3, 6, 5], [2, 4, 6, 5], [2, 1, 6, 5]]}),
    ("global_avgpool channels+space", 4, {"op": "global_avgpool", "P_x": {"ranks": [0, 1, 2, 3], "shape": [1, 2, 2, 1]},
     "x_global_shape": [2, 6, 7, 5]}),
    ("cross_entropy classes split", 4, {"op": "cross_entropy", "P_x": {"ranks": [0, 1, 2, 3], "shape": [2, 2]},
     "x_global_shape": [9, 10], "reduction": "mean"}),
    ("cross_entropy 3-d volume [1,1,2,2,1]", 4, {"op": "cross_entropy",
     "P_x": {"ranks": [0, 1, 2, 3], "shape": [1, 1, 2, 2, 1]}, "x_global_shape": [2, 3, 6, 5, 4],
     "reduction": "mean"}),
    ("cross_entropy 2-d image batch split", 2, {"op": "cross_entropy",
     "P_x": {"ranks": [0, 1], "shape": [2, 1, 1, 1]}, "x_global_shape": [3, 4, 5, 7],
     "reduction": "sum"}),
    ("bce_with_logits sum", 4, {"op": "loss", "kind": "bce_with_logits", "reduction": "sum",
     "P_x": {"ranks": [0, 1, 2, 3], "shape": [1, 4]}, "x_global_shape": [3, 10]}),
]
# Every elementwise loss of a spec (issue 18) with each of its reductions, on a volume
# [2, 1, 6, 5, 4] split over 2 ranks spatially (as a U-Net's output is), and "none" with
# an upstream gradient.
_VOL = {"P_x": {"ranks": [0, 1], "shape": [1, 1, 2, 1, 1]}, "x_global_shape": [2, 1, 6, 5, 4]}
for _kind, _reds in (("mse", ("mean", "sum", "none")), ("l1", ("mean", "sum", "none")),
                     ("bce", ("mean", "sum", "none")), ("bce_with_logits", ("mean", "none")),
                     ("kl_div", ("mean", "sum", "batchmean", "none")),
                     ("kl_div_log_target", ("mean", "batchmean")),
                     ("poisson_nll", ("mean", "sum", "none"))):
    for _red in _reds:
        CASES.append((f"{_kind} {_red} volume", 2,
                      dict(_VOL, op="loss", kind=_kind, reduction=_red)))


def torch_loss(kind, x, t, reduction):
    """PyTorch's loss of each kind, with its default arguments."""
    if kind == "mse":
        return F.mse_loss(x, t, reduction=reduction)
    if kind == "l1":
        return F.l1_loss(x, t, reduction=reduction)
    if kind == "bce":
        return F.binary_cross_entropy(x, t, reduction=reduction)
    if kind == "bce_with_logits":
        return F.binary_cross_entropy_with_logits(x, t, reduction=reduction)
    if kind in ("kl_div", "kl_div_log_target"):
        return F.kl_div(x, t, reduction=reduction, log_target=kind == "kl_div_log_target")
    if kind == "poisson_nll":
        return F.poisson_nll_loss(x, t, log_input=True, full=False, reduction=reduction)
    raise ValueError(kind)


def load(d, name):
    p = os.path.join(d, name + ".npy")
    return torch.tensor(np.load(p)) if os.path.exists(p) else None


def reference_join(case, d):
    # Multi-input layers dump x0, x1, ... and dx0, dx1, ...
    n = case.get("n", 2) if case["op"] == "add" else len(case["x_global_shapes"])
    xs = [load(d, f"x{k}").requires_grad_(True) for k in range(n)]
    y = sum(xs[1:], xs[0]) if case["op"] == "add" else torch.cat(xs, dim=1)
    y.backward(load(d, "dy"))
    out = {"y": y.detach()}
    out.update({f"dx{k}": x.grad for k, x in enumerate(xs)})
    return out


def reference(case, d):
    op = case["op"]
    if op in ("add", "concat"):
        return reference_join(case, d)
    x = load(d, "x").requires_grad_(True)
    w, b = load(d, "weight"), load(d, "bias")
    params = [t.requires_grad_(True) for t in (w, b) if t is not None]
    if op.startswith("conv"):
        f = {"conv1d": F.conv1d, "conv2d": F.conv2d}[op]
        y = f(x, w, b, stride=case.get("stride", 1), padding=case.get("padding", 0),
              dilation=case.get("dilation", 1))
    elif op == "linear":
        y = F.linear(x, w, b)
    elif op == "maxpool2d":
        y = F.max_pool2d(x, case["kernel"], case.get("stride"), case.get("padding", 0))
    elif op == "avgpool2d":
        y = F.avg_pool2d(x, case["kernel"], case.get("stride"), case.get("padding", 0))
    elif op == "global_avgpool":
        y = F.adaptive_avg_pool2d(x, 1)
    elif op == "batchnorm":
        y = F.batch_norm(x, None, None, w, b, training=True, eps=1e-5)
    elif op == "upsample":
        mode = "nearest" if case["mode"] == "nearest" else "bilinear"
        kw = {"align_corners": case["align_corners"]} if mode != "nearest" else {}
        y = F.interpolate(x, size=case.get("size"), scale_factor=case.get("scale_factor"), mode=mode, **kw)
    elif op == "cross_entropy":
        t = load(d, "target").long()
        y = F.cross_entropy(x, t, reduction=case["reduction"])
    elif op == "loss":
        y = torch_loss(case["kind"], x, load(d, "target"), case["reduction"])
        if case["reduction"] == "none":
            y.backward(load(d, "dloss").reshape(y.shape))
            return {"loss": y.detach(), "dx": x.grad}
    if op in ("cross_entropy", "loss"):
        y.backward()
        return {"loss": y.detach(), "dx": x.grad}
    dy = load(d, "dy")
    y.backward(dy)
    out = {"y": y.detach(), "dx": x.grad}
    if w is not None:
        out["dweight"] = w.grad
    if b is not None:
        out["dbias"] = b.grad
    return out


def main(argv):
    sep = argv.index("--")
    mpirun, verify = argv[1:sep], argv[sep + 1]
    worst, failed = 0.0, 0
    for name, np_, case in CASES:
        case = dict(case, dtype="f64", seed=11, checks=["sequential"])
        with tempfile.TemporaryDirectory() as d:
            case["dump"] = d
            r = subprocess.run(mpirun + ["-np", str(np_), verify, json.dumps(case)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL {name}: distdl-verify exited {r.returncode}\n{r.stdout}{r.stderr}")
                failed += 1
                continue
            ref = reference(case, d)
            err = 0.0
            for key, val in ref.items():
                got = load(d, key)
                scale = max(float(val.abs().max()), 1e-30)
                err = max(err, float((got.reshape(val.shape) - val).abs().max()) / scale)
            worst = max(worst, err)
            ok = err <= 1e-10
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name:32s} max rel diff vs PyTorch {err:.2e}")
    print(f"{len(CASES) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
