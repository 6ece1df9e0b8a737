// What the Ops implementation files (vk_ops.cpp: norms, quantizers, matrices; vk_kv_store_ops.cpp:
// KV encoding; vk_attention_ops.cpp: attention) share: workgroup sizes and small conversions.
// Internal to them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <tuple>

#include "engine/backend/vulkan/vk_commands.h"
#include "engine/backend/vulkan/vk_ops.h"

namespace kvfs::vk::ops_detail {

// Workgroup sizes of the element-wise and the row shaders.
constexpr uint32_t kElementwiseGroup = 64;
constexpr uint32_t kRowGroup = 256;  // rms_norm, softmax, attn_output, quantize_act
// The most storage buffers a shader binds (matvec_quant, attn_output; Vulkan only guarantees 4 per stage, real
// devices allow dozens or more): Ops::Create requires them, each file checks its shaders.
constexpr uint32_t kMostStorageBuffers = 10;
static_assert(kMostStorageBuffers <= Recorder::kMaxBuffers);

// The quantizer's shared arrays (quantize_block.glsl): 5 words per invocation when quantizing.
inline int64_t QuantizerSharedBytes(uint32_t group, bool quantizes) { return quantizes ? int64_t{20} * group : 20; }

inline uint32_t U32(int64_t v) { return static_cast<uint32_t>(v); }
inline uint32_t CeilDiv(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

// 1 / sqrt(head_dim): the orthonormal Walsh-Hadamard transform's scale, and the softmax's scale
// of the scores.
inline float InvSqrtHeadDim(int64_t head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

// The spec constant ROPE of kv_store and attn_scores: 0 none, 1 pairs (2i, 2i+1), 2 NeoX pairs.
inline uint32_t RopeMode(const Ops::RopeTable* rope) {
  return rope == nullptr ? 0u : (rope->style == RopeStyle::kNeox ? 2u : 1u);
}

// An AttnCall's spec constants, Params and buffers from arrays (JOBS 0; the jobs table unbound).
template <size_t NS, typename Params, size_t NB>
void FillCall(const uint32_t (&spec)[NS], const Params& params, const Buffer* const (&buffers)[NB],
              const Buffer* unused, Ops::AttnCall& call) {
  static_assert(NS + 1 <= std::tuple_size_v<decltype(call.spec)>);
  static_assert(NB + 1 <= std::tuple_size_v<decltype(call.buffers)>);
  static_assert(sizeof(Params) % 4 == 0 && sizeof(Params) <= 4 * Ops::kMaxCallWords);
  std::copy(std::begin(spec), std::end(spec), call.spec.begin());
  call.spec[NS] = 0;
  call.n_spec = NS + 1;
  std::copy(std::begin(buffers), std::end(buffers), call.buffers.begin());
  call.buffers[NB] = unused;
  call.n_buffers = NB + 1;
  std::memcpy(call.params.data(), &params, sizeof(Params));
  call.n_params = sizeof(Params) / 4;
}

}  // namespace kvfs::vk::ops_detail
