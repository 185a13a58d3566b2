#!/usr/bin/python3
"""Checkpoint data safety (issue 16, item 5), from an independent client (Debian's
python3-grpcio, stubs from `protoc --python_out`, so raw strings reach the daemon as sent).
daemon_harness.py's ckpt_safety scenario runs it against a 2-rank LeNet-5 daemon started
with --model and --checkpoint-dir CK:

  first    train 3 steps and checkpoint (step 3 in CK); Checkpoint/Restore dirs that leave CK
           (.., absolute, a symbolic link out) and strings holding a NUL byte are
           INVALID_ARGUMENT naming the rule and change nothing; a dir inside CK works;
           CreateModel(replace) of cnn-bn-2 checkpoints into CK/models/cnn-bn-2 and leaves
           CK/latest on LeNet-5's step 3; it cannot checkpoint into another model's home
           (CK, CK/models/...) nor inside a checkpoint, and a new model under a name that
           has checkpoints is refused.
  resumed  (the first command line + --resume) the daemon is LeNet-5 at step 3; 2 more
           steps, then Shutdown(checkpoint=false): the reply's durable_step is 3, and the
           harness checks that CK/latest still names step 3 and nothing newer was written.

  DDL_ADDRESS=host:port ckpt_safety.py --proto SRC/proto --gen DIR --ck CK --specs DIR PHASE
"""
import argparse
import os
import sys

from interop import gen_stubs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--proto", required=True)
    p.add_argument("--gen", required=True)
    p.add_argument("--ck", required=True)
    p.add_argument("--specs", required=True)
    p.add_argument("phase", choices=["first", "resumed"])
    a = p.parse_args()
    gen_stubs(a.proto, a.gen)
    import grpc
    from distdl.v1 import trainer_pb2 as tr

    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            failures.append(what)

    ch = grpc.insecure_channel(os.environ["DDL_ADDRESS"])
    grpc.channel_ready_future(ch).result(timeout=30)
    T = "/distdl.v1.Trainer/"

    def unary(method, req, resp_cls):
        return ch.unary_unary(T + method, request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=resp_cls.FromString)(req, timeout=120)

    def train(steps):
        call = ch.unary_stream(T + "Train", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=tr.TrainProgress.FromString)
        last = None
        for r in call(tr.TrainRequest(steps=steps, progress_every=steps), timeout=120):
            last = r
        return last

    def refused(method, req, resp_cls, code, *subs):
        try:
            unary(method, req, resp_cls)
            check(False, "%s %s must be refused" % (method, str(req).replace("\n", " ")))
        except grpc.RpcError as e:
            msg = e.details() or ""
            check(e.code() == code and all(s in msg for s in subs),
                  "%s refused: %s %s" % (method, e.code(), msg))

    def tree(root):
        out = set()
        for d, dirs, files in os.walk(root):
            for n in dirs + files:
                out.add(os.path.relpath(os.path.join(d, n), root))
        return out

    def latest(root):
        with open(os.path.join(root, "latest")) as f:
            return f.read().strip()

    status = lambda: unary("GetStatus", tr.GetStatusRequest(), tr.GetStatusResponse)
    ck = os.path.realpath(a.ck)
    INV = grpc.StatusCode.INVALID_ARGUMENT

    if a.phase == "first":
        train(3)
        r = unary("Checkpoint", tr.CheckpointRequest(), tr.CheckpointResponse)
        check(r.step == 3 and r.durable and latest(ck) == "step-000000003",
              "Checkpoint: step %d durable %s latest %s" % (r.step, r.durable, latest(ck)))

        # Item 3: Checkpoint and Restore stay inside --checkpoint-dir.
        outside = os.path.join(os.path.dirname(ck), "outside")
        os.makedirs(outside, exist_ok=True)
        link = os.path.join(ck, "link-out")
        if not os.path.islink(link):
            os.symlink(outside, link)
        escape = os.path.join(os.path.dirname(ck), "escape")  # absolute, not yet there
        before_ck, before_out = tree(ck), tree(outside)
        # The root's own ancestors ("..", its parent by absolute path), not "/": a daemon
        # that fails this test writes where it was sent (f26a0f1 wrote step-000000003 and
        # latest into / when run as root), and its parent is the test's own directory.
        for bad in ["../outside", outside, os.path.join(outside, "deep"), "link-out",
                    "link-out/x", "sub/../../outside", escape, "..", os.path.dirname(ck)]:
            refused("Checkpoint", tr.CheckpointRequest(dir=bad), tr.CheckpointResponse, INV,
                    '"%s"' % bad, "--checkpoint-dir", "confined")
            refused("Restore", tr.RestoreRequest(dir=bad, latest=True), tr.RestoreResponse, INV,
                    '"%s"' % bad, "--checkpoint-dir", "confined")
        check(not os.path.exists(escape), "nothing written at " + escape)
        check(not os.path.exists(os.path.join(os.path.dirname(ck), "latest")),
              "nothing written in the root's parent " + os.path.dirname(ck))

        # Item 4: a NUL byte inside a string is refused, not cut short.
        for method, req, resp in [
                ("Checkpoint", tr.CheckpointRequest(dir="nul\0tail"), tr.CheckpointResponse),
                ("Checkpoint", tr.CheckpointRequest(dir=ck + "/nul\0tail"), tr.CheckpointResponse),
                ("Restore", tr.RestoreRequest(dir="sub\0x", latest=True), tr.RestoreResponse),
                ("Evaluate", tr.EvaluateRequest(dataset="\0"), tr.EvaluateResponse),
                ("CreateModel", tr.CreateModelRequest(spec_json="{}", name="a\0b", replace=True),
                 tr.CreateModelResponse)]:
            refused(method, req, resp, INV, "NUL")
        check(tree(ck) == before_ck and tree(outside) == before_out,
              "the refused requests changed nothing (%s)" % sorted(tree(ck) ^ before_ck))
        check(status().step == 3, "still at step 3")

        # Inside the root: relative, or absolute below it.
        r = unary("Checkpoint", tr.CheckpointRequest(dir="sub/a"), tr.CheckpointResponse)
        check(r.step == 3 and r.path == os.path.join(ck, "sub", "a") and
              latest(os.path.join(ck, "sub", "a")) == "step-000000003",
              "Checkpoint dir=sub/a: %s" % r.path)
        r = unary("Restore", tr.RestoreRequest(dir=os.path.join(ck, "sub", "a"), latest=True),
                  tr.RestoreResponse)
        check(r.step == 3, "Restore from an absolute dir inside: step %d" % r.step)

        # Item 2: a replacement checkpoints apart from the first model.
        with open(os.path.join(a.specs, "cnn-bn-2.json")) as f:
            spec2 = f.read()
        refused("CreateModel", tr.CreateModelRequest(spec_json=spec2, replace=True, name="../x"),
                tr.CreateModelResponse, INV, "name", "models/<name>")
        c = unary("CreateModel", tr.CreateModelRequest(spec_json=spec2, replace=True,
                                                       name="cnn-bn-2"), tr.CreateModelResponse)
        check(c.name == "cnn-bn-2", "replaced by %s" % c.name)
        train(2)
        r = unary("Checkpoint", tr.CheckpointRequest(), tr.CheckpointResponse)
        mine = os.path.join(ck, "models", "cnn-bn-2")
        check(r.step == 2 and r.path == mine and latest(mine) == "step-000000002",
              "the replacement's checkpoint: step %d in %s" % (r.step, r.path))
        # Its checkpoints never go over the first model's: not by default, not by asking:
        # not into another model's home (the root, models/...) nor inside a checkpoint.
        before_ck = tree(ck)
        FP = grpc.StatusCode.FAILED_PRECONDITION
        for bad in [ck, ".", "models", "models/other", "sub/a/step-000000003",
                    "sub/a/step-000000003/x"]:
            refused("Checkpoint", tr.CheckpointRequest(dir=bad), tr.CheckpointResponse, FP,
                    '"%s"' % bad, "another model" if bad in (ck, ".") else
                    "other models" if bad.startswith("models") else "inside a checkpoint")
        check(tree(ck) == before_ck, "the refused checkpoints changed nothing (%s)" %
              sorted(tree(ck) ^ before_ck))
        r = unary("Checkpoint", tr.CheckpointRequest(dir="models/cnn-bn-2"), tr.CheckpointResponse)
        check(r.step == 2 and r.path == mine, "its own home by name: %s" % r.path)
        check(latest(ck) == "step-000000003" and not os.path.exists(
            os.path.join(ck, "step-000000002")), "CK/latest still names LeNet-5's step 3")
        # A new replacement under the same name, of another spec or of the same one (a fresh
        # model from step 0), would write over that name's checkpoints: refused, the model
        # unchanged.
        with open(os.path.join(a.specs, "lenet5-2.json")) as f:
            spec1 = f.read()
        for sp in (spec1, spec2):
            refused("CreateModel", tr.CreateModelRequest(spec_json=sp, replace=True,
                                                         name="cnn-bn-2"), tr.CreateModelResponse,
                    FP, "earlier model", "never overwritten", "choose another name")
        s = status()
        check(s.model_name == "cnn-bn-2" and s.step == 2, "still cnn-bn-2 at step 2")
    else:
        s = status()
        check(s.step == 3 and s.durable_step == 3 and s.model_name == "lenet5-2" and
              list(s.input_shape) == [1, 28, 28],
              "resumed the first model (%s) at step %d" % (s.model_name, s.step))
        train(2)
        # Item 1: Shutdown without checkpoint writes none and tells the truth.
        r = unary("Shutdown", tr.ShutdownRequest(checkpoint=False), tr.ShutdownResponse)
        check(r.durable_step == 3, "Shutdown(checkpoint=false): durable_step %d" % r.durable_step)

    ch.close()
    if failures:
        print("ckpt_safety %s: %d failures" % (a.phase, len(failures)))
        return 1
    print("ckpt_safety %s: all checks passed" % a.phase)
    return 0


if __name__ == "__main__":
    sys.exit(main())
