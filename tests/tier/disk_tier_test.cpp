// The disk tier past the common contract: restart, torn and corrupted
// pages, a damaged manifest, a full disk, the lock file, compaction.
#include "kvcache/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "kvcache/error.h"
#include "tier/manifest.h"
#include "tier/tier_test_util.h"

namespace kvcache {
namespace {

using tier_test::Pages;
using tier_test::ReadBuffers;
using tier_test::results;

DiskTierOptions small_slabs() {
  DiskTierOptions o;
  o.slab_bytes = 64 << 10;
  return o;
}

std::uint64_t pages_cap(std::uint64_t n) { return n * tier_test::fingerprint().page_bytes(); }

void store_all(DiskTier& t, const Pages& p) {
  const auto w = p.writes();
  const auto r = results(t.store(w).store_results());
  ASSERT_EQ(r, std::vector<StoreResult>(p.keys.size(), StoreResult::stored));
}

std::vector<LoadResult> load_all(DiskTier& t, const Pages& p, ReadBuffers& rb) {
  (void)p;
  return results(t.load(rb.reads).load_results());
}

void flip_byte(const std::filesystem::path& file, std::uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(DiskTierTest, RestartFindsThePages) {
  tier_test::TempDir dir;
  const Pages p(tier_test::fingerprint(), 10, 11);
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(32), small_slabs());
    EXPECT_TRUE(t.recovery().fresh);
    store_all(t, p);
  }
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(32), small_slabs());
  EXPECT_FALSE(t.recovery().fresh);
  EXPECT_EQ(t.recovery().pages, 10u);
  EXPECT_EQ(t.contains(p.keys), std::vector<std::uint8_t>(10, 1));
  ReadBuffers rb(p, 0, 10);
  EXPECT_EQ(load_all(t, p, rb), std::vector<LoadResult>(10, LoadResult::loaded));
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(rb.bytes[i], p.bytes[i]);
  // New pages go to free slots, not over the recovered ones.
  const Pages q(tier_test::fingerprint(), 4, 12);
  store_all(t, q);
  EXPECT_EQ(t.stats().pages_held, 14u);
  EXPECT_EQ(t.stats().evictions, 0u);
}

TEST(DiskTierTest, ZeroCopyAlignedBuffersRoundTrip) {
  tier_test::TempDir dir;
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8));
  const Pages p(tier_test::fingerprint(), 2, 13);
  const std::size_t n = p.bytes[0].size();
  auto* in = static_cast<std::byte*>(std::aligned_alloc(4096, 2 * n));
  auto* out = static_cast<std::byte*>(std::aligned_alloc(4096, 2 * n));
  std::memcpy(in, p.bytes[0].data(), n);
  std::memcpy(in + n, p.bytes[1].data(), n);
  const std::vector<PageWrite> w{{p.keys[0], p.tokens[0], {in, n}},
                                 {p.keys[1], p.tokens[1], {in + n, n}}};
  t.store(w).wait();
  const std::vector<PageRead> r{{p.keys[0], p.tokens[0], {out, n}},
                                {p.keys[1], p.tokens[1], {out + n, n}}};
  EXPECT_EQ(results(t.load(r).load_results()), std::vector<LoadResult>(2, LoadResult::loaded));
  EXPECT_EQ(std::memcmp(in, out, 2 * n), 0);
  std::free(in);
  std::free(out);
}

// A page whose data reached the slab but whose record did not reach the
// manifest (the process died between the two) is not found after restart.
TEST(DiskTierTest, DataWithoutItsRecordIsNotServed) {
  tier_test::TempDir dir;
  const Pages p(tier_test::fingerprint(), 3, 14);
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
    for (std::size_t i = 0; i < 3; ++i) {
      const auto w = p.writes(i, i + 1);
      t.store(w).wait();
    }
  }
  const auto m = dir.path / "manifest";
  std::filesystem::resize_file(m, std::filesystem::file_size(m) - tier::kManifestRecordBytes);
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
  EXPECT_EQ(t.recovery().pages, 2u);
  EXPECT_EQ(t.contains(p.keys), (std::vector<std::uint8_t>{1, 1, 0}));
  ReadBuffers rb(p, 0, 3);
  EXPECT_EQ(load_all(t, p, rb),
            (std::vector<LoadResult>{LoadResult::loaded, LoadResult::loaded, LoadResult::missing}));
}

TEST(DiskTierTest, CorruptedSlabBytesAreNeverServed) {
  tier_test::TempDir dir;
  const Pages p(tier_test::fingerprint(), 2, 15);
  std::size_t slot_bytes = 0;
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
    slot_bytes = t.slot_bytes();
    const auto w0 = p.writes(0, 1), w1 = p.writes(1, 2);
    t.store(w0).wait();
    t.store(w1).wait();
  }
  // Slot 1 (page 1): a byte in the middle of its page bytes.
  flip_byte(dir.path / "slab-00000.bin", slot_bytes + slot_bytes / 2 + 100);
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
  ReadBuffers rb(p, 0, 2);
  EXPECT_EQ(load_all(t, p, rb), (std::vector<LoadResult>{LoadResult::loaded, LoadResult::corrupt}));
  EXPECT_EQ(rb.bytes[0], p.bytes[0]);
  EXPECT_EQ(t.stats().corrupt, 1u);
  EXPECT_EQ(t.contains(p.keys), (std::vector<std::uint8_t>{1, 0}));  // dropped
  ReadBuffers again(p, 1, 2);
  EXPECT_EQ(load_all(t, p, again), std::vector<LoadResult>{LoadResult::missing});
}

TEST(DiskTierTest, CorruptedHeaderIsNeverServed) {
  tier_test::TempDir dir;
  const Pages p(tier_test::fingerprint(), 1, 16);
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
    store_all(t, p);
  }
  flip_byte(dir.path / "slab-00000.bin", sizeof(PageHeader) + 8);  // a token id
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
  ReadBuffers rb(p, 0, 1);
  EXPECT_EQ(load_all(t, p, rb), std::vector<LoadResult>{LoadResult::corrupt});
  EXPECT_EQ(t.stats().corrupt, 1u);
}

TEST(DiskTierTest, TruncatedSlabDropsTheSlotsItLost) {
  tier_test::TempDir dir;
  DiskTierOptions o = small_slabs();
  o.slab_bytes = 1 << 20;  // one slab file
  const Pages p(tier_test::fingerprint(), 3, 17);
  std::size_t slot_bytes = 0;
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), o);
    slot_bytes = t.slot_bytes();
    for (std::size_t i = 0; i < 3; ++i) {
      const auto w = p.writes(i, i + 1);
      t.store(w).wait();
    }
  }
  std::filesystem::resize_file(dir.path / "slab-00000.bin", 2 * slot_bytes + 4096);
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), o);
  EXPECT_EQ(t.recovery().pages, 2u);
  EXPECT_EQ(t.recovery().dropped, 1u);
  EXPECT_EQ(t.stats().corrupt, 1u);
  EXPECT_EQ(t.contains(p.keys), (std::vector<std::uint8_t>{1, 1, 0}));
  ReadBuffers rb(p, 0, 2);
  EXPECT_EQ(load_all(t, p, rb), std::vector<LoadResult>(2, LoadResult::loaded));
}

TEST(DiskTierTest, TornManifestTailIsIgnored) {
  tier_test::TempDir dir;
  const Pages p(tier_test::fingerprint(), 3, 18);
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
    store_all(t, p);
  }
  {
    std::ofstream m(dir.path / "manifest", std::ios::binary | std::ios::app);
    m.write("KVMRgarbage-of-a-torn-record", 28);
  }
  const Pages q(tier_test::fingerprint(), 1, 19);
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
    EXPECT_EQ(t.recovery().pages, 3u);
    EXPECT_EQ(t.recovery().torn_manifest_bytes, 28u);
    store_all(t, q);  // appended after the good records, not after the garbage
  }
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
  EXPECT_EQ(t.recovery().pages, 4u);
  EXPECT_EQ(t.recovery().torn_manifest_bytes, 0u);
  ReadBuffers rb(q, 0, 1);
  EXPECT_EQ(load_all(t, q, rb), std::vector<LoadResult>{LoadResult::loaded});
  EXPECT_EQ(rb.bytes[0], q.bytes[0]);
}

TEST(DiskTierTest, ADirectoryOfAnotherFingerprintStartsEmpty) {
  tier_test::TempDir dir;
  const Pages p(tier_test::fingerprint(), 2, 20);
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), small_slabs());
    store_all(t, p);
  }
  DiskTier t(tier_test::fingerprint(64, "other-model"), dir.path, pages_cap(8), small_slabs());
  EXPECT_TRUE(t.recovery().fresh);
  EXPECT_EQ(t.stats().pages_held, 0u);
  EXPECT_EQ(t.contains(p.keys), std::vector<std::uint8_t>(2, 0));
}

TEST(DiskTierTest, TheLockKeepsASecondTierOut) {
  tier_test::TempDir dir;
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8));
    EXPECT_THROW(DiskTier(tier_test::fingerprint(), dir.path, pages_cap(8)), InvalidArgument);
  }
  EXPECT_NO_THROW(DiskTier(tier_test::fingerprint(), dir.path, pages_cap(8)));
}

TEST(DiskTierTest, ForcedBackendsAndBufferedIo) {
  tier_test::TempDir dir;
  DiskTierOptions o;
  o.io = DiskIo::threads;
  o.direct_io = false;
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(8), o);
  EXPECT_EQ(t.io_backend(), "threads");
  EXPECT_FALSE(t.direct_io());
  o.threads = 0;
  EXPECT_THROW(DiskTier(tier_test::fingerprint(), dir.path / "b", pages_cap(8), o),
               InvalidArgument);
}

TEST(DiskTierTest, TheManifestIsCompacted) {
  tier_test::TempDir dir;
  DiskTierOptions o = small_slabs();
  o.compact_min_records = 4;
  const Pages p(tier_test::fingerprint(), 40, 21);
  {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(2), o);
    for (std::size_t i = 0; i < 40; ++i) {
      const auto w = p.writes(i, i + 1);
      t.store(w).wait();
    }
    EXPECT_EQ(t.stats().evictions, 38u);
  }
  // 40 stored + 38 removed records without compaction; at most 2 * 2 + 4 + a batch with it.
  const auto records =
      (std::filesystem::file_size(dir.path / "manifest") - tier::kManifestHeaderBytes) /
      tier::kManifestRecordBytes;
  EXPECT_LE(records, 12u);
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(2), o);
  EXPECT_EQ(t.contains(p.keys).back(), 1);
  EXPECT_EQ(t.stats().pages_held, 2u);
  ReadBuffers rb(p, 38, 40);
  EXPECT_EQ(load_all(t, p, rb), std::vector<LoadResult>(2, LoadResult::loaded));
}

// A process killed while it writes: whatever a new process finds loads
// byte-exact; nothing torn is served.
TEST(DiskTierTest, KilledDuringWritesServesNothingTorn) {
  tier_test::TempDir dir;
  const Pages p(tier_test::fingerprint(), 24, 22);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(64), small_slabs());
    const auto first = p.writes(0, 8);
    t.store(first).wait();
    const auto rest = p.writes(8, 24);
    t.store(rest);  // in flight when the process dies
    raise(SIGKILL);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(64), small_slabs());
  EXPECT_GE(t.recovery().pages, 8u);
  ReadBuffers rb(p, 0, 24);
  const auto r = load_all(t, p, rb);
  for (std::size_t i = 0; i < 24; ++i) {
    EXPECT_TRUE(r[i] == LoadResult::loaded || r[i] == LoadResult::missing) << i;
    if (r[i] == LoadResult::loaded) {
      EXPECT_EQ(rb.bytes[i], p.bytes[i]) << i;
    }
    if (i < 8) {
      EXPECT_EQ(r[i], LoadResult::loaded) << i;
    }
  }
}

// A full disk, by a file size limit set in a child process (writes past it
// fail with EFBIG, as ENOSPC would): the pages fail, are counted and logged,
// and after max_consecutive_errors in a row the tier disables itself; no
// call throws.
TEST(DiskTierTest, DiskFullFailsPagesThenDisablesTheTier) {
  tier_test::TempDir dir;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    DiskTierOptions o;
    o.max_consecutive_errors = 3;
    DiskTier t(tier_test::fingerprint(), dir.path, pages_cap(4), o);  // one slab of 4 slots
    const Pages p(tier_test::fingerprint(), 9, 23);
    int code = 0;
    for (std::size_t i = 0; i < 4; ++i) {  // one at a time: page i in slot i, oldest first
      const auto w = p.writes(i, i + 1);
      if (t.store(w).store_results()[0] != StoreResult::stored) code |= 1;
    }
    const rlimit lim{t.slot_bytes(), t.slot_bytes()};  // slot 0 still fits, 1..3 do not
    setrlimit(RLIMIT_FSIZE, &lim);
    std::vector<StoreResult> got;
    for (std::size_t i = 4; i < 9; ++i) {
      const auto w = p.writes(i, i + 1);
      got.push_back(t.store(w).store_results()[0]);  // each evicts the oldest page
    }
    const std::vector<StoreResult> want{StoreResult::stored, StoreResult::failed,
                                        StoreResult::failed, StoreResult::failed,
                                        StoreResult::rejected};
    if (got != want) code |= 2;
    const TierStats s = t.stats();
    if (s.io_errors != 3 || s.enabled || t.enabled()) code |= 4;
    if (t.contains(p.keys) != std::vector<std::uint8_t>(9, 0)) code |= 8;
    ReadBuffers rb(p, 4, 5);
    if (results(t.load(rb.reads).load_results()) != std::vector<LoadResult>{LoadResult::missing}) {
      code |= 16;
    }
    _exit(code);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace kvcache
