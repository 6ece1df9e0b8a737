#include "tests/test_support.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>
#include <sys/stat.h>

namespace kvfs::testing {

std::string SharedDir() {
  if (const char* env = std::getenv("KVFS_TEST_DATA"); env != nullptr && *env != '\0') return env;
  return std::string(KVFS_SOURCE_DIR) + "/../shared";
}

std::string TestModelsDir() {
  if (const char* env = std::getenv("KVFS_TEST_MODELS"); env != nullptr && *env != '\0') return env;
  return KVFS_DEFAULT_TEST_MODELS;
}

bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "kvfs-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) != nullptr) {
    path_ = pattern;
  } else {
    ADD_FAILURE() << "mkdtemp " << pattern << " failed";
  }
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

std::string VulkanUnavailable(const Status& made) {
  // Unsupported: built with -DKVFS_VULKAN=OFF; NotFound: no driver or no device. A model with
  // a weight type the shaders lack is also Unsupported, but tests only use supported ones.
  if (made.code() == StatusCode::kUnsupported || made.code() == StatusCode::kNotFound) return made.message();
  return "";
}

std::map<std::string, int> ProfileDispatches(const std::string& report) {
  std::map<std::string, int> out;
  std::istringstream lines(report);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.size() >= 1 && w[0] == "pipeline") break;  // the per-pipeline lines follow
    if (w.size() < 4 || w[0] == "shader" || line.find("passes in") != std::string::npos) continue;
    std::string key = w[0];
    for (size_t i = 1; i + 3 < w.size(); ++i) key += " " + w[i];
    out[key] += std::stoi(w[w.size() - 3]);
  }
  return out;
}

std::map<std::string, int> ProfilePipelineDispatches(const std::string& report) {
  std::map<std::string, int> out;
  std::istringstream lines(report);
  std::string line;
  bool in_pipelines = false;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (!w.empty() && w[0] == "pipeline") {
      in_pipelines = true;
      continue;
    }
    // name [constants] dispatches device-ms share [statistics...]
    if (in_pipelines && w.size() >= 5) out[w[0] + " " + w[1]] += std::stoi(w[2]);
  }
  return out;
}

}  // namespace kvfs::testing
