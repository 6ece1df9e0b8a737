#include "engine/backend/cpu/cpu_features.h"

#include <cerrno>
#include <cstdint>
#include <cstring>

#include <spdlog/spdlog.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvfs::cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, eax, ebx, ecx, edx);
  const bool fma = (ecx >> 12) & 1, osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1, f16c = (ecx >> 29) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;       // XMM and YMM state
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;  // plus opmask, ZMM_Hi256, Hi16_ZMM
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool avx2 = (ebx >> 5) & 1;
  const bool avx512f = (ebx >> 16) & 1, avx512dq = (ebx >> 17) & 1, avx512bw = (ebx >> 30) & 1,
             avx512vl = (ebx >> 31) & 1;
  const bool avx512vbmi = (ecx >> 1) & 1, avx512vnni = (ecx >> 11) & 1;
  unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
  __cpuid_count(7, 1, eax1, ebx1, ecx1, edx1);
  const bool avx_vnni = (eax1 >> 4) & 1, avx512bf16 = (eax1 >> 5) & 1;
  f.avx2_fma_f16c = os_avx && avx2 && fma && f16c;
  f.avx_vnni = f.avx2_fma_f16c && avx_vnni;
  f.avx512_core = f.avx2_fma_f16c && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl;
  f.avx512_vnni_bf16 = f.avx512_core && avx512vbmi && avx512vnni && avx512bf16;
  const bool amx_tile = (edx >> 24) & 1, amx_int8 = (edx >> 25) & 1;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA
  f.amx_int8 = f.avx512_vnni_bf16 && amx_tile && amx_int8 && os_amx;
  return f;
}
#else
CpuFeatures Detect() { return {}; }
#endif

}  // namespace

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

bool AmxTilesGranted() {
  static const bool granted = [] {
    if (!HostCpuFeatures().amx_int8) return false;
#if defined(__linux__) && defined(__x86_64__)
    // Linux hands out the 8 KiB of tile data per process on request; without it the first tile
    // instruction faults.
    constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl code (asm/prctl.h)
    constexpr long kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return true;
    spdlog::warn("the CPU has AMX but the kernel refused this process the tile state ({}): no amx kernels",
                 std::strerror(errno));
#endif
    return false;
  }();
  return granted;
}

}  // namespace kvfs::cpu
