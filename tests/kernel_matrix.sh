#!/usr/bin/env bash
# The kernel-path matrix: runs tests under each convolution and OpenBLAS path a CPU may
# take, and prints test x path -> pass/fail. A test that judges a trained or computed value
# must pass on every path (docs/TESTING.md, "Kernel paths"); bitwise comparisons hold only
# between runs on the same path.
#
#   tests/kernel_matrix.sh [-L LABEL | -R REGEX | --all] [PATH...]
#
# Selection (default -L values: the value-judging tests, without their _gemm twins): a ctest
# label, a regex, or --all (the whole suite). PATHs (default: all of them):
#   default    what this CPU picks by itself
#   avx2       DDL_CONV_DIRECT=avx2     (direct kernels capped at AVX2)
#   gemm       DDL_CONV_DIRECT=0        (im2col + GEMM convolutions)
#   haswell    OPENBLAS_CORETYPE=Haswell
#   skylakex   OPENBLAS_CORETYPE=SkylakeX  (AVX-512; Intel, AMD Zen 4/5)
#   sandybridge OPENBLAS_CORETYPE=Sandybridge (AVX only: yet another summation order)
#   prescott   OPENBLAS_CORETYPE=Prescott (SSE3: what Debian's OpenBLAS 0.3.21 picks on CPUs
#              newer than itself when nothing replaces it)
# A path this CPU cannot run (SkylakeX without AVX-512: its kernels die with SIGILL) or
# that is the same as the default here (avx2 on a CPU without AVX-512) is reported as such
# and not run. Build directory: $BUILD_DIR or ./build (tests/run.sh makes it). Exit 0 when
# every run test passed on every path run. Results per path: $OUT_DIR (default
# build/kernel-matrix)/<path>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
out="${OUT_DIR:-$build/kernel-matrix}"
mkdir -p "$out"
sel=(-L values -E '_gemm$')
case "${1:-}" in
    -L | -R) sel=("$1" "$2"); [ "$1" = -L ] && sel+=(-E '_gemm$'); shift 2 ;;
    --all) sel=(); shift ;;
esac
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(default avx2 gemm haswell skylakex sandybridge prescott)

flags=$(grep -o -m1 -E '^flags[[:space:]]*:.*' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
# The direct convolutions take their AVX-512 path on avx512f; OpenBLAS's SkylakeX kernels
# need BW, VL and DQ as well.
avx512f=false avx512=false
has avx512f && avx512f=true
$avx512f && has avx512bw && has avx512vl && has avx512dq && avx512=true
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "CPU: $cpu (AVX-512: $avx512); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "environment: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>} DDL_CONV_DIRECT=${DDL_CONV_DIRECT:-<unset>}"

declare -A result   # "<test>|<path>" -> Passed / Failed / ...
declare -A seen
tests=()
ran=()
status=0
for p in "${paths[@]}"; do
    env_p=()
    case "$p" in
        default) ;;
        avx2)
            if ! $avx512f; then
                echo "== $p: the same as default on this CPU (no AVX-512: the direct kernels are AVX2 already); not rerun"
                continue
            fi
            env_p=(DDL_CONV_DIRECT=avx2) ;;
        gemm) env_p=(DDL_CONV_DIRECT=0) ;;
        haswell) env_p=(OPENBLAS_CORETYPE=Haswell) ;;
        skylakex)
            if ! $avx512; then
                echo "== $p: cannot run on this CPU (no AVX-512: OpenBLAS's SkylakeX kernels die with SIGILL)"
                continue
            fi
            env_p=(OPENBLAS_CORETYPE=SkylakeX) ;;
        sandybridge) env_p=(OPENBLAS_CORETYPE=Sandybridge) ;;
        prescott) env_p=(OPENBLAS_CORETYPE=Prescott) ;;
        *) echo "kernel_matrix: unknown path '$p' (default avx2 gemm haswell skylakex sandybridge prescott)" >&2; exit 2 ;;
    esac
    echo "== $p: ${env_p[*]:-(the environment as it is)}; started $(date +%T), load $(cut -d' ' -f1 /proc/loadavg)"
    t0=$(date +%s)
    (cd "$build" && env "${env_p[@]}" ctest "${sel[@]}" --output-on-failure \
        -j "${CTEST_PARALLEL_LEVEL:-$(nproc)}") >"$out/$p.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    ran+=("$p")
    while read -r name res; do
        result["$name|$p"]=$res
        if [ -z "${seen[$name]:-}" ]; then
            seen[$name]=1
            tests+=("$name")
        fi
    done < <(awk '/Test +#[0-9]+: / { for (i = 1; i <= NF; i++) if ($i ~ /^#[0-9]+:$/) break;
                                        r = $(i + 2); gsub(/[.*]/, "", r);
                                        if (r == "") r = $(i + 3); print $(i + 1), r }' \
             "$out/$p.log")
    echo "   ctest exit $rc in $(( $(date +%s) - t0 )) s ($(tail -n 20 "$out/$p.log" | grep -m1 'tests passed' || echo 'no summary'))"
done

[ ${#ran[@]} -gt 0 ] || { echo "no path ran"; exit 1; }
printf '\n%-36s' "test"
for p in "${ran[@]}"; do printf ' %-11s' "$p"; done
printf '\n'
for t in "${tests[@]}"; do
    printf '%-36s' "$t"
    for p in "${ran[@]}"; do
        r=${result["$t|$p"]:-"-"}
        case "$r" in Passed) r=pass ;; Failed) r=FAIL ;; esac
        printf ' %-11s' "$r"
    done
    printf '\n'
done
exit $status
