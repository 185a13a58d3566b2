"""Shared helpers of the reliability tests: raw grpcio calls (bytes in, bytes out),
hand-made protobuf encodings, and what /proc says about the daemon's rank 0.

The calls go by method path with no serializer, so a test can send any bytes at all --
including encodings no protobuf library would produce -- and still read the status.
"""
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "server"))

import grpc  # noqa: E402
import ddld_rpc  # noqa: E402
from ddl_daemon import DaemonHarness, Failure, proc_stats  # noqa: E402

TR = "/distdl.v1.Trainer/"
HE = "/grpc.health.v1.Health/"
KS = "/inference.GRPCInferenceService/"

# method path -> kind: u unary, cs client stream, ss server stream
KINDS = {
    TR + "CreateModel": "u", TR + "GetStatus": "u", TR + "SubmitBatch": "cs", TR + "Step": "u",
    TR + "Train": "ss", TR + "Evaluate": "u", TR + "Predict": "u", TR + "PullWeights": "ss",
    TR + "PushWeights": "cs", TR + "Checkpoint": "u", TR + "Restore": "u", TR + "Shutdown": "u",
    HE + "Check": "u", HE + "Watch": "ss",
    KS + "ServerLive": "u", KS + "ServerReady": "u", KS + "ModelReady": "u",
    KS + "ModelMetadata": "u", KS + "ModelInfer": "u",
}


# ---- hand-made protobuf ---------------------------------------------------------------

def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def key(field, wt):
    return varint((field << 3) | wt)


def ld(field, payload):
    """A length-delimited field."""
    return key(field, 2) + varint(len(payload)) + payload


def vi(field, v):
    return key(field, 0) + varint(v)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


# ---- calls -----------------------------------------------------------------------------

class Raw:
    """A grpcio channel that sends and receives raw bytes."""

    def __init__(self, target, max_bytes=256 << 20, own_connection=False):
        """own_connection: a TCP connection of this channel's alone. By default grpcio
        shares one connection among its channels to the same target with the same
        options (its global subchannel pool)."""
        self.target = target
        self.ch = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.enable_retries", 0)] + ([("grpc.use_local_subchannel_pool", 1)]
                                           if own_connection else []))

    def call(self, path, payload, timeout=30):
        """payload: bytes (unary / server stream) or a list of bytes (client stream).
        Returns (code, details, responses) with code a grpc.StatusCode."""
        kind = KINDS.get(path, "u")
        try:
            if kind == "u":
                r = self.ch.unary_unary(path)(payload, timeout=timeout)
                return grpc.StatusCode.OK, "", [r]
            if kind == "cs":
                r = self.ch.stream_unary(path)(iter(payload), timeout=timeout)
                return grpc.StatusCode.OK, "", [r]
            out = list(self.ch.unary_stream(path)(payload, timeout=timeout))
            return grpc.StatusCode.OK, "", out
        except grpc.RpcError as e:
            return e.code(), e.details() or "", []

    def close(self):
        self.ch.close()


# ---- /proc ------------------------------------------------------------------------------

def rank0_pid(d):
    for pid, rank in d.rank_pids().items():
        if rank == 0:
            return pid
    raise Failure("no rank 0 process under mpirun %d" % d.proc.pid)


def vm_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise Failure("no VmRSS for %d" % pid)


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def tcp_queues(port):
    """The loopback TCP sockets of `port` from /proc/net/tcp: 'local>remote state tx/rx'
    with the bytes each kernel queue holds (tx unacknowledged or unsent, rx unread by its
    process). A stalled call then shows which side stopped: data waiting in the server's
    rx queue (it does not read), in the client's (it does not read), or in neither (the
    sender holds it back)."""
    states = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # gRPC's sockets may be dual-stack
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    p = line.split()
                    lport, rport = int(p[1].split(":")[1], 16), int(p[2].split(":")[1], 16)
                    if port not in (lport, rport):
                        continue
                    tx, rx = (int(x, 16) for x in p[4].split(":"))
                    out.append("%d>%d %s tx %d rx %d" % (lport, rport, states.get(p[3], p[3]),
                                                         tx, rx))
        except OSError as e:
            out.append("%s: %s" % (table, e))
    return "; ".join(out) or "no socket of port %d" % port


def cpu_top(seconds=1.0, n=8):
    """The processes that used the most CPU over the next `seconds` (a stalled client's account:
    is it starved, and by whom?), as 'comm(pid) 97%', and the load average."""
    def sample():
        return {pid: (comm, int(f[11]) + int(f[12])) for pid, comm, f in proc_stats()}
    a = sample()
    t0 = time.perf_counter()
    time.sleep(seconds)
    b = sample()
    dt = (time.perf_counter() - t0) * os.sysconf("SC_CLK_TCK")
    use = sorted(((b[p][1] - a[p][1]) / dt * 100, p, b[p][0]) for p in b if p in a)[::-1]
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return "load %s; %s" % (load, ", ".join("%s(%d) %.0f%%" % (c, p, u) for u, p, c in use[:n]
                                             if u > 0) or "no process used CPU")


def percentile(values, p):
    v = sorted(values)
    if not v:
        return 0.0
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


def wait_for(pred, timeout, step=0.1):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


class Harness(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-reliability-")
        self.tr, self.he, self.inf = ddld_rpc.load_protos()
