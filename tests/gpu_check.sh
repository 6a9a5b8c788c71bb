#!/bin/sh
# gpu_check.sh - the first run on a real GPU, in one command: `make gpu-check`.
#
# Builds with nvcc for the GPU present (-arch=native, or the compute
# capability nvidia-smi reports where this nvcc lacks -arch=native), then
# runs, each under a time limit, with REQUIRE_GPU=1 so a silent fallback to
# the host backend is a failure:
#   - the real-GPU test suite (tests/test_real_gpu.cu, nvcc) and the real
#     runtime suite (tests/test_cuda_toolkit.c, gcc -lcudart);
#   - bench/gpu_bench.cu: the copy path against a plain cudaMemcpyAsync
#     loop, the step against max(compute, copy), the verdict in three
#     regimes (--quick unless FULL=1);
#   - every CUDA example: quickstart, train_cuda, multi_gpu, llmc_tokens --check, the
#     demo.
# and prints one report: a table, then JSON lines (the GPU, one per check,
# and gpu_bench's own). Budget: under 8 minutes on one GPU.
# Without a GPU (no nvidia-smi, or it lists none) it says so and exits 0.
# GPU_CHECK_BUILD_ONLY=1 builds everything for ARCH (default sm_80) and runs
# nothing: for a machine with the toolkit but no GPU.
#
# Environment (make gpu-check sets them): B (build dir), NVCC, CC,
# CUDA_INC_DIR, CUDA_LIB_DIR.
set -u
B=${B:-build}
O=$B/gpu-check
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || true)}
CC=${CC:-gcc}
CUDA_INC_DIR=${CUDA_INC_DIR:-/usr/local/cuda/include}
CUDA_LIB_DIR=${CUDA_LIB_DIR:-/usr/local/cuda/lib64}
build_only=${GPU_CHECK_BUILD_ONLY:-0}
EXPECT="" # check: a line its output must have

gpu=""
if [ "$build_only" != 1 ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "gpu-check: no GPU here (no nvidia-smi on PATH): nothing to check."
        echo "gpu-check: the simulated runtime's suites run in 'make test'; run 'make gpu-check' on a machine with an NVIDIA GPU."
        exit 0
    fi
    # nvidia-smi hangs on a wedged driver: bounded, and a driver that does
    # not answer is a finding, not "no GPU"
    gpu=$(timeout 20 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1)
    rc=$?
    if [ $rc -eq 124 ]; then
        echo "gpu-check: FAIL: nvidia-smi did not answer in 20 s (a wedged driver?)" >&2
        exit 1
    fi
    if [ $rc -ne 0 ] && echo "$gpu" | grep -qi "driver"; then
        echo "gpu-check: FAIL: nvidia-smi is here but cannot talk to the driver: $(echo "$gpu" | head -n 1)" >&2
        exit 1
    fi
    [ $rc -eq 0 ] && gpu=$(echo "$gpu" | grep ',' | head -n 1) || gpu=""
    if [ -z "$gpu" ]; then
        echo "gpu-check: no GPU here (nvidia-smi lists none: $(timeout 20 nvidia-smi -L 2>&1 | head -n 1)): nothing to check."
        exit 0
    fi
fi
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then
    echo "gpu-check: a GPU ($gpu) but no nvcc: set CUDA_HOME to the CUDA toolkit (11.8 or newer) and run again." >&2
    exit 1
fi
mkdir -p "$O"

# -arch=native (nvcc 11.6 on) compiles for the GPUs present; else the
# compute capability nvidia-smi reports.
if [ "$build_only" = 1 ]; then
    ARCH="-arch=${ARCH:-sm_80}"
else
    printf '__global__ void k(void) {}\nint main(void) { return 0; }\n' > "$O/arch.cu"
    if "$NVCC" -arch=native "$O/arch.cu" -o "$O/arch" >/dev/null 2>&1; then
        ARCH="-arch=native"
    else
        cc=$(echo "$gpu" | awk -F', ' '{ gsub(/\./, "", $2); print $2 }')
        ARCH="-gencode arch=compute_$cc,code=sm_$cc"
    fi
fi
NVFLAGS="-O2 -std=c++17 -Xcompiler -Wall,-Wextra,-Werror $ARCH"
LIBS="-L$CUDA_LIB_DIR -Wl,-rpath,$CUDA_LIB_DIR -lcudart -lpthread"

results=$O/results.txt
: > "$results"
t_start=$(date +%s)
fails=0

# Every build first, all at once (nvcc is slow and a GPU machine has
# cores), then the runs one at a time, so no run shares the machine.
# bld BIN CMD: in the background; BIN.build gets its output, BIN.ok success.
bld() {
    (sh -c "$2" > "$O/$1.build" 2>&1 && touch "$O/$1.ok") &
}
rm -f "$O"/*.ok
bld real_gpu "$NVCC $NVFLAGS tests/test_real_gpu.cu -o $O/real_gpu"
bld real_gcc "$CC -std=c11 -O1 -g -DPREFETCH_CUDA -I$CUDA_INC_DIR tests/test_cuda_toolkit.c -o $O/real_gcc $LIBS"
bld gpu_bench "$NVCC $NVFLAGS bench/gpu_bench.cu -o $O/gpu_bench"
bld train_cuda "$NVCC $NVFLAGS examples/train_cuda.cu -o $O/train_cuda"
bld multi_gpu "$NVCC $NVFLAGS examples/multi_gpu.cu -o $O/multi_gpu"
bld llmc_tokens "$NVCC $NVFLAGS examples/llmc_tokens.cu -o $O/llmc_tokens"
bld demo "$NVCC $NVFLAGS -x cu examples/demo.c -o $O/demo"
bld quickstart "$NVCC $NVFLAGS -x cu examples/quickstart.c -o $O/quickstart"
bld quickstart_c "$CC -O2 -std=c11 -DPREFETCH_CUDA -I$CUDA_INC_DIR examples/quickstart.c -o $O/quickstart_c $LIBS"
wait
t_built=$(date +%s)

# check NAME LIMIT_S BIN ARGS...: run BIN (built above) with REQUIRE_GPU=1,
# keep the log, note passed/failed from a RESULT line (the test harness's)
# or the exit status; EXPECT, when set, is a line its output must have.
check() {
    name=$1
    limit=$2
    bin=$3
    shift 3
    log=$O/$(echo "$name" | tr ' /()' '____').log
    if [ ! -f "$O/$bin.ok" ]; then
        echo "$name|BUILD FAILED|0|0|1|see $O/$bin.build" >> "$results"
        fails=$((fails + 1))
        return
    fi
    if [ "$build_only" = 1 ]; then
        echo "$name|built|0|0|0|$ARCH" >> "$results"
        return
    fi
    t0=$(date +%s)
    REQUIRE_GPU=1 timeout "$limit" "$O/$bin" "$@" > "$log" 2>&1
    rc=$?
    t1=$(date +%s)
    res=$(grep '^RESULT' "$log" | tail -n 1)
    if [ -n "$res" ]; then
        set -- $res
        p=$2 f=$3 s=${4:-0}
    else
        p=$([ $rc -eq 0 ] && echo 1 || echo 0) f=$([ $rc -eq 0 ] && echo 0 || echo 1) s=0
    fi
    [ $rc -ne 0 ] && [ "$f" -eq 0 ] && f=1
    [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && f=1 # nothing passed (all skipped: no GPU seen) is no check
    note="exit $rc"
    if [ -n "$EXPECT" ] && ! grep -q "$EXPECT" "$log"; then
        p=0 f=1
        note="exit $rc, but no \"$EXPECT\" in its output (the host backend?)"
    fi
    [ $rc -eq 124 ] && note="timed out after ${limit}s"
    [ "$s" -gt 0 ] && note="$note, $s skipped"
    if [ "$f" -eq 0 ]; then st=ok; else st=FAIL; fails=$((fails + 1)); fi
    echo "$name|$st|$((t1 - t0))|$p|$f|$note" >> "$results"
}

quick="--quick"
[ "${FULL:-0}" = 1 ] && quick=""
check "real-GPU suite (nvcc)" 180 real_gpu
check "real runtime suite (gcc -lcudart)" 120 real_gcc
check "gpu_bench" 300 gpu_bench $quick
check "examples/train_cuda --quick" 120 train_cuda --quick
check "examples/multi_gpu" 120 multi_gpu
check "examples/llmc_tokens --check" 120 llmc_tokens --check
# --check compares the token stream on the host; training steps on the GPU
# need shards: two llm.c shards (header: magic 20240520, version 1, the
# token count, as little-endian int32 in 1024 bytes; then uint16 tokens),
# 64 Ki random tokens each
shard() {
    { printf '\210\330\064\001\001\000\000\000\000\000\001\000'; head -c 1012 /dev/zero; head -c 131072 /dev/urandom; } > "$1"
}
shard "$O/llmc_0.bin" && shard "$O/llmc_1.bin"
EXPECT="on the GPU" # this example has no REQUIRE_GPU: its own words say where it ran
check "examples/llmc_tokens (GPU steps)" 120 llmc_tokens "$O/llmc_*.bin" --B 8 --T 256
EXPECT=
check "examples/demo --quick" 120 demo --quick
check "examples/quickstart (the README's)" 120 quickstart --quick
check "examples/quickstart, plain C + libcudart (the README's)" 120 quickstart_c --quick
t_end=$(date +%s)

echo
if [ "$build_only" = 1 ]; then
    echo "gpu-check: built only (GPU_CHECK_BUILD_ONLY=1, $ARCH); nothing was run"
else
    echo "gpu-check on $gpu, $(date -u +%Y-%m-%dT%H:%MZ), nvcc $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $ARCH"
fi
printf '%-38s %-12s %6s %7s %7s  %s\n' check result seconds passed failed note
awk -F'|' '{ printf "%-38s %-12s %6s %7s %7s  %s\n", $1, $2, $3, $4, $5, $6 }' "$results"
echo "total $((t_end - t_start)) s ($((t_built - t_start)) s building); logs in $O/"
echo
json_str() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
if [ -n "$gpu" ]; then
    echo "$gpu" | awk -F', ' '{ printf "{\"gpu\":\"%s\",\"compute_cap\":\"%s\",\"driver\":\"%s\",\"memory\":\"%s\"}\n", $1, $2, $3, $4 }'
fi
while IFS='|' read -r name st secs p f note; do
    printf '{"check":"%s","result":"%s","seconds":%s,"passed":%s,"failed":%s,"note":"%s"}\n' \
        "$(json_str "$name")" "$st" "$secs" "$p" "$f" "$(json_str "$note")"
done < "$results"
[ -f "$O/gpu_bench.log" ] && [ "$build_only" != 1 ] && grep '^{' "$O/gpu_bench.log"
if [ "$fails" -gt 0 ]; then
    echo "gpu-check: $fails check(s) failed; their logs are in $O/" >&2
    exit 1
fi
exit 0
