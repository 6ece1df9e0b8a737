// GGUF on-disk constants (gguf spec). Constants only.
#pragma once

#include <cstdint>

namespace kvfs::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint32_t kMinVersion = 2;       // v1 used 32-bit counts; not supported
inline constexpr uint32_t kMaxVersion = 3;
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr const char* kAlignmentKey = "general.alignment";
inline constexpr int kMaxDims = 4;
// Sanity bounds that reject absurd headers before any allocation.
inline constexpr uint64_t kMaxStringBytes = 1ull << 30;
inline constexpr int kMaxArrayNesting = 1;  // arrays of arrays are refused

}  // namespace kvfs::gguf
