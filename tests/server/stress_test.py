"""distdld under concurrent load: GetStatus/Health pollers, Step and Predict callers,
SubmitBatch writers, PullWeights readers, a PushWeights writer, a Health Watch and Train
calls cancelled mid-stream, all at once for SECONDS (and until every kind has succeeded once);
then a Shutdown, after the load or (SHUTDOWN_UNDER_LOAD=1) in the middle of it. The daemon
must answer every call with a status from the protocol (no hangs: a client thread still in a
call 120 s after the load ended fails the test, with its stack), and every rank must exit 0.

usage: stress_test.py MPIEXEC [mpiexec flags...] -- DISTDLD NP SPEC [SECONDS]
"""
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import grpc
    import grpc.experimental
    import numpy as np
except ImportError:
    print("SKIP: python3-grpcio or python3-numpy is not installed")
    sys.exit(7)
import ddld_rpc  # noqa: E402

ALLOWED = {"OK", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "CANCELLED", "FAILED_PRECONDITION"}


def main():
    sep = sys.argv.index("--")
    mpiexec = sys.argv[1:sep]
    distdld, np_, spec = sys.argv[sep + 1], sys.argv[sep + 2], sys.argv[sep + 3]
    secs = float(sys.argv[sep + 4]) if len(sys.argv) > sep + 4 else 8
    tmp = tempfile.mkdtemp(prefix="ddld-stress-")
    addr_file = os.path.join(tmp, "addr")
    log_path = os.path.join(tmp, "log")
    log = open(log_path, "w")
    proc = subprocess.Popen([mpiexec[0], "-np", np_] + mpiexec[1:] + [
        distdld, "--listen", "127.0.0.1:0", "--address-file", addr_file, "--model", spec,
        "--queue", "8"], stdout=log, stderr=subprocess.STDOUT)
    ok = False
    try:
        addr = ddld_rpc.wait_address(addr_file, proc)
        main_c = ddld_rpc.Client(addr)
        tr = main_c.tr
        st = main_c.status()
        B, shp = st.batch_size, list(st.input_shape)
        x = np.random.RandomState(0).rand(B, *shp).astype(np.float32)
        y = np.random.RandomState(1).randint(0, st.num_classes, size=B).astype(np.int64)
        batch = tr.Batch(x=tr.Tensor(datatype="FP32", shape=[B] + shp, raw=x.tobytes()),
                         labels=tr.Tensor(datatype="INT64", shape=[B], raw=y.tobytes()))
        chunks = list(main_c.server_stream("/distdl.v1.Trainer/PullWeights",
                                           tr.PullWeightsRequest(), tr.WeightChunk))
        seen, bad, lock = {}, [], threading.Lock()
        done = threading.Event()  # set when the load ends

        def note(kind, code):
            with lock:
                seen[(kind, code)] = seen.get((kind, code), 0) + 1
                if code not in ALLOWED:
                    bad.append((kind, code))

        def loop(kind, fn):
            # Server streams on the calling thread: grpcio 1.51's default (a per-channel
            # thread that polls for every call's events) once left Health/Watch's first
            # next() waiting 120 s past its 5 s deadline, with the daemon long gone (1 run
            # in 10 beside 4 busy loops). Deadlines bound the wait on this path.
            c = ddld_rpc.Client(addr, options=[(
                grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
            while not done.is_set():
                try:
                    fn(c)
                    note(kind, "OK")
                except grpc.RpcError as e:
                    note(kind, e.code().name)
            c.ch.close()

        def status(c):
            c.status()
            c.health()

        def step(c):
            c.trainer("Step", tr.StepRequest(batch=batch), "StepResponse", timeout=60)

        def predict(c):
            c.trainer("Predict", tr.PredictRequest(x=batch.x), "PredictResponse", timeout=60)

        def submit(c):
            c.client_stream("/distdl.v1.Trainer/SubmitBatch", iter([batch, batch]),
                            tr.SubmitBatchResponse, timeout=60)
            c.trainer("Step", tr.StepRequest(), "StepResponse", timeout=60)

        def pull(c):
            n = sum(1 for _ in c.server_stream("/distdl.v1.Trainer/PullWeights",
                                               tr.PullWeightsRequest(), tr.WeightChunk,
                                               timeout=60))
            assert n == len(chunks)

        def push(c):
            c.client_stream("/distdl.v1.Trainer/PushWeights", iter(chunks),
                            tr.PushWeightsResponse, timeout=60)

        def train_cancel(c):
            it = c.server_stream("/distdl.v1.Trainer/Train", tr.TrainRequest(steps=1000),
                                 tr.TrainProgress, timeout=60)
            for i, _ in enumerate(it):
                if i == 2:
                    it.cancel()
                    break

        def watch(c):
            # 60 s: only a hang detector. The first status comes from the daemon's
            # completion-queue thread, which this test's load starves on a 2-core host.
            it = c.server_stream("/grpc.health.v1.Health/Watch", c.he.HealthCheckRequest(),
                                 c.he.HealthCheckResponse, timeout=60)
            next(it)
            it.cancel()

        work = [("status", status)] * 3 + [("step", step)] * 2 + [
            ("predict", predict), ("submit", submit), ("pull", pull), ("push", push),
            ("train", train_cancel), ("watch", watch)]
        threads = [threading.Thread(target=loop, args=w, name=w[0], daemon=True) for w in work]
        for t in threads:
            t.start()
        kinds = sorted(set(k for k, _ in work))

        def all_succeeded():
            with lock:
                return all(seen.get((k, "OK"), 0) > 0 for k in kinds)

        # The load lasts SECONDS, and at least until every kind of call has succeeded once
        # (a loaded machine may need longer for the first Step or push), but not forever.
        def load_for(secs_):
            t0 = time.time()
            while time.time() - t0 < secs_ or (not all_succeeded() and time.time() - t0 < 120):
                time.sleep(0.1)

        under_load = os.environ.get("SHUTDOWN_UNDER_LOAD") == "1"
        if under_load:  # Shutdown in the middle: every later call must fail cleanly
            load_for(secs / 2)
            main_c.trainer("Shutdown", tr.ShutdownRequest(), "ShutdownResponse", timeout=60)
            time.sleep(secs / 2)
        else:
            load_for(secs)
        done.set()
        stop = time.time()
        t_end = stop + 120
        for t in threads:
            t.join(timeout=max(0.0, t_end - time.time()))
        stuck = [t for t in threads if t.is_alive()]
        if stuck:  # name the call and where it waits, then fail
            frames = sys._current_frames()
            for t in stuck:
                print("client thread '%s' still in a call %.0f s after its loop ended:"
                      % (t.name, time.time() - stop))
                traceback.print_stack(frames.get(t.ident), file=sys.stdout)
            print("daemon: %s" % ("exited %d" % proc.poll() if proc.poll() is not None
                                  else "still running"))
        assert not stuck, "client threads hang: %s" % [t.name for t in stuck]
        for (kind, code), n in sorted(seen.items()):
            print("  %-8s %-20s %d" % (kind, code, n))
        assert not bad, bad
        assert all_succeeded(), "some kind never succeeded in 120 s"
        if not under_load:
            main_c.trainer("Shutdown", tr.ShutdownRequest(), "ShutdownResponse", timeout=60)
        rc = proc.wait(timeout=60)
        assert rc == 0, "mpirun exit %d" % rc
        ok = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        print(open(log_path).read()[-3000:])
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
