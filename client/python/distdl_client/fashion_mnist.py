"""Fashion-MNIST from its IDX files (gzip-compressed, as Debian's dataset-fashion-mnist
ships them in /usr/share/datasets/fashion-mnist), read with gzip and numpy only.

  x, y = load("test", count=16)        # x uint8 [16, 1, 28, 28], y int64 [16]
"""
import gzip
import os

import numpy as np

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_FILES = {"train": "train", "test": "t10k"}


def _read_idx(path, magic, count):
    """The header dimensions and the first `count` items (all when None) of an IDX file."""
    with gzip.open(path, "rb") as f:
        head = f.read(4)
        if len(head) != 4 or int.from_bytes(head, "big") != magic:
            raise ValueError("%s: not an IDX file of type 0x%08x" % (path, magic))
        ndim = magic & 0xff
        dims = [int.from_bytes(f.read(4), "big") for _ in range(ndim)]
        n = dims[0] if count is None else count
        if n < 0 or n > dims[0]:
            raise ValueError("%s: asked for %d items, the file has %d" % (path, n, dims[0]))
        item = int(np.prod(dims[1:], dtype=np.int64))
        data = f.read(n * item)
        if len(data) != n * item:
            raise ValueError("%s: truncated (%d of %d bytes)" % (path, len(data), n * item))
    return dims, np.frombuffer(data, dtype=np.uint8)


def load(split="test", count=None, data_dir=None):
    """Images uint8 [n, 1, 28, 28] and labels int64 [n] of `split` ("train" or "test"):
    the first `count` (all when None). data_dir: $DDL_DATA_DIR or DEFAULT_DIR."""
    if split not in _FILES:
        raise ValueError("split must be 'train' or 'test', got %r" % (split,))
    d = data_dir or os.environ.get("DDL_DATA_DIR") or DEFAULT_DIR
    stem = os.path.join(d, _FILES[split])
    dims, px = _read_idx(stem + "-images-idx3-ubyte.gz", 0x00000803, count)
    _, lb = _read_idx(stem + "-labels-idx1-ubyte.gz", 0x00000801, count)
    x = px.reshape(-1, 1, dims[1], dims[2])
    return x, lb.astype(np.int64)
