// Shared by the Vulkan op conformance tests: a device, its pipelines and ops, host-visible
// buffers for inputs and outputs, and the error measure. Only built with KVFS_VULKAN.
#pragma once

#if defined(KVFS_VULKAN)

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/vulkan/vk_commands.h"
#include "engine/backend/vulkan/vk_context.h"
#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_pipelines.h"
#include "engine/model/ggml_types.h"
#include "engine/model/quants.h"
#include "tests/engine/random_operands.h"
#include "tests/test_support.h"

namespace kvfs::testing {

// NMSE = sum (got - want)^2 / sum want^2.
inline double Nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0.0 ? num / den : num;
}

inline std::string TypeName(GgmlType t) { return std::string(GgmlTypeInfo(static_cast<uint32_t>(t))->name); }

// n_rows rows of n values of type t: random bytes with sane f16 scale fields; float types N(0, 1).
inline std::vector<uint8_t> RandomWeights(GgmlType t, int64_t n_rows, int64_t n, std::mt19937& rng) {
  const int64_t row_bytes = RowBytes(t, n);
  std::vector<uint8_t> w(static_cast<size_t>(row_bytes * n_rows));
  for (size_t i = 0; i < w.size(); i += 4) {  // random bytes, four per draw
    const uint32_t bits = rng();
    std::memcpy(w.data() + i, &bits, std::min<size_t>(4, w.size() - i));
  }
  SetSaneScales(t, w, n_rows, n, rng);
  return w;
}


class VulkanOpsTest : public ::testing::Test {
 protected:
  // Whether the context may use the packed integer dot product (the *_idot shaders).
  virtual bool IntegerDot() const { return true; }

  void SetUp() override {
    auto ctx = vk::Context::Create(-1, IntegerDot());
    KVFS_REQUIRE_VULKAN(ctx.status());
    ctx_ = std::move(*ctx);
    pipelines_ = std::make_unique<vk::PipelineCache>(ctx_->device());
    auto ops = vk::Ops::Create(*ctx_, *pipelines_);
    ASSERT_TRUE(ops.ok()) << ops.status().message();
    ops_ = std::move(*ops);
    rec_ = std::make_unique<vk::Recorder>(*ctx_);
  }
  void TearDown() override {
    rec_.reset();
    ops_.reset();
    pipelines_.reset();
    ctx_.reset();
  }

  // A host-visible buffer holding `bytes` bytes of `data` (shaders read it directly).
  vk::Buffer Input(const void* data, size_t bytes) {
    auto b = ctx_->CreateBuffer(static_cast<int64_t>(bytes), vk::MemoryKind::kUpload);
    EXPECT_TRUE(b.ok()) << b.status().message();
    if (!b.ok()) return {};
    std::memset(b->mapped(), 0, static_cast<size_t>(b->bytes()));
    if (bytes > 0) std::memcpy(b->mapped(), data, bytes);
    return std::move(*b);
  }
  template <typename T>
  vk::Buffer Input(const std::vector<T>& v) {
    return Input(v.data(), v.size() * sizeof(T));
  }
  // A zeroed host-visible buffer the shaders write and the test reads.
  vk::Buffer Output(size_t bytes) {
    auto b = ctx_->CreateBuffer(static_cast<int64_t>(bytes), vk::MemoryKind::kReadback);
    EXPECT_TRUE(b.ok()) << b.status().message();
    if (!b.ok()) return {};
    std::memset(b->mapped(), 0, static_cast<size_t>(b->bytes()));
    return std::move(*b);
  }
  template <typename T>
  static std::vector<T> Read(const vk::Buffer& b, size_t n) {
    std::vector<T> v(n);
    std::memcpy(v.data(), b.mapped(), n * sizeof(T));
    return v;
  }
  // Records `record` in one command buffer, runs it and waits.
  Status Run(const std::function<Status(vk::Recorder&)>& record) {
    KVFS_RETURN_IF_ERROR(rec_->Begin());
    KVFS_RETURN_IF_ERROR(record(*rec_));
    return rec_->SubmitAndWait();
  }

  std::unique_ptr<vk::Context> ctx_;
  std::unique_ptr<vk::PipelineCache> pipelines_;
  std::unique_ptr<vk::Ops> ops_;
  std::unique_ptr<vk::Recorder> rec_;
};

}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
