// Shared by the Vulkan KV and attention conformance tests (vulkan_attention_test.cpp,
// vulkan_new_keys_test.cpp): the geometry, random K/V rows and their CPU encoding, device planes
// of scattered KV blocks, and the fixture. Only built with KVFS_VULKAN.
#pragma once

#if defined(KVFS_VULKAN)

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/attention.h"
#include "engine/kv/kv_format.h"
#include "tests/engine/vulkan_test_util.h"

namespace kvfs::testing {

constexpr int64_t kHeads = 4, kHeadsKv = 2, kHeadDim = 64, kBlockTokens = 16;
constexpr int64_t kRowValues = kHeadsKv * kHeadDim;

inline std::vector<KvFormat> Formats() {
  std::vector<KvFormat> out;
  for (const char* type : {"f16", "q8", "q4"}) {
    for (const char* rotate : {"off", "on"}) {
      auto f = MakeKvFormat(type, rotate, kHeadsKv, kHeadDim);
      if (f.ok() && !(f->type == KvType::kF16 && std::string(rotate) == "on")) out.push_back(*f);
    }
  }
  return out;
}

// Random K or V rows with a few outliers (what the rotation is for).
inline std::vector<float> RandomRows(int64_t n_rows, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n_rows * kRowValues);
  for (float& v : x) v = normal(rng);
  for (int64_t r = 0; r < n_rows; ++r) x[r * kRowValues + (r * 37) % kRowValues] *= 12.0f;
  return x;
}

// The CPU encoding of rows (rotated per head first when the format rotates).
inline std::vector<uint8_t> EncodeRows(const KvFormat& f, std::vector<float> x, int64_t n_rows) {
  const int64_t row_bytes = f.RowBytes(kRowValues);
  std::vector<uint8_t> out(n_rows * row_bytes);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x.data() + r * kRowValues;
    if (f.rotate) {
      for (int64_t h = 0; h < kHeadsKv; ++h) HadamardTransform(row + h * kHeadDim, kHeadDim);
    }
    KvQuantizeRow(f, row, out.data() + r * row_bytes, kRowValues);
  }
  return out;
}

// A device plane of `slots` KV blocks and a block table sending block b to slots_of[b].
struct Plane {
  int64_t row_stride;
  std::vector<uint32_t> table;
  std::vector<uint8_t> bytes;  // [slots * block_tokens][row_stride]
  int64_t block_tokens = kBlockTokens;
  int64_t RowOffset(int64_t pos) const {
    return (table[pos / block_tokens] * block_tokens + pos % block_tokens) * row_stride;
  }
};
inline Plane MakePlane(const KvFormat& f, int64_t n_positions, int64_t block_tokens = kBlockTokens) {
  Plane p;
  p.block_tokens = block_tokens;
  p.row_stride = (f.RowBytes(kRowValues) + 3) / 4 * 4;
  const int64_t n_blocks = (n_positions + block_tokens - 1) / block_tokens;
  // Slots in reverse order after 3 unused ones, block 0 in the last.
  for (int64_t b = 0; b < n_blocks; ++b) p.table.push_back(static_cast<uint32_t>(n_blocks + 2 - b));
  p.bytes.assign((n_blocks + 3) * block_tokens * p.row_stride, 0);
  return p;
}

// A plane holding the n encoded rows (EncodeRows' layout) at positions 0 .. n-1.
inline Plane PlaneOf(const KvFormat& f, const std::vector<uint8_t>& rows, int64_t n,
                     int64_t block_tokens = kBlockTokens) {
  Plane plane = MakePlane(f, n, block_tokens);
  const int64_t row_bytes = f.RowBytes(kRowValues);
  for (int64_t p = 0; p < n; ++p) {
    std::memcpy(plane.bytes.data() + plane.RowOffset(p), rows.data() + p * row_bytes, row_bytes);
  }
  return plane;
}

class VulkanAttentionTest : public VulkanOpsTest {
 protected:
  vk::KvView View(const KvFormat& f, const vk::Buffer& plane, const vk::Buffer& table, int64_t row_stride) {
    vk::KvView v;
    v.k_plane = &plane;
    v.v_plane = &plane;
    v.block_table = &table;
    v.table0 = 0;
    v.format = f;
    v.block_tokens = kBlockTokens;
    v.row_stride = row_stride;
    return v;
  }

  // Raw scores of T query tokens (rows of kHeads heads) into `raw`, then the whole attention into
  // `out`, its softmax fused into the weighted sum when given `stats`.
  Status ScoresAndAttention(const vk::KvView& view, const vk::Buffer& q, int64_t T, int64_t pos0,
                            const vk::Buffer& scores, const vk::Buffer& raw, const vk::Buffer& out,
                            const vk::Buffer* stats, int64_t partial_floats) {
    const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
    const int64_t q_stride = kHeads * kHeadDim;
    const vk::Buffer partials = Output(partial_floats * 4);
    return Run([&](vk::Recorder& rec) -> Status {
      KVFS_RETURN_IF_ERROR(ops_->AttnScores(rec, view, shape, q, q_stride, 0, T, pos0, raw));
      return ops_->Attention(rec, view, shape, q, q_stride, 0, T, pos0, scores, partials, partial_floats, out, q_stride,
                             0, stats, stats != nullptr ? stats->bytes() / 4 : 0);
    });
  }

  // Query tiles (several queries per attention workgroup, the default) must give the bits of one
  // query per workgroup: ScoresAndAttention's raw scores and output (raw, out) again with query
  // tiles off.
  void ExpectSameWithoutQueryTiles(const std::vector<float>& raw, const std::vector<float>& out,
                                   const vk::KvView& view, const vk::Buffer& q, int64_t T, int64_t pos0,
                                   const vk::Buffer& scores, const vk::Buffer* stats, int64_t partial_floats) {
    const vk::Buffer raw1 = Output(raw.size() * 4), out1 = Output(out.size() * 4);
    ops_->set_query_tiles(false);
    const Status st = ScoresAndAttention(view, q, T, pos0, scores, raw1, out1, stats, partial_floats);
    ops_->set_query_tiles(true);
    ASSERT_TRUE(st.ok()) << st.message();
    const std::vector<float> raw_untiled = Read<float>(raw1, raw.size());
    const std::vector<float> out_untiled = Read<float>(out1, out.size());
    // Both write exactly the scores of the positions each query sees, into zeros.
    EXPECT_EQ(0, std::memcmp(raw.data(), raw_untiled.data(), raw.size() * 4)) << "scores differ with query tiles";
    EXPECT_EQ(0, std::memcmp(out.data(), out_untiled.data(), out.size() * 4)) << "output differs with query tiles";
  }
};

}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
