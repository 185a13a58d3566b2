#!/usr/bin/python3
"""Interoperability: an independent client (Debian's python3-grpcio, stubs from
`protoc --python_out`) calls a running distdld's Health, Trainer and ModelInfer.

  DDL_ADDRESS=host:port interop.py --proto SRC/proto --gen DIR
"""
import argparse
import os
import struct
import subprocess
import sys


def gen_stubs(proto, gen):
    os.makedirs(gen, exist_ok=True)
    files = ["distdl/v1/trainer.proto", "grpc/health/v1/health.proto",
             "inference/grpc_service.proto"]
    subprocess.run(["protoc", "-I" + proto, "--python_out=" + gen] +
                   [os.path.join(proto, f) for f in files], check=True)
    sys.path.insert(0, gen)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--proto", required=True)
    p.add_argument("--gen", required=True)
    a = p.parse_args()
    gen_stubs(a.proto, a.gen)
    import grpc
    from distdl.v1 import trainer_pb2 as tr
    # The generated grpc/health/v1 would collide with grpcio's own `grpc` package: load it
    # from its file instead.
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "ddl_health_pb2", os.path.join(a.gen, "grpc", "health", "v1", "health_pb2.py"))
    hp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hp)
    from inference import grpc_service_pb2 as inf

    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            failures.append(what)

    ch = grpc.insecure_channel(os.environ["DDL_ADDRESS"])
    grpc.channel_ready_future(ch).result(timeout=30)

    def unary(path, req, resp_cls):
        return ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=resp_cls.FromString)(req, timeout=60)

    h = unary("/grpc.health.v1.Health/Check", hp.HealthCheckRequest(service=""),
              hp.HealthCheckResponse)
    check(h.status == hp.HealthCheckResponse.SERVING, "Health.Check: %s" % h.status)

    s = unary("/distdl.v1.Trainer/GetStatus", tr.GetStatusRequest(), tr.GetStatusResponse)
    check(s.has_model and s.world_size == 2 and s.num_classes == 10,
          "GetStatus: model %s world %d classes %d" % (s.model_name, s.world_size, s.num_classes))

    live = unary("/inference.GRPCInferenceService/ServerLive", inf.ServerLiveRequest(),
                 inf.ServerLiveResponse)
    check(live.live, "ServerLive")

    # A deterministic batch of 64 "images" and labels.
    n = int(s.batch_size) or 64
    px = bytes((i * 37 + 11) % 256 for i in range(n * 784))
    labels = struct.pack("<%dq" % n, *[(i * 7) % 10 for i in range(n)])
    batch = tr.Batch(x=tr.Tensor(name="x", datatype="UINT8", shape=[n, 1, 28, 28], raw=px),
                     labels=tr.Tensor(name="labels", datatype="INT64", shape=[n], raw=labels))
    st = unary("/distdl.v1.Trainer/Step", tr.StepRequest(batch=batch), tr.StepResponse)
    check(st.step == s.step + 1 and st.loss > 0, "Step: step %d loss %.4f" % (st.step, st.loss))

    # Predict and ModelInfer on the same FP32 input give the same logits.
    k = 3
    xs = [((i % 97) / 97.0 - 0.5) for i in range(k * 784)]
    raw = struct.pack("<%df" % len(xs), *xs)
    pr = unary("/distdl.v1.Trainer/Predict",
               tr.PredictRequest(x=tr.Tensor(name="x", datatype="FP32", shape=[k, 1, 28, 28], raw=raw)),
               tr.PredictResponse)
    check(list(pr.logits.shape) == [k, 10] and pr.logits.datatype == "FP32" and
          len(pr.logits.raw) == k * 10 * 4, "Predict: logits %s %s" % (pr.logits.datatype, list(pr.logits.shape)))
    req = inf.ModelInferRequest(model_name=s.model_name)
    req.inputs.add(name="input", datatype="FP32", shape=[k, 1, 28, 28])
    req.raw_input_contents.append(raw)
    mi = unary("/inference.GRPCInferenceService/ModelInfer", req, inf.ModelInferResponse)
    out_raw = mi.raw_output_contents[0] if mi.raw_output_contents else b""
    if not out_raw and mi.outputs and mi.outputs[0].contents.fp32_contents:
        out_raw = struct.pack("<%df" % len(mi.outputs[0].contents.fp32_contents),
                              *mi.outputs[0].contents.fp32_contents)
    check(len(mi.outputs) >= 1 and list(mi.outputs[0].shape) == [k, 10],
          "ModelInfer: outputs %s" % [list(o.shape) for o in mi.outputs])
    check(out_raw == pr.logits.raw, "ModelInfer logits == Predict logits")

    # A bad request gets its status and message.
    try:
        unary("/distdl.v1.Trainer/Predict",
              tr.PredictRequest(x=tr.Tensor(name="x", datatype="FP32", shape=[k, 1, 28, 27], raw=raw)),
              tr.PredictResponse)
        check(False, "Predict with a bad shape must fail")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details(),
              "bad Predict: %s %s" % (e.code(), e.details()))

    # Server streaming: PullWeights assembles every tensor completely.
    pull = ch.unary_stream("/distdl.v1.Trainer/PullWeights",
                           request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=tr.WeightChunk.FromString)
    sizes, got, cur = {}, {}, None
    for c in pull(tr.PullWeightsRequest(), timeout=60):
        if c.first:
            cur = c.name
            n_el = 1
            for d in c.shape:
                n_el *= d
            sizes[cur] = n_el * 4
            got[cur] = 0
        got[cur] += len(c.data)
    total = sum(sizes.values()) // 4
    check(sizes and all(got[t] == sizes[t] for t in sizes) and total == 61706,
          "PullWeights: %d tensors, %d elements" % (len(sizes), total))

    ch.close()
    if failures:
        print("interop: %d failures" % len(failures))
        return 1
    print("interop: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
