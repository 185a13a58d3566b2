"""The one place the deploy tests talk to a running distdld through a client program.

The `distdl` CLI (`distdl --address-file F [--token-file T] train --steps N | status --json |
shutdown`); CLIENT = "examples" runs build/bin/ddl_example_train and ddl_example_status
instead. Every deploy test (distdld-run, Slurm) goes through run_client().
"""
import json
import os
import re
import subprocess
import time

CLIENT = "cli"  # "cli" (build/bin/distdl) or "examples" (ddl_example_*)


def _argv(build, address_file, verb, steps):
    b = os.path.join(build, "bin")
    if CLIENT == "cli":
        extra = {"train": ["train", "--steps", str(steps)], "status": ["status", "--json"],
                 "shutdown": ["shutdown"]}[verb]
        # A Slurm job publishes its token beside its address (distdld.sbatch).
        tok = os.path.join(os.path.dirname(address_file), "distdld.token")
        auth = ["--token-file", tok] if os.path.exists(tok) else []
        return [os.path.join(b, "distdl"), "--address-file", address_file] + auth + extra
    if verb == "train":
        return [os.path.join(b, "ddl_example_train"), "--address-file", address_file, "--steps",
                str(steps), "--predict", "0", "--pull", "", "--progress-every", str(steps)]
    if verb == "status":
        return [os.path.join(b, "ddl_example_status"), "@" + address_file]
    return [os.path.join(b, "ddl_example_train"), "--address-file", address_file, "--steps", "1",
            "--predict", "0", "--pull", "", "--shutdown"]


def run_client(build, address_file, verb, steps=1, timeout=120):
    """Runs `verb` (train, status, shutdown) against the daemon whose address is in
    address_file. Returns (exit code, stdout); for status also a dict with step and
    durable_step (None when the call failed)."""
    argv = _argv(build, address_file, verb, steps)
    print("$ " + " ".join(argv), flush=True)
    t0 = time.time()
    env = dict(os.environ, GRPC_VERBOSITY="ERROR")
    r = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=timeout, env=env)
    print(r.stdout, end="", flush=True)
    print("(%.1f s, exit %d)" % (time.time() - t0, r.returncode), flush=True)
    if verb != "status":
        return r.returncode, r.stdout
    st = None
    if r.returncode == 0:
        if CLIENT == "cli":
            j = json.loads(r.stdout)
            st = {"step": int(j["step"]), "durable_step": int(j["durable_step"])}
        else:
            m1 = re.search(r"\bstep (-?\d+), last loss", r.stdout)
            m2 = re.search(r"durable step (-?\d+)", r.stdout)
            if m1 and m2:
                st = {"step": int(m1.group(1)), "durable_step": int(m2.group(1))}
    return r.returncode, st
