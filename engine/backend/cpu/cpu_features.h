// What this CPU and OS can run, read once from cpuid and XCR0 (xgetbv). Every run-time choice
// of an instruction set (matrix kernels, attention kernels, element loops) asks here, so they
// agree and all check that the OS saves the vector state (a CPU flag alone is not enough under
// an OS or hypervisor that leaves AVX-512 off). Compiled without AVX flags.
#pragma once

namespace kvfs::cpu {

struct CpuFeatures {
  bool avx2_fma_f16c = false;  // AVX2 + FMA + F16C, OS saves YMM
  // plus AVX-VNNI (vpdpbusd on ymm, VEX-encoded): Intel cores since Alder Lake, including the
  // client parts and E-core Xeons (Sierra Forest) that have no AVX-512; the "avxvnni" table.
  bool avx_vnni = false;
  bool avx512_core = false;    // plus AVX-512 F, BW, VL, DQ, OS saves ZMM and opmasks
  bool avx512_vnni_bf16 = false;  // plus VNNI, VBMI, BF16 (the AVX-512 matrix kernel table)
  // plus AMX-TILE and AMX-INT8 with the tile state enabled in XCR0: the "amx" table, once the
  // process holds the tile state (AmxTilesGranted).
  bool amx_int8 = false;
};

const CpuFeatures& HostCpuFeatures();

// Whether this process may use the AMX tiles: asks Linux for the tile state (arch_prctl
// ARCH_REQ_XCOMP_PERM) the first time, on a CPU with amx_int8. Asked only where the amx table is
// chosen, not at feature detection: the grant holds for the whole process and cannot be given
// back, and it makes every signal frame larger (an alternate signal stack must then exceed
// about 11 KiB). A refusal is logged once and leaves the avx512 table.
bool AmxTilesGranted();

}  // namespace kvfs::cpu
