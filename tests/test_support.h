// Locating the shared test data. Tests that need ../shared skip with a message when it is
// absent, but fail when CI=true (CI must run them).
#pragma once

#include <map>
#include <string>

#include <gtest/gtest.h>

#include "engine/core/status.h"

namespace kvfs::testing {

// The shared data directory: $KVFS_TEST_DATA, else <source>/../shared.
std::string SharedDir();
// Where the random-weight test models are regenerated: $KVFS_TEST_MODELS, else <build>/testmodels.
std::string TestModelsDir();
bool InCi();
bool FileExists(const std::string& path);
std::string ReadFile(const std::string& path);

// A new directory under the temporary directory (mkdtemp: unique even when test binaries run in
// parallel), removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // A path inside it.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Why a Vulkan test cannot run, or "" when `made` (the status of making a Vulkan backend or
// context) is not about a missing backend or device: a build without Vulkan, or a machine
// without a Vulkan driver or device.
std::string VulkanUnavailable(const Status& made);

// A Vulkan profile's "shader [groups] -> dispatches" lines (Backend::TakeProfileReport), which
// show what a pass recorded.
std::map<std::string, int> ProfileDispatches(const std::string& report);
// The same profile's per-pipeline lines: "shader [specialization constants]" -> dispatches.
std::map<std::string, int> ProfilePipelineDispatches(const std::string& report);

}  // namespace kvfs::testing

// Skips (or fails under CI=true) when `path` does not exist.
#define KVFS_REQUIRE_DATA(path)                                                         \
  do {                                                                                  \
    if (!::kvfs::testing::FileExists(path)) {                                           \
      if (::kvfs::testing::InCi()) FAIL() << "CI=true but test data is missing: " << (path); \
      GTEST_SKIP() << "test data not found: " << (path) << " (set KVFS_TEST_DATA)";     \
    }                                                                                   \
  } while (0)

// After making a Vulkan backend or context: skips, with the reason, when the build or the
// machine has no Vulkan; under CI=true only a build without Vulkan (-DKVFS_VULKAN=OFF) skips, since
// CI installs lavapipe. Fails on any other error.
#define KVFS_REQUIRE_VULKAN(made_status)                                       \
  do {                                                                        \
    const ::kvfs::Status kvfs_made_ = (made_status);                          \
    if (!kvfs_made_.ok()) {                                                   \
      const std::string kvfs_why_ = ::kvfs::testing::VulkanUnavailable(kvfs_made_); \
      if (kvfs_why_.empty()) FAIL() << kvfs_made_.message();                  \
      if (::kvfs::testing::InCi() && kvfs_made_.code() != ::kvfs::StatusCode::kUnsupported) \
        FAIL() << "CI=true but no Vulkan device: " << kvfs_why_;             \
      GTEST_SKIP() << "Vulkan unavailable: " << kvfs_why_;                    \
    }                                                                         \
  } while (0)
