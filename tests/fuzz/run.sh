#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan + coverage) and runs each one on a
# temporary copy of its seed corpus. Exit 0: no crash, leak, timeout or OOM; 1: a finding
# (its reproducer is printed and kept); 7: clang/libFuzzer are not installed (skip).
#
#   tests/fuzz/run.sh [target...]          (default: every target)
#
# Environment:
#   DDL_FUZZ_SECONDS   seconds per target (default 60)
#   DDL_FUZZ_DEADLINE  seconds from the start by which the fuzzing should end (default: none).
#                      A slow build (a loaded machine) shortens each target's time to its
#                      share of what is left, never below 5 s: the pass is time-boxed, so
#                      ctest's timeout catches a hang, not a busy machine.
#   DDL_FUZZ_JOBS      targets run at the same time (default 2)
#   DDL_FUZZ_BUILD     the clang build directory (default <repo>/build-fuzz; reused)
#   DDL_FUZZ_MERGE=1   merge the inputs that found new coverage back into the repo's
#                      corpus (tests/fuzz/corpus/<target>); off by default
#   DDL_FUZZ_ARGS      extra libFuzzer flags (e.g. "-max_len=65536")
#   DDL_FUZZ_BUILD_ONLY=1  build the targets and stop (tests/run.sh does, before ctest)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${DDL_FUZZ_SECONDS:-60}"
jobs="${DDL_FUZZ_JOBS:-2}"
deadline="${DDL_FUZZ_DEADLINE:-}"
start_s=$(date +%s)
build="${DDL_FUZZ_BUILD:-$repo/build-fuzz}"
all_targets=(fuzz_requests fuzz_spec fuzz_safetensors fuzz_npy fuzz_idx fuzz_manifest fuzz_jdata)
if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=("${all_targets[@]}")
fi

# ---- skip when the toolchain is missing ----------------------------------------------------
if ! command -v clang >/dev/null 2>&1; then
    echo "fuzz: SKIP: clang is not installed (apt-get install clang libfuzzer-14-dev libclang-rt-14-dev)"
    exit 7
fi
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    >"$probe/p.c"
if ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
    echo "fuzz: SKIP: clang cannot link -fsanitize=fuzzer,address,undefined (apt-get install libfuzzer-14-dev libclang-rt-14-dev)"
    exit 7
fi

# ---- build ------------------------------------------------------------------------------
t0=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$repo" -B "$build" -DCMAKE_C_COMPILER=clang -DDDL_FUZZ=ON -DBUILD_TESTING=OFF \
        -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS="-O1" >"$probe/configure.log" 2>&1 ||
        { cat "$probe/configure.log"; echo "fuzz: FAIL: configure"; exit 1; }
fi
cmake --build "$build" -j "$jobs" --target fuzz_all >"$probe/build.log" 2>&1 ||
    { tail -50 "$probe/build.log"; echo "fuzz: FAIL: build"; exit 1; }
echo "fuzz: built in $(( $(date +%s) - t0 )) s ($build)"
if [ "${DDL_FUZZ_BUILD_ONLY:-0}" = 1 ]; then
    exit 0
fi

# ---- run --------------------------------------------------------------------------------
work="$(mktemp -d /tmp/ddl-fuzz.XXXXXX)"
trap 'rm -rf "$probe" "$work"' EXIT
keep="$build/findings"
mkdir -p "$keep"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

run_one() {
    local t="$1" dir="$work/$1"
    mkdir -p "$dir/corpus" "$dir/artifacts"
    if [ -d "$here/corpus/$t" ]; then
        cp -r "$here/corpus/$t/." "$dir/corpus/"
    fi
    local dict=()
    if [ -f "$here/dict/$t.dict" ]; then
        dict=("-dict=$here/dict/$t.dict")
    fi
    # shellcheck disable=SC2086
    TMPDIR="$dir" "$build/fuzz/$t" "$dir/corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
        ${DDL_FUZZ_ARGS:-} >"$dir/log" 2>&1
    echo $? >"$dir/rc"
}

pids=()
left=${#targets[@]}
for t in "${targets[@]}"; do
    if [ ! -x "$build/fuzz/$t" ]; then
        echo "fuzz: FAIL: no target $t"
        exit 1
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
        wait -n
    done
    if [ -n "$deadline" ]; then
        # this target's share of the time left: the slots still to run over the jobs
        share=$(( (deadline - ($(date +%s) - start_s)) * jobs / left ))
        seconds="${DDL_FUZZ_SECONDS:-60}"
        if [ "$share" -lt "$seconds" ]; then
            seconds=$(( share < 5 ? 5 : share ))
        fi
    fi
    left=$((left - 1))
    echo "fuzz: $t for ${seconds} s"
    run_one "$t" &
    pids+=($!)
done
wait

fail=0
printf '%-18s %6s %8s %8s %8s %10s  %s\n' target rc cov ft corpus exec/s result
for t in "${targets[@]}"; do
    dir="$work/$t"
    rc="$(cat "$dir/rc" 2>/dev/null || echo 99)"
    last="$(grep -E '^#[0-9]+' "$dir/log" | tail -1)"
    cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
    ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
    corp="$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")"
    eps="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log")"
    if [ "$rc" = 0 ]; then
        res=ok
    else
        res=FAIL
        fail=1
    fi
    printf '%-18s %6s %8s %8s %8s %10s  %s\n' "$t" "$rc" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
        "${eps:-?}" "$res"
    if [ "$rc" != 0 ]; then
        echo "---- $t: the end of its log ----"
        grep -v -E '^#[0-9]+' "$dir/log" | tail -60
        for a in "$dir"/artifacts/*; do
            [ -e "$a" ] || continue
            cp "$a" "$keep/$t-$(basename "$a")"
            echo "fuzz: reproducer kept: $keep/$t-$(basename "$a")"
            echo "fuzz: reproduce with: $build/fuzz/$t $keep/$t-$(basename "$a")"
        done
    fi
    if [ "${DDL_FUZZ_MERGE:-0}" = 1 ] && [ "$rc" = 0 ]; then
        mkdir -p "$here/corpus/$t"
        "$build/fuzz/$t" -merge=1 "$here/corpus/$t" "$dir/corpus" >"$dir/merge.log" 2>&1 &&
            echo "fuzz: merged new coverage into tests/fuzz/corpus/$t"
    fi
done
exit $fail
