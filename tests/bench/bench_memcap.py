#!/usr/bin/python3
"""The headline at a size that matters (issue 18 item 4): the regression U-Net
(deploy/specs/unet3d-poisson-4.json) on S^3 volumes of the screened Poisson problem, every
rank capped at CAP in a cgroup v1 memory group of its own (deploy/memcap.sh), through the
daemon from an HDF5 file. Prints one rank's refusal (the estimate), one rank's peak charge
under an 8x cap (what one rank would need), and for four ranks each rank's peak charge
against the cap, the bytes each read of the file, the losses and the time.

  bench_memcap.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."]
                  [--size 128] [--cap-mib 1536] [--train 8] [--epochs 1] [--one-steps 1]

Same-run figures only; name the CPU and the load with them (the script prints both).
"""
import argparse
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import python_harness as ph  # noqa: E402
from ddl_daemon import add_common_args  # noqa: E402


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    p = argparse.ArgumentParser()
    add_common_args(p)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--cap-mib", type=int, default=1536)
    p.add_argument("--train", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--one-steps", type=int, default=1)
    a = p.parse_args()
    h = ph.Harness(a)
    load0 = os.getloadavg()
    try:
        fig = ph.memcap_run(h, a.size, a.cap_mib << 20, a.train, a.epochs, a.one_steps)
    finally:
        h.cleanup()
    fig["cpu"], fig["load_before"], fig["load_after"] = cpu_name(), load0, os.getloadavg()
    print(json.dumps(fig, indent=1))
    print("%s, load %.2f before / %.2f after" % (fig["cpu"], load0[0], fig["load_after"][0]))
    print("| rank | peak RSS (VmHWM, shared pages included) | peak charge (the capped "
          "quantity) | cap | bytes read | of the whole |")
    print("|---|---|---|---|---|---|")
    for r, (hw, pk, b) in enumerate(zip(fig["vmhwm_mib"], fig["peak_mib"],
                                         fig["bytes_per_rank"])):
        print("| %d | %.1f MiB | %.1f MiB | %.0f MiB | %d | %.3f |"
              % (r, hw, pk, fig["cap_mib"], b, b / fig["bytes_whole"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
