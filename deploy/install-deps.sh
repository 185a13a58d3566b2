#!/usr/bin/env bash
# Installs every Debian package distdl-c needs to build, test and run (Debian 12).
# Run as root (or through sudo). Safe to run again: apt-get skips what is installed.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends \
    build-essential cmake pkg-config git ca-certificates \
    libopenmpi-dev openmpi-bin \
    libopenblas-dev \
    libgrpc-dev protobuf-c-compiler libprotobuf-c-dev \
    libuv1-dev libjansson-dev zlib1g-dev libssl-dev openssl libmicrohttpd-dev libgnutls28-dev \
    libhdf5-openmpi-dev python3-h5py-mpi \
    dataset-fashion-mnist \
    python3 python3-numpy python3-torch \
    python3-grpcio python3-protobuf protobuf-compiler curl python3-requests \
    python3-matplotlib python3-nbconvert python3-ipykernel jupyter-nbconvert \
    tmux iproute2 python3-yaml slurm-wlm munge systemd \
    clang libfuzzer-14-dev libclang-rt-14-dev valgrind \
    prometheus snakemake libjs-chart.js chromium
# What each group is for: the build (compiler, MPI, OpenBLAS, gRPC core + protobuf-c, libuv,
# jansson, zlib, OpenSSL's libcrypto for TLS checks, libmicrohttpd and GnuTLS for /metrics and KServe over HTTP,
# parallel HDF5 for per-rank ingest, h5py to write its files); the data;
# the PyTorch and grpcio cross-checks; the notebook (Jupyter, matplotlib); the tests of
# the CLI's progress bar (tmux), two simulated hosts (iproute2), the Kubernetes manifest
# (python3-yaml), Slurm (slurm-wlm, munge) and the systemd unit (systemd-analyze); the
# fuzzers (clang, libFuzzer) and memcheck (valgrind); and Prometheus with promtool, which
# scrape /metrics and check the shipped rules (deploy/prometheus/); Snakemake, which runs
# the workflow of deploy/workflows/; Chart.js, which the daemon serves to its dashboard
# (/dashboard on --metrics-listen), and Chromium, which the dashboard's test drives headless.
