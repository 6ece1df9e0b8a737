// The Vulkan backend as a whole: logits close to the CPU backend's, a batch equal to each
// sequence alone, and the device KV copies following the host blocks: rows written by another
// backend, blocks shared through the pool or copied into new blocks, truncation, eviction under
// a small device KV budget, weights split across bindings and micro-batches. Runs on lavapipe
// in CI; skips without a Vulkan device.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/vulkan_tuning.h"
#include "engine/model/quants.h"
#include "tests/engine/vulkan_backend_fixture.h"
#include "tests/test_support.h"

#if defined(KVFS_VULKAN)
#include "engine/backend/vulkan/device_weights.h"
#include "engine/backend/vulkan/vk_transfer.h"
#include "engine/backend/vulkan/weight_layout.h"
#endif

namespace kvfs {
namespace {

using testing::Nmse;
using testing::VulkanBackendTest;


// Against the scalar CPU table: both backends then quantize activations and K/V identically and
// differ only in the order of float sums (the SIMD tables reorder them too, which can flip a
// 4-bit KV code and move these random-weight logits by more).
TEST_F(VulkanBackendTest, LogitsMatchTheCpuBackend) {
  auto cpu = MakeCpuBackend(*model_, CpuOptions{2, &cpu::ScalarKernels()});
  const int64_t V = hp().n_vocab, n = static_cast<int64_t>(prompt_.size());
  for (const char* type : {"f16", "q8", "q4"}) {
    SequenceKv kv_cpu(Layout(type), 256), kv_gpu(Layout(type), 256);
    Logits a, b;
    SequenceStep sa{&kv_cpu, prompt_, true}, sb{&kv_gpu, prompt_, true};
    ASSERT_TRUE(cpu->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
    ASSERT_TRUE(vulkan_->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
    ASSERT_EQ(a.data.size(), b.data.size());
    const double prompt_nmse = Nmse(b.data.data(), a.data.data(), n * V);
    const TokenId next = 42;
    const std::vector<float> da = Step(*cpu, kv_cpu, std::span<const TokenId>(&next, 1));
    const std::vector<float> db = Step(*vulkan_, kv_gpu, std::span<const TokenId>(&next, 1));
    const double decode_nmse = Nmse(db.data(), da.data(), V);
    std::printf("[vulkan backend] kv %s: prompt logits NMSE %.3g, decode NMSE %.3g\n", type, prompt_nmse, decode_nmse);
    EXPECT_LE(prompt_nmse, 1e-8) << type;
    EXPECT_LE(decode_nmse, 1e-8) << type;
  }
}

// A GPU's matrix-vector shape (VulkanTuning resolved for a discrete device: workgroups of 32
// invocations, 2 rows a slot) on whatever device runs the tests, for every KV format: a prompt
// and decode steps keep the CPU backend's logits. Decode attention stays in the fixture's splits
// of 128 (a finer split adds its partial sums in another order; VulkanAttentionTest checks
// splits). Under the ctest vulkan_subgroup32 (lavapipe built for 32 lanes) this is an NVIDIA
// GPU's shape: warp-sized subgroups, and slots of one subgroup whose sums go by shuffles alone;
// under vulkan_subgroup64, AMD's wave64, each slot half a subgroup.
TEST_F(VulkanBackendTest, GpuMatvecShapeMatchesTheCpuBackend) {
  VulkanOptions options;
  options.tuning = ResolvedTuning(VulkanTuning{}, "discrete");
  options.tuning.attention_split = VulkanTuning::kDefaultAttentionSplit;
  options.profile = true;  // to see the shape recorded
  ASSERT_EQ(options.tuning.matvec.group, VulkanMatvecShape::kGpuGroup);
  auto gpu = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  auto cpu = MakeCpuBackend(*model_, CpuOptions{2, &cpu::ScalarKernels()});
  const int64_t V = hp().n_vocab, n = static_cast<int64_t>(prompt_.size());
  for (const char* type : {"f16", "q8", "q4", "q4k"}) {
    SequenceKv kv_cpu(Layout(type, 64), 256), kv_gpu(Layout(type, 64), 256);
    Logits a, b;
    SequenceStep sa{&kv_cpu, prompt_, true}, sb{&kv_gpu, prompt_, true};
    ASSERT_TRUE(cpu->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
    ASSERT_TRUE((*gpu)->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
    ASSERT_EQ(a.data.size(), b.data.size());
    const double prompt_nmse = Nmse(b.data.data(), a.data.data(), n * V);
    double decode_nmse = 0.0;
    for (int step = 0; step < 4; ++step) {
      const TokenId next = static_cast<TokenId>(42 + 5 * step);
      const std::vector<float> da = Step(*cpu, kv_cpu, std::span<const TokenId>(&next, 1));
      const std::vector<float> db = Step(**gpu, kv_gpu, std::span<const TokenId>(&next, 1));
      ASSERT_EQ(da.size(), db.size());
      decode_nmse = std::max(decode_nmse, Nmse(db.data(), da.data(), V));
      // The decode step's matrix-vector pipelines have workgroups of the GPU's 32 invocations.
      int matvecs = 0;
      for (const auto& [label, count] : testing::ProfilePipelineDispatches((*gpu)->TakeProfileReport())) {
        if (label.rfind("matvec_quant", 0) != 0) continue;
        matvecs += count;
        EXPECT_NE(label.find(" [32,"), std::string::npos) << label;
      }
      EXPECT_GT(matvecs, 0);
    }
    std::printf("[vulkan backend] GPU matvec shape, kv %s: prompt logits NMSE %.3g, decode NMSE %.3g (worst of 4)\n", type,
                prompt_nmse, decode_nmse);
    EXPECT_LE(prompt_nmse, 1e-8) << type;
    EXPECT_LE(decode_nmse, 1e-8) << type;
  }
}

// q4k (keys per channel in chunks of 64 tokens): passes that end inside a chunk, complete one,
// start in the middle of one (the staged f16 keys uploaded from the host) and run token by token
// across chunk and block boundaries give the CPU's logits, and leave the host blocks (chunks, V
// rows, staged keys) as the CPU backend leaves them, so either backend can continue.
TEST_F(VulkanBackendTest, Q4kMatchesTheCpuBackend) {
  auto cpu = MakeCpuBackend(*model_, CpuOptions{2, &cpu::ScalarKernels()});
  // Decode attention in one workgroup per head, as the prompt passes: a split's partial sums
  // are added in another order than the CPU's (VulkanAttentionTest checks them against it), and
  // one ulp there can move an int8 activation code of the next matrix, which these
  // random-weight layers then carry into every later K and V row. With 4096 positions per split
  // this test checks the q4k chunk and block handling it is about, bit for bit.
  VulkanOptions options;
  options.tuning.attention_split = 4096;
  auto vulkan_or = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(vulkan_or.ok()) << vulkan_or.status().message();
  Backend* const vulkan = vulkan_or->get();
  const int64_t V = hp().n_vocab;
  std::vector<TokenId> tokens;
  while (tokens.size() < 160) tokens.insert(tokens.end(), prompt_.begin() + (tokens.empty() ? 0 : 1), prompt_.end());
  std::vector<int64_t> passes = {40, 30, 1, 1, 60, 1, 1, 1, 25};
  SequenceKv kv_cpu(Layout("q4k", 64), 512), kv_gpu(Layout("q4k", 64), 512);
  int64_t at = 0;
  double worst = 0.0;
  for (const int64_t n : passes) {
    const std::span<const TokenId> part(tokens.data() + at, static_cast<size_t>(n));
    Logits a, b;
    SequenceStep sa{&kv_cpu, part, true}, sb{&kv_gpu, part, true};
    ASSERT_TRUE(cpu->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
    const Status st = vulkan->Forward(std::span<const SequenceStep>(&sb, 1), b);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(a.data.size(), b.data.size());
    const double nmse = Nmse(b.data.data(), a.data.data(), n * V);
    worst = std::max(worst, nmse);
    EXPECT_LE(nmse, 1e-8) << "pass ending at " << at + n;
    at += n;
  }
  // The host blocks: chunks, V rows and staged keys as the CPU wrote them (codes may differ
  // only where the two backends' float sums round a value across a code step).
  const KvLayout& L = kv_cpu.layout();
  int64_t chunk_bytes_differing = 0, v_bytes_differing = 0, staged_differing = 0;
  for (int64_t l = 0; l < L.n_layer; ++l) {
    for (int64_t c = 0; c < at / 64; ++c) {
      for (int64_t i = 0; i < L.chunk_bytes(); ++i) chunk_bytes_differing += kv_cpu.k_chunk(l, c)[i] != kv_gpu.k_chunk(l, c)[i];
    }
    for (int64_t p = 0; p < at; ++p) {
      for (int64_t i = 0; i < L.row_bytes(); ++i) v_bytes_differing += kv_cpu.v_row(l, p)[i] != kv_gpu.v_row(l, p)[i];
    }
    if (at % 64 == 0) continue;  // no incomplete chunk
    const uint16_t *sc = kv_cpu.k_staging(l, at / 64 * 64), *sg = kv_gpu.k_staging(l, at / 64 * 64);
    for (int64_t i = 0; i < at % 64 * L.row_values(); ++i) {
      staged_differing += std::abs(Fp16ToFp32(sc[i]) - Fp16ToFp32(sg[i])) > 1e-3f * (1.0f + std::abs(Fp16ToFp32(sc[i])));
    }
  }
  const int64_t chunk_bytes = L.n_layer * (at / 64) * L.chunk_bytes(), v_bytes = L.n_layer * at * L.row_bytes();
  std::printf("[vulkan backend] kv q4k: worst logits NMSE %.3g over %zu passes; host bytes differing from the CPU's: "
              "K chunks %lld of %lld, V rows %lld of %lld, staged keys %lld\n",
              worst, passes.size(), static_cast<long long>(chunk_bytes_differing), static_cast<long long>(chunk_bytes),
              static_cast<long long>(v_bytes_differing), static_cast<long long>(v_bytes),
              static_cast<long long>(staged_differing));
  EXPECT_LE(chunk_bytes_differing, chunk_bytes / 1000);
  EXPECT_LE(v_bytes_differing, v_bytes / 1000);
  EXPECT_EQ(staged_differing, 0);
  // Either backend continues from the other's cache exactly as from its own (the host blocks
  // are byte-identical, so the logits must be too; the Vulkan backend uploads kv_cpu's blocks
  // and staged keys, which it has never seen). Across backends the logits are only close: a
  // value that lands within an ulp of an int8 rounding step can take another code.
  const TokenId next = 42;
  for (Backend* backend : {static_cast<Backend*>(cpu.get()), vulkan}) {
    const bool is_cpu = backend == cpu.get();
    SequenceKv& own = is_cpu ? kv_cpu : kv_gpu;
    SequenceKv& other = is_cpu ? kv_gpu : kv_cpu;
    const std::vector<float> from_own = Step(*backend, own, std::span<const TokenId>(&next, 1));
    const std::vector<float> from_other = Step(*backend, other, std::span<const TokenId>(&next, 1));
    ASSERT_EQ(from_own.size(), static_cast<size_t>(V));
    EXPECT_EQ(from_own, from_other) << (is_cpu ? "cpu" : "vulkan") << " backend";
    own.Truncate(at);  // within the incomplete chunk: lossless
    other.Truncate(at);
  }
}

TEST_F(VulkanBackendTest, BatchedEqualsAlone) {
  // Two q4k sequences: the second's key rows start after the first's in the pass's key rows,
  // and the long one completes a chunk in the prefill.
  std::vector<TokenId> long_prompt = prompt_;
  while (long_prompt.size() < 100) long_prompt.insert(long_prompt.end(), prompt_.begin() + 1, prompt_.end());
  const std::vector<std::vector<TokenId>> prompts = {prompt_, {1, 15043}, {1, 450, 4996, 17354, 1701, 29916},
                                                     long_prompt, {1, 450, 4996}};
  const char* types[] = {"f16", "q8", "q4", "q4k", "q4k"};
  const int64_t V = hp().n_vocab;
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceKv kv(Layout(types[i], 64), 256);
    Step(*vulkan_, kv, prompts[i]);
    const TokenId next = 42;
    alone.push_back(Step(*vulkan_, kv, std::span<const TokenId>(&next, 1)));
  }
  std::vector<std::unique_ptr<SequenceKv>> kvs;
  std::vector<SequenceStep> steps;
  for (size_t i = 0; i < prompts.size(); ++i) {
    kvs.push_back(std::make_unique<SequenceKv>(Layout(types[i], 64), 256));
    steps.push_back({kvs.back().get(), prompts[i], false});
  }
  Logits lg;
  ASSERT_TRUE(vulkan_->Forward(steps, lg).ok());
  const TokenId next = 42;
  std::vector<SequenceStep> decode;
  for (auto& kv : kvs) decode.push_back({kv.get(), std::span<const TokenId>(&next, 1), false});
  ASSERT_TRUE(vulkan_->Forward(decode, lg).ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_LE(Nmse(lg.row(lg.first_row[i]), alone[i].data(), V), 1e-10) << "sequence " << i;
  }
}

TEST_F(VulkanBackendTest, DeviceKvFollowsHostBlocks) {
  const int64_t B = 16;  // small blocks: the prompt spans several
  const std::vector<TokenId> more = {263, 1701, 29916, 42};
  std::vector<TokenId> whole = prompt_;
  whole.insert(whole.end(), more.begin(), more.end());
  auto cpu = MakeCpuBackend(*model_, CpuOptions{2, &cpu::ScalarKernels()});
  const int64_t V = hp().n_vocab;
  const int64_t n = static_cast<int64_t>(prompt_.size());
  ASSERT_GT(n, 2 * B);
  SequenceKv reference(Layout("q4", B), 256);
  const std::vector<float> want = Step(*vulkan_, reference, whole);

  // Rows written by the CPU backend are uploaded before the Vulkan backend reads them.
  SequenceKv from_cpu(Layout("q4", B), 256);
  Step(*cpu, from_cpu, prompt_);
  std::vector<float> got = Step(*vulkan_, from_cpu, more);
  EXPECT_LE(Nmse(got.data(), want.data(), V), 1e-10) << "prefill on the CPU, decode on Vulkan";

  // Full blocks shared through the pool keep their device copy; blocks copied into new host
  // blocks (as a load from disk makes them) are uploaded; the host rows are the written-back ones.
  BlockPool pool(0);
  SequenceKv a(Layout("q4", B), 256, pool);
  Step(*vulkan_, a, prompt_);
  const int64_t full = n / B;
  std::vector<BlockHash> keys;
  for (int64_t i = 0; i < full; ++i) {
    keys.push_back(BlockHash{1, static_cast<uint64_t>(i)});
    a.NameBlock(i, keys.back());
  }
  SequenceKv shared(Layout("q4", B), 256, pool), copied(Layout("q4", B), 256);
  for (int64_t i = 0; i < full; ++i) {
    shared.SetBlock(i, pool.Acquire(keys[i]));
    ASSERT_TRUE(copied.Reserve((i + 1) * B).ok());
    std::memcpy(copied.block(i)->data, a.block(i)->data, static_cast<size_t>(a.layout().block_bytes()));
  }
  shared.SetTokens(full * B);
  copied.SetTokens(full * B);
  const std::span<const TokenId> rest(whole.data() + full * B, whole.size() - full * B);
  got = Step(*vulkan_, shared, rest);
  EXPECT_LE(Nmse(got.data(), want.data(), V), 1e-10) << "shared blocks";
  got = Step(*vulkan_, copied, rest);
  EXPECT_LE(Nmse(got.data(), want.data(), V), 1e-10) << "copied blocks";

  // Truncation into a block: the rewritten rows replace the old ones on the device too.
  SequenceKv truncated(Layout("q4", B), 256);
  Step(*vulkan_, truncated, prompt_);
  truncated.Truncate(B + 3);
  got = Step(*vulkan_, truncated, std::span<const TokenId>(whole.data() + B + 3, whole.size() - B - 3));
  EXPECT_LE(Nmse(got.data(), want.data(), V), 1e-10) << "after truncation";
}

// Erasure reaches device memory: when the pool frees a host block, ForgetBlocks overwrites its
// device copy with zeros and frees the slot; the other blocks' copies stay.
TEST_F(VulkanBackendTest, ForgottenBlocksAreZeroedOnTheDevice) {
  const int64_t B = 16;
  BlockPool pool(0);
  pool.TrackFreed();
  auto kv = std::make_unique<SequenceKv>(Layout("q4", B), 256, pool);
  Step(*vulkan_, *kv, prompt_);
  ASSERT_GE(kv->n_blocks(), 2);
  const uint64_t first = kv->block(0)->serial, second = kv->block(1)->serial;
  const int64_t copies = vulkan_->BlockCopies();
  ASSERT_GE(copies, 2);
  // The copy holds the host block's rows (K/V codes are not all zero).
  auto before = VulkanReadBlockCopy(*vulkan_, first);
  ASSERT_TRUE(before.ok()) << before.status().message();
  EXPECT_TRUE(std::any_of(before->begin(), before->end(), [](uint8_t x) { return x != 0; }));
  // Freeing the sequence's blocks reports their serials; forgetting one zeroes its slot.
  kv.reset();
  const std::vector<uint64_t> freed = pool.TakeFreed();
  EXPECT_TRUE(std::find(freed.begin(), freed.end(), first) != freed.end());
  EXPECT_TRUE(std::find(freed.begin(), freed.end(), second) != freed.end());
  auto after = VulkanForgetAndReadSlot(*vulkan_, first);
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_EQ(after->size(), before->size());
  EXPECT_TRUE(std::all_of(after->begin(), after->end(), [](uint8_t x) { return x == 0; }));
  EXPECT_EQ(vulkan_->BlockCopies(), copies - 1);
  EXPECT_EQ(VulkanReadBlockCopy(*vulkan_, first).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(VulkanReadBlockCopy(*vulkan_, second).ok());
  ASSERT_TRUE(vulkan_->ForgetBlocks(freed).ok());
  EXPECT_EQ(vulkan_->BlockCopies(), copies - static_cast<int64_t>(freed.size()));
}

TEST_F(VulkanBackendTest, SmallDeviceKvBudgetEvictsAndReloads) {
  const int64_t B = 16;
  const KvLayout layout = Layout("q8", B);
  // Room for 4 blocks: each 39-token sequence needs 3, so they evict each other.
  VulkanOptions options;
  options.kv_device_bytes = 4 * 2 * layout.n_layer * B * ((layout.row_bytes() + 3) / 4 * 4);
  auto small = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(small.ok()) << small.status().message();
  std::vector<TokenId> p = prompt_;
  p.resize(std::min<size_t>(p.size(), 39));
  SequenceKv a(layout, 256), b(layout, 256), ref(layout, 256);
  const TokenId next = 42;
  Step(**small, a, p);
  Step(**small, b, p);
  const std::vector<float> got = Step(**small, a, std::span<const TokenId>(&next, 1));
  Step(*vulkan_, ref, p);
  const std::vector<float> want = Step(*vulkan_, ref, std::span<const TokenId>(&next, 1));
  EXPECT_LE(Nmse(got.data(), want.data(), hp().n_vocab), 1e-10);

  // A sequence that alone needs more blocks than the budget fails cleanly, as Fits foretells;
  // so does a pass of two sequences that each fit alone (3 blocks each, 4 in the budget).
  SequenceKv big(layout, 256);
  std::vector<TokenId> long_prompt(5 * B, 450);
  Logits lg;
  SequenceStep s{&big, long_prompt, false};
  EXPECT_FALSE((*small)->Fits(std::span<const SequenceStep>(&s, 1)));
  const Status st = (*small)->Forward(std::span<const SequenceStep>(&s, 1), lg);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
  EXPECT_EQ(big.n_tokens(), 0);
  SequenceKv c(layout, 256), d(layout, 256);
  const SequenceStep pair[2] = {{&c, p, false}, {&d, p, false}};
  EXPECT_TRUE((*small)->Fits(std::span<const SequenceStep>(pair, 1)));
  EXPECT_TRUE((*small)->Fits(std::span<const SequenceStep>(pair + 1, 1)));
  EXPECT_FALSE((*small)->Fits(pair));
  EXPECT_EQ((*small)->Forward(pair, lg).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.n_tokens() + d.n_tokens(), 0);
}

// The packed integer dot product (the default where the device has it) and the plain-integer
// shaders compute the same exact integer sums, so a prompt (tiled matrix shaders) and decode
// steps (matrix-vector shaders) give the same logits either way.
TEST_F(VulkanBackendTest, PackedAndPlainIntegerDotsGiveTheSameLogits) {
  VulkanOptions options;
  options.integer_dot = false;
  auto plain = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  const int64_t V = hp().n_vocab, n = static_cast<int64_t>(prompt_.size());
  SequenceKv ka(Layout("q4"), 256), kb(Layout("q4"), 256);
  Logits a, b;
  SequenceStep sa{&ka, prompt_, true}, sb{&kb, prompt_, true};
  ASSERT_TRUE(vulkan_->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
  ASSERT_TRUE((*plain)->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
  ASSERT_EQ(b.data.size(), static_cast<size_t>(n * V));
  EXPECT_LE(Nmse(b.data.data(), a.data.data(), n * V), 1e-12) << "prompt";
  for (TokenId next : {TokenId{42}, TokenId{7}, TokenId{1000}}) {
    const std::vector<float> da = Step(*vulkan_, ka, std::span<const TokenId>(&next, 1));
    const std::vector<float> db = Step(**plain, kb, std::span<const TokenId>(&next, 1));
    EXPECT_LE(Nmse(db.data(), da.data(), V), 1e-12) << "decode of token " << next;
  }
}

// Fused dispatches (norm or SwiGLU with the quantization after it, K and V stored in one
// dispatch that also applies the keys' RoPE) compute what the separate ops compute, value for
// value: the logits of a prompt and of decode steps are equal, for every KV format (q4k keeps
// the separate key rope: its keys are staged as rows).
TEST_F(VulkanBackendTest, FusedAndSeparateOpsGiveTheSameLogits) {
  VulkanOptions options;
  options.fuse_ops = false;
  auto separate = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(separate.ok()) << separate.status().message();
  for (const char* type : {"f16", "q8", "q4", "q4k"}) {
    SequenceKv ka(Layout(type, 64), 256), kb(Layout(type, 64), 256);
    Logits a, b;
    SequenceStep sa{&ka, prompt_, true}, sb{&kb, prompt_, true};
    ASSERT_TRUE(vulkan_->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
    ASSERT_TRUE((*separate)->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
    ASSERT_EQ(a.data.size(), b.data.size());
    EXPECT_TRUE(a.data == b.data) << type << " prompt: NMSE " << Nmse(a.data.data(), b.data.data(), a.data.size());
    for (TokenId next : {TokenId{42}, TokenId{7}, TokenId{1000}}) {
      const std::vector<float> da = Step(*vulkan_, ka, std::span<const TokenId>(&next, 1));
      const std::vector<float> db = Step(**separate, kb, std::span<const TokenId>(&next, 1));
      EXPECT_TRUE(da == db) << type << " decode of token " << next << ": NMSE "
                            << Nmse(da.data(), db.data(), static_cast<int64_t>(da.size()));
    }
  }
}

// Q4_0 weights with their codes moved to 16-byte boundaries (the default) and as the GGUF file
// stores them decode to the same values, so every matrix product, and so the logits of a
// prompt (tiled shaders) and of decode steps (matrix-vector shaders), are equal.
TEST_F(VulkanBackendTest, SplitAndGgufWeightRowsGiveTheSameLogits) {
  VulkanOptions options;
  options.split_weight_rows = false;
  auto gguf_rows = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(gguf_rows.ok()) << gguf_rows.status().message();
  SequenceKv ka(Layout("q4", 64), 256), kb(Layout("q4", 64), 256);
  Logits a, b;
  SequenceStep sa{&ka, prompt_, true}, sb{&kb, prompt_, true};
  ASSERT_TRUE(vulkan_->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
  ASSERT_TRUE((*gguf_rows)->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
  ASSERT_EQ(a.data.size(), b.data.size());
  EXPECT_TRUE(a.data == b.data) << "prompt: NMSE " << Nmse(a.data.data(), b.data.data(), a.data.size());
  for (TokenId next : {TokenId{42}, TokenId{7}, TokenId{1000}}) {
    const std::vector<float> da = Step(*vulkan_, ka, std::span<const TokenId>(&next, 1));
    const std::vector<float> db = Step(**gguf_rows, kb, std::span<const TokenId>(&next, 1));
    EXPECT_TRUE(da == db) << "decode of token " << next << ": NMSE "
                          << Nmse(da.data(), db.data(), static_cast<int64_t>(da.size()));
  }
}

// Reading weights ahead (VulkanTuning::prefetch_mib) only loads: a prompt and decode steps
// give the same logits as without it, bit for bit, with each matrix whole and in parts (the
// feed-forward's and the output's, whose read-ahead then crosses part boundaries), in f16 and
// q4k (whose kv_store and scores share the phase the read-ahead joins). It reads in decode
// only: whole, 1 MiB covers each place's matrices in one dispatch each, q|k|v, o, gate|up per
// layer and the output (a prompt of more than 8 tokens reads none).
TEST_F(VulkanBackendTest, PrefetchingWeightsChangesNoLogit) {
  for (const int64_t max_binding : {int64_t{0}, int64_t{160} << 10}) {  // a logit row: 125 KiB
    VulkanOptions plain_options, prefetch_options;
    plain_options.max_binding_bytes = prefetch_options.max_binding_bytes = max_binding;
    prefetch_options.tuning.prefetch_mib = 1;
    prefetch_options.profile = true;
    auto plain = MakeVulkanBackend(*model_, plain_options);
    auto prefetching = MakeVulkanBackend(*model_, prefetch_options);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    ASSERT_TRUE(prefetching.ok()) << prefetching.status().message();
    for (const char* type : {"f16", "q4k"}) {
      SCOPED_TRACE(::testing::Message() << type << ", bindings of at most " << max_binding << " bytes");
      SequenceKv ka(Layout(type, 64), 256), kb(Layout(type, 64), 256);
      Logits a, b;
      SequenceStep sa{&ka, prompt_, true}, sb{&kb, prompt_, true};
      ASSERT_TRUE((*plain)->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
      ASSERT_TRUE((*prefetching)->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
      EXPECT_TRUE(a.data == b.data) << "prompt";
      const int64_t prompt_reads = testing::ProfileDispatches((*prefetching)->TakeProfileReport())["prefetch"];
      if (max_binding == 0) {  // (smaller bindings: a token per micro-batch)
        EXPECT_EQ(prompt_reads, 0);
      }
      for (TokenId next : {TokenId{42}, TokenId{7}, TokenId{1000}}) {
        const std::vector<float> da = Step(**plain, ka, std::span<const TokenId>(&next, 1));
        const std::vector<float> db = Step(**prefetching, kb, std::span<const TokenId>(&next, 1));
        ASSERT_FALSE(da.empty());
        EXPECT_TRUE(da == db) << "decode of token " << next;
        const int64_t reads = testing::ProfileDispatches((*prefetching)->TakeProfileReport())["prefetch"];
        if (max_binding == 0) {
          EXPECT_EQ(reads, 3 * hp().n_layer + 1);
        } else {
          EXPECT_GT(reads, 3 * hp().n_layer + 1);  // gate|up and the output in parts
        }
      }
    }
  }
}

// Attention with tiles of queries (the default: a workgroup scores several tokens and a KV head's
// query heads, and sums several tokens' outputs) computes each query as one query a workgroup
// does: a prompt, the same prompt again at depth (prefill over cached positions) and decode
// steps give the same logits, bit for bit, in every KV format.
TEST_F(VulkanBackendTest, QueryTilesGiveTheSameLogits) {
  VulkanOptions options;
  options.query_tiles = false;
  auto untiled = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(untiled.ok()) << untiled.status().message();
  for (const char* type : {"f16", "q4", "q4k"}) {
    SequenceKv ka(Layout(type, 64), 256), kb(Layout(type, 64), 256);
    for (int pass = 0; pass < 2; ++pass) {
      Logits a, b;
      SequenceStep sa{&ka, prompt_, true}, sb{&kb, prompt_, true};
      ASSERT_TRUE(vulkan_->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
      ASSERT_TRUE((*untiled)->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
      ASSERT_EQ(a.data.size(), b.data.size());
      EXPECT_TRUE(a.data == b.data) << type << " prompt pass " << pass << ": NMSE "
                                    << Nmse(a.data.data(), b.data.data(), a.data.size());
    }
    for (TokenId next : {TokenId{42}, TokenId{7}}) {
      const std::vector<float> da = Step(*vulkan_, ka, std::span<const TokenId>(&next, 1));
      const std::vector<float> db = Step(**untiled, kb, std::span<const TokenId>(&next, 1));
      EXPECT_TRUE(da == db) << type << " decode of token " << next << ": NMSE "
                            << Nmse(da.data(), db.data(), static_cast<int64_t>(da.size()));
    }
  }
}

TEST_F(VulkanBackendTest, SplitWeightsAndMicroBatchesMatch) {
  // 2 MiB bindings: the output matrix (32000 rows, 4.6 MB) splits into 3 parts and a
  // micro-batch holds 16 tokens of 32000 logits, so the prompt runs in 3 command buffers. (Both
  // runs take the tiled matrix path; the matrix-vector path sums in another order, and a float
  // rounding difference can flip an f16 K value or attention weight, which these random-weight
  // models amplify to ~1e-4.)
  VulkanOptions options;
  options.max_binding_bytes = 2 << 20;
  auto split = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(split.ok()) << split.status().message();
  const int64_t V = hp().n_vocab, n = static_cast<int64_t>(prompt_.size());
  SequenceKv ka(Layout("f16", 256), 256), kb(Layout("f16", 256), 256);
  Logits a, b;
  SequenceStep sa{&ka, prompt_, true}, sb{&kb, prompt_, true};
  ASSERT_TRUE(vulkan_->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
  ASSERT_TRUE((*split)->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
  ASSERT_EQ(b.data.size(), static_cast<size_t>(n * V));
  EXPECT_LE(Nmse(b.data.data(), a.data.data(), n * V), 1e-12);
}

#if defined(KVFS_VULKAN)
// Split rows (weight_layout.h) hold each block's scale at 2 b and its codes at 16 b after the
// scales padded to 16 bytes, the padding zero: checked byte by byte against the GGUF blocks.
TEST(VulkanWeights, SplitRowsMoveEachBlocksCodesToA16ByteBoundary) {
  std::mt19937 rng(5);
  for (const GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    const int64_t code_bytes = type == GgmlType::kQ4_0 ? 16 : 32, block_bytes = 2 + code_bytes;
    for (const int64_t n_blocks : {1, 7, 8, 25, 128}) {
      const int64_t n_in = 32 * n_blocks, n_rows = 3;
      const int64_t scales = (2 * n_blocks + 15) / 16 * 16;
      ASSERT_EQ(vk::SplitRowBytes(type, n_in), scales + n_blocks * code_bytes);
      if (n_blocks % 8 == 0) {
        EXPECT_EQ(vk::SplitRowBytes(type, n_in), n_blocks * block_bytes);
      }
      std::vector<uint8_t> gguf(n_rows * n_blocks * block_bytes);
      for (uint8_t& b : gguf) b = static_cast<uint8_t>(rng());
      const int64_t row_bytes = vk::SplitRowBytes(type, n_in);
      std::vector<uint8_t> split(n_rows * row_bytes, 0xAA);
      vk::SplitRows(type, n_in, gguf.data(), n_blocks * block_bytes, n_rows, split.data());
      for (int64_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = split.data() + r * row_bytes;
        for (int64_t b = 0; b < n_blocks; ++b) {
          const uint8_t* block = gguf.data() + (r * n_blocks + b) * block_bytes;
          EXPECT_EQ(std::memcmp(row + 2 * b, block, 2), 0) << "scale of block " << b;
          EXPECT_EQ((scales + b * code_bytes) % 16, 0);
          EXPECT_EQ(std::memcmp(row + scales + b * code_bytes, block + 2, code_bytes), 0) << "codes of block " << b;
        }
        for (int64_t i = 2 * n_blocks; i < scales; ++i) EXPECT_EQ(row[i], 0) << "padding byte " << i;
      }
    }
  }
  EXPECT_TRUE(vk::SplitRowsApplies(GgmlType::kQ4_0) && vk::SplitRowsApplies(GgmlType::kQ8_0));
  EXPECT_FALSE(vk::SplitRowsApplies(GgmlType::kQ4_K) || vk::SplitRowsApplies(GgmlType::kF16));
}

// Split Q6_K rows (weight_layout.h): every value read back from the layout the header gives
// (d of its super-block, its unit's scale, low nibble and high pair) equals the CPU's
// dequantization of the GGUF row; the offsets are 16-byte aligned and the padding is zero.
TEST(VulkanWeights, SplitQ6kRowsHoldTheSameValues) {
  std::mt19937 rng(9);
  ASSERT_TRUE(vk::SplitRowsApplies(GgmlType::kQ6_K));
  for (const int64_t n_blocks : {1, 3, 8, 16}) {
    const int64_t n_in = 256 * n_blocks, n_units = n_in / 32, n_rows = 2, gguf_row = 210 * n_blocks;
    std::vector<uint8_t> gguf(n_rows * gguf_row);
    for (uint8_t& b : gguf) b = static_cast<uint8_t>(rng());
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int64_t b = 0; b < n_blocks; ++b) {  // d: a modest f16 (random bits may be Inf or NaN)
        uint8_t* d = gguf.data() + r * gguf_row + b * 210 + 208;
        d[0] = static_cast<uint8_t>(rng());
        d[1] = static_cast<uint8_t>(0x10 + rng() % 0x20);
      }
    }
    const int64_t scales = (2 * n_blocks + 15) / 16 * 16, high = scales + (2 * n_units + 15) / 16 * 16;
    const int64_t low = high + 8 * n_units, row_bytes = vk::SplitRowBytes(GgmlType::kQ6_K, n_in);
    ASSERT_EQ(row_bytes, low + 16 * n_units);
    if (n_blocks % 8 == 0) {
      EXPECT_EQ(row_bytes, gguf_row);
    }
    std::vector<uint8_t> split(n_rows * row_bytes, 0xAA);
    vk::SplitRows(GgmlType::kQ6_K, n_in, gguf.data(), gguf_row, n_rows, split.data());
    for (int64_t r = 0; r < n_rows; ++r) {
      std::vector<float> want(n_in);
      DequantizeRow(GgmlType::kQ6_K, gguf.data() + r * gguf_row, want.data(), n_in);
      const uint8_t* row = split.data() + r * row_bytes;
      for (int64_t u = 0; u < n_units; ++u) {
        uint16_t dh = 0;
        std::memcpy(&dh, row + 2 * (u / 8), 2);
        const float d = Fp16ToFp32(dh);
        for (int64_t e = 0; e < 32; ++e) {
          const int q = ((row[low + 16 * u + e % 16] >> (e < 16 ? 0 : 4)) & 15) |
                        (((row[high + 8 * u + e % 8] >> (2 * (e / 8))) & 3) << 4);
          const int sc = static_cast<int8_t>(row[scales + 2 * u + e / 16]);
          const float got = (d * static_cast<float>(sc)) * static_cast<float>(q - 32);
          ASSERT_EQ(got, want[32 * u + e]) << "row " << r << " unit " << u << " element " << e;
        }
      }
      for (int64_t i = 2 * n_blocks; i < scales; ++i) EXPECT_EQ(row[i], 0) << "padding byte " << i;
      for (int64_t i = scales + 2 * n_units; i < high; ++i) EXPECT_EQ(row[i], 0) << "padding byte " << i;
    }
  }
}

// q, k, v (and gate, up) go to the device stacked into one matrix where their types agree,
// their biases one after another; a layer whose types differ keeps them apart (tiny-llama
// Q4_K_M: layer 1's attn_v is Q6_K).
TEST(VulkanWeights, StacksQkvAndGateUpWhereTheTypesAgree) {
  for (const char* name : {"tiny-llama-Q4_K_M.gguf", "tiny-qwen2-Q4_0.gguf"}) {
    const std::string path = testing::TestModelsDir() + "/" + name;
    KVFS_REQUIRE_DATA(path);
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto ctx = vk::Context::Create(-1);
    KVFS_REQUIRE_VULKAN(ctx.status());
    auto up = vk::Uploader::Create(**ctx, 1 << 20);
    ASSERT_TRUE(up.ok());
    const vk::WeightUploadOptions options{.max_binding_bytes = (*ctx)->limits().max_binding_bytes};
    auto dw = vk::UploadWeights(**ctx, **up, (*model)->weights(), options);
    ASSERT_TRUE(dw.ok()) << dw.status().message();
    const HParams& hp = (*model)->hparams();
    const ModelWeights& w = (*model)->weights();
    for (size_t il = 0; il < w.layers.size(); ++il) {
      const LayerWeights& l = w.layers[il];
      const vk::DeviceLayer& d = (*dw)->layers[il];
      const bool qkv = l.wq.type == l.wk.type && l.wk.type == l.wv.type;
      SCOPED_TRACE(std::string(name) + " layer " + std::to_string(il));
      EXPECT_EQ(d.wqkv.parts.empty(), !qkv);
      EXPECT_EQ(d.wq.parts.empty(), qkv);
      if (qkv) {
        EXPECT_EQ(d.wqkv.n_out, hp.n_embd_q() + 2 * hp.n_embd_kv());
        EXPECT_EQ(d.wqkv.segment_rows, (std::vector<int64_t>{hp.n_embd_q(), hp.n_embd_q() + hp.n_embd_kv()}));
        EXPECT_EQ(d.bqkv.n, l.bq.empty() ? 0 : hp.n_embd_q() + 2 * hp.n_embd_kv());
        EXPECT_TRUE(d.bq.empty());
      }
      EXPECT_EQ(d.w_gate_up.parts.empty(), l.w_gate.type != l.w_up.type);
      if (!d.w_gate_up.parts.empty()) {
        EXPECT_EQ(d.w_gate_up.segment_rows, (std::vector<int64_t>{hp.n_ff}));
      }
    }
    if (std::string(name) == "tiny-llama-Q4_K_M.gguf") {
      EXPECT_FALSE((*dw)->layers[0].wqkv.parts.empty());  // both kinds of layer are there
      EXPECT_TRUE((*dw)->layers[1].wqkv.parts.empty());
    } else {
      EXPECT_GT((*dw)->layers[0].bqkv.n, 0);  // qwen2's biases, stacked
    }
  }
}

// Two backends made from `name` with the default options and with `other`: the same logits,
// bit for bit, for a prompt (tiled shaders) and two decode steps (matrix-vector shaders).
void ExpectTheSameLogitsWith(const char* name, const VulkanOptions& other, const char* kv, int64_t block_tokens,
                             const char* text) {
  const std::string path = testing::TestModelsDir() + "/" + name;
  KVFS_REQUIRE_DATA(path);
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto plain = MakeVulkanBackend(**model, VulkanOptions{});
  KVFS_REQUIRE_VULKAN(plain.status());
  auto changed = MakeVulkanBackend(**model, other);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  const HParams& hp = (*model)->hparams();
  const KvLayout layout = KvLayoutFor(hp, *MakeKvFormat(kv, "", hp.n_head_kv, hp.head_dim), block_tokens);
  const std::vector<TokenId> prompt = (*model)->tokenizer().Encode(text, true, false);
  SequenceKv ka(layout, 128), kb(layout, 128);
  Logits a, b;
  SequenceStep sa{&ka, prompt, true}, sb{&kb, prompt, true};
  ASSERT_TRUE((*plain)->Forward(std::span<const SequenceStep>(&sa, 1), a).ok());
  ASSERT_TRUE((*changed)->Forward(std::span<const SequenceStep>(&sb, 1), b).ok());
  ASSERT_EQ(a.data.size(), prompt.size() * static_cast<size_t>(hp.n_vocab));
  EXPECT_TRUE(a.data == b.data) << name << " prompt";
  for (TokenId next : {TokenId{42}, TokenId{7}}) {
    SequenceStep da{&ka, std::span<const TokenId>(&next, 1), false}, db{&kb, std::span<const TokenId>(&next, 1), false};
    ASSERT_TRUE((*plain)->Forward(std::span<const SequenceStep>(&da, 1), a).ok());
    ASSERT_TRUE((*changed)->Forward(std::span<const SequenceStep>(&db, 1), b).ok());
    EXPECT_TRUE(a.data == b.data) << name << " decode of token " << next;
  }
}

// The stacked matrices give the logits the separate ones give, bit for bit (the same products
// into the same outputs), with qwen2's biases, float weights, and layers where some stack and
// some do not.
TEST(VulkanStackedMatrices, GiveTheSameLogitsAsSeparateMatrices) {
  VulkanOptions separate;
  separate.stack_matrices = false;
  for (const char* name : {"tiny-llama-Q4_K_M.gguf", "tiny-qwen2-Q4_0.gguf", "tiny-llama-F16.gguf"}) {
    ExpectTheSameLogitsWith(name, separate, "q8", 16, "Stacked matrices, one dispatch each.");
  }
}

// MoltenVK (Apple) is a portability driver: loaders list it only to an instance that enables
// VK_KHR_portability_enumeration with its flag. The context asks for it exactly where the loader
// has the extension (checked here against the loader's own list; Debian 12's loader has it, so
// CI opens lavapipe through the flagged instance), and lists the devices as before.
TEST(VulkanDevices, AskTheLoaderForPortabilityDriversWhereItCan) {
  auto ctx = vk::Context::Create(-1);
  KVFS_REQUIRE_VULKAN(ctx.status());
  uint32_t n = 0;
  ASSERT_EQ(vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr), VK_SUCCESS);
  std::vector<VkExtensionProperties> extensions(n);
  ASSERT_EQ(vkEnumerateInstanceExtensionProperties(nullptr, &n, extensions.data()), VK_SUCCESS);
  bool listed = false;
  for (const VkExtensionProperties& e : extensions) {
    listed = listed || std::strcmp(e.extensionName, "VK_KHR_portability_enumeration") == 0;
  }
  EXPECT_EQ((*ctx)->portability_enumeration(), listed);
  if (testing::InCi()) {
    EXPECT_TRUE(listed) << "Debian 12's Vulkan loader lists VK_KHR_portability_enumeration";
  }
  auto devices = ListVulkanDevices();
  ASSERT_TRUE(devices.ok()) << devices.status().message();
  const VulkanDeviceInfo* chosen = ChosenVulkanDevice(*devices, -1);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ((*ctx)->info().name, chosen->name);
  EXPECT_EQ((*ctx)->info().portability, chosen->portability);
}

// tiny-llama Q4_K_M (Q4_K matrices, Q6_K attn_v, ffn_down and output) with split rows (its
// Q6_K ones) and with the GGUF rows: the same logits, prompt and decode, bit for bit.
TEST(VulkanSplitRows, Q6kMatricesGiveTheSameLogitsAsGgufRows) {
  VulkanOptions gguf_rows;
  gguf_rows.split_weight_rows = false;
  ExpectTheSameLogitsWith("tiny-llama-Q4_K_M.gguf", gguf_rows, "q4k", 64, "Rows of sixes, split or not.");
}

TEST(VulkanWeights, UnsupportedTypeIsAClearError) {
  ModelWeights w;
  w.token_embd.type = GgmlType::kQ2_K;
  const Status s = vk::CheckWeightTypes(w);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("Q2_K"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("token_embd"), std::string::npos) << s.message();
}
#endif

TEST(VulkanDevices, ListsDevicesWithOneDefault) {
  auto devices = ListVulkanDevices();
  KVFS_REQUIRE_VULKAN(devices.status());
  ASSERT_FALSE(devices->empty());
  int defaults = 0;
  for (const VulkanDeviceInfo& d : *devices) {
    defaults += d.is_default;
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.max_binding_bytes, 0);
  }
  EXPECT_EQ(defaults, 1);
}

}  // namespace
}  // namespace kvfs
