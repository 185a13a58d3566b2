"""Shared test support: start a real distdld under mpirun and run programs against it.

  from ddl_daemon import DaemonHarness, Daemon, Failure, Skip, FMNIST, run_scenarios

A Daemon runs `mpirun -np P distdld --listen 127.0.0.1:0 --address-file F --data-root
FMNIST ARGS`, waits for the address file, and on wait_exit() requires mpirun -- hence every
rank -- to exit 0. Tests put tests/support on sys.path to import this module.
"""
import argparse
import os
import shlex
import shutil
import socket
import signal
import subprocess
import sys
import tempfile
import time


class Failure(Exception):
    pass


class Skip(Exception):
    pass


FMNIST = "/usr/share/datasets/fashion-mnist"

# A sanitizer build (CMake sets DDL_SANITIZER_BUILD for every test): ASan holds freed
# memory in its quarantine and runs some 2-5x slower, so tests report resident-memory
# growth and flood latencies there instead of judging them.
SANITIZER = bool(os.environ.get("DDL_SANITIZER_BUILD"))


class Daemon:
    def __init__(self, h, np, args, name, listen="127.0.0.1:0", prefix=(), mpi_flags=None,
                 extra_mpi_flags=(), env=None, wrapper=None):
        """prefix: argv put before mpirun (e.g. ip netns exec NS); mpi_flags replace the
        harness's flags, extra_mpi_flags are added after them; env: variables added to (or
        overriding) this process's environment for mpirun and the ranks; wrapper: argv
        every rank runs distdld under (e.g. deploy/memcap.sh CAP), instead of
        $DDL_DAEMON_WRAPPER."""
        self.h = h
        self.np = np
        self.dir = tempfile.mkdtemp(prefix="ddl-daemon-%s-" % name, dir=h.work)
        self.addr_file = os.path.join(self.dir, "addr")
        self.log_path = os.path.join(self.dir, "daemon.log")
        flags = (h.mpi_flags if mpi_flags is None else list(mpi_flags)) + list(extra_mpi_flags)
        # DDL_DAEMON_WRAPPER runs every rank under a tool (tests/sanitize/valgrind_daemon.sh:
        # valgrind memcheck).
        if wrapper is None:
            wrapper = shlex.split(os.environ.get("DDL_DAEMON_WRAPPER", ""))
        wrapper = list(wrapper)
        # A rank under a tool runs many times slower (valgrind memcheck: start-up and exit
        # alike), so the default hang detectors below are 5 times as long under one.
        self.slow = 5 if wrapper else 1
        cmd = list(prefix) + [h.mpiexec, "-np", str(np)] + flags + wrapper + [
            h.distdld, "--listen", listen, "--address-file", self.addr_file,
            "--data-root", FMNIST] + args
        self.cmd = cmd
        self.log = open(self.log_path, "w")
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        self.t0 = time.time()
        penv = None
        if env:
            penv = dict(os.environ)
            penv.update(env)
            new = sorted(kv for kv in env.items() if os.environ.get(kv[0]) != kv[1])
            print("  with %s" % " ".join("%s=%s" % kv for kv in new), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=penv)
        self.address = None
        self.conv_env = (penv or os.environ).get("DDL_CONV_DIRECT")

    def check_kernel_path(self):
        """A kernel-path twin (ctest NAME_gemm, DDL_CONV_DIRECT=0: docs/TESTING.md) must run
        that path: rank 0's start-up line names it."""
        if self.conv_env != "0":
            return
        text = self.log_text()
        if "convolutions im2col + GEMM" not in text:
            self.dump()
            raise Failure("DDL_CONV_DIRECT=0, but the daemon's start-up line does not name the "
                          "im2col + GEMM convolutions")

    def wait_address(self, timeout=None):
        if timeout is None:
            timeout = 90 * self.slow
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                self.dump()
                raise Failure("daemon exited with %d before writing its address" % self.proc.returncode)
            try:
                with open(self.addr_file) as f:
                    a = f.read().strip()
                if a:
                    self.address = a
                    print("daemon (np %d) listening on %s after %.1f s" %
                          (self.np, a, time.time() - self.t0), flush=True)
                    self.check_kernel_path()
                    return a
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        self.kill()
        self.dump()
        raise Failure("no address in %s after %d s" % (self.addr_file, timeout))

    def rank_pids(self):
        """pid -> rank of the daemon's processes (children of mpirun)."""
        out = {}
        for pid, _, fields in proc_stats():
            try:
                if int(fields[1]) != self.proc.pid:
                    continue
                with open("/proc/%d/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
                for e in env:
                    if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                        out[pid] = int(e.split(b"=", 1)[1])
            except (OSError, ValueError, IndexError):
                continue
        return out

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def wait_exit(self, timeout=None):
        if timeout is None:
            timeout = 60 * self.slow
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.dump()
            raise Failure("daemon still running %d s after it was told to stop" % timeout)
        self.log.close()
        if rc != 0:
            self.dump()
            raise Failure("mpirun exited with %d (a rank failed or was killed)" % rc)
        print("daemon exited 0", flush=True)

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def dump(self):
        try:
            if not self.log.closed:
                self.log.flush()
            with open(self.log_path) as f:
                text = f.read()
            print("---- daemon log (%s) ----\n%s---- end of daemon log ----" %
                  (self.log_path, text[-6000:]), flush=True)
        except OSError:
            pass


def proc_stats():
    """(pid, comm, the fields after comm) from /proc/PID/stat of every process still there
    to be read (fields[1] is the parent's pid, [11] and [12] utime and stime in ticks)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        yield int(d), st[st.index("(") + 1:st.rindex(")")], st[st.rindex(")") + 2:].split()


def job_pids(d):
    """mpirun and every rank of daemon d: the live processes whose command line holds its
    address file (found through /proc, so ranks re-parented after mpirun died count; a
    zombie has an empty command line and does not)."""
    out = []
    key = d.addr_file.encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    if key in f.read():
                        out.append(int(pid))
            except OSError:
                pass
    return out


def kill_job(d):
    """SIGKILL to mpirun and every rank at the same moment, like a node losing power."""
    for pid in job_pids(d):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    d.proc.wait()
    d.log.close()
    end = time.time() + 10
    while job_pids(d):
        if time.time() > end:
            raise Failure("processes %s outlived the SIGKILL of their job" % job_pids(d))
        time.sleep(0.05)


def free_port():
    """A loopback port where nothing listens (bound then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class DaemonHarness:
    """Starts daemons and runs programs against them; subclasses add their own helpers.

    Built from the common command line (see add_common_args): --build, --source, --mpiexec,
    --mpi-flags. Every daemon started is killed by cleanup() if it is still running."""

    def __init__(self, a, prefix="ddl-it-"):
        self.build = a.build
        self.source = a.source
        self.mpiexec = a.mpiexec
        self.mpi_flags = shlex.split(a.mpi_flags)
        self.distdld = os.path.join(a.build, "bin", "distdld")
        self.specs = os.path.join(a.source, "deploy", "specs")
        self.work = tempfile.mkdtemp(prefix=prefix)
        self.daemons = []

    def spec(self, name):
        return os.path.join(self.specs, name)

    def start(self, np, args, name, **kw):
        d = Daemon(self, np, args, name, **kw)
        self.daemons.append(d)
        d.wait_address()
        return d

    def run(self, d, argv, timeout=600, env_extra=None, capture=False, check=True):
        """Runs argv with DDL_ADDRESS=d.address (d may be None); returns its stdout when
        capture, else None. check: a nonzero exit raises Failure (after the daemon log)."""
        env = dict(os.environ)
        if d is not None:
            env["DDL_ADDRESS"] = d.address
        env["DDL_SPEC_DIR"] = self.specs
        env["DDL_DATA_DIR"] = FMNIST
        env.setdefault("GRPC_VERBOSITY", "ERROR")
        if env_extra:
            env.update(env_extra)
        print("$ " + " ".join(shlex.quote(c) for c in argv), flush=True)
        t0 = time.time()
        try:
            r = subprocess.run(argv, env=env, timeout=timeout,
                               stdout=subprocess.PIPE if capture else None,
                               text=True if capture else None)
        except subprocess.TimeoutExpired:
            raise Failure("%s timed out after %d s" % (argv[0], timeout))
        if capture:
            print(r.stdout, end="", flush=True)
        print("(%.1f s, exit %d)" % (time.time() - t0, r.returncode), flush=True)
        self.last_returncode = r.returncode
        if check and r.returncode != 0:
            if d is not None:
                d.dump()
            raise Failure("%s exited with %d" % (" ".join(argv[:2]), r.returncode))
        return r.stdout if capture else None

    def raw_get_status(self, d, timeout=10):
        """GetStatus of daemon d over raw grpcio (stubs from `protoc --python_out`), not
        through our client library: the reference a client's status is compared with."""
        if not hasattr(self, "_get_status"):
            gen = os.path.join(self.work, "py")
            os.makedirs(gen, exist_ok=True)
            proto = os.path.join(self.source, "proto")
            subprocess.run(["protoc", "-I" + proto, "--python_out=" + gen,
                            os.path.join(proto, "distdl", "v1", "trainer.proto")], check=True)
            sys.path.insert(0, gen)
            import grpc
            from distdl.v1 import trainer_pb2
            self._status_pb2, self._grpc, self._get_status = trainer_pb2, grpc, {}
        if d.address not in self._get_status:
            ch = self._grpc.insecure_channel(d.address)
            self._get_status[d.address] = (ch, ch.unary_unary(
                "/distdl.v1.Trainer/GetStatus",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=self._status_pb2.GetStatusResponse.FromString))
        return self._get_status[d.address][1](self._status_pb2.GetStatusRequest(),
                                              timeout=timeout)

    def raw_close(self, d):
        """Closes raw_get_status's channel to d, if it opened one."""
        ch = getattr(self, "_get_status", {}).pop(d.address, None)
        if ch is not None:
            ch[0].close()

    def cleanup(self):
        for d in self.daemons:
            if d.proc.poll() is None:
                d.kill()


def add_common_args(p):
    p.add_argument("--build", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--mpiexec", default="mpirun")
    p.add_argument("--mpi-flags", default="")


def run_scenarios(harness_cls, scenarios, argv=None):
    """The main() of a scenario script: parses the common arguments plus the scenario name,
    skips (7) when distdld is not built, runs it, prints PASS/FAIL and returns the exit code
    (0 pass, 1 fail, 7 skip; a scenario raises Skip to skip with its reason)."""
    p = argparse.ArgumentParser()
    add_common_args(p)
    p.add_argument("scenario", choices=sorted(scenarios))
    a = p.parse_args(argv)
    h = harness_cls(a)
    if not os.path.exists(h.distdld):
        print("SKIP: %s is not built" % h.distdld)
        return 7
    keep = True  # the work directory (daemon logs, checkpoints) stays for a failure only
    try:
        scenarios[a.scenario](h)
        keep = False
    except Skip as e:
        keep = False
        print("SKIP: %s: %s" % (a.scenario, e), flush=True)
        return 7
    except Failure as e:
        for d in getattr(h, "daemons", []):  # what each daemon said, for the CI log
            d.dump()
        print("FAIL: %s: %s (work directory kept: %s)" % (a.scenario, e, h.work), flush=True)
        return 1
    finally:
        h.cleanup()
        if not keep:
            shutil.rmtree(h.work, ignore_errors=True)
    print("PASS: %s" % a.scenario)
    return 0
