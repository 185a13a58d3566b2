#!/usr/bin/python3
"""The first N training and M test samples of an IDX directory (Fashion-MNIST's four
files, gzipped or not), written uncompressed to another directory: what a test that
trains on the first batches of an epoch reads, without unzipping all 70,000 images at
every start. Shared by tests/engine/train_lib.sh and tests/integration/torch_networks.py.

  idx_subset.py SRC DST N_TRAIN N_TEST
"""
import gzip
import os
import struct
import sys


def idx_subset(src, dst, n_train, n_test):
    os.makedirs(dst, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        for name, head, rec in (("images-idx3-ubyte", 16, 784), ("labels-idx1-ubyte", 8, 1)):
            path = os.path.join(src, "%s-%s" % (split, name))
            gz = os.path.exists(path + ".gz")
            with (gzip.open(path + ".gz") if gz else open(path, "rb")) as f:
                data = f.read(head + n * rec)
            (have,) = struct.unpack(">I", data[4:8])
            if have < n or len(data) != head + n * rec:
                raise ValueError("%s: %d samples, %d wanted" % (path, have, n))
            with open(os.path.join(dst, "%s-%s" % (split, name)), "wb") as out:
                out.write(data[:4] + struct.pack(">I", n) + data[8:])
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    idx_subset(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
