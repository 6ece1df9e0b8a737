// The attention output shaders' epilogue: quantizes the HEADS heads of one token row held in
// `hvec` (HEADS * HD values, heads h0 .. h0 + HEADS - 1 of the row) for the o matrix, as
// quantize_act.comp would quantize that row (quantize_block.glsl; the host fuses only when
// HEADS * HD is a whole number of blocks). The codes rows hold the whole row: n_head * HD
// values. Every invocation of the workgroup calls it.
void QuantizeHeads(uint row, uint h0, uint n_head) {
  const uint subgroup = TreeSubgroupSize();
  const uint tid = TreeTid(subgroup);
  const uint n = n_head * HD, first = h0 * HD;  // values per row; the workgroup's first
  const uint n_blocks = HEADS * HD / BLOCK;
  for (uint b0 = 0u; b0 < n_blocks; b0 += WG / 32u) {
    const uint b = b0 + tid / 32u;
    const bool live = b < n_blocks;
    float v[PER_LANE];
    for (uint i = 0u; i < PER_LANE; ++i) v[i] = live ? hvec[b * BLOCK + (tid % 32u) * PER_LANE + i] : 0.0;
    QuantizeBlock(v, row * (n / 4u) + (first + b * BLOCK) / 4u, row * (n / 32u) + (first + b * BLOCK) / 32u, live,
                  tid, min(32u, subgroup));
  }
}
