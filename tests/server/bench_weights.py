"""PullWeights / PushWeights throughput of a running distdld, from Python grpcio with the
payload left unparsed on pull (Python protobuf parsing is slower than the daemon), so the
figure is a lower bound for a C client. usage: bench_weights.py HOST:PORT [repeats]"""
import sys
import time

import ddld_rpc

c = ddld_rpc.Client(sys.argv[1])
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
tr = c.tr
raw_pull = c.ch.unary_stream("/distdl.v1.Trainer/PullWeights",
                             request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=lambda b: b)
# One parsed pull to learn the tensors (and to build the push stream).
chunks = list(c.server_stream("/distdl.v1.Trainer/PullWeights", tr.PullWeightsRequest(),
                              tr.WeightChunk))
total = sum(len(ch.data) for ch in chunks)
print("model: %d tensors, %.1f MiB, %d chunks" % (sum(ch.first for ch in chunks),
                                                 total / 2**20, len(chunks)))
best, rates = 0, []
for _ in range(reps):
    t0 = time.perf_counter()
    n = sum(len(b) for b in raw_pull(tr.PullWeightsRequest()))
    dt = time.perf_counter() - t0
    rates.append(total / dt / 2**30)
print("pull GiB/s (payload bytes / wall):", " ".join("%.2f" % r for r in rates),
      "median %.2f" % sorted(rates)[len(rates) // 2])
serialized = [ch.SerializeToString() for ch in chunks]
raw_push = c.ch.stream_unary("/distdl.v1.Trainer/PushWeights",
                             request_serializer=lambda b: b,
                             response_deserializer=tr.PushWeightsResponse.FromString)
rates = []
for _ in range(reps):
    t0 = time.perf_counter()
    r = raw_push(iter(serialized))
    dt = time.perf_counter() - t0
    rates.append(total / dt / 2**30)
print("push GiB/s (payload bytes / wall):", " ".join("%.2f" % r for r in rates),
      "median %.2f" % sorted(rates)[len(rates) // 2])
