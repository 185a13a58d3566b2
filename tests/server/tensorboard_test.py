#!/usr/bin/python3
"""distdld --tensorboard-dir: TensorBoard event files, read back against the format's
specification, not through our writer.

  tensorboard_test.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."] SCENARIO

events: a 2-rank LeNet-5 daemon writes events while the CLI trains (a Train of 12 steps,
  one `--json` record per step), takes one inline Step and evaluates. The directory then
  holds one file named events.out.tfevents.<seconds>.<host>.<pid>. Every record's two
  masked CRC-32C checksums are recomputed here (CRC-32C itself checked on the standard
  check value) and every record decodes as an Event (tb_event.proto: TensorFlow's field
  numbers). The first event is file_version "brain.Event:2"; then one event per step with
  train/loss, train/accuracy, train/images_per_second and train/learning_rate, each equal
  as float32 to the CLI's JSON record of that step (the Step's images/s is the daemon's own
  figure and only checked > 0); then one evaluation event at step 13 whose eval/loss and
  eval/accuracy equal `distdl eval --json`'s. The learning rate follows the spec's cosine
  schedule (lr 0.002, t_max 4685) to float32 precision.
tool: distdl-train --tensorboard-dir: the step events equal its --print-steps losses and
  the epoch's evaluation its test line; an unusable directory exits 2 before training.
bad_dir: a --tensorboard-dir that cannot be made (below a regular file) ends every rank
  with exit 2 and a message naming the path, before anything is served; an empty
  --tensorboard-dir is a usage error (exit 2).

Exit status: 0 pass, 1 fail, 7 skip (distdld not built, or no protoc / python3-protobuf /
numpy).
"""
import glob
import json
import math
import os
import re
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
from ddl_daemon import FMNIST, DaemonHarness, Failure, Skip, run_scenarios  # noqa: E402
from metrics_test import expect_start_failure  # noqa: E402

STEPS = 12
LR, T_MAX = 0.002, 4685  # deploy/specs/lenet5-2.json's optimizer


# ---- the record format, from its specification ------------------------------------------

def crc32c(data):
    """CRC-32C (Castagnoli; reflected polynomial 0x82f63b78), bit by bit: slow and plain,
    so that it shares nothing with the writer's table."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    """The data of every record of a TFRecord file; a bad length, checksum or a truncated
    record raises Failure."""
    blob = open(path, "rb").read()
    out, off = [], 0
    while off < len(blob):
        if off + 12 > len(blob):
            raise Failure("%s: truncated record header at byte %d" % (path, off))
        head = blob[off:off + 8]
        (n,) = struct.unpack("<Q", head)
        (hc,) = struct.unpack("<I", blob[off + 8:off + 12])
        if hc != masked(head):
            raise Failure("%s: record at byte %d: length checksum %08x, expected %08x" %
                          (path, off, hc, masked(head)))
        if off + 12 + n + 4 > len(blob):
            raise Failure("%s: truncated record at byte %d" % (path, off))
        data = blob[off + 12:off + 12 + n]
        (dc,) = struct.unpack("<I", blob[off + 12 + n:off + 16 + n])
        if dc != masked(data):
            raise Failure("%s: record at byte %d: data checksum %08x, expected %08x" %
                          (path, off, dc, masked(data)))
        out.append(data)
        off += 16 + n
    return out


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def load_event_proto(work):
    gen = os.path.join(work, "tbpy")
    os.makedirs(gen, exist_ok=True)
    try:
        subprocess.run(["protoc", "-I" + HERE, "--python_out=" + gen,
                        os.path.join(HERE, "tb_event.proto")], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise Skip("protoc cannot generate tb_event.proto's module: %s" % e)
    sys.path.insert(0, gen)
    try:
        import tb_event_pb2
    except ImportError as e:
        raise Skip("python3-protobuf: %s" % e)
    return tb_event_pb2


def json_lines(out):
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def sc_events(h):
    try:
        import numpy as np
    except ImportError as e:
        raise Skip("numpy: %s" % e)
    if crc32c(b"123456789") != 0xE3069283:  # the CRC-32C check value
        raise Failure("the test's own CRC-32C is wrong")
    pb = load_event_proto(h.work)
    tb = os.path.join(h.work, "tb", "run1")  # its parent does not exist yet either
    d = h.start(2, ["--model", h.spec("lenet5-2.json"), "--tensorboard-dir", tb], "events")
    cli = os.path.join(h.build, "bin", "distdl")
    train = json_lines(h.run(d, [cli, "--json", "train", "--steps", str(STEPS), "--progress-every",
                             "1"], capture=True))
    rnd = np.random.default_rng(7)
    x, y = os.path.join(h.work, "x.npy"), os.path.join(h.work, "y.npy")
    np.save(x, rnd.uniform(-1, 1, size=(64, 1, 28, 28)).astype(np.float32))
    np.save(y, rnd.integers(0, 10, size=64).astype(np.int64))
    step = json_lines(h.run(d, [cli, "--json", "step", "--input", x, "--targets", y],
                            capture=True))
    ev = json_lines(h.run(d, [cli, "--json", "eval"], capture=True))
    h.run(d, [cli, "shutdown"])
    d.wait_exit()
    files = glob.glob(os.path.join(tb, "*"))
    if len(files) != 1 or not re.fullmatch(r"events\.out\.tfevents\.\d+\.[^/]+\.\d+",
                                           os.path.basename(files[0])):
        raise Failure("expected one events.out.tfevents.<s>.<host>.<pid> file in %s, found %s"
                      % (tb, files))
    events = []
    for data in records(files[0]):
        e = pb.Event()
        e.ParseFromString(data)
        if e.SerializeToString() != data:  # every byte accounted for by the schema
            raise Failure("an event does not re-encode to its own bytes: %r" % data)
        events.append(e)
    print("%s: %d records, every checksum right" % (files[0], len(events)), flush=True)
    if not events or events[0].WhichOneof("what") != "file_version" or \
            events[0].file_version != "brain.Event:2":
        raise Failure("the first event is not file_version brain.Event:2: %s" % events[:1])
    scalars = []
    for e in events[1:]:
        if e.WhichOneof("what") != "summary" or e.wall_time <= 0:
            raise Failure("not a summary event with a wall time: %s" % e)
        scalars.append((e.step, {v.tag: v.simple_value for v in e.summary.value}))
    progress = [r for r in train if r.get("event") == "progress"]
    if len(progress) != STEPS or len(scalars) != STEPS + 2:
        raise Failure("%d progress records and %d summary events (expected %d and %d)" %
                      (len(progress), len(scalars), STEPS, STEPS + 2))
    bad = []

    def same(what, got, want):
        if got != f32(want):
            bad.append("%s: %r in the file, %r (float32 %r) in the JSON" % (what, got, want,
                                                                           f32(want)))

    def lr_after(t):  # the rate of step t + 1: PyTorch's CosineAnnealingLR, eta_min 0
        return LR * (1 + math.cos(math.pi * min(t, T_MAX) / T_MAX)) / 2

    for r, (s, v) in zip(progress + step, scalars):
        if s != r["step"] or set(v) != {"train/loss", "train/accuracy", "train/images_per_second",
                                        "train/learning_rate"}:
            bad.append("step %d: event at step %d with %s" % (r["step"], s, sorted(v)))
            continue
        same("step %d train/loss" % s, v["train/loss"], r["loss"])
        same("step %d train/accuracy" % s, v["train/accuracy"], r["accuracy"])
        if r.get("event") == "progress":
            same("step %d train/images_per_second" % s, v["train/images_per_second"],
                 r["images_per_second"])
        elif not v["train/images_per_second"] > 0:
            bad.append("step %d: images/s %r" % (s, v["train/images_per_second"]))
        if abs(v["train/learning_rate"] - lr_after(s)) > 1e-7 * LR:
            bad.append("step %d: learning rate %r, the schedule says %r" %
                       (s, v["train/learning_rate"], lr_after(s)))
    s, v = scalars[-1]
    e = [r for r in ev if r.get("event") == "eval"][0]
    if s != STEPS + 1 or set(v) != {"eval/loss", "eval/accuracy"}:
        bad.append("evaluation: event at step %d with %s" % (s, sorted(v)))
    else:
        same("eval/loss", v["eval/loss"], e["loss"])
        same("eval/accuracy", v["eval/accuracy"], e["accuracy"])
    print("%d training events and 1 evaluation event, each equal to the CLI's JSON; last "
          "train/loss %.6f, eval/accuracy %.4f" % (STEPS + 1, scalars[-2][1]["train/loss"],
                                                   v.get("eval/accuracy", -1)), flush=True)
    if bad:
        raise Failure("; ".join(bad[:8]))


def sc_tool(h):
    """distdl-train --tensorboard-dir: one event per step whose train/loss equals the step's
    --print-steps line as float32, then the epoch's evaluation; an unusable directory ends
    every rank with exit 2 before training."""
    pb = load_event_proto(h.work)
    tb = os.path.join(h.work, "tool")
    train = os.path.join(h.build, "bin", "distdl-train")
    out = h.run(None, [h.mpiexec, "-np", "2"] + h.mpi_flags + [
        train, "--model", h.spec("lenet5-2.json"), "--data", FMNIST,
        "--max-steps", "6", "--print-steps", "--tensorboard-dir", tb], capture=True)
    losses = {int(m.group(1)): float(m.group(2))
              for m in re.finditer(r"^step (\d+) loss (\S+)$", out, re.M)}
    acc = re.search(r"test loss (\S+)  test acc (\S+)", out)
    files = glob.glob(os.path.join(tb, "events.out.tfevents.*"))
    if len(files) != 1 or len(losses) != 6 or acc is None:
        raise Failure("expected one event file, 6 step lines and a test line: %s, %s" %
                      (files, sorted(losses)))
    ev = []
    for data in records(files[0])[1:]:
        e = pb.Event()
        e.ParseFromString(data)
        ev.append((e.step, {v.tag: v.simple_value for v in e.summary.value}))
    bad = ["step %d: train/loss %r, printed %r" % (st, v.get("train/loss"), losses.get(st))
           for st, v in ev[:-1] if v.get("train/loss") != f32(losses.get(st, math.nan))]
    st, v = ev[-1]
    if len(ev) != 7 or st != 6 or abs(v.get("eval/loss", -1) - float(acc.group(1))) > 5e-5 or \
            abs(v.get("eval/accuracy", -1) - float(acc.group(2))) > 5e-5:
        bad.append("the evaluation event %s against the printed %s" % (ev[-1:], acc.group(0)))
    if bad:
        raise Failure("; ".join(bad))
    print("distdl-train: 6 step events equal to the printed losses, and the evaluation",
          flush=True)
    below = os.path.join(h.work, "x.npy")  # a regular file: no directory below it
    open(below, "w").close()
    r = subprocess.run([h.mpiexec, "-np", "2"] + h.mpi_flags + [
        train, "--model", h.spec("lenet5-2.json"), "--data", FMNIST,
        "--tensorboard-dir", os.path.join(below, "tb")], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=60)
    if r.returncode != 2 or "--tensorboard-dir" not in r.stdout or "step " in r.stdout:
        raise Failure("an unusable --tensorboard-dir: exit %d\n%s" % (r.returncode, r.stdout))


def sc_bad_dir(h):
    below_file = os.path.join(h.work, "a-file")
    open(below_file, "w").close()
    path = os.path.join(below_file, "tb")
    expect_start_failure(h, ["--model", h.spec("lenet5-2.json"), "--tensorboard-dir", path],
                         "below_file", path)
    expect_start_failure(h, ["--tensorboard-dir", ""], "empty", "--tensorboard-dir")


if __name__ == "__main__":
    sys.exit(run_scenarios(DaemonHarness, {"events": sc_events, "bad_dir": sc_bad_dir,
                                            "tool": sc_tool}))
