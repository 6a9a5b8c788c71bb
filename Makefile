# prefetch.h - build and test. Everything lands in build/.
#   make test     the whole suite; ends with "N passed, N failed"
#   make demo     naive vs prefetched on the default workload (GPU if present)
#   make bench    the benchmarks (JSON lines, then a table); QUICK=1 for a short run
#   make examples every example
#   make fuzz     libFuzzer for FUZZ_TIME seconds (default 120); finds go to build/
#   make fuzz-token  the same for checkpoint tokens (cfg.resume)
#   make lint     cppcheck, clang-tidy and valgrind memcheck, all clean
#   make gpu-check  the first run on a real GPU: the real-GPU suites, gpu_bench and
#                 every CUDA example, one report (without a GPU: says so, exits 0)
# make predefines CC=cc and CXX=g++; we mean gcc unless told otherwise
ifeq ($(origin CC),default)
CC       := gcc
endif
ifeq ($(origin CXX),default)
CXX      := g++
endif
CLANG    ?= clang
# clang is optional: without it the clang-only builds are skipped with a
# line, and the sanitizer builds that prefer it use $(CC)
HAVE_CLANG := $(if $(shell command -v $(CLANG) 2>/dev/null),1)
SANCC    := $(if $(HAVE_CLANG),$(CLANG),$(CC))
# The CUDA toolkit where users have it: $(CUDA_HOME), else the nvcc on PATH
# and its prefix (Debian: /usr/bin/nvcc, headers in /usr/include, the
# library in /usr/lib/<triplet>; conda: $CONDA_PREFIX/bin/nvcc and friends)
CUDA_HOME ?= /usr/local/cuda
NVCC     := $(or $(wildcard $(CUDA_HOME)/bin/nvcc),$(shell command -v nvcc 2>/dev/null))
CUDA_ROOT := $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_INC_DIR := $(patsubst %/cuda_runtime_api.h,%,$(firstword $(wildcard $(CUDA_ROOT)/include/cuda_runtime_api.h \
	$(CUDA_ROOT)/targets/*/include/cuda_runtime_api.h /usr/include/cuda_runtime_api.h)))
CUDA_LIB_DIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(CUDA_ROOT)/lib64/libcudart.so $(CUDA_ROOT)/lib/libcudart.so \
	$(CUDA_ROOT)/targets/*/lib/libcudart.so /usr/lib/*-linux-gnu/libcudart.so))))
B        := build

WARN     := -Wall -Wextra -Wpedantic -Werror
CSTD     := -std=c11
TFLAGS   := -O1 -g $(WARN)
ASAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN     := -fsanitize=thread
SIM      := -DTEST_SIM -DPREFETCH_CUDA -Itests/sim
CUDA_INC := -I$(CUDA_INC_DIR)
CUDA_LIB := -L$(CUDA_LIB_DIR) -Wl,-rpath,$(CUDA_LIB_DIR) -lcudart
NVFLAGS  := -O2 -std=c++17 -Xcompiler -Wall,-Wextra,-Werror
# GPU code for real architectures, so no PTX is JIT-compiled at the first
# launch (seconds on an H100, inside whatever is timed): the GPU at hand
# when there is one, else Ampere and Hopper machine code plus PTX for newer.
GPU_ARCH := $(shell nvidia-smi -L >/dev/null 2>&1 && echo -arch=native || \
	echo -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90)

HDR      := prefetch.h
THDR     := tests/harness.h tests/util.h $(HDR)
SIMSRC   := tests/sim/cuda_sim.c
SIMHDR   := tests/sim/cuda_runtime_api.h

# The toolkit is optional on a user's machine: the CUDA builds are then
# skipped with a line saying so (the simulated-runtime suites still run).
HAVE_CUDA := $(if $(and $(NVCC),$(CUDA_INC_DIR),$(CUDA_LIB_DIR)),1)

HOST_TESTS := $(B)/core_gcc $(if $(HAVE_CLANG),$(B)/core_clang) $(B)/core_cxx $(B)/core_asan $(B)/core_tsan $(B)/threads_gcc $(B)/threads_tsan \
	$(B)/resume_gcc $(B)/resume_asan $(B)/data_gcc $(B)/data_cxx $(B)/data_asan $(B)/data_tsan
SIM_TESTS  := $(B)/core_sim $(B)/cuda_sim $(B)/core_sim_asan $(B)/cuda_sim_asan $(B)/core_sim_tsan $(B)/cuda_sim_tsan \
	$(B)/threads_sim $(B)/threads_sim_tsan $(B)/resume_sim $(B)/data_sim $(B)/data_sim_asan
COMPILE_TESTS := $(B)/strict_gcc $(if $(HAVE_CLANG),$(B)/strict_clang) $(B)/strict_cxx $(B)/static_impl $(B)/two_tu \
	$(B)/config_init_c $(B)/config_init_cxx11 $(B)/config_init_cxx17
RELIABILITY := $(B)/fuzz_replay $(B)/fuzz_token_replay $(B)/stress_gcc $(B)/stress_tsan $(B)/stress_sim $(B)/stress_sim_tsan $(B)/gpu_bench_model
HOST_EXAMPLES := $(B)/demo $(B)/quickstart $(B)/record_files $(B)/images_tar $(B)/mnist_mlp $(B)/varlen $(B)/launch $(B)/checkpoint_resume $(B)/llmc_tokens $(B)/llmc_tokens_sim
# Older toolkits' header surfaces, derived from the installed one by
# tests/cuda_shapes.sh (those older than it): the CUDA backend is built
# against each with gcc, g++ and nvcc, as users on 11.8, 12.4 and 12.8 build it.
CUDART_HAVE := $(if $(CUDA_INC_DIR),$(shell sed -n 's/^\#define CUDART_VERSION[ \t]*\([0-9]*\).*/\1/p' $(CUDA_INC_DIR)/cuda_runtime_api.h))
SHAPES   := $(if $(CUDART_HAVE),$(shell for v in 11.8:11080 12.4:12040 12.8:12080; do \
	[ $${v#*:} -lt $(CUDART_HAVE) ] && printf '%s ' $${v%:*}; done))
shape_num = $(word 2,$(subst :, ,$(filter $1:%,11.8:11080 12.4:12040 12.8:12080)))
SHAPE_TESTS := $(foreach v,$(SHAPES),$(B)/shape_$(v)_gcc $(B)/shape_$(v)_cxx $(B)/shape_$(v)_nvcc)
CUDA_TESTS := $(SHAPE_TESTS) $(B)/config_init_nvcc $(B)/quickstart_cuda $(B)/real_gcc $(B)/real_cxx $(B)/real_nvtx $(B)/real_gpu $(B)/nvcc_impl $(B)/train_cuda $(B)/multi_gpu $(B)/llmc_tokens_cuda \
	$(B)/gpu_bench $(B)/demo_cuda

ALL_TESTS := $(HOST_TESTS) $(SIM_TESTS) $(COMPILE_TESTS) $(RELIABILITY) $(HOST_EXAMPLES)
ifeq ($(HAVE_CUDA),1)
ALL_TESTS += $(CUDA_TESTS)
endif

.PHONY: test test-build demo bench examples fuzz fuzz-token lint clean gpu-check

test:
	@mkdir -p $(B)
	@echo "building $(words $(ALL_TESTS)) test programs (gcc$(if $(HAVE_CLANG),$(comma) clang), g++, ASan+UBSan, TSan$(if $(HAVE_CUDA),$(comma) CUDA toolkit at $(CUDA_ROOT)))"
	@$(MAKE) -k --no-print-directory -j2 test-build > $(B)/build.log 2>&1 || \
		{ echo "some builds failed (each is counted as a failure below); the compiler said:"; grep -E "error|Error" $(B)/build.log | head -40; }
	@HAVE_CUDA="$(HAVE_CUDA)" HAVE_CLANG="$(HAVE_CLANG)" CUDA_HOME="$(CUDA_HOME)" NVCC="$(NVCC)" SHAPES="$(SHAPES)" sh tests/run.sh

comma := ,
test-build: $(ALL_TESTS)

# ---- the suites: one template, suite x variant (tests/README.md says what each proves)
# A variant is a compiler and its flags; the sim variants add the simulated
# CUDA runtime (tests/sim) and build the CUDA backend against it.
V_gcc      := $(CC) $(CSTD) $(TFLAGS)
V_clang    := $(CLANG) $(CSTD) $(TFLAGS)
V_cxx      := $(CXX) -std=c++17 $(TFLAGS) -x c++
V_asan     := $(CC) $(CSTD) $(TFLAGS) $(ASAN)
V_tsan     := $(CC) $(CSTD) $(TFLAGS) $(TSAN)
V_sim      := $(CC) $(CSTD) $(TFLAGS) $(SIM)
V_sim_asan := $(SANCC) $(CSTD) $(TFLAGS) $(ASAN) $(SIM)
V_sim_tsan := $(SANCC) $(CSTD) $(TFLAGS) $(TSAN) $(SIM)
is_sim = $(filter sim%,$(1))

# $(call SUITE,name,source,variants): build/name_variant from tests/source
define SUITE
$(foreach v,$(3),$(eval $(call SUITE_ONE,$(1),$(2),$(v))))
endef
define SUITE_ONE
$(B)/$(1)_$(3): tests/$(2) $(THDR) $(if $(call is_sim,$(3)),$(SIMSRC) $(SIMHDR))
	@mkdir -p $$(@D); rm -f $$@
	$$(V_$(3)) $$< $(if $(call is_sim,$(3)),-x none $(SIMSRC)) -o $$@ -lpthread
endef

$(call SUITE,core,test_core.c,gcc clang cxx asan tsan sim sim_asan sim_tsan)
$(call SUITE,threads,test_threads.c,gcc tsan sim sim_tsan)
$(call SUITE,resume,test_resume.c,gcc asan sim)
$(call SUITE,data,test_data.c,gcc cxx asan tsan sim sim_asan)
$(call SUITE,cuda,test_cuda_sim.c,sim sim_asan sim_tsan)
$(call SUITE,stress,test_stress.c,gcc tsan sim sim_tsan)

# ---- reliability: the fuzz corpus replayed, stress and soak on both backends
$(B)/fuzz_replay: tests/fuzz.c $(HDR) $(SIMSRC) $(SIMHDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(TFLAGS) $(ASAN) -DFUZZ_REPLAY -DPREFETCH_CUDA -Itests/sim $< $(SIMSRC) -o $@ -lpthread
$(B)/fuzz_token_replay: tests/fuzz_token.c $(HDR) $(SIMSRC) $(SIMHDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(TFLAGS) $(ASAN) -DFUZZ_REPLAY -DPREFETCH_CUDA -Itests/sim $< $(SIMSRC) -o $@ -lpthread

# ---- bench/gpu_bench.cu built with gcc against the simulator's timing model
$(B)/gpu_bench_model: bench/gpu_bench.cu $(HDR) $(SIMSRC) $(SIMHDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) -O2 $(WARN) $(SIM) -x c $< -x none $(SIMSRC) -o $@ -lpthread

# ---- how users include it: strict C11, C++17, PREFETCH_STATIC, two files
$(B)/strict_gcc: tests/compile/strict_c11.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(WARN) $< -o $@
$(B)/strict_clang: tests/compile/strict_c11.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CLANG) $(CSTD) $(WARN) $< -o $@
$(B)/strict_cxx: tests/compile/strict_c11.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CXX) -std=c++17 $(WARN) -x c++ $< -o $@
$(B)/static_impl: tests/compile/static_impl.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(WARN) $< -o $@
# PF_CONFIG_INIT: no warning with -Wextra as C11, C++11, C++17 (and nvcc below)
$(B)/config_init_c: tests/compile/config_init.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(WARN) -Wmissing-field-initializers $< -o $@ -lpthread
$(B)/config_init_cxx11: tests/compile/config_init.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CXX) -std=c++11 $(WARN) -Wmissing-field-initializers -x c++ $< -o $@ -lpthread
$(B)/config_init_cxx17: tests/compile/config_init.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CXX) -std=c++17 $(WARN) -Wmissing-field-initializers -x c++ $< -o $@ -lpthread
$(B)/config_init_nvcc: tests/compile/config_init.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) -x cu $< -o $@
$(B)/two_tu: tests/compile/two_tu_impl.c tests/compile/two_tu_main.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(WARN) tests/compile/two_tu_impl.c tests/compile/two_tu_main.c -o $@

# ---- the real CUDA toolkit: gcc and g++ with -lcudart, and nvcc
$(B)/real_gcc: tests/test_cuda_toolkit.c $(THDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(TFLAGS) -DPREFETCH_CUDA $(CUDA_INC) $< -o $@ $(CUDA_LIB) -lpthread
$(B)/real_cxx: tests/test_cuda_toolkit.c $(THDR)
	@mkdir -p $(@D); rm -f $@
	$(CXX) -std=c++17 $(TFLAGS) -DPREFETCH_CUDA $(CUDA_INC) -x c++ $< -o $@ $(CUDA_LIB) -lpthread
$(B)/real_nvtx: tests/test_cuda_toolkit.c $(THDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(TFLAGS) -DPREFETCH_CUDA -DPREFETCH_NVTX $(CUDA_INC) $< -o $@ $(CUDA_LIB) -lpthread -ldl
$(B)/real_gpu: tests/test_real_gpu.cu $(THDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) $(GPU_ARCH) $< -o $@
$(B)/nvcc_impl: tests/compile/nvcc_impl.cu $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) $< -o $@
$(B)/train_cuda: examples/train_cuda.cu $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) $(GPU_ARCH) $< -o $@
$(B)/multi_gpu: examples/multi_gpu.cu $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) $(GPU_ARCH) $< -o $@
$(B)/gpu_bench: bench/gpu_bench.cu $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) $(GPU_ARCH) $< -o $@
$(B)/demo_cuda: examples/demo.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) $(GPU_ARCH) -x cu $< -o $@

# ---- older toolkits' header surfaces (tests/cuda_shapes.sh): gcc, g++, nvcc
$(B)/cuda-shapes/stamp: tests/cuda_shapes.sh
	@mkdir -p $(B)/cuda-shapes
	sh tests/cuda_shapes.sh $(CUDA_INC_DIR) $(B)/cuda-shapes
	@touch $@
$(B)/shape_%_gcc: tests/compile/cuda_shape.c $(HDR) $(B)/cuda-shapes/stamp
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(WARN) -DSHAPE_VERSION=$(call shape_num,$*) -I$(B)/cuda-shapes/$*/include $< -o $@ $(CUDA_LIB) -lpthread
$(B)/shape_%_cxx: tests/compile/cuda_shape.c $(HDR) $(B)/cuda-shapes/stamp
	@mkdir -p $(@D); rm -f $@
	$(CXX) -std=c++17 $(WARN) -x c++ -DSHAPE_VERSION=$(call shape_num,$*) -I$(B)/cuda-shapes/$*/include $< -o $@ \
		$(CUDA_LIB) -lpthread
$(B)/shape_%_nvcc: tests/compile/cuda_shape.c $(HDR) $(B)/cuda-shapes/stamp
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) -x cu -DSHAPE_VERSION=$(call shape_num,$*) -I$(B)/cuda-shapes/$*/include $< -o $@

# ---- examples and the demo
$(B)/demo: examples/demo.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread
$(B)/record_files: examples/record_files.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread
$(B)/images_tar: examples/images_tar.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread
$(B)/llmc_tokens: examples/llmc_tokens.cu $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) -x c $< -o $@ -lpthread
$(B)/llmc_tokens_sim: examples/llmc_tokens.cu $(HDR) $(SIMSRC) $(SIMHDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $(SIM) -x c $< -x none $(SIMSRC) -o $@ -lpthread
$(B)/llmc_tokens_cuda: examples/llmc_tokens.cu $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) $(GPU_ARCH) $< -o $@
$(B)/quickstart: examples/quickstart.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread
$(B)/quickstart_cuda: examples/quickstart.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(NVCC) $(NVFLAGS) $(GPU_ARCH) -x cu $< -o $@
$(B)/varlen: examples/varlen.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread
$(B)/mnist_mlp: examples/mnist_mlp.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread -lm
$(B)/checkpoint_resume: examples/checkpoint_resume.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread
$(B)/launch: tests/test_launch.c $(THDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) $(CSTD) $(TFLAGS) $< -o $@ -lpthread

ifeq ($(HAVE_CUDA),1)
DEMO := $(B)/demo_cuda
else
DEMO := $(B)/demo
endif

demo:
	@mkdir -p $(B)
	@$(if $(HAVE_CUDA),,echo "no CUDA toolkit at $(CUDA_HOME): building the host-only demo";)
	@$(MAKE) --no-print-directory $(DEMO) >/dev/null
	@$(DEMO)

# ---- benchmarks: the host backend here; the GPU one reports only on a GPU
$(B)/bench: bench/bench.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread

$(B)/peer_bench: bench/peer_bench.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread
$(B)/reader_bench: bench/reader_bench.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread
$(B)/cold_bench: bench/cold_bench.c $(HDR)
	@mkdir -p $(@D); rm -f $@
	$(CC) -O2 $(CSTD) $(WARN) $< -o $@ -lpthread

bench:
	@mkdir -p $(B)
	@$(MAKE) --no-print-directory $(B)/bench $(B)/cold_bench $(B)/reader_bench $(B)/peer_bench $(B)/llmc_tokens $(B)/gpu_bench_model $(if $(HAVE_CUDA),$(B)/gpu_bench) >/dev/null
	@$(B)/bench $(if $(QUICK),--quick)
	@echo; echo "beside PyTorch's DataLoader (when a python3 with torch is here):"
	@$(B)/peer_bench $(if $(QUICK),--quick)
	@$(B)/llmc_tokens --bench $(if $(QUICK),--quick)
	@echo; echo "the readers (records, llm.c tokens, tar) against a plain pread loop of the same bytes:"
	@$(B)/reader_bench --dir $(B) $(if $(QUICK),--quick)
	@echo; echo "records past the page cache: sequential, sample shuffle, block shuffle:"
	@$(B)/cold_bench --dir $(B) $(if $(QUICK),--quick)
	@echo; echo "the CUDA backend on the simulator's timing model (figures labelled \"simulated GPU (model)\"):"
	@$(B)/gpu_bench_model $(if $(QUICK),--quick)
	@$(if $(HAVE_CUDA),echo; $(B)/gpu_bench $(if $(QUICK),--quick),echo "(no CUDA toolkit at $(CUDA_HOME): the real-GPU benchmark was not built)")

# every file in examples/, host builds always, the CUDA ones with a toolkit
EXAMPLES := $(B)/demo $(B)/quickstart $(B)/record_files $(B)/images_tar $(B)/checkpoint_resume $(B)/mnist_mlp $(B)/varlen $(B)/llmc_tokens \
	$(if $(HAVE_CUDA),$(B)/demo_cuda $(B)/quickstart_cuda $(B)/train_cuda $(B)/multi_gpu $(B)/llmc_tokens_cuda)
examples:
	@mkdir -p $(B)
	@$(MAKE) --no-print-directory $(EXAMPLES)
	@echo "examples built in $(B)/: $(notdir $(EXAMPLES))$(if $(HAVE_CUDA),, (no CUDA toolkit: the .cu examples were not built))"

# ---- the first run on a real GPU (tests/gpu_check.sh): builds for the GPU
# present, runs the real-GPU suites, gpu_bench and every CUDA example with
# REQUIRE_GPU=1, prints a table and JSON lines. FULL=1: gpu_bench in full.
gpu-check:
	@mkdir -p $(B)
	@B="$(B)" NVCC="$(NVCC)" CC="$(CC)" CUDA_INC_DIR="$(CUDA_INC_DIR)" CUDA_LIB_DIR="$(CUDA_LIB_DIR)" \
		FULL="$(FULL)" sh tests/gpu_check.sh

# ---- fuzzing: new inputs land in build/fuzz-corpus, crashes in build/
FUZZ_TIME ?= 120
$(B)/fuzz: tests/fuzz.c $(HDR) $(SIMSRC) $(SIMHDR)
	@mkdir -p $(@D); rm -f $@
	$(CLANG) $(CSTD) -O1 -g $(WARN) -fsanitize=fuzzer,address,undefined -DPREFETCH_CUDA -Itests/sim $< $(SIMSRC) -o $@ -lpthread

$(B)/fuzz_token: tests/fuzz_token.c $(HDR) $(SIMSRC) $(SIMHDR)
	@mkdir -p $(@D); rm -f $@
	$(CLANG) $(CSTD) -O1 -g $(WARN) -fsanitize=fuzzer,address,undefined -DPREFETCH_CUDA -Itests/sim $< $(SIMSRC) -o $@ -lpthread

fuzz-token: $(B)/fuzz_token
	@mkdir -p $(B)/fuzz-token-corpus
	$(B)/fuzz_token -max_total_time=$(FUZZ_TIME) -max_len=600 -artifact_prefix=$(B)/ \
		-print_final_stats=1 $(B)/fuzz-token-corpus tests/corpus_token

fuzz: $(B)/fuzz
	@mkdir -p $(B)/fuzz-corpus
	$(B)/fuzz -max_total_time=$(FUZZ_TIME) -max_len=512 -len_control=0 -artifact_prefix=$(B)/ \
		-print_final_stats=1 $(B)/fuzz-corpus tests/corpus

# ---- static and dynamic checks
# clang-tidy runs bugprone, concurrency and clang-analyzer on both builds of
# the header, warnings as errors, with three checks off:
#   clang-analyzer-security.insecureAPI.DeprecatedOrUnsafeBufferHandling
#     asks for C11 Annex K (memset_s, memcpy_s, vsnprintf_s), which glibc,
#     musl and most C libraries do not provide;
#   bugprone-easily-swappable-parameters: internal helpers take several
#     counts of one type by design (epoch, batch, nbatches);
#   clang-analyzer-optin.performance.Padding: pf_loader exists once per
#     loader; its fields are grouped by role for reading, not packed.
# The readers (pf_records_*, pf_tokens_*, pf_tar_*) are POSIX only: a third
# lint build turns them on. From the command line, not a #define in the file,
# which bugprone-reserved-identifier would flag
LINT_POSIX  := -D_POSIX_C_SOURCE=200809L
TIDY_CHECKS := -*,bugprone-*,concurrency-*,clang-analyzer-*,-clang-analyzer-security.insecureAPI.DeprecatedOrUnsafeBufferHandling,-bugprone-easily-swappable-parameters,-clang-analyzer-optin.performance.Padding

lint: $(B)/core_gcc
	@mkdir -p $(B)
	@printf '#define PREFETCH_IMPLEMENTATION\n#include "prefetch.h"\n' > $(B)/lint_host.c
	@printf '#define PREFETCH_CUDA\n#define PREFETCH_IMPLEMENTATION\n#include "prefetch.h"\n' > $(B)/lint_cuda.c
	@printf '/* linted with -D_POSIX_C_SOURCE=200809L: the readers (pread, open, fstat) */\n#define PREFETCH_IMPLEMENTATION\n#include "prefetch.h"\n' > $(B)/lint_posix.c
	cppcheck --enable=warning,style,performance,portability --std=c11 --error-exitcode=1 --inline-suppr --quiet \
		--suppress=toomanyconfigs -I. -Itests/sim $(B)/lint_host.c $(B)/lint_cuda.c
	cppcheck --enable=warning,style,performance,portability --std=c11 --error-exitcode=1 --inline-suppr --quiet \
		--suppress=toomanyconfigs -I. -Itests/sim $(LINT_POSIX) $(B)/lint_posix.c
	cppcheck --enable=warning,performance,portability --std=c11 --error-exitcode=1 --quiet -I. -Itests -Itests/sim -DTEST_SIM -DPREFETCH_CUDA tests/test_core.c tests/sim/cuda_sim.c
	clang-tidy --quiet --header-filter='prefetch.h' --checks='$(TIDY_CHECKS)' --warnings-as-errors='*' $(B)/lint_host.c $(B)/lint_cuda.c -- $(CSTD) -I. -Itests/sim
	clang-tidy --quiet --header-filter='prefetch.h' --checks='$(TIDY_CHECKS)' --warnings-as-errors='*' $(B)/lint_posix.c -- $(CSTD) $(LINT_POSIX) -I. -Itests/sim
	valgrind --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite,indirect --quiet $(B)/core_gcc > $(B)/valgrind.log 2>&1 || { tail -30 $(B)/valgrind.log; exit 1; }
	@echo "lint: cppcheck, clang-tidy and valgrind memcheck (the core suite) are clean"

clean:
	rm -rf $(B)
