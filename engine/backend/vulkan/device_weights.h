// The model's weights on the device, uploaded once when the backend is made: every matrix as
// its GGUF rows (the shaders decode the block formats themselves), Q4_0 and Q8_0 rows
// rewritten with aligned codes (WeightLayout::kSplitRows) unless asked not to, split into
// parts of whole rows where a matrix is larger than one storage binding may cover; norms and
// biases as f32.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
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
  DeviceMatrix wq, wk, wv, wo;  // as LayerWeights; wq, wk, wv without parts when stacked in wqkv
  DeviceVector bq, bk, bv;      // qwen2 only; empty otherwise, and when stacked in bqkv
  // wq, wk, wv stacked ([n_embd -> n_embd_q + 2 n_embd_kv], segment_rows {n_embd_q, n_embd_q +
  // n_embd_kv}) when they share a type (WeightUploadOptions::stack_matrices): one dispatch for
  // the three; bqkv their biases one after another (qwen2). No parts otherwise.
  DeviceMatrix wqkv;
  DeviceVector bqkv;
  DeviceVector ffn_norm;        // [n_embd]
  DeviceMatrix w_gate, w_up, w_down;  // w_gate and w_up without parts when stacked
  DeviceMatrix w_gate_up;       // w_gate and w_up stacked ([n_embd -> 2 n_ff]) when they share a type
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
  bool stack_matrices = true;     // q/k/v and gate/up as one matrix each where their types agree
};

// Copies one matrix to the device in parts of whole rows; adds the bytes it takes to
// total_bytes. The copies run at the uploader's next flush.
Result<DeviceMatrix> UploadMatrix(Context& ctx, Uploader& uploader, const Matrix& m,
                                  const WeightUploadOptions& options, int64_t& total_bytes);
// Whether matrices can be stacked into one: up to three, all of one type and row length.
bool Stackable(std::span<const Matrix* const> ms);
// The device matrix UploadStacked makes of Stackable matrices (type, layout, rows, segments and
// parts), without buffers: what kvfs shaders plans its pipelines for.
Result<DeviceMatrix> PlanStacked(std::span<const Matrix* const> ms, const WeightUploadOptions& options);
// Whether a layer's q, k, v (all of one type, biases all there or all absent) and its gate, up
// go to the device stacked.
bool StacksQkv(const LayerWeights& l, const WeightUploadOptions& options);
bool StacksGateUp(const LayerWeights& l, const WeightUploadOptions& options);
// Copies Stackable matrices to the device as one, their rows one after another
// (DeviceMatrix::segment_rows says where each starts), in parts of whole rows as UploadMatrix.
Result<DeviceMatrix> UploadStacked(Context& ctx, Uploader& uploader, std::span<const Matrix* const> ms,
                                   const WeightUploadOptions& options, int64_t& total_bytes);

// Copies every tensor to the device.
Result<std::unique_ptr<DeviceWeights>> UploadWeights(Context& ctx, Uploader& uploader, const ModelWeights& w,
                                                     const WeightUploadOptions& options);

}  // namespace kvfs::vk
