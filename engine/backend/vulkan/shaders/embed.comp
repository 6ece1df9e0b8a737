#version 450
#extension GL_GOOGLE_include_directive : require
// Token embeddings: x[t] = dequantized row tokens[t] of token_embd, for any weight type the
// backend supports (WEIGHT_TYPE). One invocation per 32 values of a row. A matrix split into
// parts (rows row0 .. row0 + n_rows of this binding) is looked up part by part: tokens outside
// this part are left to the other dispatches.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint WEIGHT_TYPE = 1;
layout(constant_id = 2) const uint WEIGHT_LAYOUT = 0;  // vk::WeightLayout

layout(push_constant) uniform Params {
  uint n;          // values per row (n_embd)
  uint row_bytes;  // bytes per weight row
  uint row0;       // first token id held by this part
  uint n_rows;     // rows in this part
  uint n_tokens;
} p;

layout(binding = 0) readonly buffer Weights { uint weight_words[]; };  // n_rows rows of row_bytes
layout(binding = 1) readonly buffer Tokens { int tokens[]; };          // [n_tokens]
layout(binding = 2) writeonly buffer Output { float x[]; };            // [n_tokens][n]

#include "common.glsl"
#include "weight_bytes.glsl"
#include "weight_units.glsl"
#include "weight_values.glsl"

void main() {
  const uint u = gl_GlobalInvocationID.x;
  const uint t = gl_GlobalInvocationID.y;
  if (t >= p.n_tokens || 32u * u >= p.n) return;
  const uint id = uint(tokens[t]);
  if (id < p.row0 || id >= p.row0 + p.n_rows) return;
  const uint row = (id - p.row0) * p.row_bytes;
  const bool is_float = WEIGHT_TYPE == kTypeF32 || WEIGHT_TYPE == kTypeF16 || WEIGHT_TYPE == kTypeBF16;
  if (is_float) {
    for (uint j = 0u; j < 32u && 32u * u + j < p.n; ++j) x[t * p.n + 32u * u + j] = WeightValue(row, 32u * u + j);
  } else {
    const WeightUnit wu = LoadUnit(row, u, (p.n + 31u) / 32u);
    for (uint j = 0u; j < 32u; ++j) x[t * p.n + 32u * u + j] = UnitValue(wu, j);
  }
}
