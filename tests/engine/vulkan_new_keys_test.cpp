// Decode scores that make the step's new keys themselves (Ops::NewKeys): kv_store then runs
// beside attn_scores with no barrier between, so the scores must not read the new positions
// from the cache, and must compute what reading them would have given, bit for bit.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/fmt/fmt.h>

#if defined(KVFS_VULKAN)

#include "tests/engine/vulkan_attention_util.h"

namespace kvfs::testing {
namespace {

// A RoPE table (cos, sin pairs) of n_rows rows.
std::vector<float> RopeTable(int64_t n_rows, int64_t n_rot, std::mt19937& rng) {
  std::uniform_real_distribution<float> angle(-3.0f, 3.0f);
  std::vector<float> table(n_rows * n_rot);
  for (int64_t i = 0; i < n_rows * n_rot / 2; ++i) {
    const float a = angle(rng);
    table[2 * i] = std::cos(a);
    table[2 * i + 1] = std::sin(a);
  }
  return table;
}

// For f16 keys and q4k's staged ones, with both RoPE styles and partial rotation: the old
// positions are stored (q4k: staged, complete chunks encoded), the new positions' cache rows
// hold junk (0x55 bytes), and the scores of T new tokens taking their keys from the raw K rows
// must equal, bit for bit, the scores after kv_store has stored those keys.
TEST_F(VulkanAttentionTest, ScoresMakeTheNewKeysAsKvStoreStoresThem) {
  std::mt19937 rng(31);
  const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
  const int64_t q_stride = kHeads * kHeadDim, r0 = 2;  // the new tokens' rows of q and K
  struct Case {
    const char* type;
    const char* rotate;
    int64_t pos0, T;
  };
  // f16: new positions inside one 64-position score workgroup and across two. q4k: in the chunk
  // after a complete one, and at the end of a chunk the step does not complete.
  auto q4k = MakeKvFormat("q4k", "off", kHeadsKv, kHeadDim);
  ASSERT_TRUE(q4k.ok());
  const int64_t C = q4k->chunk;
  const Case cases[] = {{"f16", "off", 37, 3}, {"f16", "off", 63, 3}, {"f16", "off", 20, 1},
                        {"q4k", "off", C + 7, 3}, {"q4k", "on", 2 * C - 3, 2}, {"q4k", "off", 5, 1}};
  for (const Case& c : cases) {
    auto f = MakeKvFormat(c.type, c.rotate, kHeadsKv, kHeadDim);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(vk::Ops::ScoresReadNewKeys(*f, c.T, c.pos0)) << f->Name();
    for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
      for (int64_t n_rot : {kHeadDim, kHeadDim / 2}) {
        const int64_t n_ctx = c.pos0 + c.T;
        const std::string what = fmt::format("{} pos0 {} T {} {} n_rot {}", f->Name(), c.pos0, c.T,
                                             style == RopeStyle::kNeox ? "neox" : "normal", n_rot);
        const std::vector<float> old_k = RandomRows(c.pos0, rng), old_v = RandomRows(c.pos0, rng);
        const std::vector<float> new_k = RandomRows(r0 + c.T, rng), new_v = RandomRows(r0 + c.T, rng);
        std::vector<float> q(q_stride * (r0 + c.T));
        for (float& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
        const vk::Buffer old_kb = Input(old_k), old_vb = Input(old_v), new_kb = Input(new_k), new_vb = Input(new_v);
        const vk::Buffer qb = Input(q), old_table = Input(RopeTable(c.pos0, n_rot, rng));
        const vk::Buffer new_table = Input(RopeTable(r0 + c.T, n_rot, rng));
        const vk::Ops::RopeTable old_rope{&old_table, n_rot, style}, new_rope{&new_table, n_rot, style};

        // f16: a plane of scattered blocks of kBlockTokens. q4k: blocks of 2 chunks in reversed
        // slots (slot 0 unused) and every position's staged key row (row 0 holds position 0).
        const Plane plane = MakePlane(*f, n_ctx);
        const int64_t B = f->KeysByChannel() ? 2 * C : kBlockTokens, n_blocks = (n_ctx + B - 1) / B;
        const int64_t slot_k = B / C * f->ChunkBytes(kRowValues), row_stride = plane.row_stride;
        std::vector<uint32_t> slots = plane.table;
        if (f->KeysByChannel()) {
          slots.clear();
          for (int64_t b = 0; b < n_blocks; ++b) slots.push_back(static_cast<uint32_t>(n_blocks - b));
        }
        const int64_t k_bytes = f->KeysByChannel() ? (n_blocks + 1) * slot_k : plane.bytes.size();
        const int64_t v_bytes = f->KeysByChannel() ? (n_blocks + 1) * B * row_stride : plane.bytes.size();
        const vk::Buffer table = Input(slots), k_plane = Output(k_bytes), v_plane = Output(v_bytes);
        const vk::Buffer keys = Output(n_ctx * kRowValues * 2);
        for (const vk::Buffer* b : {&k_plane, &v_plane, &keys}) std::memset(b->mapped(), 0x55, b->bytes());
        vk::KvView view = View(*f, k_plane, table, row_stride);
        view.v_plane = &v_plane;
        view.block_tokens = B;
        if (f->KeysByChannel()) {
          view.keys = &keys;
          view.k_slot_bytes = slot_k;
        }
        const vk::Buffer got = Output(c.T * kHeads * n_ctx * 4), want = Output(c.T * kHeads * n_ctx * 4);
        const vk::Ops::NewKeys new_keys{&new_kb, kRowValues};
        ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                      // The old positions (q4k: the complete chunks encoded from the staged rows).
                      KVFS_RETURN_IF_ERROR(ops_->KvStoreBoth(rec, view, shape, old_kb, old_vb, kRowValues, 0, c.pos0,
                                                             0, &old_rope));
                      rec.Barrier();
                      if (f->KeysByChannel()) {
                        KVFS_RETURN_IF_ERROR(ops_->KChunks(rec, view, shape, 0, c.pos0 / C));
                        rec.Barrier();
                      }
                      // The new keys from their rows while the cache holds junk there, then stored.
                      KVFS_RETURN_IF_ERROR(ops_->AttnScores(rec, view, shape, qb, q_stride, r0, c.T, c.pos0, got,
                                                            nullptr, {}, &new_rope, &new_keys));
                      rec.Barrier();
                      KVFS_RETURN_IF_ERROR(ops_->KvStoreBoth(rec, view, shape, new_kb, new_vb, kRowValues, r0, c.T,
                                                             c.pos0, &new_rope));
                      rec.Barrier();
                      return ops_->AttnScores(rec, view, shape, qb, q_stride, r0, c.T, c.pos0, want, nullptr, {},
                                              &new_rope);
                    }).ok())
            << what;
        const size_t n = c.T * kHeads * n_ctx;
        const std::vector<float> g = Read<float>(got, n), w = Read<float>(want, n);
        EXPECT_EQ(0, std::memcmp(g.data(), w.data(), n * 4)) << what;
        // Not vacuous: every visible score was written, the new positions' too.
        for (int64_t t = 0; t < c.T; ++t) EXPECT_NE(w[(t * kHeads + 1) * n_ctx + c.pos0 + t], 0.0f) << what;
      }
    }
  }
}

// What the scores cannot make themselves is refused: rotated f16 keys, q4k steps that complete
// a chunk, more than kNewKeyTokens tokens, the row formats that quantize keys.
TEST_F(VulkanAttentionTest, NewKeysOnlyWhereTheScoresCanMakeThem) {
  auto f16 = MakeKvFormat("f16", "off", kHeadsKv, kHeadDim), q4k = MakeKvFormat("q4k", "off", kHeadsKv, kHeadDim);
  auto q8 = MakeKvFormat("q8", "off", kHeadsKv, kHeadDim), q4 = MakeKvFormat("q4", "on", kHeadsKv, kHeadDim);
  ASSERT_TRUE(f16.ok() && q4k.ok() && q8.ok() && q4.ok());
  const int64_t C = q4k->chunk;
  EXPECT_TRUE(vk::Ops::ScoresReadNewKeys(*f16, vk::Ops::kNewKeyTokens, 100));
  EXPECT_FALSE(vk::Ops::ScoresReadNewKeys(*f16, vk::Ops::kNewKeyTokens + 1, 100));
  EXPECT_FALSE(vk::Ops::ScoresReadNewKeys(*q8, 1, 100));
  EXPECT_FALSE(vk::Ops::ScoresReadNewKeys(*q4, 1, 100));
  EXPECT_TRUE(vk::Ops::ScoresReadNewKeys(*q4k, 2, C - 3));
  EXPECT_FALSE(vk::Ops::ScoresReadNewKeys(*q4k, 3, C - 3));  // completes chunk 0
  KvFormat rotated_f16 = *f16;
  rotated_f16.rotate = true;
  EXPECT_FALSE(vk::Ops::ScoresReadNewKeys(rotated_f16, 1, 100));
  // AttnScores refuses new keys it cannot make, and new keys without the queries' RoPE.
  const vk::Buffer dummy = Output(4096);
  const vk::KvView view = View(*q8, dummy, dummy, 256);
  const vk::Ops::NewKeys new_keys{&dummy, kRowValues};
  const vk::Ops::RopeTable rope{&dummy, kHeadDim, RopeStyle::kNormal};
  const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
  EXPECT_FALSE(Run([&](vk::Recorder& rec) {
                 return ops_->AttnScores(rec, view, shape, dummy, kHeads * kHeadDim, 0, 1, 100, dummy, nullptr, {},
                                         &rope, &new_keys);
               }).ok());
  const vk::KvView f16_view = View(*f16, dummy, dummy, 256);
  EXPECT_FALSE(Run([&](vk::Recorder& rec) {
                 return ops_->AttnScores(rec, f16_view, shape, dummy, kHeads * kHeadDim, 0, 1, 100, dummy, nullptr, {},
                                         nullptr, &new_keys);
               }).ok());
}

}  // namespace
}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
