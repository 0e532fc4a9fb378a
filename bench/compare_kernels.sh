#!/bin/bash
# Compares two builds of the `kvcache` CLI on the kernel shapes of
# docs/PERFORMANCE.md ("Current figures"): runs them alternately, ROUNDS
# times, and prints the median and range of each figure per binary
# (decode: also the fraction of the same pages' plain read bandwidth, where
# the binary reports it). The cache-resident shapes are 8 MiB (they fit a
# 32 MiB L3).
#
#   bench/compare_kernels.sh OLD_BINARY NEW_BINARY [ROUNDS]
#
# Run it on an idle machine; it takes about 5 minutes for 3 rounds.
set -euo pipefail
old=$1
new=$2
rounds=${3:-3}
out=$(mktemp)
shapes=(
  "attention --dtype bf16 --q-heads 8 --context 4096 --batch 8 --threads 2"
  "attention --dtype bf16 --q-heads 32 --context 4096 --batch 8 --threads 2"
  "attention --dtype f16 --q-heads 8 --context 4096 --batch 8 --threads 2"
  "attention --dtype f16 --q-heads 32 --context 4096 --batch 8 --threads 2"
  "attention --dtype bf16 --q-heads 32 --context 4096 --batch 8 --threads 2 --strategy continuous"
  "attention --dtype bf16 --q-heads 8 --context 2048 --batch 1 --resident cache --threads 2"
  "attention --dtype bf16 --q-heads 32 --context 2048 --batch 1 --resident cache --threads 2"
  "attention --dtype bf16 --q-heads 32 --context 32768 --batch 1 --threads 1"
  "attention --dtype bf16 --q-heads 32 --context 32768 --batch 1 --threads 2"
  "attention --dtype bf16 --q-heads 8 --context 32768 --batch 1 --threads 1"
  "attention --dtype bf16 --q-heads 8 --context 32768 --batch 1 --threads 2"
  "attention --mode prefill --context 2048 --q-heads 32 --resident cache --threads 2"
  "store --dtype bf16 --tokens 4096 --batch 16 --threads 2"
  "store --dtype f16 --tokens 4096 --batch 16 --threads 2"
  "store --dtype bf16 --tokens 4096 --batch 16 --threads 1"
)
for ((r = 0; r < rounds; ++r)); do
  for label in old new; do
    bin=$old
    [[ $label == new ]] && bin=$new
    for shape in "${shapes[@]}"; do
      # shellcheck disable=SC2086
      echo "$label|$shape|$("$bin" bench $shape --json)" >>"$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
from collections import defaultdict
runs = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1]):
    label, shape, text = line.rstrip("\n").split("|", 2)
    j = json.loads(text)
    if "fraction_of_memcpy" in j:
        key, rate = "fraction_of_memcpy", "gbps"
    elif j.get("mode") == "prefill":
        key, rate = "fraction_of_peak", "gflops"
    else:
        key, rate = "fraction_of_stream", "gbps"
    runs[shape][label].append((j[key], j[rate], j.get("fraction_of_paged_read")))
for shape, by in runs.items():
    print(shape)
    for label in ("old", "new"):
        f = [x[0] for x in by[label]]
        g = [x[1] for x in by[label]]
        pr = [x[2] for x in by[label] if x[2] is not None]
        extra = f"  of paged read {st.median(pr):.2f}" if pr else ""
        print(f"  {label}: fraction {st.median(f):.3f} [{min(f):.2f}-{max(f):.2f}]  "
              f"rate {st.median(g):.1f} [{min(g):.1f}-{max(g):.1f}]{extra}")
PY
rm -f "$out"
