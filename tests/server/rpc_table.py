"""rpc_table: the method table (proto/rpc_methods.h) against the protos it describes.

Parses every `service` block of proto/**/*.proto and every X(...) row of DDL_RPC_METHODS,
and requires the two to list exactly the same rpcs, each row with
  - the path "/<package>.<Service>/<Method>" of its rpc,
  - the kind its stream keywords give (UNARY, CLIENT_STREAM, SERVER_STREAM; a
    bidirectional rpc has no kind the daemon serves, so it is an error),
  - the protobuf-c stem of the rpc's request message (<package>__<message> in snake case),
and every role and where column one of the values the daemon expands. So a new rpc in a
.proto without a row (or a row left behind by a removed rpc) fails here, not at run time.

usage: rpc_table.py SOURCE_DIR
Exit 0: the table matches; 1: it does not (each difference is printed).
"""
import glob
import os
import re
import sys

KINDS = {(False, False): "UNARY", (True, False): "CLIENT_STREAM", (False, True): "SERVER_STREAM"}
ROLES = {"NONE", "INFER", "TRAIN", "ADMIN"}
WHERE = {"CQ", "ENGINE", "STAGED"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def snake(name):
    """protobuf-c's lower-case form of a message name: WeightChunk -> weight_chunk."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def proto_rpcs(source):
    """{path: (kind or None, request stem, file)} over every service of every .proto."""
    rpcs = {}
    for path in sorted(glob.glob(os.path.join(source, "proto", "**", "*.proto"), recursive=True)):
        text = strip_comments(open(path).read())
        pkg = re.search(r"^\s*package\s+([\w.]+)\s*;", text, re.M)
        pkg = pkg.group(1) if pkg else ""
        for svc in re.finditer(r"\bservice\s+(\w+)\s*\{((?:[^{}]|\{[^{}]*\})*)\}", text):
            for rpc in re.finditer(r"\brpc\s+(\w+)\s*\(\s*(stream\s+)?([\w.]+)\s*\)\s*"
                                   r"returns\s*\(\s*(stream\s+)?([\w.]+)\s*\)", svc.group(2)):
                name, req = rpc.group(1), rpc.group(3)
                cs, ss = bool(rpc.group(2)), bool(rpc.group(4))
                full = "/%s%s/%s" % (pkg + "." if pkg else "", svc.group(1), name)
                msg_pkg, _, msg = req.rpartition(".")
                stem = "__".join([p for p in (msg_pkg or pkg).split(".") if p] + [snake(msg)])
                rpcs[full] = (KINDS.get((cs, ss)), stem, os.path.relpath(path, source))
    return rpcs


def table_rows(source):
    """[(name, path, kind, role, where, request, handler)] of DDL_RPC_METHODS, in order."""
    text = open(os.path.join(source, "proto", "rpc_methods.h")).read()
    body = re.search(r"#define\s+DDL_RPC_METHODS\(X\)((?:[^\n]*\\\n)*[^\n]*)\n", text)
    if body is None:
        return None
    rows = []
    for m in re.finditer(r"\bX\(([^)]*)\)", body.group(1)):
        rows.append([c.strip() for c in m.group(1).split(",")])
    return rows


def main():
    source = sys.argv[1]
    bad = []
    rpcs = proto_rpcs(source)
    rows = table_rows(source)
    if not rpcs:
        bad.append("no rpc found in proto/**/*.proto")
    if not rows:
        bad.append("no X(...) row in DDL_RPC_METHODS (proto/rpc_methods.h)")
        rows = []
    seen, names = {}, set()
    for cols in rows:
        if len(cols) != 7:
            bad.append("row %s: %d columns, expected 7 (name, path, kind, role, where, request, "
                       "handler)" % (cols[0] if cols else "?", len(cols)))
            continue
        name, path, kind, role, where, request, _ = cols
        path = path.strip('"')
        if name in names:
            bad.append("row %s: the name appears twice" % name)
        names.add(name)
        if path in seen:
            bad.append("row %s: path %s is row %s already" % (name, path, seen[path]))
        seen[path] = name
        if role not in ROLES:
            bad.append("row %s: role %s is none of %s" % (name, role, sorted(ROLES)))
        if where not in WHERE:
            bad.append("row %s: where %s is none of %s" % (name, where, sorted(WHERE)))
        if path not in rpcs:
            bad.append("row %s: %s is no rpc of any proto service" % (name, path))
            continue
        want_kind, want_req, where_from = rpcs[path]
        if want_kind is None:
            bad.append("row %s: %s (%s) streams both ways; the daemon has no such kind" %
                       (name, path, where_from))
        elif kind != want_kind:
            bad.append("row %s: kind %s, but %s says %s" % (name, kind, where_from, want_kind))
        if request != want_req:
            bad.append("row %s: request %s, but %s takes %s" % (name, request, where_from,
                                                               want_req))
    for path, (_, _, where_from) in sorted(rpcs.items()):
        if path not in seen:
            bad.append("rpc %s (%s) has no row in DDL_RPC_METHODS" % (path, where_from))
    for b in bad:
        print("FAIL: " + b)
    if not bad:
        print("PASS: %d rows match the %d rpcs of %d services" %
              (len(rows), len(rpcs), len({p.rsplit("/", 1)[0] for p in rpcs})))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
