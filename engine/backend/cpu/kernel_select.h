// Choosing a CPU kernel table at run time from cpuid (or KVFS_CPU=scalar|avx2|avx512bw|avx512).
#pragma once

#include <string>
#include <vector>

#include "engine/backend/cpu/kernels.h"

namespace kvfs::cpu {

// Names of the tables compiled into this build, scalar first.
std::vector<std::string> AllKernelTableNames();
// The table with that name if this CPU can run it, else nullptr.
const KernelTable* KernelTableByName(const std::string& name);
// The best table this CPU supports, or the one KVFS_CPU names (an unknown or unsupported name
// falls back to the best, with a warning in the log). Decided once.
const KernelTable& DefaultKernelTable();

}  // namespace kvfs::cpu
