#!/usr/bin/python3
"""The bytes a training step must move, derived from a model spec (docs/SCALING.md).

For every row of the engine's traffic table (ddl_model_traffic_table: the input plan, each
layer, the loss, the labels, the output plan) this computes, from the spec's JSON alone,
the payload summed over all ranks, per primitive kind and pass, as

    formula = minimum + the named excess terms the engine is documented to add

where the minimum is what the layer's partitioning forces to move (docs/SCALING.md
derives each) and each excess term is one of the documented, explained departures:

    halo_faces   face-by-face halo slabs keep their full extent in the other dimensions
                 (the zeros of the global padding, and input a rank holds but does not
                 need), so each slab stays one contiguous run or one strided box;
    padded_block Linear moves one block size per plan: [B, max piece] when a feature
                 split is uneven;
    labels       the labels go to every rank, not only to the loss's ranks;
    halo_rebuild a split conv whose input holds DDL_SHARE_MIN_BYTES (2 MiB) or more per
                 rank keeps its padded input in the layers' shared scratch and rebuilds it
                 in backward (docs/MEMORY.md): its forward exchange once more.

Nothing here reads or imitates the engine's code: shapes follow the spec rules
(docs/MODEL_SPEC.md), decompositions and halos DistDL's formulas (DISTDL.md 1.3, 2.5),
and the group sizes the broadcast/reduction rules.

  traffic_formula.py SPEC.json                 print the formula table
  traffic_formula.py --check SPEC.json --exe test_traffic_table --mpiexec mpirun [flags...]
                                               run the engine's table and compare

The functions are also the communication half of the scaling model
(tests/bench/scaling_model.py), which feeds them specs of any size.
"""
import json
import math
import os
import subprocess
import sys

F64 = 8
I64 = 8


# ---- decomposition and partitions -----------------------------------------------------

def piece(n, p, i):
    """(start, length) of piece i of n over p: the first n % p pieces get one more."""
    q, r = divmod(n, p)
    return q * i + min(i, r), q + (1 if i < r else 0)


class Part:
    def __init__(self, name, ranks, shape):
        self.name, self.ranks, self.shape = name, list(ranks), list(shape)
        assert len(self.ranks) == math.prod(self.shape), name

    def coords(self, k):
        """Row-major coordinates of the k-th rank of the partition."""
        c = []
        for s in reversed(self.shape):
            c.append(k % s)
            k //= s
        return tuple(reversed(c))

    def members(self):
        for k, r in enumerate(self.ranks):
            yield r, self.coords(k)

    def rank_at(self, c):
        k = 0
        for s, x in zip(self.shape, c):
            k = k * s + x
        return self.ranks[k]

    def box(self, gshape, c):
        return [piece(n, p, i) for n, p, i in zip(gshape, self.shape, c)]


def vol(box):
    return math.prod(n for _, n in box)


def overlap(a, b):
    v = 1
    for (s0, n0), (s1, n1) in zip(a, b):
        lo, hi = max(s0, s1), min(s0 + n0, s1 + n1)
        if hi <= lo:
            return 0
        v *= hi - lo
    return v


# ---- one term per kind and pass -------------------------------------------------------

class Bytes:
    """Bytes summed over ranks, keyed by 'kind/pass', split into the minimum and named
    excess terms."""

    def __init__(self):
        self.terms = {}  # (kind/pass, term) -> bytes
        # What the engine executes, for the time model (tests/bench/scaling_model.py):
        #   ("fan", kind, [(g, bytes), ...])        one broadcast/reduce per group of g
        #   ("allreduce", kind, [(g, bytes), ...])  one all-reduce per group of g
        #   ("p2p", kind, {rank: [sent, received, messages]})
        self.ops = []

    def add(self, key, n, term="min"):
        if n:
            self.terms[(key, term)] = self.terms.get((key, term), 0) + n

    def total(self, term=None):
        out = {}
        for (k, t), n in self.terms.items():
            if term is None or t == term:
                out[k] = out.get(k, 0) + n
        return out

    def sum(self, term=None):
        return sum(self.total(term).values())


def pieces_met(N, P, a, n):
    """How many of the P pieces of N meet the range [a, a + n) (empty pieces meet none)."""
    if n == 0:
        return 0
    return sum(1 for i in range(P) if overlap([piece(N, P, i)], [(a, n)]) > 0)


def repartition_ops(gshape, Px, Py, es):
    """Per rank [sent, received, messages] of a Repartition: everything but the self
    overlap of each rank moves, to or from every rank whose box meets its own (boxes are
    products of ranges, so the partners are counted dimension by dimension)."""
    xb = {r: Px.box(gshape, c) for r, c in Px.members()}
    yb = {r: Py.box(gshape, c) for r, c in Py.members()}
    per = {}
    for r, b in xb.items():
        own = overlap(b, yb[r]) if r in yb else 0
        meet = math.prod(pieces_met(n, p, a, k) for n, p, (a, k) in zip(gshape, Py.shape, b))
        e = per.setdefault(r, [0, 0, 0])
        e[0] += (vol(b) - own) * es
        e[2] += meet - (1 if own else 0)
    for r, b in yb.items():
        own = overlap(xb[r], b) if r in xb else 0
        meet = math.prod(pieces_met(n, p, a, k) for n, p, (a, k) in zip(gshape, Px.shape, b))
        e = per.setdefault(r, [0, 0, 0])
        e[1] += (vol(b) - own) * es
        e[2] += meet - (1 if own else 0)
    return per


def repartition_bytes(gshape, Px, Py, es):
    """Everything but the self overlaps: the boxes of each side tile the tensor."""
    mine = {}
    for r, c in Px.members():
        mine[r] = Px.box(gshape, c)
    kept = sum(overlap(mine[r], Py.box(gshape, c)) for r, c in Py.members() if r in mine)
    return (math.prod(gshape) - kept) * es


# ---- halos (DistDL's formulas on the explicitly padded global length) -----------------

def halo_dim(N, P, i, k, s, p, d):
    """Raw halos of piece i, its padding and local length, and its needed input range in
    unpadded global coordinates (empty when it computes no output)."""
    start, n = piece(N, P, i)
    pad_lo, pad_hi = (p if i == 0 else 0), (p if i == P - 1 else 0)
    Np = N + 2 * p
    m = (Np - d * (k - 1) - 1) // s + 1
    y0, ny = piece(m, P, i)
    x0 = start + (0 if i == 0 else p)            # first held element, padded coordinates
    held = pad_lo + n + pad_hi
    if ny == 0:
        return dict(n=n, pad_lo=pad_lo, pad_hi=pad_hi, lo=-held, hi=0, need=(start, 0))
    need_l = max(0, s * y0)
    need_r = min(Np - 1, s * (y0 + ny - 1) + d * (k - 1))
    lo, hi = x0 - need_l, need_r - (x0 + held - 1)
    # The needed input in unpadded coordinates, clipped to the tensor.
    a, b = max(0, need_l - p), min(N - 1, need_r - p)
    return dict(n=n, pad_lo=pad_lo, pad_hi=pad_hi, lo=lo, hi=hi, need=(a, max(0, b - a + 1)),
                start=start)


def halo_bytes(gshape, P, k, s, p, d, es):
    """(engine, minimum) bytes received over all ranks by one halo exchange on the
    feature partition P = [1, 1, S...] of x [N, C, spatial...].

    The minimum is, per rank, the input its output window needs (within the tensor)
    minus what it holds. The exchange moves, dimension by dimension, slabs with the full
    buffer extent in the dimensions already exchanged and the held extent (padding
    included) in the others: summed, the padded buffer minus the held block."""
    eng, mini, _ = halo_ops(gshape, P, k, s, p, d, es)
    return eng, mini


def halo_ops(gshape, P, k, s, p, d, es):
    """(engine bytes, minimum bytes, per rank [sent, received, messages]) of one halo
    exchange (either direction: the adjoint sends back what the forward received)."""
    nsp = len(gshape) - 2
    NC = gshape[0] * gshape[1]
    eng = mini = 0
    per = {}
    hd = {}
    for j in range(nsp):
        for i in range(P.shape[2 + j]):
            hd[(j, i)] = halo_dim(gshape[2 + j], P.shape[2 + j], i, k[j], s[j], p[j], d[j])
    for r, c in P.members():
        dims = [hd[(j, c[2 + j])] for j in range(nsp)]
        held = [h["pad_lo"] + h["n"] + h["pad_hi"] for h in dims]
        buf = [hl + max(h["lo"], 0) + max(h["hi"], 0) for hl, h in zip(held, dims)]
        eng += NC * (math.prod(buf) - math.prod(held))
        need = [h["need"] for h in dims]
        own = [piece(gshape[2 + j], P.shape[2 + j], c[2 + j]) for j in range(nsp)]
        mini += NC * (vol(need) - overlap(need, own))
        # Step i moves slabs with the buffer extent in dims < i, the held one in dims > i;
        # what I send a neighbour is its ghost on my side.
        sent = recv = msgs = 0
        for i in range(nsp):
            cross = NC * math.prod(buf[:i]) * math.prod(held[i + 1:])
            g = max(dims[i]["lo"], 0), max(dims[i]["hi"], 0)
            ci = c[2 + i]
            out = (max(hd[(i, ci - 1)]["hi"], 0) if ci > 0 else 0,
                   max(hd[(i, ci + 1)]["lo"], 0) if ci + 1 < P.shape[2 + i] else 0)
            recv += cross * sum(g)
            sent += cross * sum(out)
            msgs += sum(1 for v in g + out if v > 0)
        per[r] = [sent * es, recv * es, msgs]
    return eng * es, mini * es, per


# ---- the spec, layer by layer ---------------------------------------------------------

def conv_out(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def spatial(v, nsp, default):
    if v is None:
        return [default] * nsp
    return list(v) if isinstance(v, list) else [v] * nsp


class Layer:
    def __init__(self, name, kind, x, y, Pin, Pout, params):
        self.name, self.kind, self.x, self.y = name, kind, x, y
        self.Pin, self.Pout, self.params = Pin, Pout, params
        self.fwd, self.bwd = Bytes(), Bytes()
        self.flops = 0  # forward multiply-adds x 2 (filled by the scaling model)
        self.cfg = {}
        self.ins = []        # operand layer indices, -1 for the model input
        self.run_back = False
        self.first_param = False  # its backward runs, but no operand's gradient is read


# The engine's stems for generated names (docs/MODEL_SPEC.md): "<stem>_at_<index>".
STEMS = {"relu": "activation", "leaky_relu": "activation", "sigmoid": "activation",
         "tanh": "activation", "gelu": "activation", "dropout": "activation",
         "max_pool": "pool", "avg_pool": "pool", "global_pool": "pool"}


def upsample_size(n, L, j, nsp):
    if "size" in L:
        return spatial(L["size"], nsp, 1)[j]
    return int(math.floor(n * spatial(L["scale_factor"], nsp, 1)[j]))


def walk(spec):
    """The layers of a spec with their global shapes, partitions, operands and which
    backwards run. A graph: "from" names the operand(s) (a layer's name or "input");
    without it a layer takes the previous layer's output (docs/MODEL_SPEC.md)."""
    parts = {n: Part(n, p["ranks"], p["shape"]) for n, p in spec["partitions"].items()}
    B = spec["batch_size"]
    tensors = {"input": (-1, [B] + list(spec["input"]["shape"]),
                         parts[spec["input"]["partition"]])}
    prev = "input"
    layers = []
    # File order (the shipped specs name only earlier layers; a later one is refused).
    for i, L in enumerate(spec["layers"]):
        t = L["type"]
        frm = L.get("from", prev)
        frm = [frm] if isinstance(frm, str) else list(frm)
        if any(f not in tensors for f in frm):
            raise NotImplementedError("%s: an operand is listed later" % t)
        ops = [tensors[f] for f in frm]
        cur = list(ops[0][1])
        P = ops[0][2]
        if "P_x" in L:
            assert parts[L["P_x"]].ranks == P.ranks and parts[L["P_x"]].shape == P.shape, L
            P = parts[L["P_x"]]
        x = list(cur)
        Pout, params, cfg = P, False, {}
        nsp = len(cur) - 2
        if t == "repartition":
            Pout = parts[L["to"]]
            kind = "repartition"
        elif t == "flatten":
            Pout = parts[L["to"]]
            cur = [cur[0], math.prod(cur[1:])]
            kind = "flatten"
        elif t.startswith("conv"):
            k = spatial(L["kernel"], nsp, 1)
            s = spatial(L.get("stride"), nsp, 1)
            p = spatial(L.get("padding"), nsp, 0)
            d = spatial(L.get("dilation"), nsp, 1)
            cfg = dict(k=k, s=s, p=p, d=d, bias=L.get("bias", True), cin=cur[1],
                       cout=L["out_channels"])
            cur = [cur[0], L["out_channels"]] + [conv_out(cur[2 + j], k[j], s[j], p[j], d[j])
                                                 for j in range(nsp)]
            if "P_y" in L:
                raise NotImplementedError("channel/general conv: see docs/SCALING.md")
            kind, params = "conv_feature", True
        elif t.startswith("adaptive_avgpool"):
            out = spatial(L["output_size"], nsp, 1)
            if all(o == 1 for o in out):
                kind = "global_pool"
                cur = cur[:2] + [1] * nsp
            else:
                k = [n // o for n, o in zip(cur[2:], out)]
                cfg = dict(k=k, s=list(k), p=[0] * nsp, d=[1] * nsp)
                cur = cur[:2] + out
                kind = "avg_pool"
        elif t.startswith("maxpool") or t.startswith("avgpool"):
            k = spatial(L["kernel"], nsp, 1)
            s = [st if st else kk for st, kk in zip(spatial(L.get("stride"), nsp, 0), k)]
            p = spatial(L.get("padding"), nsp, 0)
            d = spatial(L.get("dilation"), nsp, 1)
            cfg = dict(k=k, s=s, p=p, d=d)
            cur = [cur[0], cur[1]] + [conv_out(cur[2 + j], k[j], s[j], p[j], d[j])
                                      for j in range(nsp)]
            kind = "max_pool" if t.startswith("max") else "avg_pool"
        elif t == "upsample":
            out = [upsample_size(cur[2 + j], L, j, nsp) for j in range(nsp)]
            cfg = dict(mode=L.get("mode", "nearest"), align=L.get("align_corners", False),
                       sf=(None if "size" in L else spatial(L["scale_factor"], nsp, 1)),
                       out=out)
            cur = cur[:2] + out
            kind = "upsample"
        elif t == "add":
            for _, sh, Q in ops:
                assert sh == cur and Q.ranks == P.ranks and Q.shape == P.shape, L
            kind = "add"
        elif t == "concat":
            for _, sh, Q in ops:
                assert sh[:1] == cur[:1] and sh[2:] == cur[2:] and Q.ranks == P.ranks, L
            assert P.shape[1] == 1, L  # dim 1 whole: the join is local
            cur = [cur[0], sum(sh[1] for _, sh, _ in ops)] + cur[2:]
            kind = "concat"
        elif t == "linear":
            Pout = parts[L["P_y"]]
            cfg = dict(Pw=parts[L["P_w"]], bias=L.get("bias", True))
            cur = [cur[0], L["out_features"]]
            kind, params = "linear", True
        elif t == "batchnorm":
            cfg = dict(affine=L.get("affine", True))
            kind, params = "batchnorm", cfg["affine"]
        elif t in ("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "dropout"):
            kind = t
        else:
            raise NotImplementedError(t)
        name = L.get("name")
        if name is None:  # the engine's default names (spec.c)
            name = "%s_at_%d" % (STEMS.get(kind, t), i)
        lay = Layer(name, kind, x, list(cur), P, Pout, params)
        lay.cfg = cfg
        lay.ins = [o[0] for o in ops]
        # Its backward runs when it has parameters or an operand's backward runs (leading
        # data movement has no gradient to carry); the gradients of its operands are read
        # only when some operand's backward runs.
        rb = [o >= 0 and layers[o].run_back for o in lay.ins]
        lay.run_back = params or any(rb)
        lay.first_param = lay.run_back and not any(rb)
        layers.append(lay)
        tensors[name] = (i, list(cur), Pout)
        prev = name
    return parts, layers


def rebuilds_halo(L, es):
    """A split conv that shares its padded input (docs/MEMORY.md): the layers share a
    scratch block (DDL_SHARE_SCRATCH not 0) and its input holds at least
    DDL_SHARE_MIN_BYTES (default 2 MiB) per rank of P_x, from global sizes."""
    if os.environ.get("DDL_SHARE_SCRATCH") == "0":
        return False
    try:
        least = float(os.environ.get("DDL_SHARE_MIN_BYTES", ""))
    except ValueError:
        least = -1
    if least < 0:
        least = 2.0 * 1024 * 1024
    return math.prod(L.x) * es / len(L.Pin.ranks) >= least


def layer_bytes(L, es, with_bwd):
    """Fills L.fwd and L.bwd (bwd only when the step runs the layer's backward)."""
    fwd, bwd = L.fwd, L.bwd
    if L.kind == "repartition":
        n = repartition_bytes(L.x, L.Pin, L.Pout, es)
        fwd.add("repartition/forward", n)
        if n:
            per = repartition_ops(L.x, L.Pin, L.Pout, es)
            fwd.ops.append(("p2p", "repartition", per))
        if with_bwd:
            bwd.add("repartition/adjoint", n)
            if n:
                bwd.ops.append(("p2p", "repartition", per))
    elif L.kind == "flatten":
        # Local unless the channel split gives unbalanced feature blocks: then the flat
        # blocks [N_loc, C_loc * S] are rebalanced over the features.
        S = math.prod(L.x[2:])
        n = 0
        Pin, Pout = L.Pin, L.Pout
        per = {}
        for r, c in Pin.members():
            rows = piece(L.x[0], Pin.shape[0], c[0])
            c0, cl = piece(L.x[1], Pin.shape[1], c[1])
            mine = [rows, (c0 * S, cl * S)]
            for q, cy in Pout.members():
                v = overlap(mine, Pout.box(L.y, cy)) if q != r else 0
                if v:
                    n += v
                    per.setdefault(r, [0, 0, 0])
                    per.setdefault(q, [0, 0, 0])
                    per[r][0] += v * es
                    per[r][2] += 1
                    per[q][1] += v * es
                    per[q][2] += 1
        fwd.add("repartition/forward", n * es)
        if n:
            fwd.ops.append(("p2p", "repartition", per))
        if with_bwd:
            bwd.add("repartition/adjoint", n * es)
            if n:
                bwd.ops.append(("p2p", "repartition", per))
    elif L.kind in ("conv_feature", "max_pool", "avg_pool"):
        c = L.cfg
        if L.Pin.shape[2:] != [1] * (len(L.x) - 2):
            eng, mini, per = halo_ops(L.x, L.Pin, c["k"], c["s"], c["p"], c["d"], es)
            fwd.add("halo_exchange/forward", mini)
            fwd.add("halo_exchange/forward", eng - mini, "halo_faces")
            if eng:
                fwd.ops.append(("p2p", "halo_exchange", per))
            # The adjoint only assembles dx, which nobody reads before the first layer
            # with parameters.
            if with_bwd and not L.first_param:
                bwd.add("halo_exchange/adjoint", mini)
                bwd.add("halo_exchange/adjoint", eng - mini, "halo_faces")
                if eng:
                    bwd.ops.append(("p2p", "halo_exchange", per))
            if with_bwd and L.kind == "conv_feature" and rebuilds_halo(L, es):
                bwd.add("halo_exchange/forward", eng, "halo_rebuild")
                if eng:
                    bwd.ops.append(("p2p", "halo_exchange", per))
        if L.kind == "conv_feature":
            # Weight and bias live on rank 0 of P_x: broadcast to the others each forward,
            # their gradients summed back (the adjoint).
            w = c["cout"] * c["cin"] * math.prod(c["k"]) + (c["cout"] if c["bias"] else 0)
            g = len(set(L.Pin.ranks))
            n = (g - 1) * w * es
            fwd.add("broadcast/forward", n)
            if n:
                fwd.ops.append(("fan", "broadcast", [(g, w * es)]))
            if with_bwd:
                bwd.add("broadcast/adjoint", n)
                if n:
                    bwd.ops.append(("fan", "sum_reduce", [(g, w * es)]))
    elif L.kind == "global_pool":
        global_pool_bytes(L, es, with_bwd)
    elif L.kind == "upsample":
        upsample_bytes(L, es, with_bwd)
    elif L.kind == "linear":
        linear_bytes(L, es, with_bwd)
    elif L.kind == "batchnorm":
        batchnorm_bytes(L, es, with_bwd)
    # activations, dropout, add and concat are local (their operands share one
    # partition, and concat's does not split the joined dim)


def global_pool_bytes(L, es, with_bwd):
    """Global average pooling: the sums over each rank's spatial block must meet on the
    rank of its (batch, channel) block at spatial coordinate 0, which holds the
    [N_b, C_c, 1...] output (the balanced decomposition of a size-1 dim); a fan-in of the
    block over the g ranks sharing those coordinates. The adjoint sends dy back (fan-out)."""
    P = L.Pin
    groups = {}
    for r, c in P.members():
        groups.setdefault(c[:2], set()).add(r)
    fan = []
    n = 0
    for c, g in groups.items():
        blk = piece(L.x[0], P.shape[0], c[0])[1] * piece(L.x[1], P.shape[1], c[1])[1]
        n += (len(g) - 1) * blk
        if len(g) > 1:
            fan.append((len(g), blk * es))
    L.fwd.add("sum_reduce/forward", n * es)
    if fan:
        L.fwd.ops.append(("fan", "sum_reduce", fan))
    if with_bwd and not L.first_param:
        L.bwd.add("sum_reduce/adjoint", n * es)
        if fan:
            L.bwd.ops.append(("fan", "broadcast", fan))


def interp_need(n_in, n_out, o0, o1, mode, align, sf):
    """The input range [a, b] that the outputs [o0, o1) of one spatial dim read, by
    torch.nn.Upsample's index math: nearest reads floor(o * scale) (clamped), linear the
    two neighbours of its source coordinate (the upper one clamped to the last index)."""
    if o1 <= o0:
        return (0, 0)
    if align and mode == "linear":
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        scale = 1.0 / sf if sf is not None else n_in / n_out
    if mode == "nearest":
        src = lambda o: min(int(math.floor(o * scale)), n_in - 1)
        return (src(o0), src(o1 - 1) - src(o0) + 1)
    def lohi(o):
        c = o * scale if align else max((o + 0.5) * scale - 0.5, 0.0)
        i0 = min(int(math.floor(c)), n_in - 1)
        return i0, min(i0 + 1, n_in - 1)
    a, b = lohi(o0)[0], lohi(o1 - 1)[1]
    return (a, b - a + 1)


def upsample_bytes(L, es, with_bwd):
    """Each rank gathers the input box its output box reads (its own batch and channel
    block, the interp_need range per spatial dim) from the ranks that hold it: everything
    in that box but its own piece. The adjoint sends the same pieces back."""
    P, c = L.Pin, L.cfg
    nsp = len(L.x) - 2
    boxes = {r: P.box(L.x, cc) for r, cc in P.members()}
    per = {}
    n = 0
    for r, cc in P.members():
        ob = P.box(L.y, cc)
        need = ob[:2] + [interp_need(L.x[2 + j], L.y[2 + j], ob[2 + j][0],
                                     ob[2 + j][0] + ob[2 + j][1], c["mode"], c["align"],
                                     None if c["sf"] is None else c["sf"][j])
                         for j in range(nsp)]
        if vol(ob) == 0:
            continue
        for q, b in boxes.items():
            if q == r:
                continue
            v = overlap(need, b)
            if v:
                n += v
                per.setdefault(r, [0, 0, 0])
                per.setdefault(q, [0, 0, 0])
                per[r][1] += v * es
                per[r][2] += 1
                per[q][0] += v * es
                per[q][2] += 1
    L.fwd.add("halo_exchange/forward", n * es)
    if n:
        L.fwd.ops.append(("p2p", "halo_exchange", per))
    if with_bwd and not L.first_param:
        L.bwd.add("halo_exchange/adjoint", n * es)
        if n:
            L.bwd.ops.append(("p2p", "halo_exchange", per))


def linear_bytes(L, es, with_bwd):
    Px, Py, Pw = L.Pin, L.Pout, L.cfg["Pw"]
    Bt, Fin = L.x
    Fout = L.y[1]
    Pfo, Pfi = Pw.shape
    # x_c goes from P_x rank (0, c) down column c of P_w; the partial y_rc of row r are
    # summed onto P_y rank (0, r).
    fi_max, fo_max = piece(Fin, Pfi, 0)[1], piece(Fout, Pfo, 0)[1]
    xg = [(len(set([Px.rank_at((0, c))] + [Pw.rank_at((r, c)) for r in range(Pfo)])),
           Bt * fi_max * es) for c in range(Pfi)]
    yg = [(len(set([Py.rank_at((0, r))] + [Pw.rank_at((r, c)) for c in range(Pfi)])),
           Bt * fo_max * es) for r in range(Pfo)]
    xg = [g for g in xg if g[0] > 1]
    yg = [g for g in yg if g[0] > 1]
    xb = sum((len(set([Px.rank_at((0, c))] + [Pw.rank_at((r, c)) for r in range(Pfo)])) - 1)
             * Bt * piece(Fin, Pfi, c)[1] for c in range(Pfi))
    xb_pad = sum((len(set([Px.rank_at((0, c))] + [Pw.rank_at((r, c)) for r in range(Pfo)])) - 1)
                 * Bt * fi_max for c in range(Pfi))
    yb = sum((len(set([Py.rank_at((0, r))] + [Pw.rank_at((r, c)) for c in range(Pfi)])) - 1)
             * Bt * piece(Fout, Pfo, r)[1] for r in range(Pfo))
    yb_pad = sum((len(set([Py.rank_at((0, r))] + [Pw.rank_at((r, c)) for c in range(Pfi)])) - 1)
                 * Bt * fo_max for r in range(Pfo))
    L.fwd.add("broadcast/forward", xb * es)
    L.fwd.add("broadcast/forward", (xb_pad - xb) * es, "padded_block")
    L.fwd.add("sum_reduce/forward", yb * es)
    L.fwd.add("sum_reduce/forward", (yb_pad - yb) * es, "padded_block")
    if xg:
        L.fwd.ops.append(("fan", "broadcast", xg))
    if yg:
        L.fwd.ops.append(("fan", "sum_reduce", yg))
    if with_bwd:
        L.bwd.add("sum_reduce/adjoint", yb * es)
        L.bwd.add("sum_reduce/adjoint", (yb_pad - yb) * es, "padded_block")
        if yg:
            L.bwd.ops.append(("fan", "broadcast", yg))
        if not L.first_param:
            L.bwd.add("broadcast/adjoint", xb * es)
            L.bwd.add("broadcast/adjoint", (xb_pad - xb) * es, "padded_block")
            if xg:
                L.bwd.ops.append(("fan", "sum_reduce", xg))


def batchnorm_bytes(L, es, with_bwd):
    # Per channel piece c: the P_x ranks holding it, summed onto (and broadcast from) the
    # one at [0, c, 0...]. All in f64: the forward's [sum | squares] pair summed, then
    # [mean | var | gamma | beta] (without affine [mean | var]) broadcast; the backward's
    # [sum dy | sum dy x_hat] pair summed and broadcast.
    P, C = L.Pin, L.x[1]
    groups = {}
    for r, c in P.members():
        groups.setdefault(c[1], []).append(r)
    st = sum((len(set(g)) - 1) * piece(C, P.shape[1], c)[1] for c, g in groups.items())
    gs = [(len(set(g)), piece(C, P.shape[1], c)[1]) for c, g in groups.items()]
    gs = [(g, n) for g, n in gs if g > 1]
    w = 4 if L.cfg["affine"] else 2
    L.fwd.add("sum_reduce/forward", 2 * st * F64)
    L.fwd.add("broadcast/forward", w * st * F64)
    if gs:
        L.fwd.ops.append(("fan", "sum_reduce", [(g, 2 * n * F64) for g, n in gs]))
        L.fwd.ops.append(("fan", "broadcast", [(g, w * n * F64) for g, n in gs]))
    if with_bwd:
        L.bwd.add("sum_reduce/forward", 2 * st * F64)    # [sum dy | sum dy x_hat]
        L.bwd.add("broadcast/forward", 2 * st * F64)
        if gs:
            L.bwd.ops.append(("fan", "sum_reduce", [(g, 2 * n * F64) for g, n in gs]))
            L.bwd.ops.append(("fan", "broadcast", [(g, 2 * n * F64) for g, n in gs]))


def loss_bytes(P, x, es, dense=False):
    """Cross-entropy on x [N, C] over P [P_b, P_c] (reduced); on x [N, C, spatial...]
    (per voxel, P not splitting C) every rank's voxels are whole, so only the reduced
    [local sum, failures] pair of doubles goes to P rank 0 (and back as the adjoint). An
    elementwise loss on dense targets (dense) is local too, on any P: the same pair."""
    fwd, bwd = Bytes(), Bytes()
    if len(x) > 2 or dense:
        assert dense or P.shape[1] == 1, "the per-voxel loss needs the classes whole"
        g = len(set(P.ranks))
        fwd.add("sum_reduce/forward", (g - 1) * 2 * F64)
        bwd.add("sum_reduce/adjoint", (g - 1) * 2 * F64)
        if g > 1:
            fwd.ops.append(("fan", "sum_reduce", [(g, 2 * F64)]))
            bwd.ops.append(("fan", "broadcast", [(g, 2 * F64)]))
        return fwd, bwd
    Pb, Pc = P.shape
    g = len(set(P.ranks))
    rows = sum(piece(x[0], Pb, b)[1] for b in range(Pb))  # = N
    fwd.add("all_max_reduce/forward", Pc * (Pc - 1) * rows * F64)
    fwd.add("all_sum_reduce/forward", Pc * (Pc - 1) * 2 * rows * F64)
    fwd.add("sum_reduce/forward", (g - 1) * 2 * F64)
    bwd.add("sum_reduce/adjoint", (g - 1) * 2 * F64)
    if Pc > 1:
        rb = [(Pc, piece(x[0], Pb, b)[1] * F64) for b in range(Pb)]
        fwd.ops.append(("allreduce", "all_max_reduce", rb))
        fwd.ops.append(("allreduce", "all_sum_reduce", [(g_, 2 * n) for g_, n in rb]))
    if g > 1:
        fwd.ops.append(("fan", "sum_reduce", [(g, 2 * F64)]))
        bwd.ops.append(("fan", "broadcast", [(g, 2 * F64)]))
    return fwd, bwd


def table(spec):
    """The formula rows, in the engine's order: input, layers, loss, labels, output."""
    es = 4 if spec.get("dtype", "f32") == "f32" else 8
    parts, layers = walk(spec)
    W = spec["world_size"]
    B = spec["batch_size"]
    for L in layers:
        # (L.first_param: its dx is unused, no communication assembles it)
        layer_bytes(L, es, L.run_back)
    rows = []
    xin = [B] + list(spec["input"]["shape"])
    root_in = Part("root", [0], [1] * len(xin))
    inp = Bytes()
    Pin0 = parts[spec["input"]["partition"]]
    inp.add("repartition/forward", repartition_bytes(xin, root_in, Pin0, es))
    if inp.sum():
        inp.ops.append(("p2p", "repartition", repartition_ops(xin, root_in, Pin0, es)))
    rows.append(("input", inp, Bytes()))
    for L in layers:
        rows.append((L.name, L.fwd, L.bwd))
    last = layers[-1]
    dense = spec["loss"]["type"] != "cross_entropy"
    lf, lb = loss_bytes(last.Pout, last.y, es, dense)
    rows.append(("loss", lf, lb))
    if dense:
        # Dense targets shaped like the output (the spec's dtype) from rank 0 to the ranks
        # holding those values of the output: a Repartition; no gathered output in a step.
        tgt = Bytes()
        root_t = Part("root", [0], [1] * len(last.y))
        tgt.add("repartition/forward", repartition_bytes(last.y, root_t, last.Pout, es))
        if tgt.sum():
            tgt.ops.append(("p2p", "repartition", repartition_ops(last.y, root_t, last.Pout, es)))
        rows.append(("targets", tgt, Bytes()))
        rows.append(("output", Bytes(), Bytes()))
        return rows, layers
    seg = len(last.y) > 2
    if seg:
        # Per-voxel labels [B, 1, spatial...] (f64 class indices, exact) from rank 0 to
        # the ranks holding those voxels of the output: a Repartition, the minimum. The
        # output is not gathered in a step (the hits are counted on each rank's voxels).
        lab, out = Bytes(), Bytes()
        ls = [B, 1] + last.y[2:]
        root_l = Part("root", [0], [1] * len(ls))
        lab.add("repartition/forward", repartition_bytes(ls, root_l, last.Pout, F64))
        if lab.sum():
            lab.ops.append(("p2p", "repartition", repartition_ops(ls, root_l, last.Pout, F64)))
        rows.append(("labels", lab, Bytes()))
        rows.append(("output", out, Bytes()))
        return rows, layers
    # Labels: needed by the loss's ranks other than rank 0 (their rows); the engine
    # broadcasts all of them to every rank.
    lab = Bytes()
    need = sum(piece(B, last.Pout.shape[0], c[0])[1] for r, c in last.Pout.members() if r != 0)
    lab.add("broadcast/forward", need * I64)
    lab.add("broadcast/forward", ((W - 1) * B - need) * I64, "labels")
    if W > 1:
        lab.ops.append(("fan", "broadcast", [(W, B * I64)]))
    rows.append(("labels", lab, Bytes()))
    out = Bytes()
    root_out = Part("root", [0], [1] * len(last.y))
    out.add("repartition/forward", repartition_bytes(last.y, last.Pout, root_out, es))
    if out.sum():
        out.ops.append(("p2p", "repartition", repartition_ops(last.y, last.Pout, root_out, es)))
    rows.append(("output", out, Bytes()))
    return rows, layers


# ---- printing and checking ------------------------------------------------------------

def fmt(n):
    return "%d" % n


def print_table(spec, rows):
    print("%s (world %d, batch %d): bytes per training step, summed over ranks" %
          (spec.get("name", "?"), spec["world_size"], spec["batch_size"]))
    tot_min = tot = 0
    for name, f, b in rows:
        m = f.sum("min") + b.sum("min")
        a = f.sum() + b.sum()
        tot_min += m
        tot += a
        extra = {t for (_, t) in list(f.terms) + list(b.terms) if t != "min"}
        print("  %-20s fwd %10d  bwd %10d  min %10d  %s" % (name, f.sum(), b.sum(), m,
                                                           " ".join(sorted(extra))))
    print("  %-20s %10d bytes (minimum %d)" % ("step", tot, tot_min))


def check(spec_path, exe, mpiexec):
    spec = json.load(open(spec_path))
    rows, _ = table(spec)
    cmd = [mpiexec[0], "-np", str(spec["world_size"])] + mpiexec[1:] + [exe, spec_path]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=100)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        sys.exit("test_traffic_table failed (%d)" % p.returncode)
    got = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    bad = 0
    if len(got) != len(rows):
        sys.exit("the engine has %d rows, the formula %d" % (len(got), len(rows)))
    for g, (name, f, b) in zip(got, rows):
        if g["name"] != name:
            sys.exit("row %s of the engine is %s in the formula" % (g["name"], name))
        for part, want in (("fwd", f.total()), ("bwd", b.total())):
            have = g[part]
            for key in sorted(set(have) | set(want)):
                s, r = have.get(key, [0, 0])
                w = want.get(key, 0)
                ok = s == w and r == w
                bad += not ok
                print("%-4s %-20s %-4s %-24s counted %10d/%-10d formula %10d %s" %
                      ("ok" if ok else "FAIL", name, part, key, s, r, w,
                       "" if ok else "<-- differs"))
    print_table(spec, rows)
    if bad:
        sys.exit("%d entries differ from the formula" % bad)


def main():
    a = sys.argv[1:]
    if a and a[0] == "--check":
        spec = a[1]
        exe = a[a.index("--exe") + 1]
        mpi = a[a.index("--mpiexec") + 1:]
        check(spec, exe, mpi)
    else:
        for path in a:
            spec = json.load(open(path))
            print_table(spec, table(spec)[0])


if __name__ == "__main__":
    main()
