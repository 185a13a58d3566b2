#!/usr/bin/python3
"""Two hosts, for real: distdld across two network namespaces on one machine.

Topology (docs/TWO_HOSTS.md has the picture): namespaces h1 and h2 joined by a veth pair
(10.231.0.1 / 10.231.0.2, the "MPI network"), and a client namespace c joined to h1 by a
second veth pair (10.232.0.2 -> 10.232.0.1, the "client network"). No address is added
to the root namespace. mpirun runs in h1 with a hostfile naming the two hosts by their
MPI-network addresses and an rsh launch agent that starts Open MPI's orted inside the
namespace of the host it is given, so Open MPI sees two nodes and the ranks talk over
btl/tcp across the veth (vader is excluded). Rank 0 listens on h1's client-network
address; the client programs run in c and reach the daemon only through that link.

The scenario trains the spec's model over both hosts (70 + 30 steps, evaluating and
pulling the weights after each part), checks that
  - each rank runs in the namespace of its host (/proc/PID/ns/net against the namespace),
    with mca_btl_tcp loaded and mca_btl_vader not,
  - the MPI veth carried, per training step, at least the bytes the model's partitions
    must move between the hosts,
  - the loss goes down and the test accuracy is sane,
then shuts the daemon down through the client (every rank exits 0), checks that over the
job the MPI veth carried every byte Open MPI's pml/monitoring counted between the hosts
(plus framing, and not much more), and repeats the same
client calls against a plain one-host daemon (shared memory): the per-step losses, the
accuracies and the pulled weights must be identical.

  two_hosts.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."] np2|np4

Exit status: 0 pass, 1 fail, 7 skip (not root, no iproute2, namespaces or veth forbidden,
distdld not built). Namespaces, veths and every process inside them are removed on every
path; namespaces left by a run that was killed (ddl-*-PID with PID gone) are removed at
the start of the next.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ddl_daemon import DaemonHarness, Failure, Skip, run_scenarios  # noqa: E402

MPI_NET = "10.231.0"  # h1 .1, h2 .2 (the veth between the hosts)
CLI_NET = "10.232.0"  # h1 .1, c .2 (the veth between the client and h1)
MPI_IF = "ddlmpi0"  # interface names exist only inside the namespaces
CLI_IF = "ddlcli0"
NS_RE = re.compile(r"^ddl-(h1|h2|c)-(\d+)$")


def sh(argv, check=True, timeout=30):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise Failure("%s: exit %d: %s" % (" ".join(argv), r.returncode, r.stderr.strip()))
    return r


class Topology:
    """The three namespaces and two veth pairs of one run; down() removes them all."""

    def __init__(self):
        tag = os.getpid()
        self.h1, self.h2, self.c = ("ddl-h1-%d" % tag, "ddl-h2-%d" % tag, "ddl-c-%d" % tag)
        self.made = []

    @staticmethod
    def remove_stale():
        """Namespaces of earlier runs whose test process is gone (e.g. killed by a timeout)."""
        for line in sh(["ip", "netns", "list"]).stdout.splitlines():
            m = NS_RE.match(line.split()[0]) if line.strip() else None
            if m and not os.path.exists("/proc/%s" % m.group(2)):
                print("removing stale namespace %s" % m.group(0), flush=True)
                Topology.kill_inside(m.group(0))
                sh(["ip", "netns", "del", m.group(0)], check=False)

    @staticmethod
    def kill_inside(ns):
        r = sh(["ip", "netns", "pids", ns], check=False)
        for pid in r.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def up(self):
        for ns in (self.h1, self.h2, self.c):
            r = sh(["ip", "netns", "add", ns], check=False)
            if r.returncode != 0:
                msg = r.stderr.strip()
                if "not permitted" in msg or "Permission denied" in msg:
                    raise Skip("this machine forbids network namespaces: `ip netns add %s`: %s"
                               % (ns, msg))
                raise Failure("ip netns add %s: %s" % (ns, msg))
            self.made.append(ns)
        # Each veth pair is created with its ends directly inside the namespaces.
        for a, b, dev in ((self.h1, self.h2, MPI_IF), (self.h1, self.c, CLI_IF)):
            r = sh(["ip", "link", "add", "name", dev, "netns", a, "type", "veth", "peer", "name",
                    dev, "netns", b], check=False)
            if r.returncode != 0:
                msg = r.stderr.strip()
                if "not permitted" in msg or "not supported" in msg or "Unknown device" in msg:
                    raise Skip("this machine forbids veth pairs between namespaces: %s" % msg)
                raise Failure("ip link add veth: %s" % msg)
        for ns, dev, addr in ((self.h1, MPI_IF, MPI_NET + ".1"), (self.h2, MPI_IF, MPI_NET + ".2"),
                              (self.h1, CLI_IF, CLI_NET + ".1"), (self.c, CLI_IF, CLI_NET + ".2")):
            sh(["ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev])
            sh(["ip", "-n", ns, "link", "set", dev, "up"])
        for ns in self.made:
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        # Some containers allow creating namespaces but not entering them (ip netns exec
        # mounts a fresh /sys).
        r = sh(["ip", "netns", "exec", self.h1, "true"], check=False)
        if r.returncode != 0:
            msg = r.stderr.strip()
            if "not permitted" in msg or "Permission denied" in msg:
                raise Skip("this machine forbids entering network namespaces: %s" % msg)
            raise Failure("ip netns exec %s true: %s" % (self.h1, msg))
        print("namespaces %s (%s.1, %s.1) <-> %s (%s.2); client %s (%s.2) -> h1" %
              (self.h1, MPI_NET, CLI_NET, self.h2, MPI_NET, self.c, CLI_NET), flush=True)

    def down(self):
        for ns in self.made:
            self.kill_inside(ns)
        time.sleep(0.2)  # let the killed processes go before their namespace
        for ns in self.made:
            sh(["ip", "netns", "del", ns], check=False)
        left = [ns for ns in self.made
                if ns in sh(["ip", "netns", "list"], check=False).stdout.split()]
        self.made = []
        if left:
            raise Failure("namespaces still present after cleanup: %s" % left)

    def interfaces(self, ns):
        return sorted(l["ifname"] for l in json.loads(sh(["ip", "-n", ns, "-j", "link"]).stdout))

    def inode(self, ns):
        return os.stat("/run/netns/" + ns).st_ino

    def bytes(self, ns, dev):
        """(rx, tx) byte counters of an interface inside a namespace."""
        s = json.loads(sh(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev]).stdout)
        s = s[0]["stats64"]
        return s["rx"]["bytes"], s["tx"]["bytes"]


# ---- the client: every call of this test goes through client() -------------------------

def client(h, d, ns, verb, steps=0, pull=None):
    """Runs one `distdl` CLI call against daemon d, inside namespace ns (None: this
    namespace), with the run's bearer token (h.token_file; the two-host daemon listens on a
    non-loopback address, so it requires one). "train" trains `steps` steps (--json, a
    record every step), then evaluates the test set and pulls the weights to `pull`; returns
    {"losses": [(step, loss as printed)...], "accuracy": float}. "status" returns the status
    object, "shutdown" None."""
    pre = ["ip", "netns", "exec", ns] if ns else []
    cli = [os.path.join(h.build, "bin", "distdl"), "--address", d.address, "--token-file",
           h.token_file, "--json"]

    def call(*args):
        out = h.run(d, pre + cli + list(args), timeout=120, capture=True)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    if verb == "status":
        return call("status")[-1]
    if verb == "shutdown":
        call("shutdown", "--no-checkpoint")
        return None
    if verb != "train":
        raise ValueError(verb)
    recs = call("train", "--steps", str(steps), "--progress-every", "1")
    losses = [(r["step"], repr(r["loss"])) for r in recs if r.get("event") == "progress"]
    ev = call("eval")[-1]
    call("pull", "--output", pull)
    # Not necessarily one record per step: the daemon drops older records when the client
    # falls behind (one send in flight, then a ring of 16 whose newest entry is replaced,
    # server/service.c), which a loaded host decides. Those that arrive are in step order,
    # within the Train, and at least 16 (a drop means the ring was full, and all 16 arrive).
    st = [s for s, _ in losses]
    if (len(st) < min(steps, 16) or st != sorted(set(st)) or (st and st[-1] - st[0] >= steps)
            or ev.get("event") != "eval"):
        raise Failure("train: expected up to %d progress records in step order and an eval "
                      "result, got steps %s" % (steps, st))
    return {"losses": losses, "accuracy": float(ev["accuracy"])}


# ---- checks on the ranks ----------------------------------------------------------------

def find_ranks(h, marker, np, timeout=20):
    """rank -> pid of the distdld processes carrying DDL_NETNS_RUN=marker (any namespace)."""
    exe = os.path.realpath(h.distdld)
    want = ("DDL_NETNS_RUN=%s" % marker).encode()
    end = time.time() + timeout
    while True:
        ranks = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.path.realpath("/proc/%s/exe" % pid) != exe:
                    continue
                with open("/proc/%s/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if want in env:
                for e in env:
                    if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                        ranks[int(e.split(b"=", 1)[1])] = int(pid)
        if len(ranks) == np or time.time() > end:
            break
        time.sleep(0.2)
    if sorted(ranks) != list(range(np)):
        raise Failure("found ranks %s of the two-host daemon, expected 0..%d" %
                      (sorted(ranks), np - 1))
    return ranks


def check_placement(topo, ranks, per_host):
    """Each rank in its host's namespace; btl/tcp loaded in it, btl/vader not."""
    for r, pid in sorted(ranks.items()):
        ns = (topo.h1, topo.h2)[r // per_host]
        link = os.readlink("/proc/%d/ns/net" % pid)
        if link != "net:[%d]" % topo.inode(ns):
            raise Failure("rank %d (pid %d) is in %s, expected %s (net:[%d])" %
                          (r, pid, link, ns, topo.inode(ns)))
        with open("/proc/%d/maps" % pid) as f:
            maps = f.read()
        if "mca_btl_tcp" not in maps or "mca_btl_vader" in maps:
            raise Failure("rank %d: expected mca_btl_tcp loaded and mca_btl_vader not" % r)
        print("rank %d: pid %d in %s (%s), btl tcp loaded, vader not" % (r, pid, ns, link),
              flush=True)


def check_job_bytes(topo, prof, np, per_host, job0):
    """Over the daemon's whole life, the MPI veth must have carried every byte the ranks of
    one host sent the ranks of the other (pml/monitoring's count), plus TCP/IP and BTL
    framing and Open MPI's out-of-band messages, and not much more."""
    job1 = topo.bytes(topo.h1, MPI_IF)
    sent = [0, 0]  # h1->h2, h2->h1
    for r in range(np):
        path = "%s.%d.prof" % (prof, r)
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise Failure("no pml/monitoring output of rank %d: %s" % (r, e))
        for src, dst, n in re.findall(r"^E\t(\d+)\t(\d+)\t(\d+) bytes", text, re.M):
            a, b = int(src) // per_host, int(dst) // per_host
            if a != b:
                sent[a] += int(n)
    veth = (job1[1] - job0[1], job1[0] - job0[0])
    for k, what in enumerate(("h1->h2", "h2->h1")):
        print("whole job, %s: ranks sent %d bytes across, the MPI veth carried %d (x%.3f)" %
              (what, sent[k], veth[k], veth[k] / max(sent[k], 1)), flush=True)
        if sent[k] == 0 or veth[k] < sent[k]:
            raise Failure("%s: the MPI veth carried %d bytes, less than the %d the ranks sent "
                          "across the hosts" % (what, veth[k], sent[k]))
        # Framing costs 1.5-3 % here; far more would mean other traffic on the MPI link.
        if veth[k] > 1.15 * sent[k] + (1 << 20):
            raise Failure("%s: the MPI veth carried %d bytes, far more than the %d the ranks "
                          "sent across the hosts" % (what, veth[k], sent[k]))


# Bytes one training step must move between the hosts, at least, per direction (float32,
# batch 64, ranks 0..per_host-1 on h1). h1->h2: the input lives on rank 0 alone and the
# conv partition puts the lower half of the image rows (64*1*14*28) on h2's ranks.
# h2->h1, 2 ranks: rank 1's partial sums of fc1 (64*120) and fc3 (64*10) reduce onto rank 0.
# 4 ranks: fc2's outputs live on ranks 0,1, so the partial sums of h2's ranks 2,3 (64*84)
# come back, and the logits (64*10) go from fc_out (2,3) to rank 0.
MIN_STEP_BYTES = {"lenet5-2": (64 * 14 * 28 * 4, (64 * 120 + 64 * 10) * 4),
                  "lenet5-4": (64 * 14 * 28 * 4, (64 * 84 + 64 * 10) * 4)}


def two_hosts(h, np):
    if os.geteuid() != 0:
        raise Skip("needs root (CAP_SYS_ADMIN) to create network namespaces; euid is %d" %
                   os.geteuid())
    if shutil.which("ip") is None:
        raise Skip("iproute2 (`ip`) is not installed: apt-get install iproute2")
    per_host = np // 2
    spec = "lenet5-%d" % np
    Topology.remove_stale()
    topo = Topology()
    h.cleanups.append(topo.down)
    topo.up()

    # The launch agent: Open MPI calls it as `agent HOST orted ARGS...` for every host that
    # is not local to mpirun (mpirun runs in h1, so only h2); it runs the command inside
    # that host's namespace, as ssh would on a real host.
    agent = os.path.join(h.work, "netns-agent.sh")
    agent_log = os.path.join(h.work, "agent.log")
    with open(agent, "w") as f:
        f.write("#!/bin/sh\n# Open MPI rsh agent: HOST CMD... -> run CMD in HOST's namespace\n"
                "host=$1; shift\n"
                "case \"$host\" in\n"
                "  %s.1) ns=%s ;;\n  %s.2) ns=%s ;;\n"
                "  *) echo \"netns-agent: unknown host $host\" >&2; exit 255 ;;\n"
                "esac\n"
                "echo \"$host -> $ns\" >> %s\n"
                "exec ip netns exec \"$ns\" /bin/sh -c \"$*\"\n" %
                (MPI_NET, topo.h1, MPI_NET, topo.h2, agent_log))
    os.chmod(agent, 0o755)
    hostfile = os.path.join(h.work, "hostfile")
    with open(hostfile, "w") as f:
        f.write("%s.1 slots=%d\n%s.2 slots=%d\n" % (MPI_NET, per_host, MPI_NET, per_host))

    # One BLAS thread per rank on both daemons: the engine would give a rank alone on its
    # "host" every core of the machine (which the simulated hosts share), and a different
    # thread count changes OpenBLAS's summation order, hence the last bits of the weights.
    marker = "%d-%d" % (os.getpid(), int(time.time()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               DDL_NETNS_RUN=marker, OPENBLAS_NUM_THREADS="1")
    subnet = MPI_NET + ".0/24"
    # Open MPI's pml/monitoring (over ob1) counts the bytes each rank sends each peer and
    # writes them at MPI_Finalize: prof.RANK.prof, lines "E <src> <dst> <n> bytes ...".
    prof = os.path.join(h.work, "prof")
    flags = ["--hostfile", hostfile, "--map-by", "slot", "--bind-to", "none",
             "--mca", "plm", "rsh", "--mca", "plm_rsh_agent", agent,
             "--mca", "btl", "self,tcp", "--mca", "pml", "ob1,monitoring",
             "--mca", "pml_monitoring_enable", "1", "--mca", "pml_monitoring_enable_output", "3",
             "--mca", "pml_monitoring_filename", prof,
             "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
             "--mca", "mpi_yield_when_idle", "1",
             "-x", "DDL_NETNS_RUN", "-x", "OPENBLAS_NUM_THREADS"]
    model = ["--model", h.spec(spec + ".json")]
    job0 = topo.bytes(topo.h1, MPI_IF)
    # A non-loopback address: distdld requires tokens (or TLS); the client sends the admin one.
    h.token_file = os.path.join(h.work, "tokens")
    with open(h.token_file, "w") as f:
        f.write("admin two-hosts-%s\n" % os.urandom(16).hex())
    os.chmod(h.token_file, 0o600)
    d = h.start(np, model + ["--token-file", h.token_file], "two-hosts", listen=CLI_NET + ".1:0",
                prefix=["ip", "netns", "exec", topo.h1], mpi_flags=flags, env=env)
    if not d.address.startswith(CLI_NET + ".1:"):
        raise Failure("daemon bound %s, expected h1's client-network address" % d.address)
    with open(agent_log) as f:
        launched = f.read().split("\n")
    if ("%s.2 -> %s" % (MPI_NET, topo.h2)) not in launched:
        raise Failure("the launch agent never started a daemon in %s" % topo.h2)
    check_placement(topo, find_ranks(h, marker, np), per_host)

    if topo.interfaces(topo.c) != sorted(["lo", CLI_IF]):
        raise Failure("the client namespace has interfaces %s, expected lo and %s only" %
                      (topo.interfaces(topo.c), CLI_IF))
    status = client(h, d, topo.c, "status")
    if status.get("world_size") != np:
        raise Failure("status reports world size %s, expected %d" % (status.get("world_size"), np))

    # Two training calls: the difference of their MPI-network bytes is per-step traffic
    # only (each call also evaluates the test set and pulls the weights).
    parts = (70, 30)
    runs, moved = [], []
    cli0 = topo.bytes(topo.c, CLI_IF)
    for i, steps in enumerate(parts):
        b0 = topo.bytes(topo.h1, MPI_IF)
        runs.append(client(h, d, topo.c, "train", steps,
                           os.path.join(d.dir, "weights-%d.safetensors" % i)))
        b1 = topo.bytes(topo.h1, MPI_IF)
        moved.append((b1[1] - b0[1], b1[0] - b0[0]))  # (h1->h2, h2->h1)
        print("MPI veth, %d steps + eval + pull: h1->h2 %d bytes, h2->h1 %d bytes" %
              ((steps,) + moved[-1]), flush=True)
    cli1 = topo.bytes(topo.c, CLI_IF)
    print("client veth: %d bytes to h1, %d bytes back" % (cli1[1] - cli0[1], cli1[0] - cli0[0]),
          flush=True)
    if cli1[1] - cli0[1] < 1000 or cli1[0] - cli0[0] < 100000:
        raise Failure("the client's calls did not go over the client veth")
    need = MIN_STEP_BYTES[spec]
    for k, what in enumerate(("h1->h2", "h2->h1")):
        per_step = (moved[0][k] - moved[1][k]) / (parts[0] - parts[1])
        print("MPI veth %s: %.0f bytes per training step (at least %d)" %
              (what, per_step, need[k]), flush=True)
        if per_step < need[k]:
            raise Failure("%s carried %.0f bytes per step, fewer than the %d the partitions "
                          "must move: the ranks did not talk over the veth" %
                          (what, per_step, need[k]))

    losses = [l for r in runs for l in r["losses"]]
    first = sum(float(l) for _, l in losses[:10]) / 10
    last = sum(float(l) for _, l in losses[-10:]) / 10
    print("two hosts: loss %.4f (first 10 steps) -> %.4f (last 10), test accuracy %.4f" %
          (first, last, runs[-1]["accuracy"]), flush=True)
    if not last < 0.6 * first:
        raise Failure("the loss did not go down: %.4f -> %.4f" % (first, last))
    if runs[-1]["accuracy"] < 0.60:
        raise Failure("test accuracy %.4f after %d steps" % (runs[-1]["accuracy"], sum(parts)))

    client(h, d, topo.c, "shutdown")
    d.wait_exit()  # mpirun exits 0 only if every rank, on both hosts, exited 0
    for ns in (topo.h1, topo.h2):
        left = sh(["ip", "netns", "pids", ns]).stdout.split()
        if left:
            raise Failure("processes still running in %s after shutdown: %s" % (ns, left))
    check_job_bytes(topo, prof, np, per_host, job0)

    # The same client calls against a plain one-host daemon (shared memory, loopback).
    ref = h.start(np, model, "one-host", env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    ref_runs = [client(h, ref, None, "train", steps,
                       os.path.join(ref.dir, "weights-%d.safetensors" % i))
                for i, steps in enumerate(parts)]
    client(h, ref, None, "shutdown")
    ref.wait_exit()
    for i in range(len(parts)):
        # By step: the records each run delivered (the pulled weights below cover every step).
        ref_by_step = dict(ref_runs[i]["losses"])
        for st, loss in runs[i]["losses"]:
            if st in ref_by_step and loss != ref_by_step[st]:
                raise Failure("step %d: loss %s on two hosts, %s on one" % (st, loss,
                                                                          ref_by_step[st]))
        if runs[i]["accuracy"] != ref_runs[i]["accuracy"]:
            raise Failure("test accuracy %.4f on two hosts, %.4f on one" %
                          (runs[i]["accuracy"], ref_runs[i]["accuracy"]))
        digests = []
        for dd in (d, ref):
            with open(os.path.join(dd.dir, "weights-%d.safetensors" % i), "rb") as f:
                digests.append(hashlib.sha256(f.read()).hexdigest())
        if digests[0] != digests[1]:
            raise Failure("the weights pulled after part %d differ between two hosts and one" % i)
    print("one host: the same %d losses, accuracies and weights (sha256 %s...)" %
          (len(losses), digests[0][:16]), flush=True)
    h.passed = True


class Harness(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-netns-")
        self.cleanups = []
        self.passed = False

    def cleanup(self):
        """Kills the daemons, removes the namespaces (and what runs in them), and the work
        directory when the scenario passed or skipped before any daemon (the logs stay for
        a failure)."""
        super().cleanup()
        while self.cleanups:
            self.cleanups.pop()()
        if self.passed or not self.daemons:
            shutil.rmtree(self.work, ignore_errors=True)


def on_signal(signum, frame):
    raise Failure("interrupted by signal %d" % signum)  # unwinds through the cleanup


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.exit(run_scenarios(Harness, {"np2": lambda h: two_hosts(h, 2),
                                     "np4": lambda h: two_hosts(h, 4)}))
