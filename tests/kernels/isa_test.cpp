// Tests for kvcache/kernels/isa.h: listing and pinning the instruction set
// of the fast kernels.
#include "kvcache/kernels/isa.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvcache/error.h"

namespace kvcache {
namespace {

// Puts the best instruction set back whatever a test does.
struct AutoIsa {
  ~AutoIsa() { select_isa("auto"); }
};

TEST(Isa, TheBestIsActiveByDefaultAndEverySetCanBeSelected) {
  AutoIsa restore;
  const std::vector<std::string> isas = available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(active_isa(), isas.front());
  for (const std::string& isa : isas) {
    select_isa(isa);
    EXPECT_EQ(active_isa(), isa);
    // The list names every set, not just the selected one.
    EXPECT_EQ(available_isas(), isas);
  }
  select_isa("auto");
  EXPECT_EQ(active_isa(), isas.front());
}

TEST(Isa, UnknownNameThrowsNamingItAndTheChoicesAndChangesNothing) {
  AutoIsa restore;
  const std::vector<std::string> isas = available_isas();
  select_isa(isas.back());
  try {
    select_isa("AVX9000");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("AVX9000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("auto"), std::string::npos) << msg;
    for (const std::string& isa : isas) EXPECT_NE(msg.find(isa), std::string::npos) << msg;
  }
  EXPECT_EQ(active_isa(), isas.back());
  EXPECT_THROW(select_isa(""), InvalidArgument);
  EXPECT_EQ(active_isa(), isas.back());
}

}  // namespace
}  // namespace kvcache
