// FallbackBackend over the Vulkan backend: passes whose KV blocks do not fit the device's KV
// budget run in groups that fit, steps that do not fit alone run on the CPU, and a lost device
// (injected at the n-th queue submission) hands every pass to the CPU. In every case the logits
// must be the CPU backend's for the same history (the scalar table: the Vulkan backend matches
// it to NMSE < 1e-14 on these models), so no state is lost on the way. Runs on lavapipe in CI.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/fallback_backend.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

double Nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? num / den : num;
}

constexpr int64_t kBlockTokens = 16;

class VulkanFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf";
    KVFS_REQUIRE_DATA(path);
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status().message();
    model_ = std::move(*model);
    KVFS_REQUIRE_VULKAN(MakeVulkanBackend(*model_, VulkanOptions{}).status());
    cpu_ = MakeCpuBackend(*model_, CpuOptions{2, &cpu::ScalarKernels()});
    layout_ = KvLayoutFor(hp(), *MakeKvFormat("q8", "", hp().n_head_kv, hp().head_dim), kBlockTokens);
    prompt_ = model_->tokenizer().Encode(
        "The quick brown fox jumps over the lazy dog, twice, and then it sleeps under the old oak tree "
        "until the farmer comes home with a basket of apples for the children.",
        true, false);
    ASSERT_GE(prompt_.size(), 39u);
  }
  const HParams& hp() const { return model_->hparams(); }
  // A FallbackBackend over a Vulkan device with room for `blocks` KV blocks of layout_.
  // max_binding_bytes > 0 caps the storage bindings, and so the micro-batches.
  std::unique_ptr<FallbackBackend> Make(int64_t blocks, int64_t lose_at_submission = 0, int64_t max_binding_bytes = 0) {
    VulkanOptions options;
    options.max_binding_bytes = max_binding_bytes;
    options.kv_device_bytes = blocks * 2 * layout_.n_layer * kBlockTokens * ((layout_.row_bytes() + 3) / 4 * 4);
    auto device = MakeVulkanBackend(*model_, options);
    EXPECT_TRUE(device.ok()) << device.status().message();
    if (!device.ok()) return nullptr;
    if (lose_at_submission > 0) {
      EXPECT_TRUE(VulkanLoseDevice(**device, lose_at_submission).ok());
    }
    return std::make_unique<FallbackBackend>(*model_, std::move(*device), CpuOptions{2, &cpu::ScalarKernels()});
  }
  std::span<const TokenId> Prompt(size_t n) const { return std::span<const TokenId>(prompt_).first(n); }
  // One pass over steps; each step's last logits row.
  std::vector<std::vector<float>> Pass(Backend& backend, std::span<const SequenceStep> steps) {
    Logits lg;
    const Status st = backend.Forward(steps, lg);
    EXPECT_TRUE(st.ok()) << st.message();
    std::vector<std::vector<float>> rows;
    for (size_t i = 0; i < steps.size() && st.ok(); ++i) {
      const int64_t last = lg.first_row[i] + (steps[i].all_logits ? static_cast<int64_t>(steps[i].tokens.size()) - 1 : 0);
      rows.emplace_back(lg.row(last), lg.row(last) + hp().n_vocab);
    }
    return rows;
  }
  std::vector<float> Alone(Backend& backend, SequenceKv& kv, std::span<const TokenId> tokens) {
    const SequenceStep s{&kv, tokens, false};
    auto rows = Pass(backend, std::span<const SequenceStep>(&s, 1));
    return rows.empty() ? std::vector<float>() : rows[0];
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Backend> cpu_;
  KvLayout layout_;
  std::vector<TokenId> prompt_;
};

// Room for 4 blocks: three 39-token prompts (3 blocks each) in one pass run as three device
// passes, not on the CPU; two short prompts (a block each) still share one pass.
TEST_F(VulkanFallbackTest, PassesOverTheDeviceBudgetRunInGroupsThatFit) {
  auto fb = Make(4);
  ASSERT_NE(fb, nullptr);
  SequenceKv a(layout_, 256), b(layout_, 256), c(layout_, 256), ra(layout_, 256), rb(layout_, 256), rc(layout_, 256);
  const SequenceStep three[3] = {{&a, Prompt(39), false}, {&b, Prompt(38), false}, {&c, Prompt(37), false}};
  EXPECT_FALSE(fb->device()->Fits(three));
  const auto got = Pass(*fb, three);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(fb->stats().device_passes, 3);
  EXPECT_EQ(fb->stats().cpu_steps, 0);
  EXPECT_LE(Nmse(got[0], Alone(*cpu_, ra, Prompt(39))), 1e-8);
  EXPECT_LE(Nmse(got[1], Alone(*cpu_, rb, Prompt(38))), 1e-8);
  EXPECT_LE(Nmse(got[2], Alone(*cpu_, rc, Prompt(37))), 1e-8);
  EXPECT_EQ(a.n_tokens() + b.n_tokens() + c.n_tokens(), 39 + 38 + 37);

  // A decode step of all three, evicting each other's copies on the way.
  const TokenId next[3] = {42, 7, 1000};
  const SequenceStep decode[3] = {{&a, std::span<const TokenId>(&next[0], 1), false},
                                  {&b, std::span<const TokenId>(&next[1], 1), false},
                                  {&c, std::span<const TokenId>(&next[2], 1), false}};
  const auto stepped = Pass(*fb, decode);
  ASSERT_EQ(stepped.size(), 3u);
  EXPECT_EQ(fb->stats().device_passes, 6);
  EXPECT_LE(Nmse(stepped[0], Alone(*cpu_, ra, std::span<const TokenId>(&next[0], 1))), 1e-8);
  EXPECT_LE(Nmse(stepped[1], Alone(*cpu_, rb, std::span<const TokenId>(&next[1], 1))), 1e-8);
  EXPECT_LE(Nmse(stepped[2], Alone(*cpu_, rc, std::span<const TokenId>(&next[2], 1))), 1e-8);

  SequenceKv d(layout_, 256), e(layout_, 256);
  const SequenceStep two[2] = {{&d, Prompt(12), true}, {&e, Prompt(9), false}};
  Logits lg;
  ASSERT_TRUE(fb->Forward(two, lg).ok());
  EXPECT_EQ(fb->stats().device_passes, 7);
  EXPECT_EQ(lg.first_row, (std::vector<int64_t>{0, 12}));  // all 12 rows of d, then e's last
  EXPECT_EQ(lg.data.size(), static_cast<size_t>(13 * hp().n_vocab));
  EXPECT_EQ(fb->Health().cpu_fallback_steps, 0);
}

// A step whose blocks exceed the budget alone runs on the CPU, beside the device's steps. The
// CPU then wrote rows the device held stale copies of (a truncated sequence): those copies
// must be dropped, or the device's next pass over that sequence would read old rows.
TEST_F(VulkanFallbackTest, AStepOverTheDeviceBudgetRunsOnTheCpu) {
  auto fb = Make(3);
  ASSERT_NE(fb, nullptr);
  const std::vector<TokenId> other(40, 450);  // rows 10.. differ from the prompt's
  SequenceKv s(layout_, 256), r(layout_, 256), small(layout_, 256), r_small(layout_, 256);

  const auto first = Alone(*fb, s, Prompt(30));  // 2 blocks: on the device
  EXPECT_LE(Nmse(first, Alone(*cpu_, r, Prompt(30))), 1e-8);
  EXPECT_EQ(fb->stats().device_passes, 1);
  s.Truncate(10);
  r.Truncate(10);
  // 50 positions (4 blocks): s on the CPU, `small` beside it on the device.
  const SequenceStep both[2] = {{&s, other, false}, {&small, Prompt(20), false}};
  const auto mixed = Pass(*fb, both);
  ASSERT_EQ(mixed.size(), 2u);
  EXPECT_EQ(fb->stats().cpu_steps, 1);
  EXPECT_EQ(fb->stats().device_passes, 2);
  EXPECT_EQ(fb->Health().cpu_fallback_steps, 1);
  EXPECT_LE(Nmse(mixed[0], Alone(*cpu_, r, other)), 1e-8);
  EXPECT_LE(Nmse(mixed[1], Alone(*cpu_, r_small, Prompt(20))), 1e-8);
  EXPECT_EQ(s.n_tokens(), 50);

  // Back under the budget: the device runs s again and must see the CPU's rows 10..19.
  s.Truncate(20);
  r.Truncate(20);
  const auto back = Alone(*fb, s, Prompt(5));
  EXPECT_EQ(fb->stats().device_passes, 3);
  EXPECT_EQ(fb->stats().cpu_steps, 1);
  EXPECT_LE(Nmse(back, Alone(*cpu_, r, Prompt(5))), 1e-8);
}

// The device is lost at its n-th submission from the first pass on (before a pass, or in a
// later pass; with micro-batches of 8 tokens, in the middle of the first pass, after some of
// its command buffers ran): the failed pass runs again on the CPU, every later one runs there,
// and each pass's logits are those of a Vulkan backend for the passes before the loss and of
// the CPU backend from the lost pass on, continuing from the rows the device wrote back: the
// same bits.
TEST_F(VulkanFallbackTest, ALostDeviceHandsEveryPassToTheCpu) {
  const TokenId next[4] = {42, 7, 1000, 3};
  const int64_t ubatch8_binding = 4 * 8 * std::max({hp().n_vocab, hp().n_embd, hp().n_ff});
  for (int64_t binding : {int64_t{0}, ubatch8_binding}) {
    VulkanOptions options;
    options.max_binding_bytes = binding;
    auto vulkan = MakeVulkanBackend(*model_, options);
    ASSERT_TRUE(vulkan.ok()) << vulkan.status().message();
    for (int64_t lose_at : {1, 2, 3, 4, 5}) {
      SCOPED_TRACE(::testing::Message() << "binding " << binding << ", lost at submission " << lose_at);
      auto fb = Make(64, lose_at, binding);
      ASSERT_NE(fb, nullptr);
      SequenceKv s(layout_, 256);
      std::vector<std::vector<float>> got{Alone(*fb, s, Prompt(39))};
      for (const TokenId& t : next) got.push_back(Alone(*fb, s, std::span<const TokenId>(&t, 1)));
      EXPECT_EQ(s.n_tokens(), 39 + 4);
      // Five passes make at least five submissions, so the device is gone by now.
      EXPECT_TRUE(fb->stats().device_lost);
      EXPECT_TRUE(fb->Health().device_lost);
      EXPECT_EQ(fb->device(), nullptr);
      EXPECT_STREQ(fb->name(), "cpu");
      const int64_t on_device = fb->stats().device_passes;
      EXPECT_EQ(on_device + fb->stats().cpu_passes, 5);
      EXPECT_EQ(fb->Health().cpu_fallback_steps, 5 - on_device);
      std::printf("[vulkan fallback] binding %lld, lost at submission %lld: %lld of 5 passes on the device\n",
                  static_cast<long long>(binding), static_cast<long long>(lose_at), static_cast<long long>(on_device));

      SequenceKv r(layout_, 256);
      auto backend = [&](size_t pass) -> Backend& { return static_cast<int64_t>(pass) < on_device ? **vulkan : *cpu_; };
      std::vector<std::vector<float>> want{Alone(backend(0), r, Prompt(39))};
      for (size_t i = 0; i < 4; ++i) want.push_back(Alone(backend(i + 1), r, std::span<const TokenId>(&next[i], 1)));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "pass " << i;

      // The engine zeroes freed blocks' copies: a lost device has none left, and says so calmly.
      const uint64_t serial = s.block(0)->serial;
      EXPECT_TRUE(fb->ForgetBlocks(std::span<const uint64_t>(&serial, 1)).ok());
      EXPECT_TRUE(fb->KeepsBlockCopies());
      EXPECT_EQ(fb->BlockCopies(), 0);
      EXPECT_EQ(fb->SetVulkanTuning(VulkanTuning{}).code(), StatusCode::kUnsupported);
    }
  }
}

// The engine zeroes the copies of freed blocks before each pass, so the loss may show there
// first: that is no error (the engine aborts on one), and the next pass runs on the CPU.
TEST_F(VulkanFallbackTest, ALossSeenFirstWhenZeroingCopiesIsNoError) {
  auto fb = Make(64, 2);
  ASSERT_NE(fb, nullptr);
  auto vulkan = MakeVulkanBackend(*model_, VulkanOptions{});
  ASSERT_TRUE(vulkan.ok()) << vulkan.status().message();
  SequenceKv s(layout_, 256), r(layout_, 256);
  EXPECT_EQ(Alone(*fb, s, Prompt(39)), Alone(**vulkan, r, Prompt(39)));  // submission 1
  const uint64_t freed = ~uint64_t{0};  // a block the device holds no copy of: still a submission
  EXPECT_TRUE(fb->ForgetBlocks(std::span<const uint64_t>(&freed, 1)).ok());  // submission 2: lost
  EXPECT_TRUE(fb->stats().device_lost);
  EXPECT_EQ(fb->device(), nullptr);
  const TokenId next = 42;
  EXPECT_EQ(Alone(*fb, s, std::span<const TokenId>(&next, 1)), Alone(*cpu_, r, std::span<const TokenId>(&next, 1)));
  EXPECT_EQ(fb->stats().device_passes, 1);
  EXPECT_EQ(fb->stats().cpu_passes, 1);
}

// A lost device is made again once the wait is over, and the new one starts with no KV copies:
// it must upload the host rows, written by the old device and by the CPU in between. The
// logits must equal, bit for bit, those of the old device, then the CPU, then a fresh Vulkan
// backend that also starts from the host rows.
TEST_F(VulkanFallbackTest, ALostDeviceIsMadeAgainAndReadsTheHostRows) {
  VulkanOptions options;
  options.kv_device_bytes = 64 * 2 * layout_.n_layer * kBlockTokens * ((layout_.row_bytes() + 3) / 4 * 4);
  auto device = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(device.ok()) << device.status().message();
  ASSERT_TRUE(VulkanLoseDevice(**device, 2).ok());  // in the second pass
  int64_t now_ms = 0;
  int makes = 0;
  DeviceRecovery recovery;
  recovery.now_ms = [&] { return now_ms; };
  recovery.make = [&]() {
    ++makes;
    return MakeVulkanBackend(*model_, options);
  };
  FallbackBackend fb(*model_, std::move(*device), CpuOptions{2, &cpu::ScalarKernels()}, std::move(recovery));

  auto before = MakeVulkanBackend(*model_, options), after = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(before.ok() && after.ok());
  const TokenId next[4] = {42, 7, 1000, 3};
  SequenceKv s(layout_, 256), r(layout_, 256);
  auto one = [](const TokenId& t) { return std::span<const TokenId>(&t, 1); };
  EXPECT_EQ(Alone(fb, s, Prompt(39)), Alone(**before, r, Prompt(39)));
  EXPECT_EQ(Alone(fb, s, one(next[0])), Alone(*cpu_, r, one(next[0])));  // lost: on the CPU
  EXPECT_TRUE(fb.stats().device_lost);
  now_ms = 999;
  EXPECT_EQ(Alone(fb, s, one(next[1])), Alone(*cpu_, r, one(next[1])));
  EXPECT_EQ(makes, 0);
  now_ms = 1000;
  EXPECT_EQ(Alone(fb, s, one(next[2])), Alone(**after, r, one(next[2])));  // made again
  EXPECT_EQ(Alone(fb, s, one(next[3])), Alone(**after, r, one(next[3])));
  EXPECT_EQ(makes, 1);
  ASSERT_NE(fb.device(), nullptr);
  EXPECT_FALSE(fb.Health().device_lost);
  EXPECT_EQ(fb.Health().device_losses, 1);
  EXPECT_EQ(fb.stats().device_passes, 3);
  EXPECT_EQ(fb.stats().cpu_passes, 2);
  EXPECT_EQ(s.n_tokens(), 39 + 4);
  EXPECT_EQ(fb.BlockCopies(), (*after)->BlockCopies());
  EXPECT_GT(fb.BlockCopies(), 0);
  const uint64_t serial = s.block(0)->serial;
  EXPECT_TRUE(fb.ForgetBlocks(std::span<const uint64_t>(&serial, 1)).ok());
  EXPECT_EQ(fb.BlockCopies(), (*after)->BlockCopies() - 1);
}

// The backend kvfsd asks for makes a lost device again by itself, on the steady clock, a
// second after the loss.
TEST_F(VulkanFallbackTest, TheRequestedBackendMakesALostDeviceAgain) {
  BackendRequest request;
  request.vulkan = true;
  request.cpu = CpuOptions{2, &cpu::ScalarKernels()};
  auto chosen = MakeRequestedBackend(*model_, request);
  ASSERT_TRUE(chosen.ok()) << chosen.status().message();
  auto* fb = dynamic_cast<FallbackBackend*>(chosen->backend.get());
  ASSERT_NE(fb, nullptr);
  ASSERT_TRUE(VulkanLoseDevice(*fb, 1).ok());
  SequenceKv s(layout_, 256), r(layout_, 256);
  EXPECT_EQ(Alone(*fb, s, Prompt(20)), Alone(*cpu_, r, Prompt(20)));
  EXPECT_TRUE(fb->Health().device_lost);
  EXPECT_EQ(VulkanLoseDevice(*fb, 1).code(), StatusCode::kUnsupported);  // no device now
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto fresh = MakeVulkanBackend(*model_, VulkanOptions{});
  ASSERT_TRUE(fresh.ok()) << fresh.status().message();
  const TokenId next = 42;
  EXPECT_EQ(Alone(*fb, s, std::span<const TokenId>(&next, 1)), Alone(**fresh, r, std::span<const TokenId>(&next, 1)));
  EXPECT_FALSE(fb->Health().device_lost);
  EXPECT_EQ(fb->Health().device_losses, 1);
  EXPECT_EQ(fb->stats().device_remakes, 1);
  EXPECT_EQ(fb->stats().device_passes, 1);
  EXPECT_TRUE(VulkanLoseDevice(*fb, 1).ok());  // a device again
}

// Without the fallback (what kvfs bench asks for), a lost device is an error that leaves the
// sequence as it was.
TEST_F(VulkanFallbackTest, WithoutTheFallbackALostDeviceIsAnError) {
  auto device = MakeVulkanBackend(*model_, VulkanOptions{});
  ASSERT_TRUE(device.ok()) << device.status().message();
  ASSERT_TRUE(VulkanLoseDevice(**device, 1).ok());
  SequenceKv s(layout_, 256);
  Logits lg;
  const SequenceStep step{&s, Prompt(20), false};
  const Status st = (*device)->Forward(std::span<const SequenceStep>(&step, 1), lg);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
  EXPECT_NE(st.message().find("VK_ERROR_DEVICE_LOST"), std::string::npos) << st.message();
  EXPECT_TRUE((*device)->Lost());
  EXPECT_EQ(s.n_tokens(), 0);
  EXPECT_EQ((*device)->Forward(std::span<const SequenceStep>(&step, 1), lg).code(), StatusCode::kUnavailable);
}

// kvfsd holds a private copy of the model (GgufLoad::kPrivateCopy). While the device holds the
// matrices and no CPU backend is made, the copy's bytes of them are given back; the CPU behind
// the device and a remade device read them back from the file first, and the logits stay those
// of backends made from the file. A file rewritten in place since cannot be read back: the CPU
// then refuses, naming the file, instead of computing with other weights.
TEST_F(VulkanFallbackTest, APrivateCopysMatricesAreGivenBackWhileTheDeviceHoldsThem) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kvfs_give_back_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path copy = dir / "model.gguf";
  std::filesystem::copy_file(testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf", copy,
                             std::filesystem::copy_options::overwrite_existing);
  auto loaded = Model::Load(copy.string(), GgufLoad::kPrivateCopy);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Model& model = **loaded;
  int64_t matrix_bytes = model.weights().token_embd.n_out * model.weights().token_embd.row_bytes;
  if (!model.weights().tied_output) matrix_bytes += model.weights().output.n_out * model.weights().output.row_bytes;
  for (const LayerWeights& l : model.weights().layers)
    for (const Matrix* m : l.Matrices()) matrix_bytes += m->n_out * m->row_bytes;

  auto device = MakeVulkanBackend(model, VulkanOptions{});
  ASSERT_TRUE(device.ok()) << device.status().message();
  ASSERT_TRUE(VulkanLoseDevice(**device, 2).ok());  // in the second pass
  int64_t now_ms = 0;
  DeviceRecovery recovery;
  recovery.now_ms = [&] { return now_ms; };
  bool fail_make = false;
  recovery.make = [&]() -> Result<std::unique_ptr<Backend>> {
    if (fail_make) return Unavailable("the device is still gone");
    return MakeVulkanBackend(model, VulkanOptions{});
  };
  FallbackBackend fb(model, std::move(*device), CpuOptions{2, nullptr}, std::move(recovery));
  // Each matrix loses at most a page at either end to its neighbours.
  const int64_t slack = 2 * ::sysconf(_SC_PAGESIZE) * (2 + 7 * static_cast<int64_t>(model.weights().layers.size()));
  EXPECT_GE(model.gguf().given_back_bytes(), matrix_bytes - slack);
  EXPECT_LE(model.gguf().given_back_bytes(), matrix_bytes);

  auto vulkan_ref = MakeVulkanBackend(*model_, VulkanOptions{});
  auto cpu_ref = MakeCpuBackend(*model_, CpuOptions{2, nullptr});  // the table the fallback's CPU uses
  ASSERT_TRUE(vulkan_ref.ok());
  const TokenId next[3] = {42, 7, 1000};
  auto one = [](const TokenId& t) { return std::span<const TokenId>(&t, 1); };
  SequenceKv s(layout_, 256), r(layout_, 256);
  EXPECT_EQ(Alone(fb, s, Prompt(39)), Alone(**vulkan_ref, r, Prompt(39)));
  EXPECT_EQ(Alone(fb, s, one(next[0])), Alone(*cpu_ref, r, one(next[0])));  // lost: on the CPU
  EXPECT_TRUE(fb.stats().device_lost);
  const int64_t cpu_gave_back = model.gguf().given_back_bytes();
  EXPECT_LT(cpu_gave_back, matrix_bytes - slack);  // read back; the CPU gave back what it packed
  // A remake that fails reads the CPU's given-back bytes back for nothing: they go again.
  fail_make = true;
  now_ms = 1000;
  SequenceKv t(layout_, 256), rt(layout_, 256);
  EXPECT_EQ(Alone(fb, t, Prompt(5)), Alone(*cpu_ref, rt, Prompt(5)));
  EXPECT_EQ(fb.stats().remake_failures, 1);
  EXPECT_EQ(model.gguf().given_back_bytes(), cpu_gave_back);
  fail_make = false;
  now_ms = 3000;  // the wait doubled
  auto vulkan_after = MakeVulkanBackend(*model_, VulkanOptions{});
  ASSERT_TRUE(vulkan_after.ok());
  EXPECT_EQ(Alone(fb, s, one(next[1])), Alone(**vulkan_after, r, one(next[1])));  // made again
  EXPECT_EQ(fb.stats().device_remakes, 1);
  EXPECT_GE(model.gguf().given_back_bytes(), matrix_bytes - slack);

  // The file rewritten in place; the device lost again (at its next submission): the CPU
  // cannot read the weights back.
  ASSERT_TRUE(VulkanLoseDevice(fb, 1).ok());
  {
    std::FILE* f = std::fopen(copy.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    const std::string junk(static_cast<size_t>(std::filesystem::file_size(copy)), '\x5a');
    ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());
    std::fclose(f);
  }
  Logits lg;
  const SequenceStep step{&s, one(next[2]), false};
  const Status st = fb.Forward(std::span<const SequenceStep>(&step, 1), lg);
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.message();
  EXPECT_NE(st.message().find("model.gguf: the model file changed"), std::string::npos) << st.message();
  EXPECT_GE(model.gguf().given_back_bytes(), matrix_bytes - slack);  // still given back, not the new bytes
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfs
