#include "engine/backend/cpu/kernel_select.h"

#include <cstdint>
#include <cstdlib>

#include <spdlog/spdlog.h>

#if defined(KVFS_X86_KERNELS)
#include <cpuid.h>
#endif

namespace kvfs::cpu {

namespace {

struct Entry {
  const char* name;
  const KernelTable& (*table)();
  bool (*cpu_supports)();
};

bool Always() { return true; }

#if defined(KVFS_X86_KERNELS)
// Feature bits read straight from cpuid, plus XCR0 (xgetbv) to know that the OS saves the
// YMM / ZMM / opmask state on context switches: a CPU flag alone is not enough under an OS or
// hypervisor that leaves AVX-512 disabled. This file is compiled without AVX flags.
struct X86Features {
  bool avx2_fma_f16c = false;
  bool avx512 = false;  // F, BW, VL, DQ, VNNI, VBMI, BF16, with OS support
};

uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

X86Features DetectX86() {
  X86Features f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, eax, ebx, ecx, edx);
  const bool fma = (ecx >> 12) & 1, osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1, f16c = (ecx >> 29) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;         // XMM and YMM state
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;    // plus opmask, ZMM_Hi256, Hi16_ZMM
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool avx2 = (ebx >> 5) & 1;
  const bool avx512f = (ebx >> 16) & 1, avx512dq = (ebx >> 17) & 1, avx512bw = (ebx >> 30) & 1,
             avx512vl = (ebx >> 31) & 1;
  const bool avx512vbmi = (ecx >> 1) & 1, avx512vnni = (ecx >> 11) & 1;
  unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
  __cpuid_count(7, 1, eax1, ebx1, ecx1, edx1);
  const bool avx512bf16 = (eax1 >> 5) & 1;
  f.avx2_fma_f16c = os_avx && avx2 && fma && f16c;
  f.avx512 = f.avx2_fma_f16c && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl &&
             avx512vbmi && avx512vnni && avx512bf16;
  return f;
}

const X86Features& Features() {
  static const X86Features features = DetectX86();
  return features;
}

bool HasAvx2() { return Features().avx2_fma_f16c; }
bool HasAvx512() { return Features().avx512; }
#endif

// Ordered from the most portable to the fastest.
const std::vector<Entry>& Entries() {
  static const std::vector<Entry> entries = {
      {"scalar", &ScalarKernels, &Always},
#if defined(KVFS_X86_KERNELS)
      {"avx2", &Avx2Kernels, &HasAvx2},
      {"avx512", &Avx512Kernels, &HasAvx512},
#endif
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
