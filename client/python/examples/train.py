#!/usr/bin/python3
# train.py: the plain-script twin of train.ipynb, generated from it by sync_script.py.
# Do not edit: edit the notebook, then run `python3 sync_script.py`.

# %% [markdown]
# # Training LeNet-5 on Fashion-MNIST through distdld
#
# This notebook drives a running `distdld` daemon (the distributed LeNet-5 of
# `deploy/specs/lenet5-2.json`, or whatever model it serves) through the Python binding of
# `libdistdl-client`: it trains, plots the loss and accuracy, evaluates on the test set,
# shows predictions for test images and pulls the weights.
#
# Start a daemon first, e.g. from the repository root:
#
#     mpirun -np 2 build/bin/distdld --model deploy/specs/lenet5-2.json --address-file /tmp/addr
#
# Parameters (environment variables):
#
# | variable | meaning | default |
# |---|---|---|
# | `DDL_ADDRESS` or `DDL_ADDRESS_FILE` | the daemon (`host:port`, or its `--address-file`) | required |
# | `DDL_STEPS` | train this many steps (0: `DDL_EPOCHS` epochs) | 0 |
# | `DDL_EPOCHS` | epochs when `DDL_STEPS` is 0 | 1 |
# | `DDL_PROGRESS_EVERY` | a progress record every K steps | 10 |
# | `DDL_PREDICT` | test images shown with their predictions | 16 |
# | `DDL_OUT` | output directory: `curves.png`, `predictions.png`, `records.json`, `weights.safetensors` | `train-output` |
# | `DDL_DATA_DIR` | Fashion-MNIST IDX files (for the test images shown) | `/usr/share/datasets/fashion-mnist` |
#
# `train.py` beside this notebook is its plain-script twin, generated from it by
# `sync_script.py`.

# %%
import dataclasses
import json
import os
import sys

import matplotlib.pyplot as plt

try:
    import distdl_client
except ImportError:  # run from the source tree: the package is in client/python
    HERE = os.path.dirname(os.path.abspath(globals().get("__file__", "train.ipynb")))
    sys.path.insert(0, os.path.dirname(HERE))
    import distdl_client
from distdl_client import Client, fashion_mnist, plots

STEPS = int(os.environ.get("DDL_STEPS", "0"))
EPOCHS = 0 if STEPS else int(os.environ.get("DDL_EPOCHS", "1"))
PROGRESS_EVERY = int(os.environ.get("DDL_PROGRESS_EVERY", "10"))
N_PREDICT = int(os.environ.get("DDL_PREDICT", "16"))
OUT = os.path.abspath(os.environ.get("DDL_OUT", "train-output"))
os.makedirs(OUT, exist_ok=True)
print("python %s, libdistdl-client %s; output in %s"
      % (sys.executable, distdl_client.library_version(), OUT))

# %% [markdown]
# ## Connect
#
# `Client()` reads the address from `DDL_ADDRESS` (or the file named by `DDL_ADDRESS_FILE`).

# %%
client = Client(timeout=30)
status = client.status()
if not status.has_model:
    raise RuntimeError("the daemon at %s has no model: start it with --model SPEC "
                       "or call client.create(SPEC)" % client.address)
print("daemon at %s is %s" % (client.address, client.health()))
print("model %r on %d ranks: step %d, batch %d, input %s, %d classes, %s"
      % (status.model_name, status.world_size, status.step, status.batch_size,
         status.input_shape, status.num_classes, status.datatype))

# %% [markdown]
# ## Train
#
# `client.train()` yields a progress record every `PROGRESS_EVERY` steps and at each epoch
# end; the last record (`finished`) carries the run's mean loss and accuracy. Leaving the
# loop early would cancel the training at the next step boundary.

# %%
records = []
for p in client.train(steps=STEPS, epochs=EPOCHS, progress_every=PROGRESS_EVERY):
    records.append(p.as_dict())
    if p.finished:
        print("finished at step %d: mean loss %.4f, mean accuracy %.3f, %.0f images/s"
              % (p.step, p.mean_loss, p.accuracy, p.images_per_second))
    elif p.epoch_end or len(records) % 10 == 1:
        print("step %5d  epoch %d  loss %.4f  accuracy %.3f"
              % (p.step, p.epoch, p.loss, p.accuracy))

# %% [markdown]
# ## Loss and accuracy

# %%
fig = plots.plot_curves(records, title=status.model_name)
fig.savefig(os.path.join(OUT, "curves.png"), dpi=plots.DPI)
plt.show()

# %% [markdown]
# ## Test accuracy

# %%
test = client.evaluate(split="test")
print("test set: %d images, loss %.4f, accuracy %.2f%%"
      % (test.count, test.loss, 100 * test.accuracy))

# %% [markdown]
# ## Predictions
#
# The first test images, sent as `uint8` pixels (the daemon normalises them with the spec's
# mean and standard deviation). Titles read *predicted (true)*; wrong ones are red.

# %%
x_test, y_test = fashion_mnist.load("test", count=N_PREDICT)
logits = client.predict(x_test)
predicted = logits.argmax(axis=1)
fig = plots.plot_predictions(x_test, predicted, y_test)
fig.savefig(os.path.join(OUT, "predictions.png"), dpi=plots.DPI)
plt.show()

# %% [markdown]
# ## Weights
#
# The global (unsharded) weights, as numpy arrays, saved as safetensors.

# %%
weights = client.pull_weights()
for name, w in weights.items():
    print("%-14s %-8s %s" % (name, w.dtype, w.shape))
print("%d tensors, %d parameters" % (len(weights), sum(w.size for w in weights.values())))
distdl_client.write_safetensors(os.path.join(OUT, "weights.safetensors"), weights)

# %% [markdown]
# ## Records

# %%
with open(os.path.join(OUT, "records.json"), "w") as f:
    json.dump({"model": status.model_name, "steps": STEPS, "epochs": EPOCHS,
               "progress_every": PROGRESS_EVERY, "records": records,
               "test": dataclasses.asdict(test), "predicted": predicted.tolist(),
               "true": y_test.tolist(),
               "weights": {n: list(w.shape) for n, w in weights.items()}}, f, indent=1)
client.close()
print("wrote", sorted(os.listdir(OUT)))
