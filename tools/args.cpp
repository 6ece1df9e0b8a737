#include "tools/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <spdlog/fmt/fmt.h>

namespace kvfs::cli {

Args::Args(int argc, char** argv, const std::set<std::string>& value_opts, const std::set<std::string>& flag_opts) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (value_opts.count(a)) {
      if (i + 1 >= argc) {
        error_ = "option " + a + " needs a value";
        return;
      }
      values_[a] = argv[++i];
    } else if (flag_opts.count(a)) {
      values_[a] = "";
    } else {
      error_ = "unknown option '" + a + "'";
      return;
    }
  }
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

int64_t Args::get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) {
  auto v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || *end != '\0' || x < lo || x > hi) {
    if (error_.empty()) error_ = name + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + *v + "'";
    return fallback;
  }
  return x;
}

double Args::get_double(const std::string& name, double fallback, double lo, double hi) {
  auto v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (errno != 0 || end == v->c_str() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi) {
    if (error_.empty()) error_ = fmt::format("{} must be a number in [{}, {}], got '{}'", name, lo, hi, *v);
    return fallback;
  }
  return x;
}

uint64_t Args::get_u64(const std::string& name, uint64_t fallback) {
  auto v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || *end != '\0' || (*v)[0] == '-') {
    if (error_.empty()) error_ = name + " must be a non-negative integer, got '" + *v + "'";
    return fallback;
  }
  return x;
}

}  // namespace kvfs::cli
