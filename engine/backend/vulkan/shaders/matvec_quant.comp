#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_INTEGER_DOT)
#extension GL_EXT_spirv_intrinsics : require
#endif
#if defined(KVFS_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#if defined(KVFS_PHASE_CLOCK)
#extension GL_EXT_shader_realtime_clock : require
#extension GL_ARB_shader_clock : require
#endif
// y = W x for a few activation rows (decode and small batches) with quantized weights:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (WEIGHT_TYPE) against activations
// quantized by quantize_act. A workgroup has WG / LANES slots of LANES invocations; a slot
// computes ROWS_PER_SLOT consecutive weight rows for TOKENS activation rows. Its invocations
// stride over the 32-value units: each loads a unit of the activations once and uses it for
// all of the slot's rows (activation units outweigh weight units about 3 to 1 in bytes, so
// reloading them per row costs more cache bandwidth than the weights' memory bandwidth), and
// decodes each weight unit once for all TOKENS tokens. Partial sums are added up as a tree
// (subgroup_tree.glsl). LANES follows the row length (short rows: several slots per
// workgroup, no idle invocations); the host picks ROWS_PER_SLOT so that large matrices still
// fill the device.
//
// Epilogue (flags): y = [y_old +] (W x [+ bias]), the residual add and the qwen2 bias fused.
// With KIND < 3, a stacked gate|up matrix (gate rows [0, seg1) to y, up rows [seg1, 2 seg1) to
// y1) also hands on SwiGLU(gate, up) quantized for the down matrix, as quantize_act (SOURCE 1)
// would: the workgroup whose rows complete a block of BLOCK values (its gate and its up rows,
// counted with an atomic per block and token group) quantizes that block. Decode then needs
// no quantize_act dispatch, and no barrier, between gate|up and down.
//
// Prologue (NORM_UNITS > 0): the activations are RMSNorm(x) * w, made and quantized by every
// workgroup for itself (NormActs, below), so that the norm before q|k|v, gate|up or the output
// matrix needs no dispatch and barrier of its own.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;       // invocations, a power of two
layout(constant_id = 1) const uint WEIGHT_TYPE = 2;
layout(constant_id = 2) const uint LANES = 64;    // invocations per slot, a power of two <= WG
layout(constant_id = 3) const uint TOKENS = 1;
layout(constant_id = 4) const uint ROWS_PER_SLOT = 1;
layout(constant_id = 5) const uint WEIGHT_LAYOUT = 0;  // vk::WeightLayout
layout(constant_id = 6) const uint KIND = 3;  // SwiGLU epilogue's codes: 0 Q8_0, 1 Q8_1, 2 Q8_K; 3 none
layout(constant_id = 7) const uint AHEAD = 1;  // units an invocation loads before using any (a round)
layout(constant_id = 8) const uint NORM_UNITS = 0;  // > 0: the input is RMSNorm(x) * w of this many units (n_units)
layout(constant_id = 9) const uint NORM_KIND = 0;   // and is quantized to 0: Q8_0, 1: Q8_1 codes

layout(push_constant) uniform Params {
  uint n_units;    // 32-value units per row (n_in / 32)
  uint row_bytes;  // bytes per weight row
  uint n_rows;     // rows in this part of the matrix
  uint row_begin;  // first row (within the part) of this dispatch
  uint n_tokens;   // activation rows
  uint y_stride;   // floats between rows of y (the matrix's n_out, or seg1 with several outputs)
  uint y_col0;     // column of y (and index of bias) of the part's row 0
  uint flags;      // 1: add to y's old value; 2: add bias
  // Concatenated matrices (matrix_store.glsl): first rows of the second and third output
  // (0xFFFFFFFF: none), and those outputs' row strides.
  uint seg1;
  uint seg2;
  uint y1_stride;
  uint y2_stride;
  uint x_stride;  // NORM_UNITS > 0: floats between rows of x,
  uint x_row0;    // the row of x of token 0
  float eps;      // and the norm's epsilon
  uint t_begin;   // first activation row of this dispatch (rows [t_begin, n_tokens)): a pass's
                  // short steps and its long ones take different shaders (Ops::MatMulArgs)
} p;

layout(binding = 0) readonly buffer Weights { uint weight_words[]; };  // n_rows rows of row_bytes
layout(binding = 1) readonly buffer ActCodes { uvec4 act_code4[]; };   // [n_tokens][n_units * 2]: 32 codes a unit
layout(binding = 2) readonly buffer ActAux { vec4 act_aux[]; };        // [n_tokens][n_units]
// y and y1 are coherent: the SwiGLU epilogue reads rows other workgroups wrote.
layout(binding = 3) coherent buffer Output { float y[]; };             // [n_tokens][y_stride]
layout(binding = 4) readonly buffer Bias { float bias[]; };            // [y_stride] when flags & 2
layout(binding = 5) coherent buffer Output1 { float y1[]; };           // [n_tokens][y1_stride]: rows from seg1
layout(binding = 6) buffer Output2 { float y2[]; };                     // [n_tokens][y2_stride]: rows from seg2
// KIND < 3: SwiGLU(y, y1) quantized (quantize_block.glsl's layout), and the blocks' counters.
layout(binding = 7) writeonly buffer Codes { uint codes[]; };          // [n_tokens][seg1 / 4]
layout(binding = 8) writeonly buffer Aux { vec4 aux[]; };              // [n_tokens][seg1 / 32]
layout(binding = 9) coherent buffer Counters { uint counters[]; };     // [token groups][seg1 / BLOCK]
// NORM_UNITS > 0: bindings 1 and 2 hold the norm's input rows and weight instead of codes.
layout(binding = 1) readonly buffer NormInput { float x[]; };          // [x_row0 + n_tokens][x_stride]
layout(binding = 2) readonly buffer NormWeight { float norm_w[]; };    // [NORM_UNITS * 32]

#include "common.glsl"
#include "weight_bytes.glsl"
#include "weight_units.glsl"

const uint SLOTS = WG / LANES;
// Activation units loaded a round ahead (up to 4 tokens); else token by token (the wide groups
// of a busy step's decode rows; never with the norm or the SwiGLU epilogue: Ops::PlanMatMul).
const bool ACTS_AHEAD = TOKENS <= 4u;
const uint OUTPUTS = ROWS_PER_SLOT * TOKENS;  // per slot: output k * TOKENS + t is row k, token t

shared float partial[OUTPUTS * WG];
#define RMS_LO_SIZE (NORM_UNITS > 0u ? WG : 1u)
#include "rms_scale.glsl"

#include "matrix_store.glsl"
#include "subgroup_tree.glsl"

const uint QUANT_SHARED = KIND < 3u ? WG : 1u;
#include "quantize_block.glsl"
#include "phase_clock.glsl"

const uint GROUP_ROWS = SLOTS * ROWS_PER_SLOT;  // rows per workgroup
// Blocks whose counts a workgroup's rows can complete: in each of gate and up, its rows'
// blocks (BLOCK >= 32); [0] holds the count.
shared uint finished[KIND < 3u ? 2u * (GROUP_ROWS / 32u + 2u) + 1u : 1u];

// The SwiGLU epilogue (KIND < 3), after this workgroup's rows are stored: every invocation
// calls it. Counting follows the CUDA threadfence-reduction idiom, as attn_output's one pass:
// every invocation's fence, the workgroup barrier, then the counting invocation's fences
// around the atomics. A block completes once its 2 * BLOCK gate and up rows are counted; the
// workgroup that completes it resets its counter (0 for the next use) and quantizes it.
void QuantizeFinishedBlocks(uint tid, uint subgroup) {
  const uint first = p.row_begin + gl_WorkGroupID.x * GROUP_ROWS;
  const uint s0 = p.y_col0 + first, s1 = p.y_col0 + min(first + GROUP_ROWS, p.n_rows);  // stacked rows
  const uint n = p.seg1, n_blocks = n / BLOCK;
  memoryBarrierBuffer();
  barrier();
  // Every invocation walks the blocks (uniform control flow: on lavapipe, a loop of atomics
  // inside `if (tid == 0)` left the rest of that invocation's SIMD group writing nothing
  // afterwards); invocation 0 counts.
  if (tid == 0u) memoryBarrierBuffer();
  uint n_counted = 0u;
  for (uint which = 0u; which < 2u; ++which) {  // gate rows, then up rows
    const uint base = which * n, lo = max(s0, base), hi = min(s1, base + n);
    const uint b_end = lo < hi ? (hi - base + BLOCK - 1u) / BLOCK : 0u;
    for (uint b = lo < hi ? (lo - base) / BLOCK : 0u; b < b_end; ++b) {
      if (tid == 0u) {
        const uint rows = min(hi, base + (b + 1u) * BLOCK) - max(lo, base + b * BLOCK);
        const uint counter = gl_WorkGroupID.y * n_blocks + b;
        if (atomicAdd(counters[counter], rows) + rows == 2u * BLOCK) {
          atomicExchange(counters[counter], 0u);
          finished[1u + n_counted++] = b;
        }
      }
    }
  }
  if (tid == 0u) {
    memoryBarrierBuffer();
    finished[0] = n_counted;
  }
  barrier();
  const uint n_finished = finished[0];
  if (n_finished == 0u) return;  // the same for the whole workgroup
  memoryBarrierBuffer();
  // 32 invocations a block, WG / 32 blocks a pass, each for the workgroup's tokens.
  for (uint i0 = 0u; i0 < n_finished; i0 += WG / 32u) {
    const uint i = i0 + tid / 32u;
    const uint b = i < n_finished ? finished[1u + i] : 0u;
    for (uint k = 0u; k < TOKENS; ++k) {
      const uint t = gl_WorkGroupID.y * TOKENS + k;
      const bool live = i < n_finished && t < p.n_tokens;
      float v[PER_LANE];
      for (uint j = 0u; j < PER_LANE; ++j) {
        const uint x = b * BLOCK + (tid % 32u) * PER_LANE + j;
        v[j] = live ? SwiGluOf(y[t * p.y_stride + x], y1[t * p.y1_stride + x]) : 0.0;
      }
      QuantizeBlock(v, t * (n / 4u) + b * (BLOCK / 4u), t * (n / 32u) + b * (BLOCK / 32u), live, tid,
                    min(32u, subgroup));
    }
  }
}

// The prologue's activations: per token of the workgroup, NORM_UNITS units of 8 code words and
// an aux (quantize_block.glsl's layout).
// Units as two uvec4s: a lane's unit in two 16-byte reads (not eight words 8 words apart, each a
// bank conflict).
shared uvec4 norm_codes[NORM_UNITS > 0u ? TOKENS * NORM_UNITS * 2u : 1u];  // [token][unit][2]
shared vec4 norm_aux[NORM_UNITS > 0u ? TOKENS * NORM_UNITS : 1u];          // [token][unit]

// The prologue's invocations a 32-value unit (1, 2, 4 or 8): the workgroup's invocations beyond
// one a unit share the units, so that a unit is not one invocation's serial chain; each takes
// UNIT_VALUES consecutive values (whole code words).
const uint UNIT_LANES = WG >= 8u * NORM_UNITS ? 8u : (WG >= 4u * NORM_UNITS ? 4u : (WG >= 2u * NORM_UNITS ? 2u : 1u));
const uint UNIT_VALUES = 32u / UNIT_LANES;

// RMSNorm(x) * w of the workgroup's tokens (tokens past the last: a copy of it), quantized to
// NORM_KIND codes with quantize_act's arithmetic (SOURCE 2: RmsScale's row scale, then the
// block step's: the unit's largest magnitude, Q8Scales, NearestInt8, Q8UnitAux; the maximum
// and the code sums do not depend on the order), so every workgroup gets the codes the separate
// norm would give. Every workgroup repeats the work: the host gives these pipelines larger
// workgroups (VulkanMatvecShape::norm_group) than the others. Every invocation calls it
// (barriers); the units' maxima and code sums go through `partial` and `partial_lo`.
void NormActs(uint tid, uint subgroup, uint t0) {
  const uint lane = tid % UNIT_LANES, lead = tid - lane;
  for (uint k = 0u; k < TOKENS; ++k) {
    const uint row = (p.x_row0 + min(t0 + k, p.n_tokens - 1u)) * p.x_stride;
    const float scale = RmsScale(row, NORM_UNITS * 32u, p.eps, tid, subgroup);
    barrier();  // every invocation has read the scale: partial and partial_lo are free
    for (uint u0 = 0u; u0 < NORM_UNITS; u0 += WG / UNIT_LANES) {
      const uint u = u0 + tid / UNIT_LANES;
      const bool live = u < NORM_UNITS;
      const uint v0 = (live ? u : 0u) * 32u + lane * UNIT_VALUES;  // (a copy of unit 0 past the last)
      float v[UNIT_VALUES];
      float amax = 0.0;
      for (uint i = 0u; i < UNIT_VALUES; ++i) {
        precise float value = (x[row + v0 + i] * scale) * norm_w[v0 + i];
        v[i] = value;
        amax = abs(value) > amax ? abs(value) : amax;  // NaN: false, as on the CPU
      }
      partial[tid] = amax;
      barrier();
      for (uint j = 0u; j < UNIT_LANES; ++j) amax = partial[lead + j] > amax ? partial[lead + j] : amax;
      const vec2 scales = Q8Scales(amax);
      int sums[2] = int[2](0, 0);  // of the unit's first 16 values and of its last 16
      for (uint w = 0u; w < UNIT_VALUES / 4u; ++w) {
        uint word = 0u;
        for (uint j = 0u; j < 4u; ++j) {
          precise float scaled = v[4u * w + j] * scales.y;
          const int q = NearestInt8(scaled);
          sums[(lane * UNIT_VALUES + 4u * w) / 16u] += q;
          word |= (uint(q) & 0xFFu) << (8u * j);
        }
        const uint at = lane * (UNIT_VALUES / 4u) + w;  // the word's place in the unit
        if (live) norm_codes[(k * NORM_UNITS + u) * 2u + at / 4u][at % 4u] = word;
      }
      barrier();  // the maxima read
      partial[tid] = float(sums[0]);  // (at most 16 x 127: exact)
      partial_lo[tid] = float(sums[1]);
      barrier();
      if (live && lane == 0u) {
        int unit_sums[2] = int[2](0, 0);
        for (uint j = 0u; j < UNIT_LANES; ++j) {
          unit_sums[0] += int(partial[tid + j]);
          unit_sums[1] += int(partial_lo[tid + j]);
        }
        norm_aux[k * NORM_UNITS + u] = Q8UnitAux(scales.x, unit_sums[0], unit_sums[1], NORM_KIND);
      }
      barrier();  // the sums read; the codes and aux ready (the last pass)
    }
  }
}

// A round's weight units: unit j of the round, row k at wu[j * ROWS_PER_SLOT + k].
WeightUnit wu[AHEAD * ROWS_PER_SLOT];

// Round u0's weight units of the slot's rows r0 .. into wu (see main).
void LoadWeights(uint u0, uint r0) {
  for (uint j = 0u; j < AHEAD; ++j) {
    const uint u = min(u0 + j * LANES, p.n_units - 1u);
    // Every row's unit is loaded before any is used (a break at the matrix's last row kept
    // them one row at a time: a GPU then waits a memory latency per row). Rows past the
    // matrix load its last row again; their sums are not stored.
    for (uint k = 0u; k < ROWS_PER_SLOT; ++k) {
      wu[j * ROWS_PER_SLOT + k] = LoadUnit(min(r0 + k, p.n_rows - 1u) * p.row_bytes, u, p.n_units);
    }
  }
}

void main() {
  MarkPhase(0u);
  const uint subgroup = TreeSubgroupSize();
  const uint tid = TreeTid(subgroup);
  const uint lane = tid % LANES, slot = tid / LANES;
  const uint r0 = p.row_begin + (gl_WorkGroupID.x * SLOTS + slot) * ROWS_PER_SLOT;
  const uint t0 = p.t_begin + gl_WorkGroupID.y * TOKENS;
  float acc[OUTPUTS];
  for (uint o = 0u; o < OUTPUTS; ++o) acc[o] = 0.0;

  // With the norm, the first round's weights are in flight while the workgroup makes it.
  if (NORM_UNITS > 0u) {
    if (r0 < p.n_rows) LoadWeights(lane, r0);
    NormActs(tid, subgroup, t0);
    MarkPhase(1u);  // (reached with the norm only)
  }
  if (r0 < p.n_rows) {
    // Rounds of AHEAD units a lane (u0, u0 + LANES, ...): every unit of a round is loaded, with
    // no branch between the loads, before any is used, so a round waits one memory latency, not
    // AHEAD of them (decode's rows are a few rounds a lane: a GPU's memory needs many bytes in
    // flight). Units past the row load its last unit again and are not added. Each lane adds its
    // units in order, as one at a time: the same sums whatever AHEAD is.
    for (uint u0 = lane; u0 < p.n_units; u0 += LANES * AHEAD) {
      // Up to 4 tokens, the round's activation units are loaded with its weights, before any is
      // used; more (a busy step's decode rows) are loaded token by token as they are used (from
      // the cache: the slots of a workgroup read the same units), or they would not fit in
      // registers. Each output adds its units in the same order either way.
      uint a[ACTS_AHEAD ? AHEAD * TOKENS * 8u : 1u];  // unit j of the round, token t: a[(j * TOKENS + t) * 8 + i]
      vec4 aux[ACTS_AHEAD ? AHEAD * TOKENS : 1u];
      for (uint j = 0u; ACTS_AHEAD && j < AHEAD; ++j) {
        const uint u = min(u0 + j * LANES, p.n_units - 1u);
        for (uint t = 0u; t < TOKENS; ++t) {
          if (NORM_UNITS > 0u) {  // the prologue's codes (tokens past the last: a copy there)
            const uvec4 lo = norm_codes[(t * NORM_UNITS + u) * 2u], hi = norm_codes[(t * NORM_UNITS + u) * 2u + 1u];
            for (uint i = 0u; i < 4u; ++i) {
              a[(j * TOKENS + t) * 8u + i] = lo[i];
              a[(j * TOKENS + t) * 8u + 4u + i] = hi[i];
            }
            aux[j * TOKENS + t] = norm_aux[t * NORM_UNITS + u];
            continue;
          }
          const uint tt = min(t0 + t, p.n_tokens - 1u);  // past the last token: a copy, not stored
          const uvec4 lo = act_code4[(tt * p.n_units + u) * 2u], hi = act_code4[(tt * p.n_units + u) * 2u + 1u];
          for (uint i = 0u; i < 4u; ++i) {
            a[(j * TOKENS + t) * 8u + i] = lo[i];
            a[(j * TOKENS + t) * 8u + 4u + i] = hi[i];
          }
          aux[j * TOKENS + t] = act_aux[tt * p.n_units + u];
        }
      }
      if (NORM_UNITS == 0u || u0 != lane) LoadWeights(u0, r0);  // (the first round's: loaded above)
      for (uint j = 0u; j < AHEAD; ++j) {
        const uint u = u0 + j * LANES;
        if (u >= p.n_units) break;  // after the loads: they stay in flight together
        if (ACTS_AHEAD) {
          for (uint k = 0u; k < ROWS_PER_SLOT; ++k) {
            for (uint t = 0u; t < TOKENS; ++t) {
              uint at[8];
              for (uint i = 0u; i < 8u; ++i) at[i] = a[(j * TOKENS + t) * 8u + i];
              acc[k * TOKENS + t] += UnitDot(wu[j * ROWS_PER_SLOT + k], at, aux[j * TOKENS + t]);
            }
          }
          continue;
        }
        for (uint t = 0u; t < TOKENS; ++t) {
          const uint tt = min(t0 + t, p.n_tokens - 1u);  // past the last token: a copy, not stored
          const uvec4 lo = act_code4[(tt * p.n_units + u) * 2u], hi = act_code4[(tt * p.n_units + u) * 2u + 1u];
          uint at[8];
          for (uint i = 0u; i < 4u; ++i) {
            at[i] = lo[i];
            at[4u + i] = hi[i];
          }
          const vec4 at_aux = act_aux[tt * p.n_units + u];
          for (uint k = 0u; k < ROWS_PER_SLOT; ++k) {
            acc[k * TOKENS + t] += UnitDot(wu[j * ROWS_PER_SLOT + k], at, at_aux);
          }
        }
      }
    }
  }

  MarkPhase(2u);
  // The tree: the steps from LANES / 2 down to the subgroup size in shared memory, the rest
  // by shuffles (lane 0 of the slot holds the sums; subgroup_tree.glsl).
  if (LANES > subgroup) {
    for (uint o = 0u; o < OUTPUTS; ++o) partial[o * WG + tid] = acc[o];
    barrier();
    for (uint s = LANES / 2u; s >= subgroup; s >>= 1) {
      if (lane < s) {
        for (uint o = 0u; o < OUTPUTS; ++o) partial[o * WG + tid] += partial[o * WG + tid + s];
      }
      barrier();
    }
    for (uint o = 0u; o < OUTPUTS; ++o) acc[o] = partial[o * WG + tid];
  }
  for (uint o = 0u; o < OUTPUTS; ++o) acc[o] = SubgroupTreeSteps(acc[o], min(LANES, subgroup));
  if (lane == 0u) {
    for (uint o = 0u; o < OUTPUTS; ++o) {
      const uint r = r0 + o / TOKENS, t = t0 + o % TOKENS;
      if (r >= p.n_rows || t >= p.n_tokens) continue;
      StoreOutput(t, r, acc[o]);
    }
  }
  MarkPhase(3u);
  if (KIND < 3u) QuantizeFinishedBlocks(tid, subgroup);
  MarkPhase(4u);
}
