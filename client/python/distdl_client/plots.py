"""The example notebook's figures (matplotlib), shared by the notebook, its script twin
and the tests that compare them with the distdl CLI's records.

  fig = plot_curves(records)                 # loss and accuracy per progress record
  fig = plot_predictions(x, pred, true)      # a grid of images, predicted vs true label
"""
import matplotlib.pyplot as plt
import numpy as np

from .fashion_mnist import CLASSES

# Fixed sizes and resolution: the same records always give the same pixels.
DPI = 100


def step_records(records):
    """The per-step records of a Train (dicts or Progress): the last one of a run
    (finished) carries the run's mean, not a step's loss, and is left out."""
    out = []
    for r in records:
        d = r if isinstance(r, dict) else r.as_dict()
        if not d.get("finished", False):
            out.append(d)
    return out


def plot_curves(records, title="training"):
    """Loss and accuracy against the step, one panel each."""
    recs = step_records(records)
    steps = np.array([r["step"] for r in recs], dtype=np.int64)
    loss = np.array([r["loss"] for r in recs], dtype=np.float64)
    acc = np.array([r["accuracy"] for r in recs], dtype=np.float64)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=DPI)
    a1.plot(steps, loss, color="tab:blue", lw=1.2)
    a1.set_xlabel("step")
    a1.set_ylabel("cross-entropy loss")
    a1.set_title("%s: loss" % title)
    a1.grid(alpha=0.3)
    a2.plot(steps, acc, color="tab:green", lw=1.2)
    a2.set_xlabel("step")
    a2.set_ylabel("batch accuracy")
    a2.set_ylim(0, 1)
    a2.set_title("%s: accuracy" % title)
    a2.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_predictions(images, predicted, true, cols=8):
    """A grid of images [n, 1, H, W] titled "predicted / true" (red when wrong)."""
    n = len(images)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 2.2 * rows), dpi=DPI,
                             squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= n:
            continue
        ax.imshow(images[i].reshape(images[i].shape[-2:]), cmap="gray_r", vmin=0, vmax=255)
        ok = int(predicted[i]) == int(true[i])
        ax.set_title("%s\n(%s)" % (CLASSES[int(predicted[i])], CLASSES[int(true[i])]),
                     fontsize=7, color="black" if ok else "red")
    fig.suptitle("predicted (true): %d of %d right" %
                 (int(np.sum(np.asarray(predicted) == np.asarray(true))), n), fontsize=9)
    fig.tight_layout()
    return fig
