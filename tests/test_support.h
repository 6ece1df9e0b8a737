// Locating the shared test data. Tests that need ../shared skip with a message when it is
// absent, but fail when CI=true (CI must run them).
#pragma once

#include <string>

#include <gtest/gtest.h>

namespace kvfs::testing {

// The shared data directory: $KVFS_TEST_DATA, else <source>/../shared.
std::string SharedDir();
// Where the random-weight test models are regenerated: $KVFS_TEST_MODELS, else <build>/testmodels.
std::string TestModelsDir();
bool InCi();
bool FileExists(const std::string& path);
std::string ReadFile(const std::string& path);

}  // namespace kvfs::testing

// Skips (or fails under CI=true) when `path` does not exist.
#define KVFS_REQUIRE_DATA(path)                                                         \
  do {                                                                                  \
    if (!::kvfs::testing::FileExists(path)) {                                           \
      if (::kvfs::testing::InCi()) FAIL() << "CI=true but test data is missing: " << (path); \
      GTEST_SKIP() << "test data not found: " << (path) << " (set KVFS_TEST_DATA)";     \
    }                                                                                   \
  } while (0)
