#!/usr/bin/env bash
# profile_decode.sh — Nsight Compute on the decode attention kernel: one
# GQA 1 shape (bf16 n_q 8, batch 32 x 4k), one GQA 4 shape (n_q 32, same
# bytes), via kvcache_cuda_bench --once (3 calls; the 2nd decode_kernel
# launch is profiled: warm caches of metadata, cold K/V copy). Sections:
# SpeedOfLight, MemoryWorkloadAnalysis, Occupancy, WarpStateStats,
# LaunchStats. Text to $OUT/ncu_decode.txt. Expected < 90 s on an H200.
#
#   tools/cuda/profile_decode.sh     (repository root, after pack_for_device.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
mkdir -p "$out"
export LD_LIBRARY_PATH=".devbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [[ ! -x "$ncu" ]]; then
  echo "ncu not found" | tee "$out/ncu_decode.txt"
  exit 1
fi
: >"$out/ncu_decode.txt"
for shape in "8 32 4096 1" "32 32 4096 1" "8 1 32768 1"; do
  echo "== ncu: bf16 n_q/batch/context/new = $shape" | tee -a "$out/ncu_decode.txt"
  # The merge kernel too for the batch-1 shape (split path).
  filter='regex:decode_kernel'
  skip=1
  count=1
  [[ "$shape" == "8 1 32768 1" ]] && filter='regex:decode_kernel|merge_kernel' && skip=2 && count=2
  # shellcheck disable=SC2086
  timeout 40 "$ncu" --clock-control none --kernel-name "$filter" --launch-skip "$skip" \
    --launch-count "$count" --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section WarpStateStats --section LaunchStats \
    .devbin/kvcache_cuda_bench --once $shape >>"$out/ncu_decode.txt" 2>&1
  echo "== exit status $?" | tee -a "$out/ncu_decode.txt"
done
grep -E "==|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issued Ipc|No Eligible|Stall" \
  "$out/ncu_decode.txt" | head -80
