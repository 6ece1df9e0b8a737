#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, one workgroup per row. The sum of squares is a
// tree of f32 partial sums (the CPU sums in double; the difference is far below the
// tolerances). With gather set, output row i normalizes input row row_ids[i] (the final norm
// runs only over the rows whose logits are wanted).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  // a power of two

layout(push_constant) uniform Params {
  uint n;         // values per row
  uint x_stride;  // floats between rows of x
  uint y_stride;  // floats between rows of y
  uint gather;    // 1: input row = row_ids[output row]
  float eps;
} p;

layout(binding = 0) readonly buffer Input { float x[]; };
layout(binding = 1) readonly buffer Weight { float w[]; };  // [n]
layout(binding = 2) writeonly buffer Output { float y[]; };
layout(binding = 3) readonly buffer RowIds { int row_ids[]; };

shared float partial[WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint out_row = gl_WorkGroupID.x;
  const uint in_row = p.gather != 0u ? uint(row_ids[out_row]) : out_row;
  const uint x0 = in_row * p.x_stride, y0 = out_row * p.y_stride;
  float sum = 0.0;
  for (uint i = tid; i < p.n; i += WG) {
    precise float sq = x[x0 + i] * x[x0 + i];
    sum += sq;
  }
  partial[tid] = sum;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  const float mean = partial[0] / float(p.n);
  const float scale = 1.0 / sqrt(mean + p.eps);
  for (uint i = tid; i < p.n; i += WG) {
    precise float v = (x[x0 + i] * scale) * w[i];
    y[y0 + i] = v;
  }
}
