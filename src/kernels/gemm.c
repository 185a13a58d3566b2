// gemm: being written
