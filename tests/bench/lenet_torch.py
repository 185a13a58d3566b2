#!/usr/bin/python3
"""The same LeNet-5 training step in PyTorch (CPU), for bench-train's ratio.

Usage: lenet_torch.py BATCH STEPS THREADS  -> prints "images_per_s <value>"
Same network (conv 1->6 k5 p2, relu, maxpool 2; conv 6->16 k5, relu, maxpool 2;
linear 400->120->84->10 with relu), cross-entropy, Adam 1e-3, f32, real
Fashion-MNIST batches read with numpy from the Debian package's IDX files.
"""
import gzip
import sys
import time

import numpy as np
import torch
import torch.nn as nn


def load_images(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[4:8], "big")
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, 1, 28, 28)


def load_labels(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    return np.frombuffer(data, dtype=np.uint8, offset=8).astype(np.int64)


def main():
    batch, steps, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    d = "/usr/share/datasets/fashion-mnist/"
    x = load_images(d + "train-images-idx3-ubyte.gz")
    y = load_labels(d + "train-labels-idx1-ubyte.gz")
    net = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    lossf = nn.CrossEntropyLoss()
    warm = 5
    t0 = 0.0
    for s in range(warm + steps):
        idx = np.arange(s * batch, (s + 1) * batch) % x.shape[0]
        xb = torch.from_numpy(((x[idx].astype(np.float32) / 255.0) - 0.2860) / 0.3530)
        yb = torch.from_numpy(y[idx])
        if s == warm:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = lossf(net(xb), yb)
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(f"torch threads {threads} batch {batch} steps {steps}: {dt:.3f} s, images_per_s {batch * steps / dt:.1f}")


if __name__ == "__main__":
    main()
