// kernels::lines_resident, the probe by which AttentionPrefetch::automatic
// drops the prefetch pump for rows already in the caches: lines just read
// must answer as resident and lines flushed to memory must not. A single
// probe can be thrown off by an interrupt or a busy neighbour, so each
// property must hold in at least one of several tries; a probe that always
// answers the same way fails one of the two tests.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/kernel_common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvcache::kernels {
namespace {

constexpr int kTries = 20;
constexpr std::size_t kLines = 16;

// kLines cache lines 4 KiB apart (each in its own page), each holding i + 1.
struct ProbeLines {
  std::vector<std::uint8_t> buffer = std::vector<std::uint8_t>(kLines * 4096 + 64);
  const void* lines[kLines] = {};
  ProbeLines() {
    for (std::size_t i = 0; i < kLines; ++i) {
      buffer[i * 4096] = static_cast<std::uint8_t>(i + 1);
      lines[i] = buffer.data() + i * 4096;
    }
  }
  std::uint64_t read_all() const {
    std::uint64_t sum = 0;
    for (const void* p : lines) sum += *static_cast<const volatile std::uint8_t*>(p);
    return sum;
  }
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

TEST(ResidencyProbe, LinesJustReadAreResident) {
  ProbeLines probe;
  int resident = 0;
  for (int t = 0; t < kTries; ++t) {
    ASSERT_EQ(probe.read_all(), kLines * (kLines + 1) / 2);
    resident += lines_resident(probe.lines, kLines) ? 1 : 0;
  }
  EXPECT_GT(resident, 0) << "warm lines never answered as resident in " << kTries << " tries";
}

TEST(ResidencyProbe, FlushedLinesAreNotResident) {
  ProbeLines probe;
  int resident = 0;
  for (int t = 0; t < kTries; ++t) {
    ASSERT_EQ(probe.read_all(), kLines * (kLines + 1) / 2);
    for (const void* p : probe.lines) _mm_clflush(p);
    _mm_mfence();
    resident += lines_resident(probe.lines, kLines) ? 1 : 0;
  }
  EXPECT_LT(resident, kTries) << "lines flushed to memory always answered as resident";
}

#else

TEST(ResidencyProbe, AnswersNoWhereItCannotTime) {
  ProbeLines probe;
  probe.read_all();
  EXPECT_FALSE(lines_resident(probe.lines, kLines));
}

#endif

}  // namespace
}  // namespace kvcache::kernels
