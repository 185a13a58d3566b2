"""The engine's log reaches the daemon's log (server/log.c installs ddld_log with ddl_log_set).

Starts `mpirun -np 2 distdld --model SPEC --checkpoint-dir D --resume` on a checkpoint
directory that holds a step directory without a manifest and no `latest`: the engine's
checkpoint reader warns that it skips it (checkpoint.c), and that warning must come out as
"distdld: warning: checkpoint: ..." (the daemon's prefix), never as the engine's default
"ddl warning: ...". Then SIGTERM to rank 0 and a graceful exit 0. No gRPC client needed.

usage: log_sink_test.py MPIEXEC [mpiexec flags...] -- DISTDLD SPEC
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def main():
    sep = sys.argv.index("--")
    mpiexec = sys.argv[1:sep]
    distdld, spec = sys.argv[sep + 1], sys.argv[sep + 2]
    tmp = tempfile.mkdtemp(prefix="ddld-logsink-")
    ckpt = os.path.join(tmp, "ckpt")
    os.makedirs(os.path.join(ckpt, "step-000000001"))  # no manifest.json, no latest
    addr_file = os.path.join(tmp, "addr")  # port 0: the daemon picks one
    log_path = os.path.join(tmp, "log")
    cmd = [mpiexec[0], "-np", "2"] + mpiexec[1:] + [
        distdld, "--model", spec, "--checkpoint-dir", ckpt, "--resume",
        "--listen", "127.0.0.1:0", "--address-file", addr_file]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        # The address file is written just before the "listening" line: wait for the line.
        t0 = time.time()
        while True:
            m = re.search(r"^distdld: listening on .* \(pid (\d+)\)$", open(log_path).read(),
                          re.M)
            if m:
                break
            if proc.poll() is not None:
                raise AssertionError("distdld exited with %s before serving" % proc.returncode)
            if time.time() - t0 > 90:
                raise AssertionError("no listening line after 90 s")
            time.sleep(0.05)
        os.kill(int(m.group(1)), signal.SIGTERM)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = open(log_path).read()
    sys.stdout.write(text)
    want = "distdld: warning: checkpoint: %s has no latest; skipping step-000000001" % ckpt
    assert any(line.startswith(want) for line in text.splitlines()), \
        "the engine's warning did not come out through the daemon's log: %r" % want
    assert not re.search(r"^ddl (warning|error):", text, re.M), \
        "an engine line bypassed the daemon's log"
    assert "distdld: --resume: no checkpoint in %s yet; starting fresh" % ckpt in text
    assert rc == 0, "exit %d" % rc
    shutil.rmtree(tmp, ignore_errors=True)
    print("log_sink: OK")


if __name__ == "__main__":
    main()
