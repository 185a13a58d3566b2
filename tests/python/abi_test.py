#!/usr/bin/python3
"""The binding's ctypes mirrors of ddl_client.h against the C compiler's layout.

  abi_test.py PY_CLIENT_REF

Runs `py_client_ref abi` (built against ddl_client.h) and requires every struct the binding
mirrors to have the same size and the same fields at the same offsets, and every C struct
printed to be mirrored. No daemon needed.
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))
from distdl_client import _native  # noqa: E402


def main():
    c = json.loads(subprocess.run([sys.argv[1], "abi"], check=True, stdout=subprocess.PIPE,
                                  text=True).stdout)
    bad = []
    if set(c) != set(_native.STRUCTS):
        bad.append("structs: C prints %s, the binding mirrors %s" %
                   (sorted(c), sorted(_native.STRUCTS)))
    for name, cls in sorted(_native.STRUCTS.items()):
        if name not in c:
            continue
        want = c[name]
        got = {f[0]: getattr(cls, f[0]).offset for f in cls._fields_}
        if ctypes_size(cls) != want["size"]:
            bad.append("%s: sizeof %d in C, %d in ctypes" % (name, want["size"], ctypes_size(cls)))
        if list(got) != list(want["fields"]):
            bad.append("%s: fields %s in C, %s in ctypes" % (name, list(want["fields"]), list(got)))
        for f, off in want["fields"].items():
            if f in got and got[f] != off:
                bad.append("%s.%s: offset %d in C, %d in ctypes" % (name, f, off, got[f]))
        print("%-30s size %4d, %2d fields %s" % (name, want["size"], len(want["fields"]),
                                                 "ok" if not any(b.startswith(name + ":") or
                                                                 b.startswith(name + ".")
                                                                 for b in bad) else "MISMATCH"))
    bad += local_checks()
    for b in bad:
        print("FAIL: " + b)
    print("FAIL" if bad else "PASS: %d structs match" % len(c))
    return 1 if bad else 0


def local_checks():
    """What needs no daemon: a clear error when the library is missing, and the
    Fashion-MNIST reader."""
    bad = []
    env = dict(os.environ, DDL_CLIENT_LIB="/nonexistent/libdistdl-client.so")
    r = subprocess.run([sys.executable, "-c", "import distdl_client as d; d.library_version()"],
                       env=env, cwd=os.path.join(os.path.dirname(_native.__file__), ".."),
                       stderr=subprocess.PIPE, text=True)
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    ok = r.returncode != 0 and msg.startswith("distdl_client._native.LibraryNotFound: "
                                              "DDL_CLIENT_LIB=/nonexistent")
    print("%s missing library: %s" % ("ok  " if ok else "FAIL", msg))
    if not ok:
        bad.append("a missing DDL_CLIENT_LIB did not raise LibraryNotFound naming it")
    from distdl_client import fashion_mnist
    x, y = fashion_mnist.load("test", count=5)
    xa, ya = fashion_mnist.load("train")
    ok = (x.shape == (5, 1, 28, 28) and x.dtype == np.uint8 and y.tolist() == [9, 2, 1, 1, 6]
          and xa.shape == (60000, 1, 28, 28) and ya.shape == (60000,) and ya.dtype == np.int64
          and np.bincount(ya).tolist() == [6000] * 10)
    print("%s fashion_mnist.load: test[:5] labels %s, train %s" %
          ("ok  " if ok else "FAIL", y.tolist(), xa.shape))
    if not ok:
        bad.append("fashion_mnist.load gave unexpected shapes or labels")
    for args, what in ((("val",), "split 'val'"), (("test", 10001), "10001 test images")):
        try:
            fashion_mnist.load(*args)
            bad.append("fashion_mnist.load(%s) did not raise" % what)
        except ValueError as e:
            print("ok   fashion_mnist.load(%s) -> ValueError: %s" % (what, e))
    return bad


def ctypes_size(cls):
    import ctypes
    return ctypes.sizeof(cls)


if __name__ == "__main__":
    sys.exit(main())
