// What the device's shader compiler makes of the matrix shaders a model runs (kvfs shaders):
// for each distinct weight matrix (type and shape, stacked as the backend stacks them), the
// pipeline a decode step or a prompt batch multiplies it with, and the compiler's statistics
// of that pipeline (registers, spills, shared memory, occupancy, in the driver's own words;
// VK_KHR_pipeline_executable_properties). The same for the attention steps of one sequence
// per KV format (kv_store, the scores, softmax, the weighted sums, their reduction), alone and
// merged with other sequences' calls.
//
// Why: the matrix products stream the weights, so their code decides decode speed, and
// whether a change helps a GPU is first a question of what its compiler emits (registers per
// invocation, so occupancy; loads in flight). Nothing is run, so it also works on Mesa's
// driver for AMD GPUs with no GPU present (RADV_FORCE_FAMILY=gfx1100, a "null" device that
// compiles but cannot run; docs/performance.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/status.h"

namespace kvfs {

struct ShaderStatistic {
  std::string name;  // the driver's, e.g. RADV's "VGPRs" or "Subgroups per SIMD"
  double value = 0;  // integers, floats and booleans (0/1) alike
  bool operator==(const ShaderStatistic&) const = default;
};

struct MatrixShader {
  std::string matrices;  // which of a layer's matrices ("q|k|v", "o", "gate|up", "down"), or "output"
  std::string type;      // the weights' type name ("q4_0")
  int64_t n_in = 0;
  int64_t n_out = 0;     // rows (of all stacked matrices)
  int64_t layers = 0;    // layers with a matrix of this kind, type and shape (1 for "output")
  int64_t tokens = 0;    // activation rows multiplied at once (the output matrix of a prompt of
                         // more than 8: its last row only, on the tiled shader as the prompt's)
  std::string shader;    // the pipeline's shader (e.g. "matvec_quant_idot_sg")
  std::vector<uint32_t> constants;  // its specialization constants, ids 0.. in order
  uint32_t rows_per_group = 0;      // outputs each workgroup computes: rows by tokens
  uint32_t tokens_per_group = 0;
  bool norm = false;  // makes its input's RMSNorm itself (VulkanMatvecShape::norm_group)
  bool short_steps = false;  // the rows of that many short steps (ShaderReportOptions::short_steps)
  std::vector<ShaderStatistic> statistics;  // empty when the device reports none
};

// A pipeline of one sequence's attention step as a fused pass records it.
struct AttentionShader {
  std::string kv;       // the KV format ("q4k")
  int64_t tokens = 0;   // query tokens of the sequence
  int64_t depth = 0;    // positions cached before them
  std::string step;     // "kv_store", "scores", "softmax", "output" or "reduce"
  bool merged = false;  // the variant that runs several sequences' calls (kv_store: rows) in one dispatch
  std::string shader;
  std::vector<uint32_t> constants;
  std::vector<ShaderStatistic> statistics;
};

// The RMSNorm before a layer's attention, its feed-forward and the output matrix, fused with the
// quantization of its output for the matrix after it (a float matrix: the plain norm).
struct NormShader {
  std::string norm;  // "attention", "feed-forward" or "output"
  std::string acts;  // the activations it makes: "q8_0", "q8_1", "q8_k" or "f32"
  std::string shader;
  std::vector<uint32_t> constants;
  std::vector<ShaderStatistic> statistics;
};

struct ShaderReport {
  VulkanDeviceInfo device;
  bool statistics = false;  // whether the device reports pipeline statistics at all
  std::vector<MatrixShader> shaders;  // by matrix, then tokens
  std::vector<AttentionShader> attention;  // by KV format, then tokens, then step
  std::vector<NormShader> norms;  // of the first layer (other layers' matrices may take other kinds)
};

struct ShaderReportOptions {
  int device = -1;                        // as VulkanOptions::device
  std::vector<int64_t> tokens = {1, 512};  // batch sizes to plan (decode, a prompt)
  VulkanTuning tuning;                    // as the backend would record with it
  bool split_weight_rows = true;          // as VulkanOptions
  bool stack_matrices = true;
  std::vector<std::string> kv = {"f16", "q4k"};  // KV formats whose attention to plan (none: skip)
  int64_t depth = 4096;                          // positions cached before the tokens
  int64_t block_tokens = 256;                    // tokens per KV block (as the engine's default)
  bool short_steps = false;  // more than 8 tokens as the rows of as many short steps (a busy
                             // decode step: the matrix-vector shaders), not of one prompt
};

// Unsupported without the Vulkan backend; the device's errors otherwise.
Result<ShaderReport> VulkanShaderReport(const Model& model, const ShaderReportOptions& options);

}  // namespace kvfs
