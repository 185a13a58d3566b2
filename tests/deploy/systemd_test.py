"""deploy/systemd/distdld.service checked with `systemd-analyze verify`.

The unit is installed by deploy/systemd/install.sh into a staging root (DESTDIR), exactly as a
user installs it under /opt/distdl; the verified copy differs only in that prefix (and the
EnvironmentFile path), rewritten to the staging root so that verify finds the installed
distdld-run it checks for. systemd-analyze exits 0 on settings it merely ignores ("Unknown
key", "Failed to parse ..."), so any line it prints about the unit is a failure too. Broken
copies (a missing ExecStart binary; an unknown signal name) must fail the same check, which
proves the check can fail. Then the unit's stop/restart/hardening settings, the
EnvironmentFile example against the spec files, and the installed distdld-run.
Skips (7) only when systemd-analyze is absent.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


class Failure(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failure(what)
    print("ok: " + what, flush=True)


def verify(path):
    """(exit code, lines systemd-analyze printed about this unit file)."""
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    name = os.path.basename(path)
    lines = [l for l in r.stdout.splitlines() if path in l or l.startswith(name) or name in l]
    print("$ systemd-analyze verify %s -> exit %d\n%s" % (path, r.returncode, r.stdout), flush=True)
    return r.returncode, lines


def parse_unit(text):
    """{section: {key: [values]}} with backslash continuations joined."""
    text = re.sub(r"\\\n\s*", " ", text)
    out, sec = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            sec = out.setdefault(line.strip("[]"), {})
            continue
        k, v = line.split("=", 1)
        sec.setdefault(k.strip(), []).append(v.strip())
    return out


def parse_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                k, v = line.split("=", 1)
                env[k] = v
    return env


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--source", required=True)
    a, _ = p.parse_known_args()
    if shutil.which("systemd-analyze") is None:
        print("SKIP: systemd-analyze is not installed (apt-get install systemd)")
        return 7
    work = tempfile.mkdtemp(prefix="ddl-deploy-systemd-")
    root = os.path.join(work, "root")
    try:
        r = subprocess.run([os.path.join(a.source, "deploy", "systemd", "install.sh")],
                           env=dict(os.environ, DESTDIR=root, BUILD_DIR=a.build), timeout=60)
        expect(r.returncode == 0, "install.sh staged the install into %s" % root)
        installed = os.path.join(root, "etc", "systemd", "system", "distdld.service")
        with open(installed) as f:
            unit_text = f.read()
        with open(os.path.join(a.source, "deploy", "systemd", "distdld.service")) as f:
            expect(f.read() == unit_text, "the installed unit is deploy/systemd/distdld.service")
        relocated = unit_text.replace("/opt/distdl/", root + "/opt/distdl/").replace(
            "/etc/distdl/", root + "/etc/distdl/")
        changed = [(x, y) for x, y in zip(unit_text.splitlines(), relocated.splitlines()) if x != y]
        expect(all(y.replace(root, "") == x for x, y in changed) and changed,
               "the verified copy differs only by the staging root in %d line(s)" % len(changed))
        vdir = os.path.join(work, "verify")
        os.makedirs(vdir)
        good = os.path.join(vdir, "distdld.service")
        with open(good, "w") as f:
            f.write(relocated)
        rc, lines = verify(good)
        expect(rc == 0 and not lines, "systemd-analyze verify passes the unit with nothing to say about it")

        broken = {
            "missing-binary": relocated.replace("bin/distdld-run", "bin/distdld-run-missing"),
            "bad-signal": relocated.replace("KillSignal=SIGTERM", "KillSignal=SIGTREM"),
        }
        for name, text in broken.items():
            path = os.path.join(vdir, "distdld-%s.service" % name)
            with open(path, "w") as f:
                f.write(text)
            rc, lines = verify(path)
            expect(rc != 0 or lines, "a broken copy (%s) fails the check: exit %d, %d line(s)" %
                   (name, rc, len(lines)))

        u = parse_unit(unit_text)
        s = u["Service"]
        exec_start = s["ExecStart"][0]
        expect(exec_start.split()[0] == "/opt/distdl/bin/distdld-run", "ExecStart runs the installed distdld-run")
        expect(s["Type"] == ["simple"] and s["Restart"] == ["on-failure"], "Type=simple, Restart=on-failure")
        expect(s["KillMode"] == ["mixed"] and s["KillSignal"] == ["SIGTERM"],
               "SIGTERM to distdld-run only (its graceful stop), SIGKILL to the rest at the timeout")
        stop_timeout = int(re.search(r"--stop-timeout (\d+)", exec_start).group(1))
        expect(int(s["TimeoutStopSec"][0]) > stop_timeout > 5 + 10,
               "TimeoutStopSec %s > distdld-run --stop-timeout %d > distdld --grace 5 + a checkpoint" %
               (s["TimeoutStopSec"][0], stop_timeout))
        ckdir = re.search(r"--checkpoint-dir (\S+)", exec_start).group(1)
        expect(s["ProtectSystem"] == ["strict"] and any(ckdir.startswith(p + "/") for p in s["ReadWritePaths"]),
               "ProtectSystem=strict with the checkpoint dir %s writable" % ckdir)
        expect(s["NoNewPrivileges"] == ["yes"] and s["PrivateTmp"] == ["yes"], "NoNewPrivileges, PrivateTmp")
        expect("--resume" in exec_start.split(), "a (re)started service resumes from latest")

        env = parse_env(os.path.join(root, "etc", "distdl", "distdld.env"))
        used = set(re.findall(r"\$\{?([A-Z_]+)\}?", exec_start))
        expect(used <= set(env), "the EnvironmentFile example sets every variable ExecStart uses (%s)" %
               " ".join(sorted(used)))
        spec = env["DISTDLD_MODEL"].replace("/opt/distdl/", root + "/opt/distdl/")
        with open(spec) as f:
            world = json.load(f).get("world_size")
        expect(os.path.exists(spec) and world == int(env["DISTDLD_NP"]),
               "DISTDLD_MODEL %s is installed and its world size %s equals DISTDLD_NP" %
               (env["DISTDLD_MODEL"], world))
        run = os.path.join(root, "opt", "distdl", "bin", "distdld-run")
        r = subprocess.run([run, "--np", env["DISTDLD_NP"], "--model", spec, "--dry-run"],
                           stdout=subprocess.PIPE, text=True, timeout=60)
        expect(r.returncode == 0 and os.path.join(root, "opt", "distdl", "bin", "distdld") in r.stdout.split(),
               "the installed distdld-run runs the distdld installed beside it")
    except Failure as e:
        print("FAIL: %s (files kept in %s)" % (e, work), flush=True)
        return 1
    shutil.rmtree(work)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
