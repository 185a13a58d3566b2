#!/usr/bin/python3
"""Generates train.py, the plain-script twin of train.ipynb, from the notebook: markdown
cells become comments, code cells are copied as they are, in order.

  sync_script.py            rewrite train.py from train.ipynb
  sync_script.py --check    exit 1 (and say so) when train.py is not what the notebook gives

Edit the notebook, never train.py; the test suite runs --check.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = '''#!/usr/bin/python3
# train.py: the plain-script twin of train.ipynb, generated from it by sync_script.py.
# Do not edit: edit the notebook, then run `python3 sync_script.py`.
'''


def script(nb_path):
    with open(nb_path) as f:
        nb = json.load(f)
    parts = [HEADER]
    for cell in nb["cells"]:
        src = "".join(cell["source"]).rstrip("\n")
        if cell["cell_type"] == "markdown":
            body = "\n".join(("# " + line).rstrip() for line in src.split("\n"))
            parts.append("# %% [markdown]\n" + body + "\n")
        elif cell["cell_type"] == "code":
            parts.append("# %%\n" + src + "\n")
    return "\n".join(parts)


def main(argv):
    nb_path = os.path.join(HERE, "train.ipynb")
    py_path = os.path.join(HERE, "train.py")
    want = script(nb_path)
    if argv[1:] == ["--check"]:
        try:
            with open(py_path) as f:
                have = f.read()
        except FileNotFoundError:
            have = None
        if have != want:
            print("%s is out of date with %s: run %s" % (py_path, nb_path, __file__))
            return 1
        print("%s matches %s" % (py_path, nb_path))
        return 0
    if argv[1:]:
        print("usage: sync_script.py [--check]", file=sys.stderr)
        return 2
    with open(py_path, "w") as f:
        f.write(want)
    os.chmod(py_path, 0o755)
    print("wrote", py_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
