# kvcache — build entry points. Quick start: `make demo`, `make test`.
#
#   make deps     install missing Debian packages (apt-get; sudo when not root)
#   make build    configure (Release, Ninja) and build into build/
#   make install  build, then `cmake --install` into PREFIX (default /usr/local; docs/embedding.md)
#   make demo     deps + build the command line + run `kvcache demo`
#   make test     deps + build + ctest
#   make asan / make tsan   test under AddressSanitizer / ThreadSanitizer (build-asan/, build-tsan/;
#                           fewer SIMD targets, see ASAN_HWY_DISABLED below)
#   make fuzz     build the libFuzzer targets (clang, ASan+UBSan+float-cast-overflow) and run
#                 each for FUZZ_SECONDS
#   make cuda     the optional CUDA backend's tests and bench into build-cuda/ (nvcc; docs/CUDA.md)
#   make format   clang-format every C++ file we own
#   make clean    remove build directories

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
CMAKE_FLAGS ?=

DEB_PACKAGES := cmake ninja-build g++ pkg-config libgtest-dev libbenchmark-dev libhwy-dev \
	libxxhash-dev liburing-dev libcli11-dev nlohmann-json3-dev librapidcheck-dev libopenblas-dev \
	python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest python3-venv python3-mypy \
	clang libclang-rt-14-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build install demo test asan tsan fuzz cuda format clean

all: build

deps:
	@if dpkg -s $(DEB_PACKAGES) >/dev/null 2>&1; then \
	  echo "deps: all Debian packages present"; \
	else \
	  echo "deps: installing missing Debian packages"; \
	  $(SUDO) apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends $(DEB_PACKAGES); \
	fi

build:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j$(JOBS) $(if $(BUILD_TARGET),--target $(BUILD_TARGET))

PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# The demo needs the command line only (about 5.5 minutes on 2 cores from a
# fresh clone, against 8-9 for every target); `make test` builds the rest.
demo: deps
	$(MAKE) --no-print-directory build BUILD_TARGET=kvcache_cli
	$(BUILD_DIR)/bin/kvcache demo

test: deps
	$(MAKE) --no-print-directory build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)

# The sanitizer and fuzz builds compile fewer Highway targets (a bit mask of
# HWY_* from hwy/detect_targets.h): every target is another instantiation of
# the kernels, several minutes each under a sanitizer on 2 cores. `make test`
# runs every target against the reference kernels; ASan keeps AVX2 and the
# baseline (scalar with GCC 12) and drops SSSE3 / SSE4 (4096 + 2048), AVX3
# (256) and AVX3_DL (128): six attention translation units (one per element
# type) at ~7 minutes of a core per target under ASan. TSan, which is
# about threads (the pool, the split-and-merge plan, the managers' locks), not
# about instruction sets, compiles the scalar target only. The fuzzers never reach a kernel: they compile the
# scalar target only (KVCACHE_HWY_SCALAR_ONLY; clang took 9m20 for the f32
# kernel's AVX2 + EMU128 under ASan and coverage, 38 s for scalar alone).
ASAN_HWY_DISABLED ?= 6528

asan: deps
	$(MAKE) --no-print-directory test BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo \
	  CMAKE_FLAGS="-DKVCACHE_SANITIZE=address -DKVCACHE_HWY_DISABLED_TARGETS=$(ASAN_HWY_DISABLED)"

# ThreadSanitizer runs the tests that exercise threads (managers hammered from
# many threads, the thread pool, multi-threaded kernels).
TSAN_TESTS ?= Concurrency|Stress|ThreadPool|SplitsAcrossThreads|StrategiesAndThreads
tsan: deps
	$(MAKE) build BUILD_DIR=build-tsan BUILD_TYPE=RelWithDebInfo BUILD_TARGET=kvcache_tests \
	  CMAKE_FLAGS="-DKVCACHE_SANITIZE=thread -DKVCACHE_HWY_SCALAR_ONLY=ON"
	TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -j$(JOBS) \
	  -R '$(TSAN_TESTS)'

FUZZ_SECONDS ?= 60
FUZZERS := manager parsers sizes
# Largest input the parsers fuzzer makes (libFuzzer otherwise guesses from the
# corpus, 4 KiB at least): nesting that overflowed the stack took a 200 KB
# config.json (issue 40), so the fuzzer must be able to write such files.
PARSERS_MAX_LEN ?= 262144
fuzz: deps
	CXX=clang++ $(MAKE) build BUILD_DIR=build-fuzz BUILD_TYPE=RelWithDebInfo \
	  BUILD_TARGET="$(FUZZERS:%=%_fuzzer)" CMAKE_FLAGS="-DKVCACHE_SANITIZE=address -DKVCACHE_FUZZ=ON \
	  -DKVCACHE_HWY_SCALAR_ONLY=ON"
	for f in $(FUZZERS); do \
	  mkdir -p build-fuzz/corpus/$$f && \
	  build-fuzz/bin/$${f}_fuzzer -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    $$([ $$f = parsers ] && echo -max_len=$(PARSERS_MAX_LEN)) \
	    build-fuzz/corpus/$$f fuzz/corpus/$$f || exit 1; \
	done

# The CUDA backend (off in every other target): kvcache_cuda_tests and
# kvcache_cuda_bench only, which need the kvcache library but nothing else.
# The library's Highway kernels are compiled for the scalar target only there
# (the CUDA binaries use the reference kernels, not the CPU fast paths), which
# cuts the build from many minutes to a few on 2 cores.
CUDA_ARCHS ?= 90
cuda: deps
	cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCACHE_CUDA=ON \
	  -DKVCACHE_PYTHON=OFF -DCMAKE_CUDA_COMPILER=$(or $(NVCC),/usr/local/cuda/bin/nvcc) \
	  -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHS) -DKVCACHE_HWY_SCALAR_ONLY=ON $(CMAKE_FLAGS)
	cmake --build build-cuda -j$(JOBS) --target kvcache_cuda_tests kvcache_cuda_bench

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf build build-asan build-tsan build-fuzz build-cuda
