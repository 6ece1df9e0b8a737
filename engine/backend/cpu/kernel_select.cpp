#include "engine/backend/cpu/kernel_select.h"

#include "engine/backend/cpu/cpu_features.h"

#include <cstdint>
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

#if defined(KVFS_X86_KERNELS)
bool HasAvx2() { return HostCpuFeatures().avx2_fma_f16c; }
bool HasAvxVnni() { return HostCpuFeatures().avx_vnni; }
bool HasAvx512Bw() { return HostCpuFeatures().avx512_core; }
bool HasAvx512() { return HostCpuFeatures().avx512_vnni_bf16; }
bool HasAmx() { return AmxTilesGranted(); }  // (checks the CPU first)
#endif

// Ordered from the most portable to the fastest.
const std::vector<Entry>& Entries() {
  static const std::vector<Entry> entries = {
      {"scalar", &ScalarKernels, &Always},
#if defined(KVFS_X86_KERNELS)
      {"avx2", &Avx2Kernels, &HasAvx2},
      {"avxvnni", &AvxVnniKernels, &HasAvxVnni},
      {"avx512bw", &Avx512BwKernels, &HasAvx512Bw},
      {"avx512", &Avx512Kernels, &HasAvx512},
      {"amx", &AmxKernels, &HasAmx},
#endif
  };
  return entries;
}

const KernelTable& Choose() {
  // A forced table first: the others' checks are not made (amx's asks the kernel for the tile
  // state, for good).
  const char* forced = std::getenv("KVFS_CPU");
  if (forced != nullptr && *forced != '\0') {
    if (const KernelTable* t = KernelTableByName(forced)) return *t;
  }
  const Entry* best = nullptr;
  for (const Entry& e : Entries()) {
    if (e.cpu_supports()) best = &e;
  }
  if (forced != nullptr && *forced != '\0') {
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
