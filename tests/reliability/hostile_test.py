#!/usr/bin/python3
"""Bad input over the wire (issue 9, item 3): a table of malformed and hostile requests
across every RPC of distdl.v1.Trainer, grpc.health.v1.Health and the KServe subset, sent as
raw bytes through grpcio (hand-made encodings included). Every case names the status it
must get and a piece of the message (expected vs got); each must be answered within 100 ms.
Before and after: the same Predict bits, health SERVING, the step counter unchanged, rank
0's VmRSS grown by under 5 MB (measured after a warm-up pass of the whole table), and a
valid Step still succeeds.

  hostile_test.py --build B --source S --mpiexec M --mpi-flags F requests|socket
"""
import os
import random
import select
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hostile_common import (HE, KS, TR, Failure, Harness, Raw, f32, fd_count, key, ld,  # noqa
                            percentile, rank0_pid, varint, vi, vm_rss_kb, wait_for)
from ddl_daemon import SANITIZER, run_scenarios  # noqa: E402
import grpc  # noqa: E402

SC = grpc.StatusCode
MAX_MSG = 8 << 20           # --max-message-bytes of the daemon under test
BUDGET_S = 0.100            # every refusal within 100 ms ...
RETRIES = 3                 # ... measured up to 3 times when the loaded machine is slow
SAMPLE = 784                # LeNet-5: [1, 28, 28]
BATCH = 64
CLASSES = 10


class Case:
    def __init__(self, name, path, payload, code, substr, phase="model"):
        self.name, self.path, self.payload = name, path, payload
        self.code, self.substr, self.phase = code, substr, phase


def tensor(tr, datatype="FP32", shape=(BATCH, 1, 28, 28), raw=None, name="x"):
    if raw is None:
        n = 1
        for s in shape:
            n *= max(int(s), 0)
        item = {"FP32": 4, "FP64": 8, "INT64": 8, "UINT8": 1}.get(datatype, 4)
        raw = bytes(n * item) if n * item < (64 << 20) else b""
    return tr.Tensor(name=name, datatype=datatype, shape=list(shape), raw=raw)


def labels(tr, n=BATCH, values=None, datatype="INT64", shape=None, raw=None):
    if values is None:
        values = [i % CLASSES for i in range(n)]
    if raw is None:
        raw = struct.pack("<%dq" % len(values), *values)
    return tr.Tensor(name="labels", datatype=datatype, shape=list(shape or [n]), raw=raw)


def x_with(value, index, n=BATCH):
    v = [0.25] * (n * SAMPLE)
    v[index] = value
    return f32(v)


def build_cases(h, spec_text):
    tr, he, inf = h.tr, h.he, h.inf
    C = []

    def add(name, path, msg, code, substr, phase="model"):
        payload = msg if isinstance(msg, (bytes, list)) else msg.SerializeToString()
        if name.startswith("oversize/"):
            phase = "oversize"  # measured apart: glibc keeps the 8 MiB buffers cached
        C.append(Case(name, path, payload, code, substr, phase))

    good_x = tensor(tr, raw=f32([0.1] * (BATCH * SAMPLE)))
    good_batch = tr.Batch(x=good_x, labels=labels(tr))

    # ---- wrong state: no model yet --------------------------------------------------
    nm = "no model"
    add("step/no-model", TR + "Step", tr.StepRequest(batch=good_batch), SC.FAILED_PRECONDITION, nm, "empty")
    add("train/no-model", TR + "Train", tr.TrainRequest(steps=1), SC.FAILED_PRECONDITION, nm, "empty")
    add("eval/no-model", TR + "Evaluate", tr.EvaluateRequest(), SC.FAILED_PRECONDITION, nm, "empty")
    add("predict/no-model", TR + "Predict", tr.PredictRequest(x=good_x), SC.FAILED_PRECONDITION, nm, "empty")
    add("pull/no-model", TR + "PullWeights", tr.PullWeightsRequest(), SC.FAILED_PRECONDITION, nm, "empty")
    add("push/no-model", TR + "PushWeights", [tr.WeightChunk(name="w", first=True).SerializeToString()],
        SC.FAILED_PRECONDITION, nm, "empty")
    add("submit/no-model", TR + "SubmitBatch", [good_batch.SerializeToString()], SC.FAILED_PRECONDITION,
        nm, "empty")
    add("ckpt/no-model", TR + "Checkpoint", tr.CheckpointRequest(dir="/tmp/x"), SC.FAILED_PRECONDITION,
        nm, "empty")
    add("restore/no-model", TR + "Restore", tr.RestoreRequest(latest=True), SC.FAILED_PRECONDITION, nm,
        "empty")
    add("shutdown-ckpt/no-model", TR + "Shutdown", tr.ShutdownRequest(checkpoint=True),
        SC.FAILED_PRECONDITION, "no model", "empty")
    add("metadata/no-model", KS + "ModelMetadata", inf.ModelMetadataRequest(name=""), SC.NOT_FOUND,
        "no model loaded", "empty")
    req = inf.ModelInferRequest(inputs=[inf.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, 1, 28, 28])], raw_input_contents=[bytes(SAMPLE * 4)])
    add("infer/no-model", KS + "ModelInfer", req, SC.NOT_FOUND, "no model loaded", "empty")
    add("create/empty-spec", TR + "CreateModel", tr.CreateModelRequest(spec_json=""),
        SC.INVALID_ARGUMENT, "spec_json is empty", "empty")
    add("create/not-json", TR + "CreateModel", tr.CreateModelRequest(spec_json="{nope"),
        SC.INVALID_ARGUMENT, "spec_json", "empty")

    # ---- malformed encodings, for every method ----------------------------------------
    garbage = [
        ("invalid-varint", b"\x08" + b"\xff" * 11),
        ("truncated-varint", b"\x08\x80"),
        ("huge-length", b"\x0a" + varint(1 << 62) + b"abc"),
        ("length-past-end", b"\x0a\x10abc"),
        ("field-0", b"\x00\x01"),
        ("wire-type-6", key(1, 6) + b"\x00"),
        ("wire-type-7", key(2, 7) + b"\x00"),
        ("end-group", key(1, 4)),
        ("truncated-fixed64", key(9, 1) + b"\x00\x00"),
        ("truncated-fixed32", key(9, 5) + b"\x00"),
    ]
    unary_paths = [TR + "CreateModel", TR + "GetStatus", TR + "Step", TR + "Evaluate", TR + "Predict",
                   TR + "Checkpoint", TR + "Restore", TR + "Shutdown", HE + "Check",
                   KS + "ServerLive", KS + "ServerReady", KS + "ModelReady", KS + "ModelMetadata",
                   KS + "ModelInfer"]
    stream_paths = [TR + "Train", TR + "PullWeights", HE + "Watch"]
    for path in unary_paths + stream_paths:
        for gname, g in garbage[:6]:
            add("%s/%s" % (path.rsplit("/", 1)[1], gname), path, g, SC.INVALID_ARGUMENT,
                "malformed request: expected a")
    for gname, g in garbage[6:]:
        add("Step/" + gname, TR + "Step", g, SC.INVALID_ARGUMENT, "malformed request")
        add("GetStatus/" + gname, TR + "GetStatus", g, SC.INVALID_ARGUMENT, "malformed request")
    # A known field with the wrong wire type (string sent as a varint and vice versa).
    add("CreateModel/wrong-wire-type", TR + "CreateModel", vi(1, 5), SC.INVALID_ARGUMENT, "malformed")
    add("Step/batch-as-varint", TR + "Step", vi(1, 7), SC.INVALID_ARGUMENT, "malformed")
    add("Train/steps-as-bytes", TR + "Train", ld(1, b"\x05"), SC.INVALID_ARGUMENT, "malformed")
    add("Predict/x-truncated", TR + "Predict", ld(1, ld(2, b"FP32"))[:-2], SC.INVALID_ARGUMENT,
        "malformed")
    add("Predict/nested-huge-shape-len", TR + "Predict", ld(1, key(3, 2) + varint(1 << 40)),
        SC.INVALID_ARGUMENT, "malformed")
    add("Predict/raw-huge-length", TR + "Predict", ld(1, key(4, 2) + varint((1 << 31) + 5) + b"xx"),
        SC.INVALID_ARGUMENT, "malformed")
    for gname, g in garbage[:6]:
        add("SubmitBatch/" + gname, TR + "SubmitBatch", [g], SC.INVALID_ARGUMENT, "malformed")
        add("PushWeights/" + gname, TR + "PushWeights", [g], SC.INVALID_ARGUMENT, "malformed")
    add("PushWeights/packed-shape-past-end", TR + "PushWeights",
        [ld(1, b"conv1.weight") + key(3, 2) + varint(50) + varint(5)], SC.INVALID_ARGUMENT, "malformed")
    add("PushWeights/data-huge-length", TR + "PushWeights",
        [ld(1, b"conv1.weight") + key(5, 2) + varint(1 << 60)], SC.INVALID_ARGUMENT, "malformed")

    # ---- unknown methods and services -------------------------------------------------
    for p in [TR + "Nope", TR + "step", "/distdl.v2.Trainer/Step", "/grpc.health.v1.Health/List",
              KS + "RepositoryIndex", "/x/y", "/" + "a" * 300 + "/b"]:
        add("unknown" + p[:40], p, b"", SC.UNIMPLEMENTED, "unknown method")

    # ---- health and KServe names ---------------------------------------------------------
    for s in ["nope", "distdl.v1.trainer", "x" * 5000, "\u00e9\u00e8", "distdl.v1.Trainer "]:
        add("health/unknown:%s" % s[:20], HE + "Check", he.HealthCheckRequest(service=s),
            SC.NOT_FOUND, "unknown service")
    for s in ["nope", "y" * 3000]:
        add("metadata/unknown:%s" % s[:10], KS + "ModelMetadata", inf.ModelMetadataRequest(name=s),
            SC.NOT_FOUND, "not found")
        add("infer/unknown-model:%s" % s[:10], KS + "ModelInfer",
            inf.ModelInferRequest(model_name=s), SC.NOT_FOUND, "not found")

    # ---- CreateModel over an existing model -----------------------------------------------
    add("create/exists", TR + "CreateModel", tr.CreateModelRequest(spec_json=spec_text),
        SC.FAILED_PRECONDITION, "a model exists")
    bad_specs = [
        ("empty", "", SC.INVALID_ARGUMENT, "spec_json is empty"),
        ("not-json", "{", SC.INVALID_ARGUMENT, "spec_json"),
        ("array", "[]", SC.INVALID_ARGUMENT, "spec_json"),
        ("world-4", spec_text.replace('"world_size": 2', '"world_size": 4'), SC.INVALID_ARGUMENT,
         "world"),
        ("batch-0", spec_text.replace('"batch_size": 64', '"batch_size": 0'), SC.INVALID_ARGUMENT,
         "batch_size"),
        ("batch-neg", spec_text.replace('"batch_size": 64', '"batch_size": -64'), SC.INVALID_ARGUMENT,
         "batch_size"),
        ("batch-huge", spec_text.replace('"batch_size": 64', '"batch_size": 9223372036854775807'),
         SC.INVALID_ARGUMENT, "batch_size"),
        ("input-9-dims", spec_text.replace('"shape": [1, 28, 28]', '"shape": [1,1,1,1,1,1,1,1,1]'),
         SC.INVALID_ARGUMENT, "input"),
        ("input-neg", spec_text.replace('"shape": [1, 28, 28]', '"shape": [1, -28, 28]'),
         SC.INVALID_ARGUMENT, "input"),
        ("input-overflow", spec_text.replace('"shape": [1, 28, 28]',
                                             '"shape": [1, 4294967296, 4294967296]'),
         SC.INVALID_ARGUMENT, "input"),
        ("layer-unknown", spec_text.replace('"type": "relu"', '"type": "gelu9"', 1),
         SC.INVALID_ARGUMENT, "gelu9"),
        ("rank-out-of-world", spec_text.replace('"ranks": [0, 1], "shape": [1, 1, 2, 1]',
                                                '"ranks": [0, 7], "shape": [1, 1, 2, 1]'),
         SC.INVALID_ARGUMENT, "rank"),
        ("partition-unknown", spec_text.replace('"to": "conv"', '"to": "nowhere"'),
         SC.INVALID_ARGUMENT, "nowhere"),
        ("out-features-neg", spec_text.replace('"out_features": 120', '"out_features": -120'),
         SC.INVALID_ARGUMENT, "out_features"),
        ("kernel-huge", spec_text.replace('"kernel": [5, 5], "padding"', '"kernel": [99999999, 5], "padding"'),
         SC.INVALID_ARGUMENT, "kernel"),
    ]
    for name, text, code, sub in bad_specs:
        add("create/replace/" + name, TR + "CreateModel",
            tr.CreateModelRequest(spec_json=text, replace=True), code, sub)
    # Specs whose layers would need more memory than the host has: refused from the estimate
    # before anything is allocated.
    huge_linear = spec_text.replace('"out_features": 120', '"out_features": 16777216')
    add("create/replace/huge-linear", TR + "CreateModel",
        tr.CreateModelRequest(spec_json=huge_linear, replace=True), SC.RESOURCE_EXHAUSTED,
        "estimated")
    # A Linear 2^17 x 2^17 (2^34 weights, the most one tensor may have: 64 GiB in f32).
    mlp = open(h.spec("mlp-big-2.json")).read().replace('"out_features": 4096', '"out_features": 131072')
    add("create/replace/linear-2^17x2^17", TR + "CreateModel",
        tr.CreateModelRequest(spec_json=mlp, replace=True), SC.RESOURCE_EXHAUSTED,
        "spec needs an estimated")
    huge_conv = spec_text.replace('"out_channels": 16', '"out_channels": 100000')
    add("create/replace/huge-conv", TR + "CreateModel",
        tr.CreateModelRequest(spec_json=huge_conv, replace=True), SC.RESOURCE_EXHAUSTED, "estimated")
    huge_batch = spec_text.replace('"batch_size": 64', '"batch_size": 1048576')
    add("create/replace/huge-batch", TR + "CreateModel",
        tr.CreateModelRequest(spec_json=huge_batch, replace=True), SC.RESOURCE_EXHAUSTED, "estimated")

    # ---- tensors: Step (exact batch), Evaluate, Predict, SubmitBatch ---------------------
    xs = []  # (name, x tensor, substring)
    for dt in ["FP64", "INT64", "", "fp32", "BF16", "FP32 ", "Z" * 1000]:
        xs.append(("dtype:" + dt[:8], tensor(tr, datatype=dt), "expected datatype FP32 or UINT8"))
    for shape in [(BATCH,), (BATCH, 1, 28), (BATCH, 1, 28, 28, 1), (BATCH, 1, 1, 1, 1, 1, 1, 1, 1),
                  (BATCH,) + (1,) * 15, (), (BATCH, 1, 28, 27), (BATCH, 3, 28, 28), (BATCH, -1, 28, 28),
                  (BATCH, 1, -28, -28), (0, 1, 28, 28), (-1, 1, 28, 28), (-(1 << 62), 1, 28, 28),
                  (BATCH, 1, 1 << 62, 1 << 62)]:
        xs.append(("shape:%s" % (shape,), tensor(tr, shape=shape, raw=b""), "expected shape"))
    for n in [1 << 40, (1 << 62), (1 << 63) - 1]:
        xs.append(("declared-huge:%d" % n, tensor(tr, shape=(n, 1, 28, 28), raw=bytes(64)),
                   "exceed the tensor size limit"))
    xs.append(("declared-4GiB", tensor(tr, shape=(1 << 20, 1, 28, 28), raw=bytes(100)),
               "expected 3288334336 bytes"))
    for delta in [-1, 1, -4, -BATCH * SAMPLE * 4]:
        xs.append(("bytes%+d" % delta, tensor(tr, raw=bytes(BATCH * SAMPLE * 4 + delta)),
                   "expected 200704 bytes"))
    xs.append(("uint8-bytes-as-fp32", tensor(tr, datatype="UINT8", raw=bytes(BATCH * SAMPLE * 4)),
               "expected 50176 bytes"))
    xs.append(("uint8-short", tensor(tr, datatype="UINT8", raw=bytes(BATCH * SAMPLE - 1)),
               "expected 50176 bytes"))
    for name, val, idx, sub in [("nan@0", float("nan"), 0, "got NaN at element 0"),
                                ("nan@last", float("nan"), BATCH * SAMPLE - 1,
                                 "got NaN at element 50175 (sample 63"),
                                ("inf@1000", float("inf"), 1000, "got +Inf at element 1000 (sample 1"),
                                ("-inf@7", float("-inf"), 7, "got -Inf at element 7")]:
        xs.append((name, tensor(tr, raw=x_with(val, idx)), sub))
    for name, x, sub in xs:
        add("step/" + name, TR + "Step", tr.StepRequest(batch=tr.Batch(x=x, labels=labels(tr))),
            SC.INVALID_ARGUMENT, sub)
        if x.shape and x.shape[0] == BATCH or name.startswith(("nan", "inf", "-inf", "dtype")):
            # Predict takes any n >= 1: the batch-sized variants apply unchanged.
            add("predict/" + name, TR + "Predict", tr.PredictRequest(x=x), SC.INVALID_ARGUMENT, sub)
    for name, x, sub in xs[::3]:
        add("submit/" + name, TR + "SubmitBatch",
            [tr.Batch(x=x, labels=labels(tr)).SerializeToString()], SC.INVALID_ARGUMENT, sub)
        add("eval/" + name, TR + "Evaluate",
            tr.EvaluateRequest(batch=tr.Batch(x=x, labels=labels(tr))), SC.INVALID_ARGUMENT, sub)
    # Batch sizes: Step needs exactly 64; empty and oversized batches.
    for n in [1, 63, 65, 128]:
        x = tensor(tr, shape=(n, 1, 28, 28))
        add("step/n=%d" % n, TR + "Step", tr.StepRequest(batch=tr.Batch(x=x, labels=labels(tr, n))),
            SC.INVALID_ARGUMENT, "expected 64 samples")
        add("submit/n=%d" % n, TR + "SubmitBatch",
            [tr.Batch(x=x, labels=labels(tr, n)).SerializeToString()], SC.INVALID_ARGUMENT,
            "expected 64 samples")
    add("step/empty-batch-message", TR + "Step", tr.StepRequest(batch=tr.Batch()), SC.INVALID_ARGUMENT,
        "both x and targets (or labels) are required")
    add("step/x-only", TR + "Step", tr.StepRequest(batch=tr.Batch(x=good_x)), SC.INVALID_ARGUMENT,
        "both x and targets (or labels) are required")
    add("step/labels-only", TR + "Step", tr.StepRequest(batch=tr.Batch(labels=labels(tr))),
        SC.INVALID_ARGUMENT, "both x and targets (or labels) are required")
    add("step/no-batch-none-queued", TR + "Step", tr.StepRequest(), SC.FAILED_PRECONDITION,
        "no submitted batch waiting")
    add("predict/no-x", TR + "Predict", tr.PredictRequest(), SC.INVALID_ARGUMENT, "x is required")
    add("submit/empty-stream", TR + "SubmitBatch", [], SC.OK, "")
    # Labels.
    lab_cases = [
        ("dtype-FP32", labels(tr, datatype="FP32"), "expected datatype INT64"),
        ("dtype-INT32", labels(tr, datatype="INT32", raw=bytes(BATCH * 4)), "expected datatype INT64"),
        ("shape-2d", labels(tr, shape=[BATCH, 1]), "expected shape [64]"),
        ("shape-63", labels(tr, shape=[63]), "expected shape [64]"),
        ("shape-empty", labels(tr, shape=[]) if False else tr.Tensor(datatype="INT64", raw=b""),
         "expected shape [64]"),
        ("bytes-short", labels(tr, raw=bytes(BATCH * 8 - 1)), "expected 512 bytes"),
        ("bytes-long", labels(tr, raw=bytes(BATCH * 8 + 8)), "expected 512 bytes"),
        ("value-neg", labels(tr, values=[-1] + [0] * (BATCH - 1)), "expected a class in [0, 10), got -1"),
        ("value-10", labels(tr, values=[0] * 5 + [10] + [0] * (BATCH - 6)),
         "batch.labels[5]: expected a class in [0, 10), got 10"),
        ("value-max", labels(tr, values=[0] * (BATCH - 1) + [(1 << 63) - 1]), "batch.labels[63]"),
        ("value-min", labels(tr, values=[-(1 << 63)] * BATCH), "got -9223372036854775808"),
    ]
    # The same in Batch.targets, the field every kind of target travels in.
    for field in ("labels", "targets"):
        for name, lab, sub in lab_cases:
            b = tr.Batch(x=good_x, **{field: lab})
            sub = sub.replace("batch.labels", "batch." + field)
            add("step/%s-%s" % (field, name), TR + "Step", tr.StepRequest(batch=b),
                SC.INVALID_ARGUMENT, sub)
            add("eval/%s-%s" % (field, name), TR + "Evaluate", tr.EvaluateRequest(batch=b),
                SC.INVALID_ARGUMENT, sub)
            add("submit/%s-%s" % (field, name), TR + "SubmitBatch", [b.SerializeToString()],
                SC.INVALID_ARGUMENT, sub)
    both = tr.Batch(x=good_x, labels=labels(tr), targets=labels(tr))
    add("step/targets-and-labels", TR + "Step", tr.StepRequest(batch=both), SC.INVALID_ARGUMENT,
        "give exactly one of targets and labels, got both")
    add("submit/targets-and-labels", TR + "SubmitBatch", [both.SerializeToString()],
        SC.INVALID_ARGUMENT, "give exactly one of targets and labels, got both")

    # ---- Train / Evaluate arguments and dataset names ------------------------------------------
    for steps, epochs in [(0, 0), (1, 1), (-1, 0), (0, -1), (-(1 << 63), 0), (5, -5)]:
        add("train/steps=%d,epochs=%d" % (steps, epochs), TR + "Train",
            tr.TrainRequest(steps=steps, epochs=epochs), SC.INVALID_ARGUMENT,
            "expected exactly one of steps > 0 or epochs > 0")
    add("train/progress-neg", TR + "Train", tr.TrainRequest(steps=1, progress_every=-1),
        SC.INVALID_ARGUMENT, "progress_every must be >= 0")
    for ds, code, sub in [("/etc", SC.INVALID_ARGUMENT, "expected a path relative"),
                          ("..", SC.INVALID_ARGUMENT, "leaves the data root"),
                          ("a/../../..", SC.INVALID_ARGUMENT, "leaves the data root"),
                          ("nope-missing", SC.NOT_FOUND, "nope-missing"),
                          ("../../../../../../proc/self", SC.INVALID_ARGUMENT, "leaves the data root")]:
        add("train/dataset:" + ds, TR + "Train", tr.TrainRequest(steps=1, dataset=ds), code, sub)
        add("eval/dataset:" + ds, TR + "Evaluate", tr.EvaluateRequest(dataset=ds), code, sub)
    for split in ["validation", "TEST", "x" * 500]:
        add("eval/split:" + split[:10], TR + "Evaluate", tr.EvaluateRequest(split=split),
            SC.INVALID_ARGUMENT, 'expected "test" or "train"')

    # ---- Checkpoint / Restore / Shutdown ---------------------------------------------------------
    add("ckpt/no-dir", TR + "Checkpoint", tr.CheckpointRequest(), SC.FAILED_PRECONDITION,
        "no dir in the request")
    add("restore/no-dir", TR + "Restore", tr.RestoreRequest(latest=True), SC.FAILED_PRECONDITION,
        "no dir in the request")
    for step in [-1, -(1 << 63)]:
        add("restore/step=%d" % step, TR + "Restore", tr.RestoreRequest(step=step, dir=h.work),
            SC.INVALID_ARGUMENT, "step must be >= 0")
    # Without --checkpoint-dir there is no directory a Checkpoint or Restore may name.
    add("restore/no-root", TR + "Restore", tr.RestoreRequest(step=12345, dir=h.work),
        SC.FAILED_PRECONDITION, "confined to it")
    add("ckpt/no-root", TR + "Checkpoint", tr.CheckpointRequest(dir=os.path.join(h.work, "x")),
        SC.FAILED_PRECONDITION, "confined to it")
    add("ckpt/nul", TR + "Checkpoint", tr.CheckpointRequest(dir="a\0b"), SC.INVALID_ARGUMENT,
        "NUL byte")
    add("shutdown/ckpt-no-dir", TR + "Shutdown", tr.ShutdownRequest(checkpoint=True),
        SC.FAILED_PRECONDITION, "no --checkpoint-dir")

    # ---- PushWeights streams ---------------------------------------------------------------------------
    W = tr.WeightChunk

    def ch(**kw):
        return W(**kw).SerializeToString()
    add("push/empty-stream", TR + "PushWeights", [], SC.INVALID_ARGUMENT, "empty stream")
    add("push/unknown-name", TR + "PushWeights", [ch(first=True, name="nope", datatype="FP32", shape=[1])],
        SC.INVALID_ARGUMENT, 'unknown tensor "nope"')
    add("push/name-too-long", TR + "PushWeights", [ch(first=True, name="n" * 4000)],
        SC.INVALID_ARGUMENT, "name over 255 bytes")
    add("push/no-first", TR + "PushWeights", [ch(name="conv1.weight", data=b"1234")],
        SC.INVALID_ARGUMENT, "first chunk must have first=true")
    add("push/dtype", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP64", shape=[6, 1, 5, 5])],
        SC.INVALID_ARGUMENT, "expected datatype FP32")
    add("push/shape", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 4])],
        SC.INVALID_ARGUMENT, "expected shape [6, 1, 5, 5]")
    add("push/shape-9-dims", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[1] * 9)],
        SC.INVALID_ARGUMENT, "expected shape")
    add("push/shape-neg", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[-6, 1, 5, 5])],
        SC.INVALID_ARGUMENT, "expected shape")
    add("push/offset", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 5], offset=4)],
        SC.INVALID_ARGUMENT, "expected offset 0, got 4")
    add("push/offset-neg", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 5]),
         ch(offset=-8, data=b"abcd")], SC.INVALID_ARGUMENT, "expected offset 0, got -8")
    add("push/too-many-bytes", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 5], data=bytes(604))],
        SC.INVALID_ARGUMENT, "exceed its 600 bytes")
    add("push/twice", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 5], data=bytes(600)),
         ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 5])],
        SC.INVALID_ARGUMENT, "sent twice")
    add("push/incomplete", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 5], data=bytes(100))],
        SC.INVALID_ARGUMENT, "expected 600 bytes, got 100")
    add("push/missing-others", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 5], data=bytes(600))],
        SC.INVALID_ARGUMENT, "expected")

    # ---- ModelInfer --------------------------------------------------------------------------------
    IT = inf.ModelInferRequest.InferInputTensor
    OT = inf.ModelInferRequest.InferRequestedOutputTensor
    TC = inf.InferTensorContents
    one = bytes(SAMPLE * 4)

    def infer(inputs, raw=None, outputs=None):
        return inf.ModelInferRequest(inputs=inputs, raw_input_contents=raw or [], outputs=outputs or [])
    add("infer/no-inputs", KS + "ModelInfer", infer([]), SC.INVALID_ARGUMENT, "expected 1 input, got 0")
    add("infer/two-inputs", KS + "ModelInfer",
        infer([IT(name="a", datatype="FP32", shape=[1, 1, 28, 28])] * 2, [one, one]),
        SC.INVALID_ARGUMENT, "expected 1 input, got 2")
    add("infer/unknown-output", KS + "ModelInfer",
        infer([IT(name="a", datatype="FP32", shape=[1, 1, 28, 28])], [one], [OT(name="probs")]),
        SC.INVALID_ARGUMENT, 'unknown output "probs"')
    add("infer/no-data", KS + "ModelInfer", infer([IT(name="a", datatype="FP32", shape=[1, 1, 28, 28])]),
        SC.INVALID_ARGUMENT, "has no data")
    add("infer/raw-and-typed", KS + "ModelInfer",
        infer([IT(name="a", datatype="FP32", shape=[1, 1, 28, 28],
                  contents=TC(fp32_contents=[0.0] * SAMPLE))], [one]),
        SC.INVALID_ARGUMENT, "expected one raw_input_contents entry")
    add("infer/two-raw", KS + "ModelInfer",
        infer([IT(name="a", datatype="FP32", shape=[1, 1, 28, 28])], [one, one]),
        SC.INVALID_ARGUMENT, "expected one raw_input_contents entry")
    add("infer/typed-short", KS + "ModelInfer",
        infer([IT(name="a", datatype="FP32", shape=[1, 1, 28, 28],
                  contents=TC(fp32_contents=[0.0] * (SAMPLE - 1)))]),
        SC.INVALID_ARGUMENT, "expected 3136 bytes")
    add("infer/uint8-256", KS + "ModelInfer",
        infer([IT(name="a", datatype="UINT8", shape=[1, 1, 28, 28],
                  contents=TC(uint_contents=[0] * 9 + [256] + [0] * (SAMPLE - 10)))]),
        SC.INVALID_ARGUMENT, "uint_contents[9] = 256 is not a UINT8")
    add("infer/int64-typed", KS + "ModelInfer",
        infer([IT(name="a", datatype="INT64", shape=[1, 1, 28, 28],
                  contents=TC(int64_contents=[0] * SAMPLE))]),
        SC.INVALID_ARGUMENT, "expected datatype FP32 or UINT8")
    add("infer/nan-typed", KS + "ModelInfer",
        infer([IT(name="a", datatype="FP32", shape=[1, 1, 28, 28],
                  contents=TC(fp32_contents=[0.0] * 3 + [float("nan")] + [0.0] * (SAMPLE - 4)))]),
        SC.INVALID_ARGUMENT, "got NaN at element 3")
    for shape in [[1, 28, 28], [1, 1, 28, 28, 1], [0, 1, 28, 28], [-1, 1, 28, 28], [1 << 40, 1, 28, 28],
                  [1] * 9]:
        add("infer/shape:%s" % shape, KS + "ModelInfer",
            infer([IT(name="a", datatype="FP32", shape=shape)], [one]), SC.INVALID_ARGUMENT,
            "expected shape" if shape[0] != 1 << 40 else "exceed the tensor size limit")
    add("infer/bytes", KS + "ModelInfer", infer([IT(name="a", datatype="FP32", shape=[2, 1, 28, 28])],
                                                [one]), SC.INVALID_ARGUMENT, "expected 6272 bytes")

    # ---- messages over --max-message-bytes: RESOURCE_EXHAUSTED from gRPC itself --------------------
    big = bytes(MAX_MSG + 1024)
    over = "Received message larger than max (%d vs. %d)"
    add("oversize/CreateModel", TR + "CreateModel", ld(1, big), SC.RESOURCE_EXHAUSTED,
        over % (len(ld(1, big)), MAX_MSG))
    add("oversize/Predict", TR + "Predict", ld(1, ld(4, big)), SC.RESOURCE_EXHAUSTED, "larger than max (")
    add("oversize/Step-batch", TR + "Step",
        tr.StepRequest(batch=tr.Batch(x=tensor(tr, shape=(BATCH * 42, 1, 28, 28)),
                                      labels=labels(tr, BATCH * 42))), SC.RESOURCE_EXHAUSTED, "larger than max (")
    add("oversize/Health", HE + "Check", ld(1, big), SC.RESOURCE_EXHAUSTED, "larger than max (")
    add("oversize/ModelInfer", KS + "ModelInfer", ld(7, big), SC.RESOURCE_EXHAUSTED, "larger than max (")
    add("oversize/SubmitBatch-chunk", TR + "SubmitBatch", [ld(1, ld(4, big))], SC.RESOURCE_EXHAUSTED, "larger than max (")
    add("oversize/PushWeights-chunk", TR + "PushWeights",
        [ch(first=True, name="conv1.weight", datatype="FP32", shape=[6, 1, 5, 5]), ld(5, big)],
        SC.RESOURCE_EXHAUSTED, "larger than max (")

    # ---- unknown fields are ignored (protobuf's rule): these succeed ------------------------------
    unk = vi(1000, 7) + ld(1001, b"zz") + key(1002, 5) + b"\x00\x00\x00\x00"
    add("unknown-fields/GetStatus", TR + "GetStatus", unk, SC.OK, "")
    add("unknown-fields/Health", HE + "Check", unk, SC.OK, "")
    add("unknown-fields/ServerLive", KS + "ServerLive", unk, SC.OK, "")
    add("unknown-fields/ModelReady", KS + "ModelReady", ld(1, b"nope") + unk, SC.OK, "")
    return C


def run_case(raw, c, timeout=10):
    t0 = time.perf_counter()
    code, details, resp = raw.call(c.path, c.payload, timeout=timeout)
    return code, details, time.perf_counter() - t0


def run_table(raw, cases, record):
    """Runs every case; a refusal slower than the budget is measured again (the machine is
    shared and loaded) and the fastest of RETRIES counts. Returns the failures."""
    bad = []
    for c in cases:
        best = None
        for _ in range(RETRIES):
            code, details, dt = run_case(raw, c)
            if code != c.code or c.substr not in details:
                bad.append("%s: expected %s containing %r, got %s %r" %
                           (c.name, c.code.name, c.substr, code.name, details[:300]))
                break
            best = dt if best is None else min(best, dt)
            if best < BUDGET_S:
                break
        if best is not None:
            record.append((best, c.name))
            if best >= BUDGET_S:
                bad.append("%s: answered in %.1f ms at best of %d (budget %.0f ms)" %
                           (c.name, best * 1e3, RETRIES, BUDGET_S * 1e3))
    return bad


def predict_bits(raw, tr, x):
    code, details, resp = raw.call(TR + "Predict", tr.PredictRequest(x=x).SerializeToString())
    if code != SC.OK:
        raise Failure("valid Predict failed: %s %s" % (code, details))
    return tr.PredictResponse.FromString(resp[0]).logits.raw


def status(raw, tr):
    code, details, resp = raw.call(TR + "GetStatus", b"")
    if code != SC.OK:
        raise Failure("GetStatus failed: %s %s" % (code, details))
    return tr.GetStatusResponse.FromString(resp[0])


def health(raw, he):
    code, details, resp = raw.call(HE + "Check", b"")
    if code != SC.OK:
        return "%s %s" % (code.name, details)
    return he.HealthCheckResponse.ServingStatus.Name(he.HealthCheckResponse.FromString(resp[0]).status)


def sc_requests(h):
    spec_text = open(h.spec("lenet5-2.json")).read()
    d = h.start(2, ["--queue", "8", "--max-message-bytes", str(MAX_MSG)], "requests")
    raw = Raw(d.address)
    tr, he = h.tr, h.he
    pid = rank0_pid(d)
    cases = build_cases(h, spec_text)
    empty = [c for c in cases if c.phase == "empty"]
    model = [c for c in cases if c.phase == "model"]
    oversize = [c for c in cases if c.phase == "oversize"]
    methods = sorted(set(c.path for c in cases))
    print("%d cases (%d without a model, %d with one, %d over --max-message-bytes) over %d method "
          "paths" % (len(cases), len(empty), len(model), len(oversize), len(methods)), flush=True)
    lat = []
    bad = run_table(raw, empty, lat)

    code, details, _ = raw.call(TR + "CreateModel",
                                tr.CreateModelRequest(spec_json=spec_text).SerializeToString(), timeout=120)
    if code != SC.OK:
        raise Failure("CreateModel failed: %s %s" % (code, details))
    rnd = random.Random(9)
    x = tr.Tensor(name="x", datatype="FP32", shape=[3, 1, 28, 28],
                  raw=f32([rnd.uniform(-1, 1) for _ in range(3 * SAMPLE)]))
    good_batch = tr.Batch(x=tr.Tensor(datatype="FP32", shape=[BATCH, 1, 28, 28],
                                      raw=f32([rnd.uniform(-1, 1) for _ in range(BATCH * SAMPLE)])),
                          labels=labels(tr))
    # Warm-up: one valid Step (arenas, snapshot), then the whole table once.
    code, details, _ = raw.call(TR + "Step", tr.StepRequest(batch=good_batch).SerializeToString(), 60)
    if code != SC.OK:
        raise Failure("warm-up Step failed: %s %s" % (code, details))
    warm = []
    for _ in range(2):  # the allocator's arenas and gRPC's slice caches reach their size
        run_table(raw, model, warm)
    time.sleep(0.5)
    bits0 = predict_bits(raw, tr, x)
    st0 = status(raw, tr)
    rss0 = vm_rss_kb(pid)
    fd0 = fd_count(pid)
    t0 = time.time()
    bad += run_table(raw, model, lat)
    table_s = time.time() - t0
    time.sleep(0.5)
    rss1 = vm_rss_kb(pid)
    fd1 = fd_count(pid)
    st1 = status(raw, tr)
    bits1 = predict_bits(raw, tr, x)
    hs = health(raw, he)

    # Messages over --max-message-bytes: gRPC's own RESOURCE_EXHAUSTED. gRPC core 1.51
    # buffers a whole message before it checks its size (grpc/grpc#43012); the daemon's
    # memory quota (2 x max + 64 MiB) bounds what a far larger message can cost.
    bad += run_table(raw, oversize, lat)
    quota_kb = (2 * (MAX_MSG >> 20) + 64) << 10
    big_raw = Raw(d.address, max_bytes=1 << 30)
    for mb in [64, 200]:
        r0 = vm_rss_kb(pid)
        t0 = time.perf_counter()
        code, details, _ = big_raw.call(TR + "Predict", ld(1, ld(4, bytes(mb << 20))), timeout=60)
        dt = time.perf_counter() - t0
        grown = vm_rss_kb(pid) - r0
        print("a %d MiB Predict against --max-message-bytes %d: %s %r after %.2f s; rank 0 VmRSS %+d kB"
              % (mb, MAX_MSG, code.name, details[:80], dt, grown), flush=True)
        if code != SC.RESOURCE_EXHAUSTED or grown > quota_kb + (16 << 10):
            bad.append("%d MiB message: %s, VmRSS %+d kB (quota %d kB)" % (mb, code.name, grown, quota_kb))
    big_raw.close()
    # While a message presses against the quota, gRPC's benign reclaimer closes idle
    # connections (GOAWAY "Buffers full"), here raw's: a call that races the GOAWAY is
    # UNAVAILABLE on a channel without retries (Raw turns them off), and the next one
    # reconnects. What must hold is that the daemon serves again, on a new connection.
    t0, tries = time.time(), []
    while True:
        after = health(raw, he)
        tries.append(after)
        if after == "SERVING" or not after.startswith("UNAVAILABLE") or time.time() - t0 > 10:
            break
        time.sleep(0.1)
    print("health after the oversize messages: %s" % " -> ".join(tries), flush=True)
    if after != "SERVING":
        bad.append("not serving after the oversize messages: %s" % " -> ".join(tries))

    ms = sorted(t * 1e3 for t, _ in lat)
    slowest = sorted(lat)[-3:]
    print("tried %d cases, %d failed; latency of the answers (best of up to %d tries, ms): "
          "p50 %.2f p99 %.2f max %.2f (slowest: %s); table pass %.1f s" %
          (len(cases), len(bad), RETRIES, percentile(ms, 50), percentile(ms, 99),
           ms[-1] if ms else 0, ", ".join("%s %.1f" % (n, t * 1e3) for t, n in slowest), table_s),
          flush=True)
    print("rank 0 VmRSS %d -> %d kB (%+d kB over the measured pass), open fds %d -> %d, step %d -> %d, "
          "health %s" % (rss0, rss1, rss1 - rss0, fd0, fd1, st0.step, st1.step, hs), flush=True)
    for b in bad:
        print("  FAIL " + b, flush=True)
    if len(cases) < 200:
        bad.append("only %d cases (at least 200 wanted)" % len(cases))
    if bits0 != bits1:
        bad.append("the same Predict gave different bits after the hostile requests")
    if st1.step != st0.step:
        bad.append("the step counter moved from %d to %d during refused requests" % (st0.step, st1.step))
    if hs != "SERVING":
        bad.append("health is %s after the hostile requests" % hs)
    if rss1 - rss0 >= 5 * 1024 and not SANITIZER:
        bad.append("rank 0's VmRSS grew by %d kB (limit 5 MB)" % (rss1 - rss0))
    if fd1 > fd0 + 2:
        bad.append("rank 0's open files grew from %d to %d" % (fd0, fd1))
    code, details, resp = raw.call(TR + "Step", tr.StepRequest(batch=good_batch).SerializeToString(), 60)
    if code != SC.OK or tr.StepResponse.FromString(resp[0]).step != st1.step + 1:
        bad.append("a valid Step after the table: %s %s" % (code.name, details))
    raw.call(TR + "Shutdown", b"")
    raw.close()
    d.wait_exit()
    if bad:
        raise Failure("%d problems (first: %s)" % (len(bad), bad[0]))


# ---- garbage on the socket ----------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def host_port(address):
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def send_and_close(addr, data, times=1):
    """Sends data on `times` connections at once, then reads every one until the daemon
    closes it or for 2 s, and closes them. At once: a silent or truncated connection stays
    open until the daemon's 5 s handshake timeout, so the 2 s were spent waiting each time."""
    socks = [socket.create_connection(addr, timeout=5) for _ in range(times)]
    try:
        if data:
            for s in socks:
                s.sendall(data)
        waiting = list(socks)
        end = time.time() + 2
        while waiting and time.time() < end:
            ready, _, _ = select.select(waiting, [], [], max(0.0, end - time.time()))
            for s in ready:
                try:
                    if not s.recv(65536):
                        waiting.remove(s)
                except (socket.timeout, ConnectionResetError):
                    waiting.remove(s)
    finally:
        for s in socks:
            s.close()


def sc_socket(h):
    d = h.start(2, ["--queue", "8", "--model", h.spec("lenet5-2.json")], "socket")
    raw = Raw(d.address)
    tr, he = h.tr, h.he
    pid = rank0_pid(d)
    addr = host_port(d.address)
    if health(raw, he) != "SERVING":
        raise Failure("not serving at start")
    raw.close()  # the baseline is taken without our own channel's connection
    time.sleep(1.0)
    fd0 = fd_count(pid)
    rss0 = vm_rss_kb(pid)
    rnd = random.Random(5)
    settings = struct.pack(">I", 0)[1:] + b"\x04\x00" + struct.pack(">I", 0)  # empty SETTINGS
    garbage = [
        ("random-1k", bytes(rnd.getrandbits(8) for _ in range(1024))),
        ("random-64k", bytes(rnd.getrandbits(8) for _ in range(65536))),
        ("http1", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("http1-post", b"POST /distdl.v1.Trainer/Step HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nab"),
        ("truncated-preface", PREFACE[:10]),
        ("preface-then-garbage", PREFACE + settings + bytes(rnd.getrandbits(8) for _ in range(4096))),
        ("preface-huge-frame", PREFACE + settings + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + b"x" * 100),
        ("preface-bad-headers", PREFACE + settings + b"\x00\x00\x05\x01\x05\x00\x00\x00\x01" + b"\xff" * 5),
        ("tls-hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64)),
        ("nothing", b""),
    ]
    for name, data in garbage:
        send_and_close(addr, data, times=5)
        print("garbage %s: sent 5 times" % name, flush=True)
    bad = []

    def serving_quickly():
        r = Raw(d.address)
        t0 = time.perf_counter()
        hs = health(r, he)
        code, details, resp = r.call(TR + "GetStatus", b"")
        dt = time.perf_counter() - t0
        r.close()
        return hs, code, dt

    hs, code, dt = serving_quickly()
    print("after the garbage: health %s, GetStatus %s, %.1f ms for both" % (hs, code.name, dt * 1e3))
    if hs != "SERVING" or code != SC.OK:
        bad.append("after garbage: health %s GetStatus %s" % (hs, code.name))

    # 1,000 half-open connections: idle, then closed; and with a partial preface. Twice:
    # the first round warms gRPC's and the allocator's caches for the VmRSS baseline.
    for rnd_i, mode in enumerate(["idle", "partial-preface"] * 2):
        if rnd_i == 2:
            rss0 = vm_rss_kb(pid)
        socks = []
        t0 = time.time()
        for i in range(1000):
            try:
                s = socket.create_connection(addr, timeout=5)
                if mode == "partial-preface":
                    s.sendall(PREFACE[:12])
                socks.append(s)
            except OSError as e:
                bad.append("connection %d (%s): %s" % (i, mode, e))
                break
        open_s = time.time() - t0
        peak = fd_count(pid)
        # A new client must be served while they are open, and about as fast as the daemon
        # accepts connections at this moment. On a loaded machine (CI-2 of 0d874b6, two suites
        # at load 10) the 1,000 connects took 15.8 s, the backlog overflowing, and the new
        # client's connection then waited so long that gRPC's 5 s handshake deadline gave it
        # a GOAWAY ("UNAVAILABLE GOAWAY received"): the daemon's defence against half-open
        # connections at work, which a client meets by calling again. So the new client calls
        # again on UNAVAILABLE (at most 3 calls), and the bound is 2 s or twice the time the
        # daemon took to accept the 1,000, whichever is larger: a daemon that stalls on idle
        # connections still fails it, a slow machine alone does not.
        attempts = []
        for _ in range(3):
            hs, code, dt = serving_quickly()
            attempts.append("%s in %.1f ms" % (hs, dt * 1e3))
            if not hs.startswith("UNAVAILABLE"):
                break
        bound = max(2.0, 2.0 * open_s)
        print("%d %s connections open (%.1f s to open): rank 0 fds %d (baseline %d); a new client: "
              "health %s (bound %.1f s)" % (len(socks), mode, open_s, peak, fd0,
                                            "; then ".join(attempts), bound), flush=True)
        if (hs != "SERVING" or dt > bound) and not SANITIZER:
            bad.append("with %d %s connections (%.1f s to open): health %s" %
                       (len(socks), mode, open_s, "; then ".join(attempts)))
        for s in socks:
            s.close()
        t1 = time.time()
        back = wait_for(lambda: fd_count(pid) <= fd0 + 2, 15)
        print("  closed: fds back to %d after %.1f s" % (fd_count(pid), time.time() - t1), flush=True)
        if not back:
            bad.append("%s: rank 0 holds %d fds 15 s after the clients closed (baseline %d)" %
                       (mode, fd_count(pid), fd0))
    # Connections that stay open without finishing the handshake are dropped by the daemon
    # itself (handshake timeout 5 s).
    socks = [socket.create_connection(addr, timeout=5) for _ in range(200)]
    for s in socks[100:]:
        s.sendall(PREFACE[:5])
    t1 = time.time()
    peak = fd_count(pid)
    dropped = wait_for(lambda: fd_count(pid) <= fd0 + 2, 20)
    print("200 connections held open without a handshake: fds %d -> %d after %.1f s (held by us)" %
          (peak, fd_count(pid), time.time() - t1), flush=True)
    if not dropped:
        bad.append("held half-open connections are not dropped: %d fds after 20 s (baseline %d)" %
                   (fd_count(pid), fd0))
    for s in socks:
        s.close()
    hs, code, dt = serving_quickly()
    rss1 = vm_rss_kb(pid)
    fd1 = fd_count(pid)
    print("end: health %s, GetStatus %s in %.1f ms; VmRSS %d -> %d kB (%+d); fds %d -> %d" %
          (hs, code.name, dt * 1e3, rss0, rss1, rss1 - rss0, fd0, fd1), flush=True)
    if hs != "SERVING" or code != SC.OK:
        bad.append("end: health %s GetStatus %s" % (hs, code.name))
    if rss1 - rss0 >= 8 * 1024 and not SANITIZER:
        bad.append("rank 0's VmRSS grew by %d kB after the warm-up round" % (rss1 - rss0))
    r = Raw(d.address)
    r.call(TR + "Shutdown", b"")
    r.close()
    d.wait_exit()
    if bad:
        for b in bad:
            print("  FAIL " + b)
        raise Failure(bad[0])


if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, {"requests": sc_requests, "socket": sc_socket}))
