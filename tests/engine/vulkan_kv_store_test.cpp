// Conformance of the Vulkan KV encoding with the CPU's, bit for bit, per KV format (f16, q8,
// q4, q4k, with and without the Walsh-Hadamard rotation): kv_store must write the bytes
// KvQuantizeRow writes (RoPE of the keys included, where it stores both K and V), q4k's V rows
// those of QuantizeRowQ4k, and k_stage and k_chunks the staged key rows and K chunks of the CPU.
// (Attention over these encodings: vulkan_attention_test.cpp.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#if defined(KVFS_VULKAN)

#include "engine/kv/kv_format.h"
#include "engine/model/quants.h"
#include "tests/engine/vulkan_attention_util.h"

namespace kvfs::testing {
namespace {

TEST_F(VulkanAttentionTest, KvStoreWritesTheCpuEncoding) {
  std::mt19937 rng(21);
  const int64_t pos0 = 10, T = 30;  // positions 10..39: three blocks
  for (const KvFormat& f : Formats()) {
    const std::vector<float> rows = RandomRows(T, rng);
    const std::vector<uint8_t> want = EncodeRows(f, rows, T);
    Plane plane = MakePlane(f, pos0 + T);
    const vk::Buffer src = Input(rows), table = Input(plane.table);
    const vk::Buffer dev = Output(plane.bytes.size());
    const vk::KvView view = View(f, dev, table, plane.row_stride);
    ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                  return ops_->KvStore(rec, view, dev, {kHeads, kHeadsKv, kHeadDim}, src, kRowValues, 0, T, pos0);
                }).ok());
    const int64_t row_bytes = f.RowBytes(kRowValues);
    int64_t differing_rows = 0;
    std::vector<float> got_values(T * kRowValues), want_values(T * kRowValues);
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t* got = dev.mapped() + plane.RowOffset(pos0 + t);
      differing_rows += std::memcmp(got, want.data() + t * row_bytes, row_bytes) != 0;
      KvDequantize(f, got, 0, kRowValues, got_values.data() + t * kRowValues);
      KvDequantize(f, want.data() + t * row_bytes, 0, kRowValues, want_values.data() + t * kRowValues);
    }
    std::printf("[vulkan kv_store] %-8s %lld of %lld rows differ from the CPU encoding, decoded NMSE %.3g\n",
                f.Name().c_str(), static_cast<long long>(differing_rows), static_cast<long long>(T),
                Nmse(got_values, want_values));
    EXPECT_EQ(differing_rows, 0) << f.Name();
  }
}

// K and V stored in one dispatch that also applies RoPE to the keys: the bytes of rope, then
// kv_store of K and of V, for every row format, both RoPE styles and partial rotation, from
// source rows that start past the first (the cos/sin table is indexed by source row). For q4k
// (rotated and not) the keys are staged: the f16 rows of rope, then k_stage, at a key row
// offset, and the V rows those of kv_store.
TEST_F(VulkanAttentionTest, KvStoreBothRotatesKeysAsRopeThenKvStore) {
  std::mt19937 rng(27);
  const int64_t pos0 = 10, T = 30, row0 = 3, rows_total = row0 + T;
  std::uniform_real_distribution<float> angle(-3.0f, 3.0f);
  std::vector<KvFormat> formats = Formats();
  for (const char* rotate : {"off", "on"}) formats.push_back(*MakeKvFormat("q4k", rotate, kHeadsKv, kHeadDim));
  for (const KvFormat& f : formats) {
    for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
      for (int64_t n_rot : {kHeadDim, kHeadDim / 2}) {
        const std::vector<float> k_rows = RandomRows(rows_total, rng), v_rows = RandomRows(rows_total, rng);
        std::vector<float> table(rows_total * n_rot);
        for (int64_t i = 0; i < rows_total * n_rot / 2; ++i) {
          const float a = angle(rng);
          table[2 * i] = std::cos(a);
          table[2 * i + 1] = std::sin(a);
        }
        Plane plane = MakePlane(f, pos0 + T);
        const vk::Buffer k_src = Input(k_rows), v_src = Input(v_rows), tb = Input(table), bt = Input(plane.table);
        const vk::Buffer k_roped = Output(k_rows.size() * 4);
        std::memcpy(k_roped.mapped(), k_rows.data(), k_rows.size() * 4);
        // q4k: the pass's key rows, this sequence's from row 5 (position pos0 - 2 there).
        const bool staged = f.KeysByChannel();
        const size_t k_bytes = staged ? (5 + T + 2) * kRowValues * 2 : plane.bytes.size();
        const vk::Buffer k_want = Output(k_bytes), v_want = Output(plane.bytes.size());
        const vk::Buffer k_got = Output(k_bytes), v_got = Output(plane.bytes.size());
        vk::KvView separate = View(f, k_want, bt, plane.row_stride), both = View(f, k_got, bt, plane.row_stride);
        separate.v_plane = &v_want;
        both.v_plane = &v_got;
        if (staged) {
          separate.keys = &k_want;
          both.keys = &k_got;
          separate.key_row0 = both.key_row0 = 5;
          separate.key_pos0 = both.key_pos0 = pos0 - 2;
        }
        const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
        const vk::Ops::RopeTable rope{&tb, n_rot, style};
        ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                      KVFS_RETURN_IF_ERROR(ops_->Rope(rec, k_roped, kRowValues, kHeadsKv, kHeadDim, n_rot, style, tb,
                                                      rows_total));
                      rec.Barrier();
                      KVFS_RETURN_IF_ERROR(
                          staged ? ops_->KStage(rec, separate, shape, k_roped, kRowValues, row0, T, pos0)
                                 : ops_->KvStore(rec, separate, k_want, shape, k_roped, kRowValues, row0, T, pos0));
                      KVFS_RETURN_IF_ERROR(
                          ops_->KvStore(rec, separate, v_want, shape, v_src, kRowValues, row0, T, pos0));
                      return ops_->KvStoreBoth(rec, both, shape, k_src, v_src, kRowValues, row0, T, pos0, &rope);
                    }).ok());
        const size_t bytes = plane.bytes.size();
        const std::string what = f.Name() + (style == RopeStyle::kNeox ? " neox" : " normal") + " n_rot " +
                                 std::to_string(n_rot);
        EXPECT_EQ(std::memcmp(k_got.mapped(), k_want.mapped(), k_bytes), 0) << what << ": K plane or key rows";
        EXPECT_EQ(std::memcmp(v_got.mapped(), v_want.mapped(), bytes), 0) << what << ": V plane";
        // Not vacuous: the rows landed where the block table (q4k: the key rows) says.
        const uint8_t* k_row = k_got.mapped() + (staged ? (5 + 2) * kRowValues * 2 : plane.RowOffset(pos0));
        EXPECT_NE(std::count(k_row, k_row + 8, 0), 8) << what;
      }
    }
  }
}

// q4k's V rows (keys are chunks, not rows): the row-wide units and the per-sub-block search of
// (minimum, scale) candidates must pick what QuantizeRowQ4k picks, bit for bit, also for rows
// that are all zero, constant, all negative, tiny or with one huge value.
TEST_F(VulkanAttentionTest, KvStoreWritesTheCpuQ4kValueRows) {
  std::mt19937 rng(23);
  const int64_t pos0 = 5, T = 40;
  // Sub-blocks of 16 values (8 a row: part of one wave of kv_store's candidates), 4 and 2
  // (32 and 64: two and four waves of a 256-invocation workgroup).
  for (const auto& [rotate, group] : {std::pair{"off", int64_t{0}}, {"on", int64_t{0}}, {"on", int64_t{4}},
                                      {"off", int64_t{2}}}) {
    auto f = MakeKvFormat("q4k", rotate, kHeadsKv, kHeadDim);
    ASSERT_TRUE(f.ok());
    if (group != 0) f->group = group;
    std::vector<float> rows = RandomRows(T, rng);
    auto row = [&](int64_t r) { return rows.begin() + r * kRowValues; };
    std::fill(row(0), row(1), 0.0f);
    std::fill(row(1), row(2), 0.75f);
    for (int64_t i = 0; i < kRowValues; ++i) row(2)[i] = -std::abs(row(2)[i]) - 3.0f;
    for (int64_t i = 0; i < kRowValues; ++i) row(3)[i] *= 1e-6f;
    row(4)[17] = 6.0e4f;
    for (int64_t i = 0; i < kRowValues; ++i) row(5)[i] = static_cast<float>(i % 16);  // ties at the code steps
    const std::vector<uint8_t> want = EncodeRows(*f, rows, T);
    Plane plane = MakePlane(*f, pos0 + T);
    const vk::Buffer src = Input(rows), table = Input(plane.table);
    const vk::Buffer dev = Output(plane.bytes.size());
    const vk::KvView view = View(*f, dev, table, plane.row_stride);
    ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                  return ops_->KvStore(rec, view, dev, {kHeads, kHeadsKv, kHeadDim}, src, kRowValues, 0, T, pos0);
                }).ok());
    const int64_t row_bytes = f->RowBytes(kRowValues);
    int64_t differing_rows = 0;
    for (int64_t t = 0; t < T; ++t) {
      const bool same = std::memcmp(dev.mapped() + plane.RowOffset(pos0 + t), want.data() + t * row_bytes, row_bytes) == 0;
      EXPECT_TRUE(same) << f->Name() << " row " << t;
      differing_rows += !same;
    }
    std::printf("[vulkan kv_store] %-10s sub-blocks of %2lld: %lld of %lld V rows differ from the CPU encoding\n",
                f->Name().c_str(), static_cast<long long>(f->group), static_cast<long long>(differing_rows),
                static_cast<long long>(T));
  }
}

// q4k keys: k_stage writes new keys as f16 rows into the pass's key rows, and k_chunks encodes
// complete chunks from them into the K plane of scattered slots: the bytes of KvQuantizeKChunk.
TEST_F(VulkanAttentionTest, KeyChunksAreTheCpuEncoding) {
  std::mt19937 rng(29);
  auto f = MakeKvFormat("q4k", "off", kHeadsKv, kHeadDim);
  ASSERT_TRUE(f.ok());
  const int64_t C = f->chunk, B = 2 * C, chunk_bytes = f->ChunkBytes(kRowValues);
  const int64_t pos0 = 40, T = 4 * C - 40 + 10;  // positions 40 .. 4C + 9: chunks 1, 2, 3 complete here
  const std::vector<float> rows = RandomRows(T, rng);
  // Slots: block 0 -> 2, block 1 -> 0, block 2 -> 1 (block 2 holds the incomplete chunk 4).
  const std::vector<uint32_t> slots = {2, 0, 1};
  const int64_t slot_bytes = B / C * chunk_bytes;
  const vk::Buffer src = Input(rows), table = Input(slots);
  const vk::Buffer plane = Output(3 * slot_bytes);
  const vk::Buffer keys = Output((C + T) * kRowValues * 2);
  // This sequence's key rows start at row 3; row 3 holds position key_pos0.
  const vk::KvView view{.k_plane = &plane, .v_plane = &plane, .block_table = &table, .format = *f, .block_tokens = B,
                        .k_slot_bytes = slot_bytes, .keys = &keys, .key_row0 = 3, .key_pos0 = pos0 / C * C};
  const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
  ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                KVFS_RETURN_IF_ERROR(ops_->KStage(rec, view, shape, src, kRowValues, 0, T, pos0));
                rec.Barrier();
                return ops_->KChunks(rec, view, shape, pos0 / C + 1, 3);
              }).ok());
  // The staged rows are the f16 keys.
  const auto* staged = reinterpret_cast<const uint16_t*>(keys.mapped());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < kRowValues; ++i) {
      ASSERT_EQ(staged[(3 + pos0 - view.key_pos0 + t) * kRowValues + i], Fp32ToFp16(rows[t * kRowValues + i]));
    }
  }
  for (int64_t c = pos0 / C + 1; c <= pos0 / C + 3; ++c) {
    std::vector<float> x(C * kRowValues);
    for (int64_t i = 0; i < C * kRowValues; ++i) x[i] = Fp16ToFp32(Fp32ToFp16(rows[(c * C - pos0) * kRowValues + i]));
    std::vector<uint8_t> want(chunk_bytes);
    KvQuantizeKChunk(*f, x.data(), kRowValues, want.data(), kRowValues);
    const int64_t at = slots[c * C / B] * slot_bytes + (c * C % B) / C * chunk_bytes;
    EXPECT_EQ(std::memcmp(plane.mapped() + at, want.data(), chunk_bytes), 0) << "chunk " << c;
  }
}

}  // namespace
}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
