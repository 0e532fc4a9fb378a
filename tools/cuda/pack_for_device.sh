#!/usr/bin/env bash
# pack_for_device.sh — build the CUDA test and bench binaries here and pack
# them, with every non-glibc shared library they need, into .devbin/ for a
# GPU machine that has the NVIDIA driver but not our Debian packages.
#
#   tools/cuda/pack_for_device.sh            (from the repository root)
#   JOBS=1 tools/cuda/pack_for_device.sh     (build parallelism, default 1)
#
# Then on the GPU machine, from the repository root: tools/cuda/device_check.sh
# (.devbin/ should be listed in .git/info/exclude and carried explicitly).
set -euo pipefail
cd "$(dirname "$0")/../.."

make --no-print-directory cuda JOBS="${JOBS:-1}"

out=.devbin
rm -rf "$out"
mkdir -p "$out"
bins=(build-cuda/bin/kvcache_cuda_tests build-cuda/bin/kvcache_cuda_bench)
for b in "${bins[@]}"; do
  cp "$b" "$out/"
  strip "$out/$(basename "$b")"
done

# Shared libraries from ldd, except glibc's own (the loader, libc, libm,
# libpthread, libdl, librt: those must come from the target system) and the
# CUDA driver (libcuda: it comes with the target's driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libcuda\.so)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/$name"
  strip --strip-unneeded "$out/$name" 2>/dev/null || true
done

echo "packed into $out/:"
ls -la "$out"
du -sh "$out"
echo "ldd check (everything must resolve; libs from $out):"
for b in "$out"/kvcache_cuda_tests "$out"/kvcache_cuda_bench; do
  if LD_LIBRARY_PATH="$out" ldd "$b" | grep -q "not found"; then
    LD_LIBRARY_PATH="$out" ldd "$b"
    echo "unresolved libraries for $b" >&2
    exit 1
  fi
  LD_LIBRARY_PATH="$out" ldd "$b" | sed 's/^/  /'
done
