#!/usr/bin/python3
"""Generates the plain-script twin of each notebook here (train.py of train.ipynb,
poisson.py of poisson.ipynb): markdown cells become comments, code cells are copied as
they are, in order.

  sync_script.py            rewrite every twin from its notebook
  sync_script.py --check    exit 1 (and say so) when a twin is not what its notebook gives

Edit the notebooks, never the twins; the test suite runs --check.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS = ("train", "poisson")
HEADER = '''#!/usr/bin/python3
# %s.py: the plain-script twin of %s.ipynb, generated from it by sync_script.py.
# Do not edit: edit the notebook, then run `python3 sync_script.py`.
'''


def script(nb_path):
    with open(nb_path) as f:
        nb = json.load(f)
    name = os.path.splitext(os.path.basename(nb_path))[0]
    parts = [HEADER % (name, name)]
    for cell in nb["cells"]:
        src = "".join(cell["source"]).rstrip("\n")
        if cell["cell_type"] == "markdown":
            body = "\n".join(("# " + line).rstrip() for line in src.split("\n"))
            parts.append("# %% [markdown]\n" + body + "\n")
        elif cell["cell_type"] == "code":
            parts.append("# %%\n" + src + "\n")
    return "\n".join(parts)


def main(argv):
    if argv[1:] not in ([], ["--check"]):
        print("usage: sync_script.py [--check]", file=sys.stderr)
        return 2
    stale = 0
    for name in NOTEBOOKS:
        nb_path = os.path.join(HERE, name + ".ipynb")
        py_path = os.path.join(HERE, name + ".py")
        want = script(nb_path)
        if argv[1:] == ["--check"]:
            try:
                with open(py_path) as f:
                    have = f.read()
            except FileNotFoundError:
                have = None
            if have != want:
                print("%s is out of date with %s: run %s" % (py_path, nb_path, __file__))
                stale += 1
            else:
                print("%s matches %s" % (py_path, nb_path))
            continue
        with open(py_path, "w") as f:
            f.write(want)
        os.chmod(py_path, 0o755)
        print("wrote", py_path)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
