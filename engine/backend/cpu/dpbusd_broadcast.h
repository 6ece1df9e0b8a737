// vpdpbusd with its dword operand broadcast from memory inside the instruction ({1to16}).
// Included by AVX-512 files only, inside their anonymous namespace (internal linkage, compiled
// with that file's flags), like attention_x86_shared.h.
//
// Why: GCC 12 compiles _mm512_set1_epi32 of a loaded dword into a separate vpbroadcastd, which
// on Zen 5 takes a vector-pipe slot: a stream of broadcast + vpdpbusd pairs ran at 0.82 cycles
// per pair against 0.57 for the embedded form (8 independent chains, one core).
#pragma once

// acc += 4 u8 x s8 products per lane, u8 lanes against the int8 dword at `dword` in every lane.
inline __m512i DpbusdBroadcast(__m512i acc, __m512i u8, const void* dword) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u8), "m"(*static_cast<const int32_t*>(dword)));
  return acc;
}
