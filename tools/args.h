// Minimal option parsing shared by the CLI commands: "-x VALUE", "--name VALUE", "--flag".
// Errors are returned as text for the caller to print (exit status 2).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kvfs::cli {

class Args {
 public:
  // value_opts take a value; flag_opts do not. Anything else is an error.
  Args(int argc, char** argv, const std::set<std::string>& value_opts, const std::set<std::string>& flag_opts);

  const std::string& error() const { return error_; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const;
  // Typed getters record an error (see error()) when the value does not parse.
  int64_t get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi);
  double get_double(const std::string& name, double fallback, double lo, double hi);
  uint64_t get_u64(const std::string& name, uint64_t fallback);
  // Records a caller's validation error (the first error is kept).
  void set_error(const std::string& message) {
    if (error_.empty()) error_ = message;
  }

 private:
  std::map<std::string, std::string> values_;
  std::string error_;
};

}  // namespace kvfs::cli
