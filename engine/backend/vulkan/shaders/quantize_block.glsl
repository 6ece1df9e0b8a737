// The activation quantizers' block step, with exactly the arithmetic of the CPU's
// (kernels_scalar.cpp: QuantizeQ8_0 / Q8_1 / Q8_K): quantize_act.comp runs it over rows, and
// the attention output shaders run it on the rows they write (the input of the o matrix), so
// that matrix needs no quantize_act dispatch of its own. Both give the same codes, bit for bit.
//
// 32 invocations quantize a block (32 values, or 256 for Q8_K: 8 values each), so a block does
// not wait on one invocation's serial loop. What the CPU computes serially is order-free here:
// the block's largest magnitude (and, for Q8_K, the first value that has it) is a max with a
// tie rule, the code sums are integers. The reductions over a block's invocations are trees in
// shared memory, whose steps within a subgroup are shuffles when compiled with KVFS_SUBGROUP
// (subgroup_tree.glsl): with subgroups of 32 or more a block needs no barrier.
//
// Output per row of n values: n/4 code words (4 signed bytes each, element 4i+j in byte j of
// word i) and n/32 aux vec4 per 32-value unit: (scale d, Q8_1 sum term s, code sum of the
// unit's first 16 values, code sum of its last 16). Q8_0 and Q8_1 round d (and s) to f16 as
// their block format does; Q8_K keeps d as f32 and repeats it in its 8 units.
//
// The includer declares the spec constants WG (invocations, a multiple of 32) and KIND (0:
// Q8_0, 1: Q8_1, 2: Q8_K), the constant QUANT_SHARED (WG, or 1 where it never quantizes: the
// size of the shared arrays below), the buffers `codes` (uint) and `aux` (vec4), and includes
// common.glsl first.

// Rounds and clamps as the CPU's NearestInt8 (clamp to +-127, then to nearest, ties to even).
int NearestInt8(float v) { return int(RoundHalfEven(clamp(v, -127.0, 127.0))); }

// Q8_0 / Q8_1: the block's scale d and the factor id its codes are rounded from (v * id), for
// the block's largest magnitude amax.
vec2 Q8Scales(float amax) {
  precise float d = Div(amax, 127.0);
  precise float id = amax != 0.0 ? Div(127.0, amax) : 0.0;
  return vec2(d, id);
}

// Q8_0 / Q8_1 (kind 0 / 1): a unit's aux from its scale and its halves' code sums.
vec4 Q8UnitAux(float d, int sum0, int sum1, uint kind) {
  precise float s = float(sum0 + sum1) * d;  // Q8_1: from the unrounded d, as ggml
  return vec4(RoundF16(d), kind == 1u ? RoundF16(s) : 0.0, float(sum0), float(sum1));
}

const uint BLOCK = KIND == 2u ? 256u : 32u;  // values per block
const uint PER_LANE = BLOCK / 32u;           // values per invocation
const uint HALF_LANES = 16u / PER_LANE;      // invocations per 16 values (a code-sum half)

// Per invocation: the block's running max |v| with the first index that has it and its value,
// the code sum, the code byte (PER_LANE 1: 4 invocations make a word).
shared float amax_of[QUANT_SHARED];
shared uint first_of[QUANT_SHARED];
shared float vmax_of[QUANT_SHARED];
shared int sum_of[QUANT_SHARED];
shared uint byte_of[QUANT_SHARED];

// Whether (amax, first) beats (amax_o, first_o): the larger magnitude, the earlier index on
// ties (the CPU's first strict maximum).
bool Beats(float amax, uint first, float amax_o, uint first_o) {
  return amax > amax_o || (amax == amax_o && first < first_o);
}

// Quantizes one block with the 32 invocations whose tid / 32 is the same (lane = tid % 32,
// tid: TreeTid); v holds this lane's PER_LANE values (values lane * PER_LANE .. of the block).
// Its codes go to codes[code0 ..] (BLOCK / 4 words), its units' aux to aux[unit0 ..] (BLOCK / 32
// entries). Every invocation of the workgroup calls it (barriers); those with !live store
// nothing. Steps of the trees below `width` (the subgroup size, at most 32) are shuffles.
void QuantizeBlock(float v[PER_LANE], uint code0, uint unit0, bool live, uint tid, uint width) {
  const uint lane = tid % 32u, lead = tid - lane;
  float amax = 0.0, vmax = 0.0;
  uint first = 0xFFFFFFFFu;  // no value above 0 yet (the CPU's loop starts at amax 0 too)
  for (uint i = 0u; i < PER_LANE; ++i) {
    if (abs(v[i]) > amax) {  // false for NaN, as on the CPU
      amax = abs(v[i]);
      vmax = v[i];
      first = lane * PER_LANE + i;
    }
  }
  // The block's largest magnitude: shared-memory steps down to width, then shuffles; lane 0
  // ends with it (every lane, when the block is one subgroup).
  if (32u > width) {
    amax_of[tid] = amax;
    first_of[tid] = first;
    vmax_of[tid] = vmax;
    barrier();
    for (uint s = 16u; s >= width; s >>= 1) {
      if (lane < s && Beats(amax_of[tid + s], first_of[tid + s], amax_of[tid], first_of[tid])) {
        amax_of[tid] = amax_of[tid + s];
        first_of[tid] = first_of[tid + s];
        vmax_of[tid] = vmax_of[tid + s];
      }
      barrier();
    }
    amax = amax_of[tid];
    first = first_of[tid];
    vmax = vmax_of[tid];
  }
#if defined(KVFS_SUBGROUP)
  for (uint s = width / 2u; s > 0u; s >>= 1) {
    const float amax_o = subgroupShuffleXor(amax, s), vmax_o = subgroupShuffleXor(vmax, s);
    const uint first_o = subgroupShuffleXor(first, s);
    if (Beats(amax_o, first_o, amax, first)) {
      amax = amax_o;
      first = first_o;
      vmax = vmax_o;
    }
  }
#endif
  if (32u > width) {  // from lane 0 to the block (already there without shuffles)
    if (width > 1u) {
      if (lane == 0u) {
        amax_of[tid] = amax;
        vmax_of[tid] = vmax;
      }
      barrier();
    }
    amax = amax_of[lead];
    vmax = vmax_of[lead];
  }
  precise float d;
  precise float id;
  if (KIND == 2u) {
    id = amax != 0.0 ? Div(-127.0, vmax) : 0.0;  // codes = round(id * x), so vmax maps to -127
    d = amax != 0.0 ? Div(1.0, id) : 0.0;
  } else {
    const vec2 scales = Q8Scales(amax);
    d = scales.x;
    id = scales.y;
  }
  int sum = 0;
  uint words[(PER_LANE + 3u) / 4u];
  for (uint w = 0u; w < (PER_LANE + 3u) / 4u; ++w) words[w] = 0u;
  for (uint i = 0u; i < PER_LANE; ++i) {
    precise float scaled = KIND == 2u ? id * v[i] : v[i] * id;
    const int q = NearestInt8(scaled);
    sum += q;
    words[i / 4u] |= (uint(q) & 0xFFu) << (8u * (i % 4u));
  }
  // Code sums per 16 values (HALF_LANES lanes), as the max above; then the first lane of each
  // 32-value unit reads its two halves' sums (the second HALF_LANES lanes on).
  if (HALF_LANES > width) {
    sum_of[tid] = sum;
    barrier();
    for (uint s = HALF_LANES / 2u; s >= width; s >>= 1) {
      if (lane % HALF_LANES < s) sum_of[tid] += sum_of[tid + s];
      barrier();
    }
    sum = sum_of[tid];
  }
#if defined(KVFS_SUBGROUP)
  for (uint s = min(HALF_LANES, width) / 2u; s > 0u; s >>= 1) sum += subgroupShuffleXor(sum, s);
#endif
  int second_half = 0;
#if defined(KVFS_SUBGROUP)
  if (2u * HALF_LANES <= width) second_half = subgroupShuffleXor(sum, HALF_LANES);
#endif
  // Q8_0 and Q8_1 codes: a word from 4 lanes' bytes (by shuffles when 4 lanes share a subgroup).
  uint word = words[0];
#if defined(KVFS_SUBGROUP)
  if (PER_LANE == 1u && width >= 4u) {
    word <<= 8u * (lane % 4u);
    word |= subgroupShuffleXor(word, 1u);
    word |= subgroupShuffleXor(word, 2u);
  }
#endif
  if (2u * HALF_LANES > width || (PER_LANE == 1u && width < 4u)) {
    sum_of[tid] = sum;
    byte_of[tid] = words[0];
    barrier();
    // Only a unit's first lane: tid + HALF_LANES stays inside its block (and the array).
    if (2u * HALF_LANES > width && (lane * PER_LANE) % 32u == 0u) second_half = sum_of[tid + HALF_LANES];
  }
  if (live) {
    if (PER_LANE >= 4u) {
      for (uint w = 0u; w < PER_LANE / 4u; ++w) codes[code0 + lane * (PER_LANE / 4u) + w] = words[w];
    } else if (width >= 4u) {
      if (lane % 4u == 0u) codes[code0 + lane / 4u] = word;
    } else if (lane < 8u) {
      word = 0u;
      for (uint j = 0u; j < 4u; ++j) word |= byte_of[lead + 4u * lane + j] << (8u * j);
      codes[code0 + lane] = word;
    }
    if ((lane * PER_LANE) % 32u == 0u) {  // the first invocation of a 32-value unit
      const int sums[2] = int[2](sum, second_half);
      const uint unit = unit0 + lane * PER_LANE / 32u;
      if (KIND == 2u) {
        aux[unit] = vec4(d, 0.0, float(sums[0]), float(sums[1]));
      } else {
        aux[unit] = Q8UnitAux(d, sums[0], sums[1], KIND);
      }
    }
  }
  if (32u > width) barrier();  // the next block reuses the shared arrays
}
