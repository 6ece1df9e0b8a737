// What this CPU and OS can run, read once from cpuid and XCR0 (xgetbv). Every run-time choice
// of an instruction set (matrix kernels, attention kernels, element loops) asks here, so they
// agree and all check that the OS saves the vector state (a CPU flag alone is not enough under
// an OS or hypervisor that leaves AVX-512 off). Compiled without AVX flags.
#pragma once

namespace kvfs::cpu {

struct CpuFeatures {
  bool avx2_fma_f16c = false;  // AVX2 + FMA + F16C, OS saves YMM
  bool avx512_core = false;    // plus AVX-512 F, BW, VL, DQ, OS saves ZMM and opmasks
  bool avx512_vnni_bf16 = false;  // plus VNNI, VBMI, BF16 (the AVX-512 matrix kernel table)
  // plus AMX-TILE and AMX-INT8, tile state enabled in XCR0 and granted to this process by the
  // kernel (Linux's arch_prctl ARCH_REQ_XCOMP_PERM, asked once, here): the "amx" table.
  bool amx_int8 = false;
};

const CpuFeatures& HostCpuFeatures();

}  // namespace kvfs::cpu
