"""distdld_core_deps: the server's module boundaries (server/README.md), checked on the built
objects and the sources, so that they stay as they are.

  (a) no object of distdld_core needs a symbol that main.o defines (main.c is the
      executable; the modules never call up into it);
  (b) watchdog.c and log.c include no gRPC, protobuf-c or session header, directly or
      through the headers they include;
  (c) service.o needs nothing that dispatch.o defines (dispatch uses the service, never
      the reverse);
  (d) only dispatch.o, service.o and metrics.o use the snapshot ddld_g (shared.o owns it).

usage: core_deps.py NM LIBDISTDLD_CORE.a MAIN.o SOURCE_DIR
Exit 0: all hold; 1: a violation (each is printed).
"""
import os
import re
import subprocess
import sys

FORBIDDEN = re.compile(r"^(grpc/|grpcpp/|protobuf-c/)|\.pb-c\.h$|^ddl/session\.h$")
LEAVES = ["server/watchdog.c", "server/log.c", "server/listen.c"]
SNAPSHOT_USERS = {"dispatch.c.o", "service.c.o", "metrics.c.o"}


def nm(tool, path, *flags):
    """{member: set(symbols)} for an archive or one object (member: its basename)."""
    out = subprocess.run([tool, *flags, path], check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    syms, member = {}, os.path.basename(path)
    for line in out.splitlines():
        m = re.match(r"^(\S+):$", line)
        if m:
            member = m.group(1)
            continue
        parts = line.split()
        if len(parts) >= 2:
            syms.setdefault(member, set()).add(parts[-1])
    return syms


def includes(path, src, seen, trail, problems):
    """Walks path's #include lines, following the project's own headers."""
    text = open(path).read()
    for m in re.finditer(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', text, re.M):
        name = m.group(2)
        chain = trail + [name]
        if FORBIDDEN.search(name):
            problems.append(" -> ".join(chain))
            continue
        if m.group(1) != '"':
            continue
        for d in (os.path.dirname(path), os.path.join(src, "server"),
                  os.path.join(src, "src", "include")):
            cand = os.path.normpath(os.path.join(d, name))
            if os.path.isfile(cand):
                if cand not in seen:
                    seen.add(cand)
                    includes(cand, src, seen, chain, problems)
                break


def main():
    tool, lib, main_o, src = sys.argv[1:5]
    bad = []
    main_defs = set().union(*nm(tool, main_o, "--defined-only", "-g").values())
    undef = nm(tool, lib, "-u")
    defs = nm(tool, lib, "--defined-only", "-g")
    for member in sorted(undef):
        for s in sorted(undef[member] & main_defs):
            bad.append("(a) %s needs %s, which main.c defines" % (member, s))
    for leaf in LEAVES:
        problems = []
        includes(os.path.join(src, leaf), src, set(), [leaf], problems)
        for p in problems:
            bad.append("(b) %s includes a gRPC/protobuf-c/session header: %s" % (leaf, p))
    for s in sorted(undef.get("service.c.o", set()) & defs.get("dispatch.c.o", set())):
        bad.append("(c) service.c.o needs %s, which dispatch.c defines" % s)
    for member in sorted(undef):
        if "ddld_g" in undef[member] and member not in SNAPSHOT_USERS:
            bad.append("(d) %s uses ddld_g (only %s may)"
                       % (member, ", ".join(sorted(SNAPSHOT_USERS))))
    if not undef or not main_defs:
        bad.append("nm found no symbols in %s or %s" % (lib, main_o))
    for b in bad:
        print(b)
    print("distdld_core_deps: %s (%d objects)" % ("FAIL" if bad else "OK", len(undef)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
