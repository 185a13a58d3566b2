"""`cmake --install` of the built tree into a temporary prefix, used the way a user uses it.

1. The layout: bin/{distdld,distdl,distdl-train,distdl-verify,distdld-run}, the shared
   library with its soname link, lib/pkgconfig/distdl-client.pc, include/ddl_client.h and the
   header it includes (ddl/status.h), the Python package distdl_client, share/distdl/specs.
2. The installed programs find the installed library through their RPATH ($ORIGIN/../lib),
   not the build tree's; `distdl --help` and the others run.
3. client/examples/ddl_example_status.c, copied out of the source tree, built with the system
   `cc` and nothing but `pkg-config --cflags --libs distdl-client` (PKG_CONFIG_PATH = the
   prefix's lib/pkgconfig; no compiler or linker search path from the environment). It loads
   the installed library (ldd), prints its usage (exit 2) and, against a port where nothing
   listens, its documented connection error (exit 1: "connect: ... not reachable").
4. /usr/bin/python3 with PYTHONPATH = the installed package dir and no DDL_CLIENT_LIB imports
   distdl_client from the prefix, and the library it loads (/proc/self/maps) is the
   installed one; a Client to the dead port raises Unavailable.
5. The checks can fail: without the installed ddl/status.h, or with no distdl-client.pc on
   PKG_CONFIG_PATH, the example does not build; without distdl_client/_installed.py (written
   by the install) the package no longer finds the prefix's library, so check 4 depends on it.
Skips (7) on sanitizer builds (an instrumented library needs its runtime preloaded) and when
cc or pkg-config is missing.
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile


class Failure(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failure(what)
    print("ok: " + what, flush=True)


def run(cmd, env=None, cwd=None, timeout=60):
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout)
    shown = ["<script>" if "\n" in c else c for c in cmd]
    print("$ %s -> exit %d" % (" ".join(shown), r.returncode), flush=True)
    for name, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        lines = text.strip().splitlines()
        if len(lines) > 12:  # the ends say what happened (usage lines, a traceback's error)
            lines = lines[:4] + ["... (%d lines)" % (len(lines) - 8)] + lines[-4:]
        if lines:
            print("  %s: %s" % (name, "\n          ".join(lines)), flush=True)
    return r


def clean_env(**extra):
    """The environment a user's shell has: none of the search paths that could hide a
    missing install piece (the build tree's library, include or pkg-config dirs)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "LIBRARY_PATH", "C_INCLUDE_PATH", "CPATH",
                        "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PYTHONPATH", "DDL_CLIENT_LIB",
                        "LD_PRELOAD")}
    env.update(extra)
    return env


def free_port():
    """A loopback port where nothing listens (bound then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def resolved_lib(binary, env):
    """Where the dynamic loader finds libdistdl-client for a binary (ldd), or None."""
    r = subprocess.run(["ldd", binary], env=env, stdout=subprocess.PIPE, text=True)
    for line in r.stdout.splitlines():
        if "libdistdl-client" in line and "=>" in line:
            return line.split("=>")[1].split("(")[0].strip()
    return None


def under(path, prefix):
    return path is not None and os.path.realpath(path).startswith(os.path.realpath(prefix) + os.sep)


def build_example(src, out, pc_path, env):
    """cc src -o out with the flags pkg-config gives for distdl-client; the CompletedProcess
    of pkg-config, or of cc."""
    e = clean_env(PKG_CONFIG_PATH=pc_path)
    r = run(["pkg-config", "--cflags", "--libs", "distdl-client"], env=e)
    if r.returncode != 0:
        return r
    flags = r.stdout.split()
    libdir = run(["pkg-config", "--variable=libdir", "distdl-client"], env=e).stdout.strip()
    # A prefix off the loader's path: the program records it (what a user does for /opt).
    return run(["cc", "-Wall", src, "-o", out] + flags + ["-Wl,-rpath," + libdir], env=env,
               cwd=os.path.dirname(src))


PY_CHECK = r"""
import os, sys
prefix = os.path.realpath(sys.argv[1])
port = sys.argv[2]
import distdl_client
from distdl_client import _native
print("package", distdl_client.__file__)
assert os.path.realpath(distdl_client.__file__).startswith(prefix + os.sep), "package not from the prefix"
print("library_version", distdl_client.library_version())
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libdistdl-client" in l})
print("mapped", maps)
assert maps and all(os.path.realpath(m).startswith(prefix + os.sep) for m in maps), "library not from the prefix"
try:
    distdl_client.Client("127.0.0.1:" + port, timeout=2)
except distdl_client.Unavailable as e:
    print("Unavailable:", e)
else:
    raise AssertionError("Client to a dead port did not raise Unavailable")
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cmake", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--libdir", required=True)
    ap.add_argument("--includedir", required=True)
    ap.add_argument("--datadir", required=True)
    ap.add_argument("--pythondir", required=True)
    ap.add_argument("--sanitized", action="store_true")
    a = ap.parse_args()
    if a.sanitized:
        print("SKIP: sanitizer build (the instrumented library needs its runtime preloaded)")
        return 7
    for tool in ("cc", "pkg-config", "ldd"):
        if shutil.which(tool) is None:
            print("SKIP: %s not found" % tool)
            return 7

    tmp = tempfile.mkdtemp(prefix="ddl-install-")
    try:
        prefix = os.path.join(tmp, "prefix")
        r = run([a.cmake, "--install", a.build, "--prefix", prefix], timeout=120)
        expect(r.returncode == 0, "cmake --install %s --prefix %s" % (a.build, prefix))
        P = lambda *p: os.path.join(prefix, *p)  # noqa: E731

        # 1. The layout.
        for b in ("distdld", "distdl", "distdl-train", "distdl-verify", "distdld-run"):
            expect(os.access(P(a.bindir, b), os.X_OK), "installed %s/%s" % (a.bindir, b))
        for f in ("libdistdl-client.so.0.1.0", "libdistdl-client.so.0", "libdistdl-client.so",
                  "pkgconfig/distdl-client.pc"):
            expect(os.path.exists(P(a.libdir, f)), "installed %s/%s" % (a.libdir, f))
        for f in ("ddl_client.h", "ddl/status.h"):
            expect(os.path.isfile(P(a.includedir, f)), "installed %s/%s" % (a.includedir, f))
        pkg = P(a.pythondir, "distdl_client")
        for f in ("__init__.py", "_native.py", "client.py", "errors.py", "_installed.py"):
            expect(os.path.isfile(os.path.join(pkg, f)), "installed %s/distdl_client/%s" %
                   (a.pythondir, f))
        specs = sorted(os.listdir(P(a.datadir, "distdl", "specs")))
        want = sorted(f for f in os.listdir(os.path.join(a.source, "deploy", "specs"))
                      if f.endswith(".json"))
        expect(specs == want, "share/distdl/specs holds the %d shipped specs" % len(want))
        with open(P(a.libdir, "pkgconfig", "distdl-client.pc")) as f:
            pc = f.read()
        expect("prefix=%s\n" % prefix in pc, "distdl-client.pc names the install prefix")

        # 2. The installed programs use the installed library.
        env = clean_env()
        lib = resolved_lib(P(a.bindir, "distdl"), env)
        print("distdl loads %s" % lib)
        expect(under(lib, prefix), "installed distdl loads the installed libdistdl-client")
        expect(run([P(a.bindir, "distdl"), "--help"], env=env).returncode == 0, "distdl --help")
        expect(run([P(a.bindir, "distdl-train"), "--help"], env=env).returncode == 0,
               "distdl-train --help")
        expect(run([P(a.bindir, "distdld-run"), "--help"], env=env).returncode == 0,
               "distdld-run --help")

        # 3. A client built against the install alone.
        work = os.path.join(tmp, "example")
        os.mkdir(work)
        src = os.path.join(work, "ddl_example_status.c")
        shutil.copy(os.path.join(a.source, "client", "examples", "ddl_example_status.c"), src)
        exe = os.path.join(work, "ddl_example_status")
        pcdir = P(a.libdir, "pkgconfig")
        r = build_example(src, exe, pcdir, env)
        expect(r.returncode == 0 and os.access(exe, os.X_OK),
               "cc ddl_example_status.c $(pkg-config --cflags --libs distdl-client)")
        lib = resolved_lib(exe, env)
        print("ddl_example_status loads %s" % lib)
        expect(under(lib, prefix), "the example loads the installed libdistdl-client")
        r = run([exe], env=env)
        expect(r.returncode == 2 and r.stderr.startswith("usage: ddl_example_status"),
               "the example runs: usage, exit 2")
        port = free_port()
        r = run([exe, "127.0.0.1:%d" % port], env=env, timeout=30)
        expect(r.returncode == 1 and
               r.stderr.startswith("ddl_example_status: connect: 127.0.0.1:%d not reachable" % port),
               "the example calls the library: no daemon -> connect error, exit 1")

        # 4. The installed Python package.
        r = run(["/usr/bin/python3", "-c", PY_CHECK, prefix, str(free_port())],
                env=clean_env(PYTHONPATH=P(a.pythondir)), cwd=tmp)
        expect(r.returncode == 0, "/usr/bin/python3 imports the installed distdl_client, which "
                                  "loads the installed library")

        # 5. The checks can fail.
        os.rename(P(a.includedir, "ddl", "status.h"), P(a.includedir, "ddl", "status.h.off"))
        r = build_example(src, exe + "-nohdr", pcdir, env)
        expect(r.returncode != 0 and "status.h" in r.stderr,
               "without the installed ddl/status.h the example does not build")
        os.rename(P(a.includedir, "ddl", "status.h.off"), P(a.includedir, "ddl", "status.h"))
        empty = os.path.join(tmp, "empty-pkgconfig")
        os.mkdir(empty)
        r = build_example(src, exe + "-nopc", empty, env)
        expect(r.returncode != 0, "without distdl-client.pc on PKG_CONFIG_PATH it does not build")
        os.remove(os.path.join(pkg, "_installed.py"))
        r = run(["/usr/bin/python3", "-c", PY_CHECK, prefix, str(free_port())],
                env=clean_env(PYTHONPATH=P(a.pythondir)), cwd=tmp)
        expect(r.returncode != 0, "without _installed.py the package no longer finds the "
                                  "installed library (the check above is not vacuous)")
        print("PASS")
        return 0
    except Failure as e:
        print("FAIL: " + str(e))
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
