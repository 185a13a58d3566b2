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
    for b in bad:
        print("FAIL: " + b)
    print("FAIL" if bad else "PASS: %d structs match" % len(c))
    return 1 if bad else 0


def ctypes_size(cls):
    import ctypes
    return ctypes.sizeof(cls)


if __name__ == "__main__":
    sys.exit(main())
