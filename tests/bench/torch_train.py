#!/usr/bin/python3
"""The training step of a distdl-c spec's network in PyTorch (CPU), for bench-train's ratios.

Usage: torch_train.py SPEC.json BATCH STEPS THREADS [WARMUP]
       -> prints "... images_per_s <value>"

Builds the network from the spec JSON alone with the builder of the PyTorch equivalence
test (tests/integration/torch_networks.py: every layer type, from/add/concat graphs,
batch norm in training mode), in f32, with the spec's loss (cross_entropy or mse, its
reduction) and optimizer (SGD/Adam/AdamW and their hyper-parameters; the schedule is left
out: it costs nothing per step). Times STEPS steps (zero_grad, forward, loss, backward,
optimizer step) after WARMUP untimed ones (default 3) with torch.set_num_threads(THREADS).
Inputs and targets are random tensors of the right shapes (standard normal inputs; class
labels, one per sample or per output voxel; for mse normal targets shaped like the
output), NBATCH of them made before the timing and used in turn, as the distdl-c worker
does with its data: the cost of a step does not depend on the values.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from torch_networks import SpecNet, make_optimizer  # noqa: E402

NBATCH = 4


def main(argv):
    if len(argv) not in (5, 6):
        print(__doc__)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    batch, steps, threads = int(argv[2]), int(argv[3]), int(argv[4])
    warm = int(argv[5]) if len(argv) == 6 else 3
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    net = SpecNet(spec).float().train()
    opt = make_optimizer(spec["optimizer"], list(net.parameters()))
    kind, red = spec["loss"]["type"], spec["loss"].get("reduction", "mean")
    if kind not in ("cross_entropy", "mse"):
        raise SystemExit(f"{argv[1]}: loss {kind} is not timed here (cross_entropy, mse)")
    xs = [torch.randn([batch] + list(spec["input"]["shape"])) for _ in range(NBATCH)]
    with torch.no_grad():
        out = net(xs[0]).shape  # the output's shape, for the targets
    if kind == "cross_entropy":
        ys = [torch.randint(0, out[1], [batch] + list(out[2:])) for _ in range(NBATCH)]
        lossf = lambda o, y: F.cross_entropy(o, y, reduction=red)
    else:
        ys = [torch.randn(out) for _ in range(NBATCH)]
        lossf = lambda o, y: F.mse_loss(o, y, reduction=red)
    t0 = 0.0
    for s in range(warm + steps):
        if s == warm:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = lossf(net(xs[s % NBATCH]), ys[s % NBATCH])
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(f"torch {spec.get('name', argv[1])} threads {threads} batch {batch} steps {steps}: "
          f"{dt:.3f} s, images_per_s {batch * steps / dt:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
