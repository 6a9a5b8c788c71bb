#!/bin/sh
# run.sh - runs what `make test-build` built and sums every suite's
# "RESULT passed failed skipped" line. A program that was not built, crashed
# or hung counts as a failure. Logs: build/logs/. Called by `make test`.
B=build
L=$B/logs
mkdir -p $L
pass=0
fail=0
skip=0
failed_steps=""

# step NAME CMD...: run CMD, read its RESULT line (or its exit status)
step() {
    name=$1
    shift
    log=$L/$(echo "$name" | tr ' /+()' '_____').log
    if [ ! -x "$1" ]; then
        echo "  FAIL $name: $1 was not built (see $B/build.log)"
        fail=$((fail + 1))
        failed_steps="$failed_steps\n  $name"
        return
    fi
    t0=$(date +%s)
    timeout 600 "$@" > "$log" 2>&1
    rc=$?
    t1=$(date +%s)
    res=$(grep '^RESULT' "$log" | tail -n 1)
    if [ -n "$res" ]; then
        set -- $res
        p=$2 f=$3 s=${4:-0}
    elif [ $rc -eq 0 ]; then
        p=1 f=0 s=0
    else
        p=0 f=1 s=0
    fi
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi # crashed after its tally
    pass=$((pass + p))
    fail=$((fail + f))
    skip=$((skip + s))
    if [ "$f" -eq 0 ]; then
        printf '  ok   %-44s %4s passed%s  (%ss)\n' "$name" "$p" "$([ "$s" -gt 0 ] && echo ", $s skipped")" $((t1 - t0))
        grep '^  SKIP' "$log" | sed 's/^  SKIP/         skip:/'
    else
        printf '  FAIL %-44s %4s passed, %s failed (exit %s; log %s)\n' "$name" "$p" "$f" "$rc" "$log"
        grep -E 'FAIL|check failed|HANG|ERROR|Sanitizer|runtime error' "$log" | head -n 20 | sed 's/^/       /'
        failed_steps="$failed_steps\n  $name"
    fi
}

# clang is optional: its own builds are skipped with a line, never silently
clang_step() {
    if [ "$HAVE_CLANG" = "1" ]; then step "$@"; else
        echo "  SKIPPED $1: no clang on PATH (install clang to run it; the gcc builds ran)"; fi
}

echo "host backend: the core suite built five ways"
step "gcc C11"           $B/core_gcc
clang_step "clang C11"   $B/core_clang
step "g++ C++17"         $B/core_cxx
step "gcc ASan+UBSan"    $B/core_asan
step "gcc TSan"          $B/core_tsan

echo "many threads, one loader: consumers, releasers and a stats reader on both backends"
step "threads, host backend"             $B/threads_gcc
step "threads, host backend, TSan"       $B/threads_tsan
step "threads, simulated CUDA"           $B/threads_sim
step "threads, simulated CUDA, TSan"     $B/threads_sim_tsan

echo "checkpoint, resume (also elastic) and the block shuffle: property tests"
step "resume, host backend"              $B/resume_gcc
step "resume, host backend, ASan+UBSan"  $B/resume_asan
step "resume, simulated CUDA"            $B/resume_sim

echo "your data: per-worker state, packed batches, bad samples, the readers"
step "data, host backend"                $B/data_gcc
step "data, g++ C++17"                   $B/data_cxx
step "data, host backend, ASan+UBSan"    $B/data_asan
step "data, host backend, TSan"          $B/data_tsan
step "data, simulated CUDA"              $B/data_sim
step "data, simulated CUDA, ASan+UBSan"  $B/data_sim_asan -s 4

echo "CUDA backend on the simulated runtime (races checked on every access)"
step "core suite, seed 1"            $B/core_sim -s 1
step "core suite, seed 2"            $B/core_sim -s 2
step "core suite, seed 3"            $B/core_sim -s 3
step "CUDA suite, seed 1"            $B/cuda_sim -s 1
step "CUDA suite, seed 2"            $B/cuda_sim -s 2
step "core suite, clang ASan+UBSan"  $B/core_sim_asan -s 4
step "CUDA suite, clang ASan+UBSan"  $B/cuda_sim_asan -s 4
step "core suite, clang TSan"        $B/core_sim_tsan -s 5
step "CUDA suite, clang TSan"        $B/cuda_sim_tsan -s 5

echo "reliability: the fuzz corpus, stress, soak, cancellation"
step "fuzz corpus replay (ASan+UBSan)"      $B/fuzz_replay tests/corpus
step "token fuzz corpus replay (ASan+UBSan)" $B/fuzz_token_replay tests/corpus_token
step "stress and soak, gcc"                 $B/stress_gcc
step "stress and soak, gcc TSan"            $B/stress_tsan
step "stress and soak, simulated CUDA"      $B/stress_sim
step "stress and soak, simulated CUDA TSan" $B/stress_sim_tsan -q
step "gpu_bench on the timing model (quick)" $B/gpu_bench_model --quick

echo "builds as users make them"
step "strict C11, gcc (no POSIX)"    $B/strict_gcc
clang_step "strict C11, clang"       $B/strict_clang
step "C++17, g++"                    $B/strict_cxx
step "PREFETCH_STATIC"               $B/static_impl
step "two translation units"         $B/two_tu
step "PF_CONFIG_INIT, gcc C11 -Wextra" $B/config_init_c
step "PF_CONFIG_INIT, g++ C++11 -Wextra" $B/config_init_cxx11
step "PF_CONFIG_INIT, g++ C++17 -Wextra" $B/config_init_cxx17
step "pre-C11 gcc gets prefetch.h's #error" tests/compile/pre_c11.sh gcc
clang_step "pre-C11 clang gets prefetch.h's #error" tests/compile/pre_c11.sh clang

echo "launchers: sharding from torchrun, MPI and SLURM variables, in real processes"
step "launcher sharding (real processes)" $B/launch

echo "the examples, as users run them"
step "examples/record_files --check"  $B/record_files --check --quick
step "examples/record_files --check --block 16" $B/record_files --check --quick --block 16
step "examples/images_tar --check"   $B/images_tar --check --quick
step "demo --quick"                  $B/demo --quick
step "examples/quickstart --quick (the README's Quick start)" $B/quickstart --quick
step "README: every C block quoted from an example run here" tests/readme_check.sh
step "examples/checkpoint_resume --check" $B/checkpoint_resume --check --dir $B
step "examples/mnist_mlp --check (learns; resumed bit for bit)" $B/mnist_mlp --check --dir $B
step "examples/varlen --check (packed samples of 1-200 bytes)" $B/varlen --check
step "examples/llmc_tokens --check (host)" $B/llmc_tokens --check
step "examples/llmc_tokens --check (simulated CUDA)" $B/llmc_tokens_sim --check

if [ "$HAVE_CUDA" = "1" ]; then
    echo "the real CUDA toolkit ($NVCC)"
    step "gcc -DPREFETCH_CUDA -lcudart" $B/real_gcc
    step "g++ -DPREFETCH_CUDA -lcudart" $B/real_cxx
    step "gcc -DPREFETCH_NVTX -lcudart" $B/real_nvtx
    step "nvcc real-GPU overlap suite"  $B/real_gpu
    step "nvcc .cu with the implementation" $B/nvcc_impl
    step "PF_CONFIG_INIT, nvcc -Wextra"  $B/config_init_nvcc
    step "nvcc examples/quickstart.c --quick" $B/quickstart_cuda --quick
    step "nvcc examples/train_cuda.cu"  $B/train_cuda --quick
    step "nvcc examples/multi_gpu.cu"   $B/multi_gpu
    step "nvcc examples/llmc_tokens.cu --check" $B/llmc_tokens_cuda --check
    step "nvcc bench/gpu_bench.cu"      $B/gpu_bench --quick
    step "nvcc demo --quick"            $B/demo_cuda --quick
    for v in $SHAPES; do
        echo "the CUDA backend against a CUDA $v-shaped header (tests/cuda_shapes.sh)"
        step "CUDA $v headers, gcc"    $B/shape_${v}_gcc
        step "CUDA $v headers, g++"    $B/shape_${v}_cxx
        step "CUDA $v headers, nvcc"   $B/shape_${v}_nvcc
    done
else
    echo "SKIPPED: the CUDA toolkit builds (gcc/g++ -lcudart, nvcc): no toolkit at ${CUDA_HOME:-/usr/local/cuda}"
    echo "         and no nvcc on PATH; set CUDA_HOME to run them. The simulated-runtime suites above did run."
fi

[ $skip -gt 0 ] && echo "($skip skipped; each is named above with its reason)"
[ $fail -gt 0 ] && printf "failed:$failed_steps\n"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
