// The model's weights on the device, uploaded once when the backend is made: every matrix as
// its GGUF rows (the shaders decode the block formats themselves), Q4_0 and Q8_0 rows
// rewritten with aligned codes (WeightLayout::kSplitRows) unless asked not to, split into
// parts of whole rows where a matrix is larger than one storage binding may cover; norms and
// biases as f32.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_transfer.h"
#include "engine/core/status.h"
#include "engine/model/weights.h"

namespace kvfs::vk {

struct DeviceVector {
  Buffer buffer;  // n floats
  int64_t n = 0;
  bool empty() const { return n == 0; }
};

struct DeviceLayer {
  DeviceVector attn_norm;       // [n_embd]
  DeviceMatrix wq, wk, wv, wo;  // as LayerWeights
  DeviceVector bq, bk, bv;      // qwen2 only; empty otherwise
  DeviceVector ffn_norm;        // [n_embd]
  DeviceMatrix w_gate, w_up, w_down;
};

struct DeviceWeights {
  DeviceMatrix token_embd;          // n_vocab rows of n_embd
  DeviceMatrix untied_output;       // [n_embd -> n_vocab]; no parts when the output is tied
  const DeviceMatrix* output = nullptr;  // &untied_output, or &token_embd when tied
  DeviceVector output_norm;         // [n_embd]
  std::vector<DeviceLayer> layers;
  int64_t bytes = 0;                // device memory they take
};

// Unsupported, naming the tensor and its type, when a matrix has a type the shaders lack.
Status CheckWeightTypes(const ModelWeights& w);

struct WeightUploadOptions {
  int64_t max_binding_bytes = 0;  // no part is larger
  bool split_rows = true;         // kSplitRows for the types that have it; else kGguf
};

// Copies one matrix to the device in parts of whole rows; adds the bytes it takes to
// total_bytes. The copies run at the uploader's next flush.
Result<DeviceMatrix> UploadMatrix(Context& ctx, Uploader& uploader, const Matrix& m,
                                  const WeightUploadOptions& options, int64_t& total_bytes);

// Copies every tensor to the device.
Result<std::unique_ptr<DeviceWeights>> UploadWeights(Context& ctx, Uploader& uploader, const ModelWeights& w,
                                                     const WeightUploadOptions& options);

}  // namespace kvfs::vk
