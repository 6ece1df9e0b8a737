#include "engine/backend/cpu/kernel_select.h"

#include <cstdlib>

#include <spdlog/spdlog.h>

namespace kvfs::cpu {

namespace {

struct Entry {
  const char* name;
  const KernelTable& (*table)();
  bool (*cpu_supports)();
};

bool Always() { return true; }

// Ordered from the most portable to the fastest.
const std::vector<Entry>& Entries() {
  static const std::vector<Entry> entries = {
      {"scalar", &ScalarKernels, &Always},
  };
  return entries;
}

const KernelTable& Choose() {
  const Entry* best = nullptr;
  for (const Entry& e : Entries()) {
    if (e.cpu_supports()) best = &e;
  }
  if (const char* forced = std::getenv("KVFS_CPU"); forced != nullptr && *forced != '\0') {
    if (const KernelTable* t = KernelTableByName(forced)) return *t;
    spdlog::warn("KVFS_CPU={} is unknown or not supported by this CPU; using {}", forced, best->name);
  }
  return best->table();
}

}  // namespace

std::vector<std::string> AllKernelTableNames() {
  std::vector<std::string> names;
  for (const Entry& e : Entries()) names.push_back(e.name);
  return names;
}

const KernelTable* KernelTableByName(const std::string& name) {
  for (const Entry& e : Entries()) {
    if (name == e.name) return e.cpu_supports() ? &e.table() : nullptr;
  }
  return nullptr;
}

const KernelTable& DefaultKernelTable() {
  static const KernelTable& chosen = Choose();
  return chosen;
}

}  // namespace kvfs::cpu
