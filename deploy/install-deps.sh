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
    libuv1-dev libjansson-dev zlib1g-dev libssl-dev \
    dataset-fashion-mnist \
    python3 python3-numpy python3-torch \
    python3-grpcio python3-protobuf protobuf-compiler \
    clang libfuzzer-14-dev libclang-rt-14-dev
