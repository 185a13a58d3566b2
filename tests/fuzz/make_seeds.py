#!/usr/bin/python3
"""Regenerates the seed corpora of tests/fuzz/corpus/<target>/ (Debian's python3 with
python3-numpy, python3-protobuf and protobuf-compiler; the IDX seeds read Debian's
dataset-fashion-mnist). Small, valid inputs of every kind, so each fuzzer starts past the
formats' magic and headers:

  fuzz_spec          the shipped specs (deploy/specs/*.json)
  fuzz_requests      one real request per RPC, serialized by protobuf (the wire bytes
                     protobuf-c decodes), behind the harness's two control bytes
  fuzz_safetensors   small files in the format the engine writes (plus real-*.safetensors,
                     exported by distdl-train, kept as committed)
  fuzz_npy           np.save output: f4/f8, 0-d to 3-d, format versions 1 and 2
  fuzz_idx           the first images/labels of Fashion-MNIST's test split, plain and gzip'd,
                     behind the harness's 2-byte split
  fuzz_manifest      manifests in the checkpoint format (plus real-manifest.json, written
                     by distdl-train, kept as committed)

Usage: /usr/bin/python3 tests/fuzz/make_seeds.py
  (rewrites the generated seeds; keeps real-* and regress-*, the inputs of fixed bugs)
"""
import gzip
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
CORPUS = os.path.join(HERE, "corpus")
MNIST = "/usr/share/datasets/fashion-mnist"


def out(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- fuzz_spec ---------------------------------------------------------------------------

def specs():
    sd = os.path.join(REPO, "deploy", "specs")
    for n in sorted(os.listdir(sd)):
        if n.endswith(".json"):
            with open(os.path.join(sd, n), "rb") as f:
                out("fuzz_spec", n, f.read())


# ---- fuzz_safetensors ----------------------------------------------------------------------

DT = {np.float32: "F32", np.float64: "F64", np.int64: "I64", np.uint8: "U8"}


def safetensors(tensors, meta=None):
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, a in tensors:
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": DT[a.dtype.type], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def safetensors_seeds():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.linspace(-1, 1, 4).astype(np.float64)
    out("fuzz_safetensors", "wb.safetensors", safetensors([("w", w), ("b", b)]))
    out("fuzz_safetensors", "wb-meta.safetensors",
        safetensors([("b", b), ("w", w)], {"format": "pt", "step": "3"}))
    out("fuzz_safetensors", "client-types.safetensors",
        safetensors([("i", np.array([1, -2], dtype=np.int64)),
                     ("u", np.arange(5, dtype=np.uint8)),
                     ("e", np.zeros((0, 3), dtype=np.float32))]))
    out("fuzz_safetensors", "empty.safetensors", safetensors([]))


# ---- fuzz_npy --------------------------------------------------------------------------------

def npy(a, version=None, fortran=False):
    f = io.BytesIO()
    if fortran:
        a = np.asfortranarray(a)
    np.lib.format.write_array(f, a, version=version)
    return f.getvalue()


def npy_seeds():
    out("fuzz_npy", "f4-2x3.npy", npy(np.arange(6, dtype=np.float32).reshape(2, 3)))
    out("fuzz_npy", "f8-4.npy", npy(np.linspace(0, 1, 4)))
    out("fuzz_npy", "f4-0d.npy", npy(np.float32(2.5) * np.ones((), dtype=np.float32)))
    out("fuzz_npy", "f8-2x1x2-v2.npy", npy(np.ones((2, 1, 2)), version=(2, 0)))
    out("fuzz_npy", "f4-empty.npy", npy(np.zeros((0, 5), dtype=np.float32)))
    out("fuzz_npy", "f4-fortran.npy", npy(np.ones((2, 2), dtype=np.float32), fortran=True))


# ---- fuzz_idx --------------------------------------------------------------------------------

def idx_seeds():
    with gzip.open(os.path.join(MNIST, "t10k-images-idx3-ubyte.gz")) as f:
        f.read(16)
        px = f.read(3 * 28 * 28)
    with gzip.open(os.path.join(MNIST, "t10k-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        lb = f.read(3)

    def images(n, rows=28, cols=28):
        return struct.pack(">BBBBIII", 0, 0, 8, 3, n, rows, cols) + px[: n * rows * cols]

    def labels(n):
        return struct.pack(">BBBBI", 0, 0, 8, 1, n) + lb[:n]

    def pair(img, lab):
        return struct.pack("<H", len(img)) + img + lab

    gz = lambda b: gzip.compress(b, mtime=0)
    out("fuzz_idx", "plain-2.idx", pair(images(2), labels(2)))
    out("fuzz_idx", "gz-3.idx", pair(gz(images(3)), gz(labels(3))))
    out("fuzz_idx", "gz-img-plain-lab-1.idx", pair(gz(images(1)), labels(1)))
    # Two sample dims only (n, 784): images with 2 dims.
    flat = struct.pack(">BBBBII", 0, 0, 8, 2, 2, 28 * 28) + px[: 2 * 784]
    out("fuzz_idx", "flat-2.idx", pair(flat, labels(2)))
    small = struct.pack(">BBBBIII", 0, 0, 8, 3, 2, 4, 4) + px[:32]
    out("fuzz_idx", "small-4x4.idx", pair(small, gz(labels(2))))


# ---- fuzz_manifest ---------------------------------------------------------------------------

def manifest_seeds():
    sha = "0" * 64
    m = {
        "format_version": 1, "world_size": 2, "step": 7, "spec": "{}", "user": {"epoch": 0},
        "tensors": [
            {"name": "fc.weight", "dtype": "f32", "shape": [10, 4],
             "boxes": [{"start": [0, 0], "stop": [10, 2]}, {"start": [0, 2], "stop": [10, 4]}]},
            {"name": "fc.bias", "dtype": "f64", "shape": [10],
             "boxes": [{"start": [0], "stop": [10]}, {"start": [0], "stop": [10]}]},
        ],
        "shards": [{"file": "shard-%05d.bin" % r, "sha256": sha, "bytes": 4096} for r in range(2)],
    }
    out("fuzz_manifest", "two-tensors.json", json.dumps(m, indent=1) + "\n")
    m1 = dict(m, world_size=1, tensors=[
        {"name": "s", "dtype": "f32", "shape": [], "boxes": [{"start": [], "stop": []}]}],
        shards=m["shards"][:1])
    out("fuzz_manifest", "scalar-1.json", json.dumps(m1) + "\n")


# ---- fuzz_requests ---------------------------------------------------------------------------

# The harness's method index (fuzz_requests.c, methods[]).
SEL = {n: i for i, n in enumerate([
    "CreateModel", "GetStatus", "SubmitBatch", "Step", "Train", "Evaluate", "Predict",
    "PullWeights", "PushWeights", "Checkpoint", "Restore", "Shutdown", "Health",
    "ServerLive", "ServerReady", "ModelReady", "ModelMetadata", "ModelInfer"])}


def load_protos():
    sys.path.insert(0, os.path.join(REPO, "tests", "server"))
    import ddld_rpc  # noqa: E402 (protoc --python_out into a temp dir)
    return ddld_rpc.load_protos()


def requests_seeds():
    tr, he, inf = load_protos()
    rng = np.random.default_rng(1)

    def put(name, method, msg, cut=0):
        out("fuzz_requests", name, bytes([SEL[method], cut]) + msg.SerializeToString())

    def tensor(name, datatype, shape, raw):
        return tr.Tensor(name=name, datatype=datatype, shape=shape, raw=raw)

    def batch(n, datatype="UINT8"):
        item = 1 if datatype == "UINT8" else 4
        x = rng.integers(0, 255, n * 784 * item, dtype=np.uint8).tobytes()
        y = rng.integers(0, 10, n, dtype=np.int64).astype("<i8").tobytes()
        return tr.Batch(x=tensor("x", datatype, [n, 1, 28, 28], x),
                        labels=tensor("labels", "INT64", [n], y))

    with open(os.path.join(REPO, "deploy", "specs", "lenet5-2.json")) as f:
        spec = f.read()
    put("create.pb", "CreateModel", tr.CreateModelRequest(spec_json=spec, replace=True, name="m"))
    put("status.pb", "GetStatus", tr.GetStatusRequest())
    # Small batches (a few KB): lenet5-2's batch_size is 64, so the exact check refuses
    # these; Evaluate's inline batch (any n) takes the accepting path.
    put("submit-2.pb", "SubmitBatch", batch(2), cut=7)
    put("step-2.pb", "Step", tr.StepRequest(batch=batch(2)))
    tb = batch(2)
    tb.targets.CopyFrom(tb.labels)
    tb.ClearField("labels")
    put("step-targets.pb", "Step", tr.StepRequest(batch=tb))
    put("step-empty.pb", "Step", tr.StepRequest())
    put("train.pb", "Train", tr.TrainRequest(epochs=1, dataset="data/sub", progress_every=10))
    put("train-up.pb", "Train", tr.TrainRequest(steps=5, dataset="in/../../up"))
    put("eval-split.pb", "Evaluate", tr.EvaluateRequest(dataset="data", split="train"))
    put("eval-batch.pb", "Evaluate", tr.EvaluateRequest(batch=batch(1, "FP32")))
    put("eval-batch-u8.pb", "Evaluate", tr.EvaluateRequest(batch=batch(2)))
    put("predict.pb", "Predict",
        tr.PredictRequest(x=tensor("x", "FP32", [1, 1, 28, 28], bytes(784 * 4))), cut=20)
    put("pull.pb", "PullWeights", tr.PullWeightsRequest())
    put("checkpoint.pb", "Checkpoint", tr.CheckpointRequest(dir="/tmp/ck"))
    put("restore.pb", "Restore", tr.RestoreRequest(dir="/tmp/ck", step=3))
    put("shutdown.pb", "Shutdown", tr.ShutdownRequest(checkpoint=True))
    put("health.pb", "Health", he.HealthCheckRequest(service="distdl.v1.Trainer"))
    put("live.pb", "ServerLive", inf.ServerLiveRequest())
    put("ready.pb", "ServerReady", inf.ServerReadyRequest())
    put("model-ready.pb", "ModelReady", inf.ModelReadyRequest(name="lenet5-2", version="1"))
    put("metadata.pb", "ModelMetadata", inf.ModelMetadataRequest(name="lenet5-2"))

    T = inf.ModelInferRequest.InferInputTensor
    raw = inf.ModelInferRequest(model_name="lenet5-2", id="1",
                                inputs=[T(name="x", datatype="UINT8", shape=[1, 1, 28, 28])],
                                outputs=[inf.ModelInferRequest.InferRequestedOutputTensor(
                                    name="logits")],
                                raw_input_contents=[bytes(784)])
    put("infer-raw.pb", "ModelInfer", raw)
    typed = inf.ModelInferRequest(inputs=[T(name="x", datatype="FP32", shape=[1, 1, 28, 28],
                                            contents=inf.InferTensorContents(
                                                fp32_contents=[0.5] * 784))])
    put("infer-fp32.pb", "ModelInfer", typed, cut=33)
    typed8 = inf.ModelInferRequest(inputs=[T(name="x", datatype="UINT8", shape=[1, 1, 28, 28],
                                             contents=inf.InferTensorContents(
                                                 uint_contents=[7] * 784))])
    put("infer-u8.pb", "ModelInfer", typed8)

    # PushWeights: a stream of length-prefixed WeightChunks (fc3 of lenet5, in two chunks).
    def chunks(*msgs):
        b = b""
        for m in msgs:
            s = m.SerializeToString()
            b += struct.pack("<H", len(s)) + s
        return b

    C = tr.WeightChunk
    stream = chunks(C(name="fc3.bias", datatype="FP32", shape=[10], offset=0, data=bytes(24),
                      first=True),
                    C(offset=24, data=bytes(16)),
                    C(name="conv1.bias", datatype="FP32", shape=[6], offset=0, data=bytes(24),
                      first=True))
    out("fuzz_requests", "push.pb", bytes([SEL["PushWeights"], 5]) + stream)


def main():
    for t in ["fuzz_spec", "fuzz_requests", "fuzz_safetensors", "fuzz_npy", "fuzz_idx",
              "fuzz_manifest"]:
        d = os.path.join(CORPUS, t)
        if os.path.isdir(d):
            for n in os.listdir(d):
                if not n.startswith(("real-", "regress-")):
                    os.remove(os.path.join(d, n))
    specs()
    safetensors_seeds()
    npy_seeds()
    idx_seeds()
    manifest_seeds()
    requests_seeds()


if __name__ == "__main__":
    main()
