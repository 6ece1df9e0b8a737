// The new K/V rows of a pass on their way to the host blocks (written by kv_store into the
// write-back buffer, or copied there), and the kv_store and attention dispatches that the
// sequences of a KV arena share in a batched pass. Runs on lavapipe in CI; skips without a
// Vulkan device.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <string>

#include "tests/engine/vulkan_backend_fixture.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

using testing::Nmse;
using testing::VulkanBackendTest;

// The "N copies" of a Vulkan profile's summary line (-1 when there is none).
int64_t ProfileCopies(const std::string& report) {
  const size_t at = report.find(" copies:");
  if (at == std::string::npos) return -1;
  size_t begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(report[begin - 1]))) --begin;
  return std::stoll(report.substr(begin, at - begin));
}

// Rows (and q4k chunks and staged keys) of positions [0, n_tokens) that differ between two
// sequences' host blocks.
int64_t HostRowsDiffering(const SequenceKv& a, const SequenceKv& b) {
  const KvLayout& L = a.layout();
  const bool q4k = L.format.KeysByChannel();
  const auto row = static_cast<size_t>(L.row_bytes());
  int64_t differing = a.n_tokens() != b.n_tokens();
  for (int64_t l = 0; l < L.n_layer; ++l) {
    for (int64_t p = 0; p < std::min(a.n_tokens(), b.n_tokens()); ++p) {
      differing += std::memcmp(a.v_row(l, p), b.v_row(l, p), row) != 0;
      if (!q4k) differing += std::memcmp(a.k_row(l, p), b.k_row(l, p), row) != 0;
    }
    if (!q4k) continue;
    const int64_t C = L.format.chunk, complete = std::min(a.n_tokens(), b.n_tokens()) / C;
    for (int64_t c = 0; c < complete; ++c) {
      differing += std::memcmp(a.k_chunk(l, c), b.k_chunk(l, c), static_cast<size_t>(L.chunk_bytes())) != 0;
    }
    const int64_t staged = std::min(a.n_tokens(), b.n_tokens()) - complete * C;
    differing += std::memcmp(a.k_staging(l, complete * C), b.k_staging(l, complete * C),
                             static_cast<size_t>(staged * L.row_values() * 2)) != 0;
  }
  return differing;
}

// The new K/V rows reach the host blocks through the write-back buffer. By default kv_store
// writes them there as it stores them; with kv_rows_by_kv_store off, and with the separate ops,
// they are copied there at the end of the pass. The host blocks must hold the same bytes all
// three ways (row formats' K and V rows, q4k's chunks, staged keys and V rows), for sequences
// of every format batched together, prompts in micro-batches, a q4k prompt that starts inside a
// chunk and completes it, and decode steps; and a decode pass records no copy but the logits'.
TEST_F(VulkanBackendTest, KvStoreWritesTheHostRowsTheCopiesWould) {
  VulkanOptions mirror_options;
  mirror_options.max_binding_bytes = 2 << 20;  // micro-batches of 16 tokens
  mirror_options.profile = true;
  // Decode's softmax inside the weighted sum differs from softmax.comp in the last bits of its
  // sum beyond 64 positions (docs/performance.md); the separate ops' softmax for all three.
  mirror_options.tuning.fuse_softmax = false;
  VulkanOptions copy_options = mirror_options, separate_options = mirror_options;
  copy_options.kv_rows_by_kv_store = false;
  separate_options.fuse_ops = false;
  const char* names[] = {"kv_store", "copies", "separate ops"};
  std::unique_ptr<Backend> backends[3];
  for (int which = 0; which < 3; ++which) {
    auto b = MakeVulkanBackend(*model_, which == 0 ? mirror_options : which == 1 ? copy_options : separate_options);
    ASSERT_TRUE(b.ok()) << b.status().message();
    backends[which] = std::move(*b);
  }
  std::vector<TokenId> text = prompt_;
  while (text.size() < 90) text.insert(text.end(), prompt_.begin() + 1, prompt_.end());
  // Row formats in blocks of 16 (runs of rows across blocks); q4k in blocks of one and of two
  // 64-key chunks.
  const std::pair<const char*, int64_t> formats[] = {{"f16", 16}, {"q8", 16}, {"q4", 16}, {"q4k", 64}, {"q4k", 128}};
  const int64_t n_decode = 3;
  std::vector<std::unique_ptr<SequenceKv>> kvs[3];
  int64_t decode_copies[3] = {0, 0, 0};
  for (int which = 0; which < 3; ++which) {
    Backend& backend = *backends[which];
    for (const auto& [type, block] : formats) kvs[which].push_back(std::make_unique<SequenceKv>(Layout(type, block), 256));
    // Two prompts (the second from position 34 - 3 i on: inside q4k's first chunk, completing
    // it), then decode steps, every sequence in each pass.
    std::vector<SequenceStep> steps(kvs[which].size());
    for (size_t i = 0; i < steps.size(); ++i) {
      steps[i] = {kvs[which][i].get(), std::span<const TokenId>(text).first(34 - 3 * i), false};
    }
    Logits lg;
    ASSERT_TRUE(backend.Forward(steps, lg).ok());
    for (size_t i = 0; i < steps.size(); ++i) steps[i].tokens = std::span<const TokenId>(text).subspan(34 - 3 * i, 50);
    ASSERT_TRUE(backend.Forward(steps, lg).ok());
    backend.TakeProfileReport();
    const TokenId next = 42;
    for (int64_t d = 0; d < n_decode; ++d) {
      for (SequenceStep& s : steps) s.tokens = std::span<const TokenId>(&next, 1);
      ASSERT_TRUE(backend.Forward(steps, lg).ok());
    }
    decode_copies[which] = ProfileCopies(backend.TakeProfileReport());
  }
  EXPECT_EQ(decode_copies[0], n_decode) << "decode passes with the rows written by kv_store: the logits' copy alone";
  EXPECT_GT(decode_copies[1], n_decode) << "kv_rows_by_kv_store off: the rows are copied";
  EXPECT_GT(decode_copies[2], n_decode) << "separate ops: the rows are copied";
  for (int which = 1; which < 3; ++which) {
    for (size_t i = 0; i < std::size(formats); ++i) {
      EXPECT_EQ(HostRowsDiffering(*kvs[0][i], *kvs[which][i]), 0)
          << formats[i].first << " in blocks of " << formats[i].second << ": host rows (or chunks) that differ "
          << "between kv_store's and " << names[which];
    }
  }
}

// Batched, the sequences of a pass that share a KV arena (format and block size) share each
// layer's kv_store (a table of rows) and, where their calls are specialized alike, their
// attn_scores and attn_output dispatches (a table of calls), instead of one each per sequence.
// The logits and host rows must be those of one dispatch per sequence side by side
// (merge_sequences off) and of one sequence after another (batch_attention off), bit for bit:
// prompts of 12 tokens in micro-batches of 65 (two sequences of an arena side by side: merged
// prompt calls of two query tiles each; the last prompt split over two micro-batches), then
// decode steps of all of them, whose scores make the new keys themselves (f16 and q4k). Every
// decode context stays under one 128-position split, so a decode pass must record each of the
// three once per arena and layer.
TEST_F(VulkanBackendTest, SequencesOfAnArenaShareTheirAttentionDispatches) {
  VulkanOptions merged_options;
  merged_options.max_binding_bytes = 8 << 20;  // micro-batches of 65 tokens
  merged_options.profile = true;
  VulkanOptions side_by_side_options = merged_options, serial_options = merged_options;
  side_by_side_options.merge_sequences = false;
  serial_options.batch_attention = false;
  const char* names[] = {"merged", "side by side", "one after another"};
  constexpr int kWays = 3;
  std::unique_ptr<Backend> backends[kWays];
  for (int which = 0; which < kWays; ++which) {
    auto b = MakeVulkanBackend(*model_, which == 0   ? merged_options
                                        : which == 1 ? side_by_side_options
                                                     : serial_options);
    ASSERT_TRUE(b.ok()) << b.status().message();
    backends[which] = std::move(*b);
  }
  // Three arenas, two sequences each: f16 in blocks of 16, q4k in blocks of 64, f16 in blocks of 32.
  const std::pair<const char*, int64_t> formats[] = {{"f16", 16}, {"f16", 16}, {"q4k", 64},
                                                     {"q4k", 64}, {"f16", 32}, {"f16", 32}};
  const int64_t n_arenas = 3, n_decode = 3, n_prompt = 12;
  const char* shaders[] = {"kv_store", "attn_scores", "attn_output"};
  std::vector<TokenId> text = prompt_;
  while (static_cast<int64_t>(text.size()) < 4 * n_prompt) text.insert(text.end(), prompt_.begin() + 1, prompt_.end());
  std::vector<std::unique_ptr<SequenceKv>> kvs[kWays];
  std::vector<float> logits[kWays];
  std::map<std::string, int> prompt_dispatches[kWays], decode_dispatches[kWays];
  for (int which = 0; which < kWays; ++which) {
    Backend& backend = *backends[which];
    for (const auto& [type, block] : formats) kvs[which].push_back(std::make_unique<SequenceKv>(Layout(type, block), 256));
    std::vector<SequenceStep> steps(kvs[which].size());
    for (size_t i = 0; i < steps.size(); ++i) {  // every row's logits
      steps[i] = {kvs[which][i].get(), std::span<const TokenId>(text).subspan(3 * i, n_prompt), true};
    }
    Logits lg;
    ASSERT_TRUE(backend.Forward(steps, lg).ok());
    logits[which] = lg.data;
    for (const auto& [label, n] : testing::ProfileDispatches(backend.TakeProfileReport())) {
      prompt_dispatches[which][label.substr(0, label.find(' '))] += n;
    }
    const TokenId next[] = {42, 7, 1000};
    for (int64_t d = 0; d < n_decode; ++d) {
      for (SequenceStep& s : steps) s = {s.kv, std::span<const TokenId>(&next[d], 1), false};
      ASSERT_TRUE(backend.Forward(steps, lg).ok());
      logits[which].insert(logits[which].end(), lg.data.begin(), lg.data.end());
    }
    for (const auto& [label, n] : testing::ProfileDispatches(backend.TakeProfileReport())) {
      decode_dispatches[which][label.substr(0, label.find(' '))] += n;
    }
  }
  const int64_t n_seq = static_cast<int64_t>(std::size(formats));
  for (const char* shader : shaders) {
    // attn_output may be its subgroup variant.
    auto count = [&](int which) {
      return decode_dispatches[which][shader] + decode_dispatches[which][std::string(shader) + "_sg"];
    };
    EXPECT_EQ(count(0), n_decode * hp().n_layer * n_arenas) << shader << ": once per arena and layer";
    EXPECT_EQ(count(1), n_decode * hp().n_layer * n_seq) << shader << ": once per sequence and layer";
  }
  // The prompt pass: kv_store once per arena and micro-batch; attention merged for the pairs of
  // 12-token pieces (the split last prompt's two pieces have other tiles).
  EXPECT_EQ(prompt_dispatches[0]["kv_store"], 4 * hp().n_layer) << "3 arenas in the first micro-batch, 1 in the second";
  EXPECT_LT(prompt_dispatches[0]["attn_scores"], prompt_dispatches[1]["attn_scores"]) << "merged prompt scores";
  EXPECT_EQ(prompt_dispatches[0]["softmax"], 2 * hp().n_layer) << "one softmax a micro-batch and layer";
  for (int which = 1; which < kWays; ++which) {
    ASSERT_EQ(logits[0].size(), logits[which].size());
    EXPECT_TRUE(logits[0] == logits[which])
        << "merged and " << names[which] << ": NMSE " << Nmse(logits[0].data(), logits[which].data(), logits[0].size());
    for (size_t i = 0; i < std::size(formats); ++i) {
      EXPECT_EQ(HostRowsDiffering(*kvs[0][i], *kvs[which][i]), 0)
          << "sequence " << i << " (" << formats[i].first << "): host rows that differ between merged and "
          << names[which];
    }
  }
}

// A pass whose write-back would not fit one storage binding has its rows copied (kv_store binds
// the whole buffer); the passes after it write them from kv_store again. The host rows of the
// copied pass equal the device's.
TEST_F(VulkanBackendTest, AWriteBackOverOneBindingIsCopiedForThatPassOnly) {
  VulkanOptions options;
  options.max_binding_bytes = 512 << 10;  // f16 rows: 1 KiB a token for both layers and planes
  options.profile = true;
  auto backend_or = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(backend_or.ok()) << backend_or.status().message();
  Backend& backend = **backend_or;
  SequenceKv small(Layout("f16", 256), 1024), large(Layout("f16", 256), 1024);
  const TokenId next = 42;
  std::vector<TokenId> text;
  while (text.size() < 600) text.insert(text.end(), prompt_.begin() + 1, prompt_.end());
  text.resize(600);
  Step(backend, small, prompt_);
  backend.TakeProfileReport();
  Step(backend, small, std::span<const TokenId>(&next, 1));
  EXPECT_EQ(ProfileCopies(backend.TakeProfileReport()), 1) << "a decode pass before";
  const KvLayout& L = large.layout();
  Step(backend, large, text);  // 600 KiB of rows
  // The logits, and per layer and plane a copy of each block's run of rows (3 blocks).
  EXPECT_EQ(ProfileCopies(backend.TakeProfileReport()), 1 + L.n_layer * 2 * 3) << "the long prompt's rows are copied";
  Step(backend, small, std::span<const TokenId>(&next, 1));
  EXPECT_EQ(ProfileCopies(backend.TakeProfileReport()), 1) << "a decode pass after";
  // The copied rows in the host blocks are the device's (blocks of 256 f16 rows: K then V per layer).
  for (int64_t b = 0; b * 256 < large.n_tokens(); ++b) {
    auto copy = VulkanReadBlockCopy(backend, large.block(b)->serial);
    ASSERT_TRUE(copy.ok()) << copy.status().message();
    const int64_t rows = std::min<int64_t>(256, large.n_tokens() - b * 256), plane = 256 * L.row_bytes();
    int64_t differing = 0;
    for (int64_t l = 0; l < L.n_layer; ++l) {
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* k = copy->data() + (2 * l) * plane + r * L.row_bytes();
        const uint8_t* v = copy->data() + (2 * l + 1) * plane + r * L.row_bytes();
        differing += std::memcmp(k, large.k_row(l, b * 256 + r), static_cast<size_t>(L.row_bytes())) != 0;
        differing += std::memcmp(v, large.v_row(l, b * 256 + r), static_cast<size_t>(L.row_bytes())) != 0;
      }
    }
    EXPECT_EQ(differing, 0) << "block " << b << ": host rows that differ from the device's";
  }
}

}  // namespace
}  // namespace kvfs
