#!/usr/bin/env bash
# device_check.sh — run the packed CUDA tests and bench on a GPU machine.
#
# From the repository root, after tools/cuda/pack_for_device.sh filled
# .devbin/. Writes $OUT/cuda_tests.log, $OUT/cuda_bench.json and
# $OUT/cuda_host.txt when OUT is set. Exit status: the tests' (the benches
# run either way). Expected time on an H200: under 7 minutes even at the
# timeouts (tests 200 s, bench 120 s, --host 60 s); expected well under 2
# minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
mkdir -p "$out"
export LD_LIBRARY_PATH=".devbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

nvidia-smi -L || true

echo "== kvcache_cuda_tests"
timeout 200 .devbin/kvcache_cuda_tests 2>&1 | tee "$out/cuda_tests.log"
tests_rc=${PIPESTATUS[0]}
echo "== kvcache_cuda_tests exit status $tests_rc"

echo "== kvcache_cuda_bench"
timeout 120 .devbin/kvcache_cuda_bench --json "$out/cuda_bench.json" --repeats 15
echo "== kvcache_cuda_bench exit status $?"

echo "== kvcache_cuda_bench --host (per-call costs, CUDA graph replay)"
timeout 60 .devbin/kvcache_cuda_bench --host | tee "$out/cuda_host.txt"
echo "== kvcache_cuda_bench --host exit status ${PIPESTATUS[0]}"
exit "$tests_rc"
