#include "engine/backend/vulkan/weight_layout.h"

#include <cstring>

namespace kvfs::vk {

namespace {

constexpr int64_t kScaleBytes = 2;  // one f16 per block, at the start of each GGUF block

int64_t CodeBytes(GgmlType type) { return type == GgmlType::kQ4_0 ? 16 : 32; }

int64_t ScaleArrayBytes(int64_t n_blocks) { return (n_blocks * kScaleBytes + 15) / 16 * 16; }

}  // namespace

bool SplitRowsApplies(GgmlType type) { return type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0; }

int64_t SplitRowBytes(GgmlType type, int64_t n_in) {
  const int64_t n_blocks = n_in / 32;
  return ScaleArrayBytes(n_blocks) + n_blocks * CodeBytes(type);
}

void SplitRows(GgmlType type, int64_t n_in, const uint8_t* src, int64_t src_row_bytes, int64_t n_rows, uint8_t* dst) {
  const int64_t n_blocks = n_in / 32;
  const int64_t code_bytes = CodeBytes(type);
  const int64_t block_bytes = kScaleBytes + code_bytes;
  const int64_t scales_end = ScaleArrayBytes(n_blocks);
  const int64_t dst_row_bytes = SplitRowBytes(type, n_in);
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* in = src + r * src_row_bytes;
    uint8_t* out = dst + r * dst_row_bytes;
    std::memset(out + n_blocks * kScaleBytes, 0, static_cast<size_t>(scales_end - n_blocks * kScaleBytes));
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* block = in + b * block_bytes;
      std::memcpy(out + b * kScaleBytes, block, kScaleBytes);
      std::memcpy(out + scales_end + b * code_bytes, block + kScaleBytes, static_cast<size_t>(code_bytes));
    }
  }
}

}  // namespace kvfs::vk
