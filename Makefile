# kvcache — build entry points. Quick start: `make demo`, `make test`.
#
#   make deps     install missing Debian packages (apt-get; sudo when not root)
#   make build    configure (Release, Ninja) and build into build/
#   make demo     deps + build + run `kvcache demo`
#   make test     deps + build + ctest
#   make asan / make tsan   test under AddressSanitizer / ThreadSanitizer (build-asan/, build-tsan/)
#   make format   clang-format every C++ file we own
#   make clean    remove build directories

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
CMAKE_FLAGS ?=

DEB_PACKAGES := cmake ninja-build g++ pkg-config libgtest-dev libbenchmark-dev libhwy-dev \
	libxxhash-dev libcli11-dev nlohmann-json3-dev librapidcheck-dev libomp-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build demo test asan tsan format clean

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
	cmake --build $(BUILD_DIR) -j$(JOBS)

demo: deps
	$(MAKE) --no-print-directory build
	$(BUILD_DIR)/bin/kvcache demo

test: deps
	$(MAKE) --no-print-directory build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)

asan: deps
	$(MAKE) --no-print-directory test BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo CMAKE_FLAGS=-DKVCACHE_SANITIZE=address

tsan: deps
	$(MAKE) --no-print-directory test BUILD_DIR=build-tsan BUILD_TYPE=RelWithDebInfo CMAKE_FLAGS=-DKVCACHE_SANITIZE=thread

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp')

clean:
	rm -rf build build-asan build-tsan
