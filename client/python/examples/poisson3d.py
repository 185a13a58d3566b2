#!/usr/bin/python3
"""A 3-D PDE surrogate's data: source fields f and the solutions u of the screened Poisson
equation on the periodic unit cube,

    -laplace(u) + k^2 u = f,

solved exactly in Fourier space (u_hat = f_hat / (|2 pi xi|^2 + k^2)). The sources are
smooth random fields (white noise under a Gaussian spectral filter), so each sample is a
different right-hand side and the network must learn the solution operator, not a
picture. Everything is deterministic from the seed.

    poisson3d.py OUT.h5 [--train N] [--test M] [--size S] [--seed SEED] [--k K]

writes OUT.h5 with groups "train" (N samples) and "test" (M samples, from the same
stream after the training ones), each holding "x" (the sources, float32 [n, 1, S, S, S])
and "y" (the solutions, same shape), chunked one sample a chunk, and the parameters as
attributes: the layout distdld reads in parallel (Train and Evaluate with the file's
name under --data-root). make() returns the arrays in memory.
"""
import argparse
import sys

import numpy as np


def make(n, size, seed=0, k=4.0, smooth=0.08):
    """(f, u): n sources and their solutions, float32 [n, 1, size, size, size]. The sources
    have unit standard deviation over the set; the solutions are scaled by the same
    factor for every sample (k^2 / 2), so the operator stays linear and sample-independent."""
    rng = np.random.default_rng(seed)
    xi = np.fft.fftfreq(size) * size  # integer wave numbers
    kx, ky, kz = np.meshgrid(xi, xi, xi, indexing="ij")
    k2 = (2 * np.pi) ** 2 * (kx ** 2 + ky ** 2 + kz ** 2)
    filt = np.exp(-0.5 * (kx ** 2 + ky ** 2 + kz ** 2) * (smooth * 2 * np.pi) ** 2)
    green = 1.0 / (k2 + k * k)
    f = np.empty((n, 1, size, size, size), np.float64)
    u = np.empty_like(f)
    for i in range(n):
        w = np.fft.fftn(rng.standard_normal((size, size, size))) * filt
        f[i, 0] = np.fft.ifftn(w).real
        u[i, 0] = np.fft.ifftn(w * green).real
    s = f.std()
    f /= s
    u *= k * k / (2 * s)
    return f.astype(np.float32), u.astype(np.float32)


def write_h5(path, splits, **attrs):
    """Writes {"train": (f, u), "test": (f, u)} to an HDF5 file: a group per split with
    datasets x and y, one sample a chunk."""
    import h5py
    with h5py.File(path, "w") as h:
        for split, (f, u) in splits.items():
            g = h.create_group(split)
            for name, a in (("x", f), ("y", u)):
                g.create_dataset(name, data=a, chunks=(1,) + a.shape[1:])
        for key, v in attrs.items():
            h.attrs[key] = v


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=64)
    ap.add_argument("--test", type=int, default=16)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=float, default=4.0)
    a = ap.parse_args(argv)
    if a.train < 1 or a.test < 1 or a.size < 2:
        ap.error("--train and --test must be >= 1 and --size >= 2")
    f, u = make(a.train + a.test, a.size, a.seed, a.k)
    n = a.train
    write_h5(a.out, {"train": (f[:n], u[:n]), "test": (f[n:], u[n:])}, seed=a.seed, k=a.k,
             equation="-laplace(u) + k^2 u = f, periodic")
    print("%s: train %d and test %d samples of x, y float32 [1, %d, %d, %d] (seed %d, k %g)"
          % (a.out, a.train, a.test, a.size, a.size, a.size, a.seed, a.k))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
