#!/usr/bin/python3
"""A scaling model of distdl-c's training step to 1,000 ranks (docs/SCALING.md).

    scaling_model.py [--measure] [--build build] [--data DIR] [--out docs/scaling.png]
    scaling_model.py --emit lenet5|mlp|resnet|unet3d P [weak]   print a generated spec

Predicts the time of one training step of each network (NETWORKS below) from

  - the bytes and messages every primitive moves on every rank, derived from the spec
    (tests/engine/traffic_formula.py, the formulas the traffic test checks against the
    engine's counters),
  - each convolution's and upsample's time on its busiest rank: the engine's own kernel
    (forward, and backward with dW and, unless nothing reads it, dx; the interpolation)
    timed alone at that rank's local geometry by `bench-conv-paths --times`, on one thread
    and for np 1 on every core (docs/scaling_data.json, "conv_times"); the linear layers'
    FLOPs at the sgemm rate, and the memory traffic of the elementwise layers and of the
    optimizer,
  - a latency-bandwidth (alpha-beta) cost for each MPI operation (binomial-tree or
    scatter-allgather broadcast and reduce, recursive-doubling or ring all-reduce,
    point-to-point sets bounded by their busiest rank), plus the status agreements every
    layer call ends with,

for two machines: this one (alpha, beta, the sgemm rate and memcpy bandwidth measured by
bench-pingpong) and a typical cluster (100 Gb/s links, 2 us latency, one rank per core
of this machine's speed). It checks the model against step times measured here with
bench-train-worker (Fashion-MNIST, or the U-Net's generated volumes) at np 1 and 2 (np 4
and 8 oversubscribed on the 2 cores),
and plots predicted against measured (strong and weak scaling) into docs/scaling.png.

--measure reruns bench-pingpong, bench-conv-paths --times and bench-train-worker and
rewrites docs/scaling_data.json;
without it the figures come from that file, so the plot regenerates anywhere.

A network is a spec generator: NETWORKS[name] = (strong(P), weak(P)), each returning a
model spec (the JSON of docs/MODEL_SPEC.md) for P ranks: LeNet-5, the MLP, the
ResNet-18-style network of resnet-*.json and the 3-D U-Net of unet3d-*.json (graphs:
traffic_formula.walk follows their "from" operands).
"""
import functools
import json
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "engine"))
import traffic_formula as tf  # noqa: E402

SPECS = os.path.join(ROOT, "deploy", "specs")
DATA_JSON = os.path.join(ROOT, "docs", "scaling_data.json")
MPI_FLAGS = ["--oversubscribe", "--mca", "btl", "self,vader", "--mca", "pml", "ob1",
             "--mca", "btl_vader_single_copy_mechanism", "none", "--mca",
             "mpi_yield_when_idle", "1", "--bind-to", "none"]
PS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


# ---- the networks ---------------------------------------------------------------------

def shipped(name):
    with open(os.path.join(SPECS, name + ".json")) as f:
        return json.load(f)


def part(ranks, shape):
    return {"ranks": list(ranks), "shape": list(shape)}


def lenet_ok(side, a, b):
    """Every spatial layer of LeNet-5 on an a x b grid: non-empty pieces, and halos that
    reach only the immediate neighbour (the engine's rule)."""
    geo = [(side, 5, 1, 2), (side, 2, 2, 0), (side // 2, 5, 1, 0), (side // 2 - 4, 2, 2, 0)]
    for n, k, s, p in geo:
        for P in (a, b):
            if n < P:
                return False
            hs = [tf.halo_dim(n, P, i, k, s, p, 1) for i in range(P)]
            for i, h in enumerate(hs):
                held = h["pad_lo"] + h["n"] + h["pad_hi"]
                if (i > 0 and max(h["lo"], 0) > hs[i - 1]["pad_lo"] + hs[i - 1]["n"] + hs[i - 1]["pad_hi"]) or \
                   (i + 1 < P and max(h["hi"], 0) > hs[i + 1]["pad_lo"] + hs[i + 1]["n"] + hs[i + 1]["pad_hi"]) or \
                   held < 1:
                    return False
    return True


def lenet5(P, weak=False, batch=64):
    """LeNet-5 on P ranks, DistDL's layout (lenet5-4.json) extended: the convolutions on
    the largest a x b grid of at most P ranks their halos allow, the flatten over up to 16
    channel pieces, the classifier on a p x q grid of P_w (p <= 10 outputs of fc3), in and
    out alternating between fc_in [1, q] and fc_out [1, p]. Strong: 28 x 28 images; weak:
    the image side grows with sqrt(P) (a constant tile per rank). P in {1, 2, 4} with 28 x
    28 images: the shipped specs."""
    side = 28 if not weak else 4 * round(7 * math.sqrt(P))
    if side == 28 and P in (1, 2, 4):
        return shipped("lenet5-%d" % P)
    best = (1, 1)
    for n in range(P, 0, -1):
        grids = [(n // b, b) for b in range(1, int(math.isqrt(n)) + 1) if n % b == 0]
        grids = [g for g in grids if lenet_ok(side, *g)]
        if grids:
            best = max(grids, key=lambda g: g[1])
            break
    a, b = best
    Pc, Pf = a * b, min(P, 16)
    p = max(1, min(10, math.isqrt(P)))
    q = max(1, min(84, P // p))
    out_ranks = range(q, q + p) if q + p <= P else range(p)
    s = {
        "name": "lenet5-%d%s" % (P, "-weak" if weak else ""), "world_size": P, "seed": 1,
        "dtype": "f32", "batch_size": batch,
        "input": {"shape": [1, side, side], "partition": "root"},
        "partitions": {
            "root": part([0], [1, 1, 1, 1]), "root2d": part([0], [1, 1]),
            "conv": part(range(Pc), [1, 1, a, b]),
            "flat": part(range(Pf), [1, Pf, 1, 1]), "flat2d": part(range(Pf), [1, Pf]),
            "fc_in": part(range(q), [1, q]), "fc_out": part(out_ranks, [1, p]),
            "fc_a": part(range(p * q), [p, q]), "fc_b": part(range(p * q), [q, p]),
        },
        "layers": [
            {"type": "repartition", "to": "conv"},
            {"type": "conv2d", "name": "conv1", "out_channels": 6, "kernel": [5, 5], "padding": [2, 2]},
            {"type": "relu"},
            {"type": "maxpool2d", "kernel": [2, 2], "stride": [2, 2]},
            {"type": "conv2d", "name": "conv2", "out_channels": 16, "kernel": [5, 5]},
            {"type": "relu"},
            {"type": "maxpool2d", "kernel": [2, 2], "stride": [2, 2]},
            {"type": "repartition", "to": "flat"},
            {"type": "flatten", "to": "flat2d"},
            {"type": "repartition", "to": "fc_in"},
            {"type": "linear", "name": "fc1", "out_features": 120, "P_y": "fc_out", "P_w": "fc_a"},
            {"type": "relu"},
            {"type": "linear", "name": "fc2", "out_features": 84, "P_y": "fc_in", "P_w": "fc_b"},
            {"type": "relu"},
            {"type": "linear", "name": "fc3", "out_features": 10, "P_y": "fc_out", "P_w": "fc_a"},
            {"type": "repartition", "to": "root2d"},
        ],
        "loss": {"type": "cross_entropy", "reduction": "mean"},
        "optimizer": {"type": "adam", "lr": 0.002},
        "data": {"normalize": {"mean": 0.2860, "std": 0.3530}, "shuffle": True},
    }
    return s


def mlp(P, weak=False, batch=64, hidden=4096):
    """The MLP 784 -> h -> h -> 10 of mlp-big-2.json on P ranks (1-D, Megatron-style):
    fc1 and fc3 split their inputs over [1, P] and sum onto rank 0, fc2 broadcasts its
    input from rank 0 down [P, 1] and leaves its output split. Strong: h = 4096; weak:
    h = 4096 sqrt(P) (the same weight block per rank)."""
    h = hidden if not weak else int(round(hidden * math.sqrt(P)))
    if P == 2 and not weak:
        return shipped("mlp-big-2")
    return {
        "name": "mlp-%d%s" % (P, "-weak" if weak else ""), "world_size": P, "seed": 3,
        "dtype": "f32", "batch_size": batch,
        "input": {"shape": [1, 28, 28], "partition": "root"},
        "partitions": {
            "root": part([0], [1, 1, 1, 1]), "root2d": part([0], [1, 1]),
            "flat2d": part(range(P), [1, P]), "fc_w": part(range(P), [1, P]),
            "fc_wt": part(range(P), [P, 1]),
        },
        "layers": [
            {"type": "flatten", "to": "root2d"},
            {"type": "repartition", "to": "flat2d"},
            {"type": "linear", "name": "fc1", "out_features": h, "P_y": "root2d", "P_w": "fc_w"},
            {"type": "relu"},
            {"type": "linear", "name": "fc2", "out_features": h, "P_y": "flat2d", "P_w": "fc_wt"},
            {"type": "relu"},
            {"type": "linear", "name": "fc3", "out_features": 10, "P_y": "root2d", "P_w": "fc_w"},
        ],
        "loss": {"type": "cross_entropy", "reduction": "mean"},
        "optimizer": {"type": "sgd", "lr": 0.01},
        "data": {"normalize": {"mean": 0.2860, "std": 0.3530}, "shuffle": True},
    }


def halos_ok(spec):
    """Every windowed layer (conv, pool) of a spec on its partition: non-empty pieces and
    halos that reach only the immediate neighbour (the engine's rule), checked with the
    traffic formula's own halo geometry."""
    try:
        _, layers = tf.walk(spec)
    except (AssertionError, NotImplementedError):
        return False
    for L in layers:
        if L.kind not in ("conv_feature", "max_pool", "avg_pool", "upsample"):
            continue
        for j, P in enumerate(L.Pin.shape[2:]):
            n = L.x[2 + j]
            if n < P:
                return False
            if L.kind == "upsample":
                continue
            c = L.cfg
            hs = [tf.halo_dim(n, P, i, c["k"][j], c["s"][j], c["p"][j], c["d"][j])
                  for i in range(P)]
            for i, h in enumerate(hs):
                held = h["pad_lo"] + h["n"] + h["pad_hi"]
                nb = lambda q: hs[q]["pad_lo"] + hs[q]["n"] + hs[q]["pad_hi"]
                if held < 1 or (i > 0 and max(h["lo"], 0) > nb(i - 1)) or \
                   (i + 1 < P and max(h["hi"], 0) > nb(i + 1)):
                    return False
    return True


def grids(n, dims):
    """Every factorization of n into `dims` factors, most balanced first."""
    if dims == 1:
        return [(n,)]
    out = []
    for a in range(1, n + 1):
        if n % a == 0:
            out += [(a,) + g for g in grids(n // a, dims - 1)]
    return sorted(out, key=lambda g: (max(g), -min(g), [-x for x in g]))


def best_grid(P, dims, make):
    """The largest n <= P and its most balanced grid for which the spec make(grid) has
    valid halos everywhere; (1, ...) when none. A dimension is never cut into more
    pieces than its smallest extent over the windowed layers (checked first: cheap)."""
    _, layers = tf.walk(make((1,) * dims))
    ext = [min(L.x[2 + j] for L in layers if L.kind in ("conv_feature", "max_pool"))
           for j in range(dims)]
    for n in range(P, 0, -1):
        for g in grids(n, dims):
            if all(a <= e for a, e in zip(g, ext)) and halos_ok(make(g)):
                return g
    return (1,) * dims


def resnet_spec(P, hw, grid, batch=64):
    """The ResNet-18-style network of resnet-4.json for P ranks: the 4 stages (8, 16, 32,
    64 channels; 17 3x3 convolutions and 3 strided 1x1 shortcuts) feature-partitioned on an a x b
    grid of the first a b ranks, then a repartition onto up to 64 channel pieces for the
    global pooling and the classifier (its weights split along the input, summed onto
    rank 0), as shipped."""
    a, b = grid
    Pc = min(P, 64)
    base = shipped("resnet-4")
    layers = [dict(L) for L in base["layers"]]
    s = {
        "name": "resnet-%d" % P, "world_size": P, "seed": 1, "dtype": "f32",
        "batch_size": batch,
        "input": {"shape": [1] + list(hw), "partition": "root"},
        "partitions": {
            "root": part([0], [1, 1, 1, 1]), "root2d": part([0], [1, 1]),
            "conv": part(range(a * b), [1, 1, a, b]),
            "chan": part(range(Pc), [1, Pc, 1, 1]), "chan2d": part(range(Pc), [1, Pc]),
        },
        "layers": layers,
        "loss": base["loss"], "optimizer": base["optimizer"], "data": base["data"],
    }
    return s


@functools.lru_cache(maxsize=None)
def resnet(P, weak=False):
    """Strong: 28 x 28 images, the largest feature grid of at most P ranks whose halos
    the engine allows (P = 1: resnet-1.json; 2 and 4 give the shipped layouts). The
    stage-4 maps are 4 x 4, so the grid stops at 4 x 4 = 16 ranks; the other ranks only
    hold channel pieces of the pooling and the classifier. Weak: a 32 x 32 tile per rank
    (the image [32 a, 32 b] on the most balanced a x b grid of P): every stage's map
    divides evenly, which a strided layer needs (below)."""
    if not weak:
        if P == 1:
            return shipped("resnet-1")
        return resnet_spec(P, [28, 28], best_grid(P, 2, lambda g: resnet_spec(P, [28, 28], g)))
    g = grids(P, 2)[0]
    spec = resnet_spec(P, [32 * g[0], 32 * g[1]], g)
    assert halos_ok(spec), g
    return spec


def unet_spec(P, dhw, grid, batch=2):
    """unet3d-4.json on P ranks: every layer on one volume partition [1, 1, a, b, c] of
    the first a b c ranks (the input generated there, the per-voxel labels sent to
    them)."""
    a, b, c = grid
    base = shipped("unet3d-4")
    return {
        "name": "unet3d-%d" % P, "world_size": P, "seed": 1, "dtype": "f32",
        "batch_size": batch,
        "input": {"shape": [1] + list(dhw), "partition": "vol"},
        "partitions": {"vol": part(range(a * b * c), [1, 1, a, b, c])},
        "layers": [dict(L) for L in base["layers"]],
        "loss": base["loss"], "optimizer": base["optimizer"], "data": base["data"],
    }


@functools.lru_cache(maxsize=None)
def unet3d(P, weak=False):
    """Strong: 32^3 volumes, batch 2, the most balanced 3-D grid of at most P ranks the
    halos allow (2 and 4: the shipped layouts). The coarsest level is 8^3, so at most 8
    pieces per dimension: 512 ranks, one voxel of that level per dimension and
    rank. Weak: a 32^3 tile per rank, the volume [32 a, 32 b, 32 c] on the most balanced
    grid of P."""
    if not weak:
        return unet_spec(P, [32] * 3, best_grid(P, 3, lambda g: unet_spec(P, [32] * 3, g)))
    g = grids(P, 3)[0]
    spec = unet_spec(P, [32 * x for x in g], g)
    assert halos_ok(spec), g
    return spec

# name -> (strong(P), weak(P)).
NETWORKS = {
    "LeNet-5": (lambda P: lenet5(P), lambda P: lenet5(P, weak=True)),
    "MLP 784-4096-4096-10": (lambda P: mlp(P), lambda P: mlp(P, weak=True)),
    "ResNet-18 (28x28)": (lambda P: resnet(P), lambda P: resnet(P, weak=True)),
    "3-D U-Net 32^3": (lambda P: unet3d(P), lambda P: unet3d(P, weak=True)),
}


# ---- machines -------------------------------------------------------------------------

class Machine:
    def __init__(self, name, alpha, beta, flops, mem, cores=None):
        self.name, self.alpha, self.beta, self.mem = name, alpha, beta, mem
        self.flops = flops      # per rank, one thread
        self.cores = cores      # None: one core per rank (no oversubscription)

    def rank_flops(self, P, threads_np1=1.0):
        if self.cores is None:
            return self.flops
        if P == 1:
            return self.flops * threads_np1
        return self.flops * min(1.0, self.cores / P)

    def kernel_slowdown(self, P):
        """A kernel time measured at conv_threads(self, P) threads -> the time on a rank of
        P: more ranks than cores share them."""
        return max(1.0, P / self.cores) if self.cores and P > 1 else 1.0


def machines(d):
    here = Machine("this machine (AMD EPYC, 2 cores, vader)", d["alpha"], d["beta"],
                   d["sgemm_1thread_n1024"], d["memcpy"], cores=d["sgemm_threads"])
    here.np1_threads = d["sgemm_all_n1024"] / d["sgemm_1thread_n1024"]
    cluster = Machine("cluster (100 Gb/s, 2 us; one rank per core)", 2e-6, 8 / 100e9,
                      d["sgemm_1thread_n1024"], d["memcpy"])
    cluster.np1_threads = 1.0
    here.conv_times = cluster.conv_times = d.get("conv_times", {})
    return here, cluster


# ---- costs of MPI operations (Thakur, Rabenseifner and Gropp 2005) ----------------------

def lg(g):
    return math.ceil(math.log2(g)) if g > 1 else 0


def t_bcast(m, g, n):
    """Binomial tree (small messages) or scatter + recursive-doubling allgather (large)."""
    if g <= 1:
        return 0.0
    tree = lg(g) * (m.alpha + m.beta * n)
    sag = 2 * lg(g) * m.alpha + 2 * (g - 1) / g * m.beta * n
    return min(tree, sag)


def gamma(m, n):
    """The local sum of two n-byte buffers into one: 3 n bytes of memory traffic."""
    return 3 * n / m.mem


def t_reduce(m, g, n):
    """Binomial tree (each level adds) or reduce-scatter + gather (Rabenseifner)."""
    if g <= 1:
        return 0.0
    tree = lg(g) * (m.alpha + m.beta * n + gamma(m, n))
    rab = 2 * lg(g) * m.alpha + 2 * (g - 1) / g * m.beta * n + (g - 1) / g * gamma(m, n)
    return min(tree, rab)


def t_allreduce(m, g, n):
    """Recursive doubling (small) or reduce-scatter + allgather (Rabenseifner)."""
    if g <= 1:
        return 0.0
    rd = lg(g) * (m.alpha + m.beta * n + gamma(m, n))
    rab = 2 * lg(g) * m.alpha + 2 * (g - 1) / g * m.beta * n + (g - 1) / g * gamma(m, n)
    return min(rd, rab)


def t_op(m, op):
    kind, prim, arg = op
    if kind == "fan":
        f = t_bcast if prim == "broadcast" else t_reduce
        return max(f(m, g, n) for g, n in arg)
    if kind == "allreduce":
        return max(t_allreduce(m, g, n) for g, n in arg)
    # point to point: the busiest rank's messages and bytes
    return max(msgs * m.alpha + m.beta * max(s, r) for s, r, msgs in arg.values())


# ---- compute ----------------------------------------------------------------------------

# Bytes of memory traffic per element of the rank's tile: (forward, backward).
ELEMENTWISE = {"relu": (8, 12), "dropout": (9, 13), "max_pool": (10, 14), "avg_pool": (8, 12),
               "batchnorm": (20, 28), "repartition": (0, 0), "flatten": (0, 0),
               # add: two reads, one write; its backward hands the gradient to both.
               "add": (12, 12), "concat": (8, 8), "global_pool": (4, 4),
               # per OUTPUT element: 2^d reads of the input, one write (and back); only
               # when its interpolation is not timed (an output size, not a scale factor).
               "upsample": (12, 12)}
# Optimizer bytes per parameter on its owner (zero_grad included): SGD reads w, g and
# writes w, g; Adam also reads and writes m and v.
OPTIM = {"sgd": 16, "adam": 32, "adamw": 32}


def max_piece(n, p):
    return -(-n // p) if p > 0 else n


def tile(shape, P):
    """Elements of the largest local block of a tensor balanced over partition P."""
    return math.prod(max_piece(n, p) for n, p in zip(shape, P.shape))


def conv_geometry(L, with_dx):
    """The local kernel call of a feature convolution on its busiest rank, as a line of
    `bench-conv-paths --times`: conv_setup (src/layers/conv.c) runs it on the block the
    rank's output tile needs, unpadded, when the partition splits a spatial dimension (the
    halo buffer holds the padding), else on the whole extent with the layer's padding."""
    c = L.cfg
    nsp = len(c["k"])
    out = [max_piece(n, p) for n, p in zip(L.y, L.Pin.shape)]
    split = any(p > 1 for p in L.Pin.shape[2:])
    ins, pads = [], []
    for j in range(nsp):
        if split:
            ins.append((out[2 + j] - 1) * c["s"][j] + (c["k"][j] - 1) * c["d"][j] + 1)
            pads.append(0)
        else:
            ins.append(L.x[2 + j])
            pads.append(c["p"][j])
    fill = 3 - nsp
    v = ([nsp, out[0], c["cin"], c["cout"]] + ins + [1] * fill + list(c["k"]) + [1] * fill +
         list(c["s"]) + [1] * fill + pads + [0] * fill + [1 if with_dx else 0])
    return " ".join(str(x) for x in v)


def upsample_geometry(L):
    """The interpolation of an upsample on its busiest rank, as an "up" line of
    `bench-conv-paths --times`: its output tile (the first piece, the largest) and the input
    window that tile reads; None for a size given instead of a scale factor."""
    c = L.cfg
    if c["sf"] is None or len(set(c["sf"])) != 1 or c["sf"][0] != int(c["sf"][0]):
        return None
    nsp = len(c["out"])
    B = max_piece(L.x[0], L.Pin.shape[0]) * max_piece(L.x[1], L.Pin.shape[1])
    out = [max_piece(n, p) for n, p in zip(L.y[2:], L.Pout.shape[2:])]
    fill = 3 - nsp
    v = (["up", nsp, B] + list(L.x[2:]) + [1] * fill + [int(c["sf"][0]),
         1 if c["mode"] in ("linear", "bilinear", "trilinear") else 0, 1 if c["align"] else 0] +
         out + [1] * fill)
    return " ".join(str(x) for x in v)


def kernel_line(L):
    """The timed kernel of layer L (a feature convolution or an upsample), or None."""
    if L.kind == "conv_feature":
        return conv_geometry(L, L.run_back and not L.first_param)
    if L.kind == "upsample":
        return upsample_geometry(L)
    return None


def kernel_lines(P_of_threads):
    """Every distinct timed kernel (kernel_line) of every network and scaling mode at the
    ranks P for which P_of_threads(P) holds."""
    seen = []
    for strong, weak in NETWORKS.values():
        for gen in (strong, weak):
            for P in PS:
                if not P_of_threads(P):
                    continue
                for L in tf.table(gen(P))[1]:
                    key = kernel_line(L)
                    if key is not None and key not in seen:
                        seen.append(key)
    return seen


def conv_threads(m, P):
    """The kernel threads of a rank of P on machine m: np 1 takes the node's cores."""
    return m.cores if m.cores and P == 1 else 1


def layer_compute(L):
    """(forward flops, backward flops, forward bytes, backward bytes, parameters held)
    on the busiest rank."""
    if L.kind == "conv_feature":
        c = L.cfg
        out_tile = tile(L.y, L.Pin)  # [N, C_out, tile...] (P_x = [1, 1, S...])
        f = 2 * out_tile * c["cin"] * math.prod(c["k"])
        w = c["cout"] * c["cin"] * math.prod(c["k"]) + c["cout"]
        # Split: x copied into the halo buffer (4 + 4 bytes per element; in backward again,
        # when the layer rebuilds it in the shared scratch), and its gradient out of it.
        xb = 0
        if any(p > 1 for p in L.Pin.shape[2:]):
            xb = 8 * tile(L.x, L.Pin)
        back = xb * (2 if tf.rebuilds_halo(L, 4) else 1)
        return f, 2 * f, xb, back, w  # the weights live on P_x rank 0
    if L.kind == "linear":
        Pw = L.cfg["Pw"]
        fo, fi = max_piece(L.y[1], Pw.shape[0]), max_piece(L.x[1], Pw.shape[1])
        f = 2 * L.x[0] * fi * fo
        return f, 2 * f, 0, 0, fo * fi + fo
    fb, bb = ELEMENTWISE.get(L.kind, (8, 12))
    t = tile(L.y, L.Pout) if L.kind in ("upsample", "concat") else tile(L.x, L.Pin)
    return 0, 0, fb * t, bb * t, (2 * L.x[1] if L.kind == "batchnorm" else 0)


# ---- the step --------------------------------------------------------------------------

def step_time(spec, m, parts_out=None):
    """Predicted seconds of one training step, split into compute, bandwidth-latency
    communication of the primitives, and control (agreements, scalars)."""
    P = spec["world_size"]
    rows, layers = tf.table(spec)
    F = m.rank_flops(P, getattr(m, "np1_threads", 1.0))
    mem = m.mem * (min(1.0, m.cores / P) if m.cores else 1.0)
    times = getattr(m, "conv_times", {})
    comp = comm = 0.0
    params = 0
    for i, L in enumerate(layers):
        ff, fb, bf, bb, w = layer_compute(L)
        line = kernel_line(L)
        key = "%d|%s" % (conv_threads(m, P), line) if line is not None else None
        if key in times:  # the kernel's own time at this geometry
            tfw, tbw = times[key]
            comp += tfw * m.kernel_slowdown(P) + (tbw * m.kernel_slowdown(P) if L.run_back else 0)
            if L.kind == "conv_feature":  # its copies into the halo buffer
                comp += bf / mem + (bb / mem if L.run_back else 0)
        else:
            comp += ff / F + bf / mem
            if L.run_back:  # a graph: the backward runs where a parameter lies upstream
                comp += fb / F + bb / mem
        params += w
    opt = spec["optimizer"]["type"]
    comp += params * OPTIM.get(opt, 16) / mem  # on the owners; bounded by the largest
    for _, f, b in rows:
        for op in f.ops + b.ops:
            comm += t_op(m, op)
    # Control (docs/PERFORMANCE.md, "Synchronisations per step"): the model's layers and
    # loss take its own buffers without agreeing on them, so a step makes two agreements
    # over all P ranks: rank 0's batch check with the count (a broadcast of 12 bytes) and
    # the closing one carrying loss, hits and dense sums (an all-reduce of 7 doubles);
    # besides, the session broadcasts its stop flag. The labels are counted in rows.
    control = t_bcast(m, P, 12) + t_allreduce(m, P, 56) + t_bcast(m, P, 4)
    if parts_out is not None:
        parts_out.update(compute=comp, comm=comm, control=control)
    return comp + comm + control


# ---- measurements -----------------------------------------------------------------------

def run(cmd, timeout=900):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    if p.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), p.stdout[-2000:]))
    return p.stdout


def measure(build, data):
    bindir = os.path.join(build, "bin")
    out = run(["mpirun", "-np", "2"] + MPI_FLAGS + [os.path.join(bindir, "bench-pingpong")])
    d = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    d["load_before"] = os.getloadavg()[0]
    # Every local convolution and interpolation the model costs, timed alone: on one
    # thread, and at np 1 on every core as well (the rank's kernel pool takes them all).
    d["conv_times"] = {}
    cores = d["sgemm_threads"]
    for threads, which in ((1, lambda P: True), (cores, lambda P: P == 1)):
        geoms = kernel_lines(which)
        out = subprocess.run([os.path.join(bindir, "bench-conv-paths"), "--times", "3",
                              str(threads)], input="\n".join(geoms) + "\n",
                             stdout=subprocess.PIPE, text=True, check=True).stdout.split("\n")
        for i, g in enumerate(geoms):
            d["conv_times"]["%d|%s" % (threads, g)] = [float(v) for v in out[i].split()]
        print("timed %d local convolutions and interpolations on %d thread(s) "
              "(bench-conv-paths --times)" %
              (len(geoms), threads), flush=True)
    d["load_kernels"] = os.getloadavg()[0]
    d["measured"] = {}
    tmp = tempfile.mkdtemp(prefix="scaling-")
    jobs = []
    for name, (strong, _) in NETWORKS.items():
        for P in (1, 2, 4, 8):
            spec = strong(P)
            path = os.path.join(tmp, "%s-%d.json" % (re.sub(r"\W", "", name), P))
            with open(path, "w") as f:
                json.dump(spec, f)
            jobs.append((name, P, spec, path))
    # Five rounds over every case, the best of each kept: on a shared machine other work
    # only ever adds time, and interleaving spreads it over the cases alike.
    times = {}
    # A step as the model counts it: bench-train-worker times training steps after 3
    # warm-up steps on batches made beforehand (no data loading, no first-touch faults).
    for _ in range(5):
        for name, P, spec, path in jobs:
            steps = 60 if "LeNet" in name else 12
            # A spec that generates its data (the U-Net) refuses --data.
            dat = [] if "synthetic" in spec.get("data", {}) else ["--data", data]
            out = run(["mpirun", "-np", str(P)] + MPI_FLAGS +
                      [os.path.join(bindir, "bench-train-worker"), "--model", path,
                       "--steps", str(steps)] + dat)
            ips = float(re.search(r"images_per_s ([0-9.]+)", out).group(1))
            times.setdefault((name, P), []).append(spec["batch_size"] / ips)
    for (name, P), ts in times.items():
        d["measured"]["%s|%d" % (name, P)] = min(ts)
        print("measured %-22s np %d: %.2f ms per step (best of %d: %s ms)" %
              (name, P, min(ts) * 1e3, len(ts), " ".join("%.1f" % (t * 1e3) for t in ts)),
              flush=True)
    d["load_after"] = os.getloadavg()[0]
    with open(DATA_JSON, "w") as f:
        json.dump(d, f, indent=1, sort_keys=True)
        f.write("\n")
    return d


# ---- report and plot --------------------------------------------------------------------

def report(d, out_png):
    here, cluster = machines(d)
    print("alpha %.2f us, beta %.3g s/B (%.2f GB/s), sgemm %.1f GFLOP/s (1 thread), memcpy "
          "%.1f GB/s" % (d["alpha"] * 1e6, d["beta"], 1e-9 / d["beta"],
                         d["sgemm_1thread_n1024"] * 1e-9, d["memcpy"] * 1e-9))
    curves = {}
    for name, (strong, weak) in NETWORKS.items():
        for mode, gen in (("strong", strong), ("weak", weak)):
            for m in (here, cluster):
                ts, br = [], []
                for P in PS:
                    parts = {}
                    ts.append(step_time(gen(P), m, parts))
                    br.append(parts)
                curves[(name, mode, m.name)] = (ts, br)

    conv = "the kernels' own times" if d.get("conv_times") else "FLOPs at the sgemm rate"
    print("convolutions costed by %s; no per-network factor" % conv)
    misses = 0
    for name in NETWORKS:
        print("\n%s:" % name)
        for P in (1, 2, 4, 8):
            t = d["measured"].get("%s|%d" % (name, P))
            pr = curves[(name, "strong", here.name)][0][PS.index(P)]
            if t:
                ok = abs(pr / t - 1) <= 0.2
                misses += P <= 2 and not ok
                print("  np %d: measured %8.2f ms, predicted %8.2f ms, predicted / measured %.2f%s" %
                      (P, t * 1e3, pr * 1e3, pr / t, "  (oversubscribed)" if P > 2 else
                       "  within 20%" if ok else "  MISS (beyond 20%)"))
        for mode in ("strong", "weak"):
            for m in (here, cluster):
                ts, br = curves[(name, mode, m.name)]
                best = min(range(len(PS)), key=lambda i: ts[i])
                print("  %s scaling, %s: fastest at P = %d (%.2f ms); at 1024: compute %.2f, "
                      "primitives %.2f, control %.2f ms" %
                      (mode, m.name, PS[best], ts[best] * 1e3, br[-1]["compute"] * 1e3,
                       br[-1]["comm"] * 1e3, br[-1]["control"] * 1e3))
                print("    " + "  ".join("%d:%.3g" % (P, t * 1e3) for P, t in zip(PS, ts)))

    # The two tables of docs/SCALING.md §5.
    print("\nnp 1 and 2 within 20%%: %d of %d" % (2 * len(NETWORKS) - misses, 2 * len(NETWORKS)))
    print("\n| network | np | measured ms | model ms | model / measured |")
    print("|---|---|---|---|---|")
    for name in NETWORKS:
        for P in (1, 2, 4, 8):
            t = d["measured"].get("%s|%d" % (name, P))
            pr = curves[(name, "strong", here.name)][0][PS.index(P)]
            if t:
                print("| %s | %d%s | %.1f | %.1f | %.2f |" % (name, P, " (oversubscribed)" if P > 2
                                                             else "", t * 1e3, pr * 1e3, pr / t))
    print("\n| network | scaling | fastest at P (cluster) | ms | x np 1 | at P = 1024: compute / "
          "primitives / control ms |")
    print("|---|---|---|---|---|---|")
    for name in NETWORKS:
        for mode in ("strong", "weak"):
            ts, br = curves[(name, mode, cluster.name)]
            best = min(range(len(PS)), key=lambda i: ts[i])
            print("| %s | %s | %d | %.2f | %.1f | %.2f / %.2f / %.2f |" %
                  (name, mode, PS[best], ts[best] * 1e3, ts[0] / ts[best], br[-1]["compute"] * 1e3,
                   br[-1]["comm"] * 1e3, br[-1]["control"] * 1e3))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(NETWORKS), 2, figsize=(12, 4.6 * len(NETWORKS)))
    load = "load %.1f-%.1f" % (d.get("load_before", float("nan")), d.get("load_after", float("nan")))
    for row, name in enumerate(NETWORKS):
        for col, mode in enumerate(("strong", "weak")):
            ax = axes[row][col]
            for m, style in ((here, "-"), (cluster, "--")):
                ts, _ = curves[(name, mode, m.name)]
                # This machine has 2 cores: beyond 8 ranks its curve says nothing.
                n = len(PS) if m is cluster else PS.index(8) + 1
                ax.plot(PS[:n], [t * 1e3 for t in ts[:n]], style, color="C0" if m is here else "C1",
                        label="model, %s" % m.name)
            t1 = d["measured"].get("%s|1" % name)
            if mode == "weak":
                ax.plot(PS, [t1 * 1e3 for P in PS], ":", color="gray",
                        label="ideal (measured np 1, constant)")
                ax.plot([1], [t1 * 1e3], "o", color="C3", label="measured here (%s)" % load)
            if mode == "strong":
                ax.plot(PS, [t1 / P * 1e3 for P in PS], ":", color="gray", label="ideal (np 1 / P)")
                for P in (1, 2, 4, 8):
                    t = d["measured"].get("%s|%d" % (name, P))
                    if t is None:
                        continue
                    over = P > here.cores
                    ax.plot([P], [t * 1e3], "o", color="C3", mfc="none" if over else "C3",
                            label=("measured here (%s)" % load if P == 1 else
                                   "measured, oversubscribed" if P == 4 else None))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("ranks P")
            ax.set_ylabel("ms per training step")
            ax.set_title("%s, %s scaling" % (name, mode))
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print("\nwrote %s" % out_png)


def main():
    a = sys.argv[1:]
    if a and a[0] == "--emit":
        # --emit lenet5|mlp P [weak]: one generated spec as JSON (tests/engine/specs/).
        gen = {"lenet5": lenet5, "mlp": mlp, "resnet": resnet, "unet3d": unet3d}[a[1]]
        spec = gen(int(a[2]), weak=len(a) > 3 and a[3] == "weak")
        json.dump(spec, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    build = os.path.join(ROOT, "build")
    data = "/usr/share/datasets/fashion-mnist"
    out = os.path.join(ROOT, "docs", "scaling.png")
    if "--build" in a:
        build = a[a.index("--build") + 1]
    if "--data" in a:
        data = a[a.index("--data") + 1]
    if "--out" in a:
        out = a[a.index("--out") + 1]
    if "--measure" in a or not os.path.exists(DATA_JSON):
        d = measure(build, data)
    else:
        with open(DATA_JSON) as f:
            d = json.load(f)
    report(d, out)


if __name__ == "__main__":
    main()
