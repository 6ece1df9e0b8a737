// Conformance of the Vulkan attention with the CPU scalar reference, per KV format (f16, q8,
// q4, q4k, with and without the Walsh-Hadamard rotation): attention (decode and prefill,
// grouped-query heads, positions spread over KV blocks in scattered device slots) must match
// the CPU backend's computation: rotated and f16-rounded queries, scores against the decoded K
// rows, softmax, weighted V. (The encodings it reads: vulkan_kv_store_test.cpp.)
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <spdlog/fmt/fmt.h>

#if defined(KVFS_VULKAN)

#include "engine/backend/cpu/attention.h"
#include "engine/kv/kv_format.h"
#include "engine/model/quants.h"
#include "tests/engine/vulkan_attention_util.h"

namespace kvfs::testing {
namespace {

// The scores scratch bounds how many prompt tokens run their attention as one job (jobs run one
// after another, each with few workgroups of weighted sums): on a large GPU a 512-token prompt
// at depth 3500 of llama3.1-8b (32 heads) is one job; every part stays within a binding, and a
// small device keeps the old 64 MiB.
TEST(VulkanScratchTest, ScoresHoldALongPromptOnALargeGpu) {
  constexpr int64_t kMiB = int64_t{1} << 20, kGiB = int64_t{1} << 30;
  const auto tokens_per_job = [](const vk::Ops::ScratchBytes& s) { return s.scores / 4 / (32 * (3500 + 512)); };
  const vk::Ops::ScratchBytes h200 = vk::Ops::BackendScratch(4 * kGiB, 141 * kGiB);
  EXPECT_GE(tokens_per_job(h200), 512);
  EXPECT_LE(h200.scores, 512 * kMiB);  // at most a 64th of the smallest device that gets it
  const vk::Ops::ScratchBytes lavapipe = vk::Ops::BackendScratch(128 * kMiB, 2 * kGiB);
  EXPECT_EQ(lavapipe.scores, 64 * kMiB);
  const vk::Ops::ScratchBytes narrow = vk::Ops::BackendScratch(32 * kMiB, 141 * kGiB);  // bindings of 32 MiB
  EXPECT_EQ(narrow.scores, 32 * kMiB);
  EXPECT_EQ(narrow.partials, 16 * kMiB);
  EXPECT_LE(narrow.stats, 32 * kMiB);
  const vk::Ops::ScratchBytes consumer = vk::Ops::BackendScratch(4 * kGiB, 8 * kGiB);  // a 64th of 8 GiB
  EXPECT_EQ(consumer.scores, 128 * kMiB);
}

// attn_scores with q_rope rotates each query as Rope() then scores would: the scores equal bit
// for bit, for every row format (the int8-query q4 path, rotated formats), both RoPE styles and
// partial rotation, with query rows at an offset (their table rows are q's rows).
TEST_F(VulkanAttentionTest, ScoresRotateQueriesAsRopeThenScores) {
  std::mt19937 rng(29);
  const int64_t pos0 = 20, T = 3, row0 = 2, rows_total = row0 + T, n_ctx = pos0 + T, q_stride = kHeads * kHeadDim;
  std::uniform_real_distribution<float> angle(-3.0f, 3.0f);
  for (const KvFormat& f : Formats()) {
    const Plane kp = PlaneOf(f, EncodeRows(f, RandomRows(n_ctx, rng), n_ctx), n_ctx);
    const vk::Buffer kb = Input(kp.bytes), table = Input(kp.table);
    const vk::KvView view = View(f, kb, table, kp.row_stride);
    const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
    for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
      for (int64_t n_rot : {kHeadDim, kHeadDim / 2}) {
        std::vector<float> q(rows_total * q_stride), cos_sin(rows_total * n_rot);
        for (float& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
        for (int64_t i = 0; i < rows_total * n_rot / 2; ++i) {
          const float a = angle(rng);
          cos_sin[2 * i] = std::cos(a);
          cos_sin[2 * i + 1] = std::sin(a);
        }
        const vk::Buffer q_raw = Input(q), q_roped = Input(q), tb = Input(cos_sin);
        const vk::Buffer want = Output(T * kHeads * n_ctx * 4), got = Output(T * kHeads * n_ctx * 4);
        const vk::Ops::RopeTable rope{&tb, n_rot, style};
        ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                      KVFS_RETURN_IF_ERROR(
                          ops_->Rope(rec, q_roped, q_stride, kHeads, kHeadDim, n_rot, style, tb, rows_total));
                      rec.Barrier();
                      KVFS_RETURN_IF_ERROR(ops_->AttnScores(rec, view, shape, q_roped, q_stride, row0, T, pos0, want));
                      return ops_->AttnScores(rec, view, shape, q_raw, q_stride, row0, T, pos0, got, nullptr, {},
                                              &rope);
                    }).ok());
        const std::string what = f.Name() + (style == RopeStyle::kNeox ? " neox" : " normal") + " n_rot " +
                                 std::to_string(n_rot);
        const std::vector<float> w = Read<float>(want, T * kHeads * n_ctx), g = Read<float>(got, T * kHeads * n_ctx);
        EXPECT_EQ(g, w) << what;
        // Not vacuous: the rotation changes the scores.
        const vk::Buffer plain = Output(T * kHeads * n_ctx * 4);
        ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                      return ops_->AttnScores(rec, view, shape, q_raw, q_stride, row0, T, pos0, plain);
                    }).ok());
        EXPECT_NE(Read<float>(plain, T * kHeads * n_ctx), w) << what;
      }
    }
  }
}

// The CPU backend's attention for one query token and head (cpu_backend.cpp, scalar kernels).
// One query's scores against n rows by the scalar CPU table, as the backend computes them: q4
// keys with the query quantized to int8 blocks, the others with float queries.
void ScalarScores(const KvFormat& f, const cpu::KvRows& rows, const std::vector<float>& q, float* scores) {
  const cpu::AttentionKernels& attn = cpu::ScalarAttentionKernels();
  if (!cpu::KeysUseInt8Queries(f, rows.hd)) return attn.dot_rows(f, rows, q.data(), 1, scores, rows.n_rows);
  const int64_t nb = rows.hd / cpu::kQueryBlock;
  std::vector<int8_t> codes(rows.hd);
  std::vector<float> scales(nb), sums(nb);
  std::vector<int32_t> code_sums(nb);
  cpu::QuantizeQueries(q.data(), 1, rows.hd, codes.data(), scales.data(), sums.data(), code_sums.data());
  attn.dot_rows_q8(f, rows, cpu::Int8Queries{codes.data(), scales.data(), sums.data(), code_sums.data()}, 1, scores,
                   rows.n_rows);
}

std::vector<float> ReferenceAttention(const KvFormat& f, const std::vector<uint8_t>& k, const std::vector<uint8_t>& v,
                                      const float* q_head, int64_t kv_head, int64_t n_visible,
                                      int64_t block_tokens = kBlockTokens) {
  const cpu::AttentionKernels& attn = cpu::ScalarAttentionKernels();
  const int64_t row_bytes = f.RowBytes(kRowValues);
  std::vector<float> q(q_head, q_head + kHeadDim);
  if (f.rotate) attn.hadamard(q.data(), kHeadDim);
  if (f.type == KvType::kF16) attn.round_f16(q.data(), kHeadDim);
  std::vector<float> scores(n_visible), out(kHeadDim, 0.0f);
  ScalarScores(f, cpu::KvRows{k.data(), row_bytes, n_visible, kv_head, kHeadDim}, q, scores.data());
  attn.softmax(scores.data(), n_visible, n_visible, 1.0f / std::sqrt(static_cast<float>(kHeadDim)),
               f.type == KvType::kF16);
  // Block by block, as the backend walks V at this head size (a multiple of 16; q4's int8 weights
  // are quantized per tile of a block).
  for (int64_t p0 = 0; p0 < n_visible; p0 += block_tokens) {
    attn.axpy_rows(f, cpu::KvRows{v.data() + p0 * row_bytes, row_bytes, std::min(block_tokens, n_visible - p0), kv_head,
                                  kHeadDim},
                   scores.data() + p0, 1, n_visible, out.data());
  }
  if (f.rotate) attn.hadamard(out.data(), kHeadDim);
  return out;
}

// Formats() in blocks of kBlockTokens, and q4 (whose int8 weight codes attn_output makes per
// tile of up to 32 positions from a block's start, token, head and value group) also in blocks
// of 48 (whole tiles of 32, then tiles of 16) and with value groups other than a head: 32 (two
// groups a head) and 128 (one group over two heads: the second head's values start inside it).
struct Layout {
  KvFormat format;
  int64_t block_tokens;
};
std::vector<Layout> LayoutsWithQ4Tiles() {
  std::vector<Layout> out;
  for (const KvFormat& f : Formats()) {
    out.push_back({f, kBlockTokens});
    if (f.type == KvType::kQ4) out.push_back({f, 48});
  }
  for (const auto& [group, rotate] : {std::pair<int64_t, const char*>{32, "on"}, {128, "off"}}) {
    KvFormat f = *MakeKvFormat("q4", rotate, kHeadsKv, kHeadDim);
    f.group = group;
    out.push_back({f, kBlockTokens});
    out.push_back({f, 48});
  }
  return out;
}

TEST_F(VulkanAttentionTest, AttentionMatchesCpuDecodeAndPrefill) {
  std::mt19937 rng(23);
  struct Case {
    int64_t pos0, T;
  };
  // Decode with a long context spreads the positions over workgroups (attn_reduce adds them);
  // at 131 the first of two splits ends inside a KV block; 2000 x 4 (the most tokens decode
  // takes at once) has 16 splits; at 62 x 4 the tokens' rows span one or two score workgroups
  // (so the fused softmax reads a different number of their stats per row); 37 x 21 ends in a
  // part tile of queries (prefill takes 8 tokens a workgroup here); 1030 x 6 is one split over
  // more KV blocks than attn_output's block-table window holds (its table loads from memory).
  for (const Case c : {Case{70, 1}, Case{0, 5}, Case{40, 24}, Case{1100, 2}, Case{131, 1}, Case{2000, 4},
                       Case{62, 4}, Case{37, 21}, Case{1030, 6}}) {
    const int64_t n_ctx = c.pos0 + c.T;
    for (const auto& [f, block] : LayoutsWithQ4Tiles()) {
      const std::vector<uint8_t> k = EncodeRows(f, RandomRows(n_ctx, rng), n_ctx);
      const std::vector<uint8_t> v = EncodeRows(f, RandomRows(n_ctx, rng), n_ctx);
      const Plane kp = PlaneOf(f, k, n_ctx, block), vp = PlaneOf(f, v, n_ctx, block);
      const std::string name = f.Name() + " g" + std::to_string(f.group) + " b" + std::to_string(block);
      const int64_t row_bytes = f.RowBytes(kRowValues);
      std::vector<float> q(c.T * kHeads * kHeadDim);
      for (float& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
      const vk::Buffer kb = Input(kp.bytes), vb = Input(vp.bytes), table = Input(kp.table), qb = Input(q);
      const vk::Buffer scores = Output(c.T * kHeads * n_ctx * 4), raw = Output(c.T * kHeads * n_ctx * 4);
      const vk::Buffer stats = Output(1 << 16);
      const int64_t partial_floats = (1 << 20) / 4;
      vk::KvView view = View(f, kb, table, kp.row_stride);
      view.v_plane = &vb;
      view.block_tokens = block;
      const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
      const int64_t q_stride = kHeads * kHeadDim;
      // Decode fuses the softmax into the weighted sum when given the stats buffer; prefill
      // never does. Both ways are held to the reference.
      const int64_t n_splits = ops_->AttentionSplits(shape, c.T, c.pos0, partial_floats);
      const bool fuses = ops_->FusesSoftmax(view, shape, c.T, c.pos0, n_splits, stats.bytes() / 4);
      // (Blocks of 48 make splits whole multiples of 96 positions: at long contexts over the
      // fused softmax's 128, so those run softmax.comp.)
      if (block == kBlockTokens) {
        EXPECT_EQ(fuses, c.T <= 4) << name;
      }
      for (const bool fused : {false, true}) {
        // New each time: no result of the other way carries over.
        const vk::Buffer out = Output(c.T * kHeads * kHeadDim * 4);
        const vk::Buffer* stats_in = fused ? &stats : nullptr;
        const Status st = ScoresAndAttention(view, qb, c.T, c.pos0, scores, raw, out, stats_in, partial_floats);
        ASSERT_TRUE(st.ok()) << st.message();
        // Raw scores against the scalar dot products, then the whole attention.
        const std::vector<float> got_raw = Read<float>(raw, c.T * kHeads * n_ctx);
        const std::vector<float> got = Read<float>(out, c.T * kHeads * kHeadDim);
        std::vector<float> want, raw_got, raw_want;
        for (int64_t t = 0; t < c.T; ++t) {
          for (int64_t h = 0; h < kHeads; ++h) {
            const float* qh = q.data() + t * q_stride + h * kHeadDim;
            const std::vector<float> o =
                ReferenceAttention(f, k, v, qh, h / (kHeads / kHeadsKv), c.pos0 + t + 1, block);
            want.insert(want.end(), o.begin(), o.end());
            std::vector<float> qr(qh, qh + kHeadDim);
            if (f.rotate) HadamardTransform(qr.data(), kHeadDim);
            if (f.type == KvType::kF16) cpu::ScalarAttentionKernels().round_f16(qr.data(), kHeadDim);
            std::vector<float> s(c.pos0 + t + 1);
            ScalarScores(f, cpu::KvRows{k.data(), row_bytes, c.pos0 + t + 1, h / (kHeads / kHeadsKv), kHeadDim}, qr,
                         s.data());
            for (int64_t p = 0; p <= c.pos0 + t; ++p) {
              raw_want.push_back(s[p]);
              raw_got.push_back(got_raw[(t * kHeads + h) * n_ctx + p]);
            }
          }
        }
        const double nmse_scores = Nmse(raw_got, raw_want), nmse = Nmse(got, want);
        std::printf("[vulkan attention] %-16s pos0=%-4lld T=%-3lld %s scores NMSE %.3g, output NMSE %.3g\n",
                    name.c_str(), static_cast<long long>(c.pos0), static_cast<long long>(c.T),
                    fused && fuses ? "fused   " : "separate", nmse_scores, nmse);
        ExpectSameWithoutQueryTiles(got_raw, got, view, qb, c.T, c.pos0, scores, stats_in, partial_floats);
        EXPECT_LE(nmse_scores, 1e-12) << name;
        // f16 caches round the weights to f16 (a weight near a rounding boundary may go either way).
        EXPECT_LE(nmse, 1e-9) << name << (fused ? " fused" : " separate");
      }
    }
  }
}

// q4k: a query at position p reads complete K chunks below (p + 1) / C * C (the CPU's integer
// chunk path) and the f16 key rows of its own chunk, then q4k V rows; as the CPU backend does.
TEST_F(VulkanAttentionTest, Q4kAttentionMatchesCpu) {
  std::mt19937 rng(31);
  struct Case {
    int64_t pos0, T;
  };
  for (const char* rotate : {"off", "on"}) {
    auto f = MakeKvFormat("q4k", rotate, kHeadsKv, kHeadDim);
    ASSERT_TRUE(f.ok());
    const int64_t C = f->chunk, B = 2 * C, chunk_bytes = f->ChunkBytes(kRowValues), slot_k = B / C * chunk_bytes;
    const int64_t row_bytes = f->RowBytes(kRowValues), row_stride = (row_bytes + 3) / 4 * 4;
    // 131-190: decode split into 96 or 128 positions, the first split ending inside a block;
    // 126 x 3: the tokens' rows span two or three K chunks (stats entries of the fused softmax).
    // 180 x 21: a tile of queries (8 tokens) whose first tokens see chunk 2 (positions 128-191)
    // through the staged keys and whose last ones see it whole.
    for (const Case c : {Case{70, 1}, Case{0, 5}, Case{100, 40}, Case{300, 2}, Case{127, 1}, Case{131, 1},
                         Case{132, 1}, Case{190, 1}, Case{126, 3}, Case{180, 21}}) {
      const int64_t n_ctx = c.pos0 + c.T, n_blocks = (n_ctx + B - 1) / B, key_pos0 = c.pos0 / C * C;
      std::vector<float> keys = RandomRows(n_ctx, rng), values = RandomRows(n_ctx, rng);
      for (float& x : keys) x = Fp16ToFp32(Fp32ToFp16(x));  // staged keys are f16
      std::vector<uint32_t> slots;
      for (int64_t b = 0; b < n_blocks; ++b) slots.push_back(static_cast<uint32_t>(n_blocks - b));  // slot 0 unused
      // Host copies laid out block by block as the CPU reads them, and the device planes.
      std::vector<uint8_t> k_host(n_blocks * slot_k), v_host(n_blocks * B * row_bytes);
      std::vector<uint8_t> k_dev((n_blocks + 1) * slot_k), v_dev((n_blocks + 1) * B * row_stride);
      for (int64_t ch = 0; ch < n_ctx / C; ++ch) {
        KvQuantizeKChunk(*f, keys.data() + ch * C * kRowValues, kRowValues, k_host.data() + ch * chunk_bytes, kRowValues);
        std::memcpy(k_dev.data() + slots[ch * C / B] * slot_k + (ch * C % B) / C * chunk_bytes,
                    k_host.data() + ch * chunk_bytes, chunk_bytes);
      }
      const std::vector<uint8_t> v_rows = EncodeRows(*f, values, n_ctx);
      for (int64_t p = 0; p < n_ctx; ++p) {
        std::memcpy(v_host.data() + p * row_bytes, v_rows.data() + p * row_bytes, row_bytes);
        std::memcpy(v_dev.data() + (slots[p / B] * B + p % B) * row_stride, v_rows.data() + p * row_bytes, row_bytes);
      }
      std::vector<uint16_t> staged;
      for (int64_t i = key_pos0 * kRowValues; i < n_ctx * kRowValues; ++i) staged.push_back(Fp32ToFp16(keys[i]));
      std::vector<float> q(c.T * kHeads * kHeadDim);
      for (float& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
      const vk::Buffer kb = Input(k_dev), vb = Input(v_dev), table = Input(slots), qb = Input(q), sb = Input(staged);
      const vk::Buffer scores = Output(c.T * kHeads * n_ctx * 4), raw = Output(c.T * kHeads * n_ctx * 4);
      const vk::Buffer stats = Output(1 << 16);
      const int64_t partial_floats = (1 << 20) / 4;
      const vk::KvView view{.k_plane = &kb, .v_plane = &vb, .block_table = &table, .format = *f, .block_tokens = B,
                            .row_stride = row_stride, .k_slot_bytes = slot_k, .keys = &sb, .key_pos0 = key_pos0};
      const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
      const int64_t q_stride = kHeads * kHeadDim;
      const int64_t n_splits = ops_->AttentionSplits(shape, c.T, c.pos0, partial_floats);
      const bool fuses = ops_->FusesSoftmax(view, shape, c.T, c.pos0, n_splits, stats.bytes() / 4);
      EXPECT_EQ(fuses, c.T <= 4);
      for (const bool fused : {false, true}) {  // the softmax fused into the weighted sum (decode) or not
        // New each time: no result of the other way carries over.
        const vk::Buffer out = Output(c.T * kHeads * kHeadDim * 4);
        const vk::Buffer* stats_in = fused ? &stats : nullptr;
        const Status st = ScoresAndAttention(view, qb, c.T, c.pos0, scores, raw, out, stats_in, partial_floats);
        ASSERT_TRUE(st.ok()) << st.message();
        const std::vector<float> got_raw = Read<float>(raw, c.T * kHeads * n_ctx);
        const std::vector<float> got = Read<float>(out, c.T * kHeads * kHeadDim);
        const cpu::AttentionKernels& attn = cpu::ScalarAttentionKernels();
        std::vector<float> want, raw_got, raw_want;
        for (int64_t t = 0; t < c.T; ++t) {
          const int64_t n_vis = c.pos0 + t + 1, q_end = n_vis / C * C;
          for (int64_t h = 0; h < kHeads; ++h) {
            const int64_t kvh = h / (kHeads / kHeadsKv);
            const std::vector<float> qh(q.begin() + t * q_stride + h * kHeadDim,
                                        q.begin() + t * q_stride + (h + 1) * kHeadDim);
            std::vector<float> s(n_vis), o(kHeadDim, 0.0f);
            for (int64_t p0 = 0; p0 < q_end; p0 += B) {
              attn.dot_chunks(*f,
                              cpu::KvChunks{k_host.data() + p0 / C * chunk_bytes, chunk_bytes, std::min(B, q_end - p0),
                                            kvh, kHeadDim},
                              qh.data(), 1, s.data() + p0, n_vis);
            }
            if (n_vis > q_end) {
              std::vector<uint16_t> rows(staged.begin() + (q_end - key_pos0) * kRowValues,
                                         staged.begin() + (n_vis - key_pos0) * kRowValues);
              attn.dot_rows(f->StagingFormat(),
                            cpu::KvRows{reinterpret_cast<const uint8_t*>(rows.data()), 2 * kRowValues, n_vis - q_end,
                                        kvh, kHeadDim},
                            qh.data(), 1, s.data() + q_end, n_vis);
            }
            for (int64_t p = 0; p < n_vis; ++p) {
              raw_want.push_back(s[p]);
              raw_got.push_back(got_raw[(t * kHeads + h) * n_ctx + p]);
            }
            attn.softmax(s.data(), n_vis, n_vis, 1.0f / std::sqrt(static_cast<float>(kHeadDim)), false);
            for (int64_t p0 = 0; p0 < n_vis; p0 += B) {
              attn.axpy_rows(
                  *f, cpu::KvRows{v_host.data() + p0 * row_bytes, row_bytes, std::min(B, n_vis - p0), kvh, kHeadDim},
                  s.data() + p0, 1, n_vis, o.data());
            }
            if (f->RotatesV()) attn.hadamard(o.data(), kHeadDim);
            want.insert(want.end(), o.begin(), o.end());
          }
        }
        const double nmse_scores = Nmse(raw_got, raw_want), nmse = Nmse(got, want);
        std::printf("[vulkan attention] %-10s pos0=%-4lld T=%-3lld %s scores NMSE %.3g, output NMSE %.3g\n",
                    f->Name().c_str(), static_cast<long long>(c.pos0), static_cast<long long>(c.T),
                    fused && fuses ? "fused   " : "separate", nmse_scores, nmse);
        EXPECT_LE(nmse_scores, 1e-12) << f->Name() << " pos0 " << c.pos0;
        EXPECT_LE(nmse, 1e-9) << f->Name() << " pos0 " << c.pos0 << (fused ? " fused" : " separate");
        ExpectSameWithoutQueryTiles(got_raw, got, view, qb, c.T, c.pos0, scores, stats_in, partial_floats);
      }
    }
  }
}

// The output shaders' fused quantization for the o matrix (attn_output with one split,
// attn_reduce with several): the codes and scales must be those QuantizeActs gives for the
// output rows, bit for bit, and the output itself unchanged. Q8_K blocks (256 values) need
// workgroups of 4 heads of 64 (8 query heads over 2 KV heads: Q8_0 and Q8_K run, with subgroup
// trees and without); with 2 heads per workgroup only Q8_0 and Q8_1 fuse (Q8_1 runs). Rotated
// and plain formats, decode (one split, several, fused softmax) and prefill; rows at an offset
// (out_row0 2). Split decode quantizes in attn_reduce and, with split counters, in the split that
// finishes last (one pass): the output must equal the plain run's (attn_reduce, no codes), also
// when the split workgroups run alone with counters (so one pass did write it).
TEST_F(VulkanAttentionTest, OutputCodesAreQuantizeActsOfTheOutput) {
  std::mt19937 rng(43);
  const vk::ActKind kinds[] = {vk::ActKind::kQ8_0, vk::ActKind::kQ8_1, vk::ActKind::kQ8_K};
  EXPECT_FALSE(ops_->QuantizesAttentionOutput({4, 2, 64}, vk::ActKind::kQ8_K));  // 128 values a workgroup
  EXPECT_FALSE(ops_->QuantizesAttentionOutput({2, 2, 16}, vk::ActKind::kQ8_0));  // 16
  EXPECT_FALSE(ops_->QuantizesAttentionOutput({8, 2, 64}, vk::ActKind::kFloat));
  struct Case {
    int64_t pos0, T;
  };
  for (const int64_t n_head : {int64_t{4}, int64_t{8}}) {
    const vk::AttentionShape shape{n_head, kHeadsKv, kHeadDim};
    const int64_t q_stride = n_head * kHeadDim, row0 = 2;
    for (const auto& [type, rotate] : {std::pair{"f16", "off"}, std::pair{"q4", "on"}}) {
      auto f = MakeKvFormat(type, rotate, kHeadsKv, kHeadDim);
      ASSERT_TRUE(f.ok());
      for (const Case c : {Case{70, 1}, Case{1100, 2}, Case{40, 24}}) {
        const int64_t n_ctx = c.pos0 + c.T, rows = row0 + c.T;
        const std::vector<uint8_t> k = EncodeRows(*f, RandomRows(n_ctx, rng), n_ctx);
        const std::vector<uint8_t> v = EncodeRows(*f, RandomRows(n_ctx, rng), n_ctx);
        const Plane kp = PlaneOf(*f, k, n_ctx), vp = PlaneOf(*f, v, n_ctx);
        std::vector<float> q(c.T * q_stride);
        for (float& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
        const vk::Buffer kb = Input(kp.bytes), vb = Input(vp.bytes), table = Input(kp.table), qb = Input(q);
        vk::KvView view = View(*f, kb, table, kp.row_stride);
        view.v_plane = &vb;
        const vk::Ops::AttentionJob job{view, 0, c.T, c.pos0, row0};
        const vk::Buffer scores = Output(c.T * n_head * n_ctx * 4), partials = Output(1 << 20), stats = Output(1 << 16);
        const vk::Ops::AttentionScratch scratch{&scores, c.T * n_head * n_ctx, &partials, (1 << 20) / 4, &stats,
                                                (1 << 16) / 4};
        const vk::Buffer plain = Output(rows * q_stride * 4);
        ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                      return ops_->AttentionBatch(rec, shape, qb, q_stride, plain, q_stride, {&job, 1}, scratch);
                    }).ok());
        // Quantizing, split decode adds up in one pass (the last split writes and quantizes).
        const vk::Buffer counters = Output(256 * 4);
        vk::Ops::AttentionScratch one_pass = scratch;
        one_pass.counters = &counters;
        one_pass.counter_words = 256;
        const std::vector<float> want_out = Read<float>(plain, rows * q_stride);
        const int64_t n_splits = ops_->AttentionSplits(shape, c.T, c.pos0, (1 << 20) / 4);
        if (n_splits > 1) {
          // The split workgroups alone, given counters, write the output: no attn_reduce runs
          // here (the output starts as NaN), yet it equals attn_reduce's sums.
          const vk::Buffer alone = Output(rows * q_stride * 4);
          std::fill_n(reinterpret_cast<float*>(alone.mapped()), rows * q_stride, std::nanf(""));
          const bool fused = ops_->FusesSoftmax(view, shape, c.T, c.pos0, n_splits, (1 << 16) / 4);
          const Status st = Run([&](vk::Recorder& rec) -> Status {
            KVFS_RETURN_IF_ERROR(ops_->AttnScores(rec, view, shape, qb, q_stride, 0, c.T, c.pos0, scores,
                                                  fused ? &stats : nullptr));
            rec.Barrier();
            if (!fused) {
              KVFS_RETURN_IF_ERROR(ops_->Softmax(rec, scores, n_head, c.T, c.pos0, n_ctx,
                                                 1.0f / std::sqrt(static_cast<float>(kHeadDim)),
                                                 f->type == KvType::kF16));
              rec.Barrier();
            }
            return ops_->AttnOutput(rec, view, shape, scores, c.T, c.pos0, alone, q_stride, row0, n_splits, &partials,
                                    fused ? &stats : nullptr, {}, nullptr, &counters);
          });
          ASSERT_TRUE(st.ok()) << st.message();
          const std::vector<float> got = Read<float>(alone, rows * q_stride);
          EXPECT_TRUE(std::equal(got.begin() + row0 * q_stride, got.end(), want_out.begin() + row0 * q_stride))
              << n_head << " heads, " << f->Name() << ", pos0 " << c.pos0 << ": one pass";
        }
        for (const vk::ActKind kind : kinds) {
          const bool fuses = ops_->QuantizesAttentionOutput(shape, kind);
          EXPECT_EQ(fuses, kind != vk::ActKind::kQ8_K || n_head == 8);
          // (Fewer pipelines to compile: lavapipe takes about a second for each.)
          if (!fuses || (n_head == 4) != (kind == vk::ActKind::kQ8_1)) continue;
          struct Way {
            bool trees, counters;
          };
          for (const Way way : {Way{true, true}, Way{false, true}, Way{true, false}}) {
            const bool trees = way.trees;
            if (!trees && n_head == 4) continue;
            if (!way.counters && n_splits == 1) continue;  // the same dispatches as with counters
            ops_->set_subgroup_trees(trees);
            const vk::Buffer out = Output(rows * q_stride * 4);
            const vk::Buffer codes = Output(rows * q_stride), aux = Output(rows * q_stride / 32 * 16);
            const vk::Buffer want_codes = Output(rows * q_stride), want_aux = Output(rows * q_stride / 32 * 16);
            const vk::OutputCodes oc{kind, {&codes, &aux}};
            const Status st = Run([&](vk::Recorder& rec) -> Status {
              KVFS_RETURN_IF_ERROR(
                  ops_->AttentionBatch(rec, shape, qb, q_stride, out, q_stride, {&job, 1},
                                       way.counters ? one_pass : scratch, &oc));
              rec.Barrier();
              return ops_->QuantizeActs(rec, kind, out, q_stride, q_stride, rows, {&want_codes, &want_aux});
            });
            ASSERT_TRUE(st.ok()) << st.message();
            const std::string what =
                fmt::format("{} heads, {}, pos0 {} T {}, kind {}, subgroup trees {}, {}", n_head, f->Name(), c.pos0,
                            c.T, static_cast<int>(kind), trees, way.counters ? "one pass" : "attn_reduce");
            EXPECT_EQ(Read<float>(out, rows * q_stride), want_out) << what;
            const size_t code_words = static_cast<size_t>(q_stride / 4), units = static_cast<size_t>(q_stride / 32);
            const std::vector<uint32_t> got_c = Read<uint32_t>(codes, rows * code_words);
            const std::vector<uint32_t> want_c = Read<uint32_t>(want_codes, rows * code_words);
            EXPECT_TRUE(std::equal(got_c.begin() + row0 * code_words, got_c.end(), want_c.begin() + row0 * code_words))
                << what;
            const std::vector<float> got_a = Read<float>(aux, rows * units * 4);
            const std::vector<float> want_a = Read<float>(want_aux, rows * units * 4);
            EXPECT_TRUE(std::equal(got_a.begin() + row0 * units * 4, got_a.end(), want_a.begin() + row0 * units * 4))
                << what;
          }
          ops_->set_subgroup_trees(true);
        }
      }
    }
  }
}

// Several sequences' attention recorded side by side (the backend's batched passes): each job's
// rows land in their own part of the shared scratch, so every output equals that job's attention
// run alone with the same scratch sizes, bit for bit; with scratch too small for all jobs at once
// they go in rounds. Jobs mix formats, decode (split, fused) and prefill (one split, separate
// softmax), each with its own KV planes and q/out rows of one pass.
TEST_F(VulkanAttentionTest, BatchedAttentionEqualsEachSequenceAlone) {
  std::mt19937 rng(41);
  struct Job {
    const char* type;
    const char* rotate;
    int64_t pos0, T;
  };
  const Job jobs[] = {{"f16", "off", 70, 1}, {"q8", "on", 300, 1},  {"q4", "on", 1100, 2},
                      {"q4", "off", 40, 24}, {"q8", "off", 0, 5},   {"f16", "off", 2000, 4},
                      {"q4", "on", 131, 1}};
  const int64_t q_stride = kHeads * kHeadDim;
  const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
  struct Planes {
    vk::Buffer k, v, table;
  };
  std::vector<Planes> planes;
  planes.reserve(std::size(jobs));  // the views point into it
  std::vector<vk::Ops::AttentionJob> batch;
  int64_t rows = 0;
  for (const Job& j : jobs) {
    auto f = MakeKvFormat(j.type, j.rotate, kHeadsKv, kHeadDim);
    ASSERT_TRUE(f.ok());
    const int64_t n_ctx = j.pos0 + j.T;
    const std::vector<uint8_t> k = EncodeRows(*f, RandomRows(n_ctx, rng), n_ctx);
    const std::vector<uint8_t> v = EncodeRows(*f, RandomRows(n_ctx, rng), n_ctx);
    const Plane kp = PlaneOf(*f, k, n_ctx), vp = PlaneOf(*f, v, n_ctx);
    const Planes& pl = planes.emplace_back(Planes{Input(kp.bytes), Input(vp.bytes), Input(kp.table)});
    vk::KvView view = View(*f, pl.k, pl.table, kp.row_stride);
    view.v_plane = &pl.v;
    batch.push_back({view, rows, j.T, j.pos0, rows});
    rows += j.T;
  }
  std::vector<float> q(rows * q_stride);
  for (float& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  const vk::Buffer qb = Input(q);
  struct Sizes {
    int64_t scores, partials, stats;  // floats
    int64_t counters;                 // words
  };
  // The split counters, used again and again: each run must leave them 0.
  const vk::Buffer counters = Output(4096 * 4);
  // All jobs at once; then scratch for about one long job at a time (rounds), whose 6 counters
  // take a job of 2 tokens (4 counters) in one pass but not one of 4 (attn_reduce adds up); then
  // no counters. The jobs alone run without counters (attn_reduce), so one pass must give its
  // sums bit for bit.
  for (const Sizes sz : {Sizes{1 << 20, 1 << 18, 1 << 14, 4096}, Sizes{40000, 20000, 1100, 6},
                         Sizes{1 << 20, 1 << 18, 1 << 14, 4096}, Sizes{40000, 20000, 1100, 0}}) {
    const vk::Buffer scores = Output(sz.scores * 4), partials = Output(sz.partials * 4), stats = Output(sz.stats * 4);
    const vk::Buffer out = Output(rows * q_stride * 4);
    const vk::Ops::AttentionScratch scratch{&scores,   sz.scores, &partials, sz.partials, &stats, sz.stats,
                                            sz.counters > 0 ? &counters : nullptr, sz.counters};
    const Status st = Run([&](vk::Recorder& rec) {
      return ops_->AttentionBatch(rec, shape, qb, q_stride, out, q_stride, batch, scratch);
    });
    ASSERT_TRUE(st.ok()) << st.message();
    const std::vector<float> got = Read<float>(out, rows * q_stride);
    for (size_t i = 0; i < batch.size(); ++i) {
      const vk::Ops::AttentionJob& j = batch[i];
      const vk::Buffer alone = Output(rows * q_stride * 4);
      const vk::Buffer s1 = Output(sz.scores * 4), p1 = Output(sz.partials * 4), st1 = Output(sz.stats * 4);
      ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                    return ops_->Attention(rec, j.kv, shape, qb, q_stride, j.q_row0, j.n_tokens, j.pos0, s1, p1,
                                           sz.partials, alone, q_stride, j.out_row0, &st1, sz.stats);
                  }).ok());
      const std::vector<float> want = Read<float>(alone, rows * q_stride);
      const size_t from = static_cast<size_t>(j.out_row0 * q_stride), n = static_cast<size_t>(j.n_tokens * q_stride);
      EXPECT_TRUE(std::equal(got.begin() + from, got.begin() + from + n, want.begin() + from))
          << jobs[i].type << " rotate " << jobs[i].rotate << " pos0 " << j.pos0 << " T " << j.n_tokens
          << ", scratch " << sz.scores << " floats, " << sz.counters << " counters";
    }
    const std::vector<uint32_t> left = Read<uint32_t>(counters, 4096);
    EXPECT_EQ(std::count(left.begin(), left.end(), 0u), 4096) << "counters left non-zero";
  }
  // A job whose scores alone exceed the scratch is refused, not truncated.
  const vk::Buffer scores = Output(4000 * 4), partials = Output(1 << 16), out = Output(rows * q_stride * 4);
  const vk::Ops::AttentionScratch small{&scores, 4000, &partials, (1 << 16) / 4, nullptr, 0};
  const Status st = Run([&](vk::Recorder& rec) {
    return ops_->AttentionBatch(rec, shape, qb, q_stride, out, q_stride, batch, small);
  });
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.message();
}

// Jobs that share a pipeline and KV planes are recorded as one attn_scores and one attn_output
// dispatch (their calls in a table of the pass, each workgroup finding its own): the outputs
// must be those of a dispatch per job, bit for bit, for decode jobs split over positions (with
// the splits' sums added in one pass by counters, and by attn_reduce without them) and prefill
// jobs of several query tiles (24 and 12 tokens: merged with 3 and 2 tiles of scores along z),
// at different positions of one sequence; and there must be fewer dispatches. With the pass's
// table space used up, the calls are recorded one by one: the same outputs, as many dispatches
// as alone.
TEST_F(VulkanAttentionTest, MergedJobsEqualADispatchPerJob) {
  std::mt19937 rng(43);
  ASSERT_TRUE(rec_->EnableProfiling().ok());
  struct Job {
    int64_t pos0, T;
  };
  const Job jobs[] = {{70, 1}, {300, 1}, {1100, 2}, {40, 24}, {0, 5}, {2000, 4}, {131, 1}, {1500, 1}, {600, 12}};
  const int64_t n_ctx = 2004, q_stride = kHeads * kHeadDim;
  const vk::AttentionShape shape{kHeads, kHeadsKv, kHeadDim};
  for (const auto& [type, rotate] : {std::pair{"f16", "off"}, std::pair{"q4", "on"}, std::pair{"q8", "off"}}) {
    auto f = MakeKvFormat(type, rotate, kHeadsKv, kHeadDim);
    ASSERT_TRUE(f.ok());
    const Plane kp = PlaneOf(*f, EncodeRows(*f, RandomRows(n_ctx, rng), n_ctx), n_ctx);
    const Plane vp = PlaneOf(*f, EncodeRows(*f, RandomRows(n_ctx, rng), n_ctx), n_ctx);
    const vk::Buffer k = Input(kp.bytes), v = Input(vp.bytes), table = Input(kp.table);
    vk::KvView view = View(*f, k, table, kp.row_stride);
    view.v_plane = &v;
    std::vector<vk::Ops::AttentionJob> batch;
    int64_t rows = 0;
    for (const Job& j : jobs) {
      batch.push_back({view, rows, j.T, j.pos0, rows});
      rows += j.T;
    }
    std::vector<float> q(rows * q_stride);
    for (float& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    const vk::Buffer qb = Input(q);
    const vk::Buffer counters = Output(4096 * 4);
    for (const bool with_counters : {true, false}) {
      // 0: a dispatch per job; 1: merged; 2: merged, but no table space left in the pass.
      std::vector<float> outs[3];
      int64_t dispatches[3] = {0, 0, 0};
      for (int merged = 0; merged < 3; ++merged) {
        ops_->set_merge_jobs(merged >= 1);
        const vk::Buffer scores = Output((1 << 20) * 4), partials = Output((1 << 18) * 4), stats = Output((1 << 14) * 4);
        const vk::Buffer out = Output(rows * q_stride * 4);
        const vk::Ops::AttentionScratch scratch{&scores,  1 << 20, &partials, 1 << 18, &stats, 1 << 14,
                                                with_counters ? &counters : nullptr, with_counters ? 4096 : 0};
        rec_->TakeProfileReport();
        ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                      if (merged == 2) {  // fill the table space
                        const std::vector<uint8_t> fill(vk::Recorder::kPassTableBytes - 64, 1);
                        KVFS_ASSIGN_OR_RETURN(const int64_t at, rec.PassTable(fill, 4));
                        if (at != 0) return Internal("the filling table is not the pass's first");
                      }
                      return ops_->AttentionBatch(rec, shape, qb, q_stride, out, q_stride, batch, scratch);
                    }).ok());
        const std::string report = rec_->TakeProfileReport();
        const size_t at = report.find(" dispatches,");
        ASSERT_NE(at, std::string::npos) << report;
        size_t begin = at;
        while (begin > 0 && std::isdigit(static_cast<unsigned char>(report[begin - 1]))) --begin;
        dispatches[merged] = std::stoll(report.substr(begin, at - begin));
        outs[merged] = Read<float>(out, rows * q_stride);
      }
      ops_->set_merge_jobs(true);
      const std::string what = fmt::format("{} rotate {}, {}", type, rotate, with_counters ? "counters" : "attn_reduce");
      EXPECT_TRUE(outs[0] == outs[1]) << what << ": NMSE " << Nmse(outs[1], outs[0]);
      EXPECT_TRUE(outs[0] == outs[2]) << what << ", table space used up: NMSE " << Nmse(outs[2], outs[0]);
      EXPECT_EQ(dispatches[2], dispatches[0]) << what << ", table space used up";
      // Alone: a scores and an output dispatch per job at least. Merged: the decode jobs' scores,
      // their sums split or not, the prompts of one tile shape and all softmaxes share theirs.
      EXPECT_GE(dispatches[0], 2 * static_cast<int64_t>(std::size(jobs))) << what;
      EXPECT_LT(dispatches[1], dispatches[0] - 6) << what;
    }
  }
}

}  // namespace
}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
