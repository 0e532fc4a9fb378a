#!/usr/bin/env bash
# device_check.sh — run the packed CUDA tests and bench on a GPU machine.
#
# From the repository root, after tools/cuda/pack_for_device.sh filled
# .devbin/. Writes $OUT/cuda_tests.log and $OUT/cuda_bench.json when OUT is
# set. Exit status: the tests' (the bench runs either way). Expected time on
# an H200: well under 6 minutes (tests ~1-2 min, bench ~1 min).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
mkdir -p "$out"
export LD_LIBRARY_PATH=".devbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

nvidia-smi -L || true

echo "== kvcache_cuda_tests"
timeout 240 .devbin/kvcache_cuda_tests 2>&1 | tee "$out/cuda_tests.log"
tests_rc=${PIPESTATUS[0]}
echo "== kvcache_cuda_tests exit status $tests_rc"

echo "== kvcache_cuda_bench"
timeout 150 .devbin/kvcache_cuda_bench --json "$out/cuda_bench.json" --repeats 15
echo "== kvcache_cuda_bench exit status $?"
exit "$tests_rc"
