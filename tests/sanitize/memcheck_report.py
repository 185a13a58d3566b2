#!/usr/bin/python3
"""Reads valgrind memcheck logs of distdld ranks and reports the errors and definite leaks
that come from our code: those whose innermost frame outside valgrind's allocator
replacements is a function of ours (in the distdld binary or built from this source tree).
A leak that Open MPI, PMIx, gRPC or another system library makes for its own lifetime is
listed as a count, not as a failure.

  memcheck_report.py SOURCE_DIR BUILD_DIR LOG...      exit 1 if any finding is ours
"""
import re
import sys


def records(text):
    """Splits a memcheck log into its error and leak records (blank-line separated)."""
    out, cur = [], []
    for line in text.splitlines():
        body = re.sub(r"^==\d+== ?", "", line)
        if body.strip() == "":
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(body)
    if cur:
        out.append(cur)
    return out


# C library functions that only allocate on their caller's behalf: the caller is the owner.
LIBC_ALLOCATORS = ("strdup ", "strndup ", "__strdup ", "__vasprintf_internal ", "vasprintf ",
                   "asprintf ", "__asprintf_chk ", "__vasprintf_chk ", "open_memstream ")


def innermost(rec):
    """The innermost frame that is neither valgrind's allocator nor a C library function
    allocating for its caller (strdup, asprintf, ...)."""
    for l in rec:
        m = re.match(r"\s+(?:at|by) 0x[0-9A-F]+: (.*)$", l)
        if m and "vgpreload_" not in m.group(1) and not m.group(1).startswith(LIBC_ALLOCATORS):
            return m.group(1)
    return None


def our_files(src, build):
    """Basenames of the C files we compile: ours when a frame names one (file.c:line)."""
    import os
    names = set()
    for top in ("src", "server", "client", "proto", "tests"):
        for base in (src, build):
            for dirpath, _, files in os.walk(os.path.join(base, top)):
                names.update(f for f in files if f.endswith(".c"))
    return names


def is_ours(frame, names, build):
    m = re.search(r"\(([^()/]+\.c):\d+\)$", frame)
    if m:
        return m.group(1) in names
    return ("(in %s/" % build) in frame


def main():
    src, build, logs = sys.argv[1], sys.argv[2], sys.argv[3:]
    names = our_files(src, build)
    bad = 0
    for path in logs:
        with open(path, errors="replace") as f:
            recs = records(f.read())
        mine, theirs = [], 0
        for rec in recs:
            head = rec[0]
            leak = "definitely lost in loss record" in head
            error = not leak and not head.startswith(
                ("HEAP SUMMARY", "LEAK SUMMARY", "Memcheck", "Copyright", "Using Valgrind",
                 "Command:", "Parent PID", "For lists", "ERROR SUMMARY", "To see them",
                 "Use --track-origins", "in use at exit", "definitely lost:", "Rerun with",
                 "Reachable blocks", "possibly lost", "indirectly lost", "still reachable",
                 "suppressed")) and innermost(rec) is not None
            if not (leak or error):
                continue
            if is_ours(innermost(rec), names, build):
                mine.append(rec)
            else:
                theirs += 1
        print("%s: %d findings in our code, %d in system libraries (not ours)" %
              (path, len(mine), theirs))
        for rec in mine:
            print("  " + "\n  ".join(rec[:16]))
        bad += len(mine)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
