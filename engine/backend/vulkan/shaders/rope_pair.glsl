// RoPE of one pair (x0, x1) by the angle whose (cos, sin) is c. rope.comp and the shaders that
// rotate on the way (kv_store's keys, attn_scores' queries and new keys) share it, so all give
// the same bits (precise: no fused multiply-add, as the CPU's RoPE).
// The dimensions of pair i within a head: (2i, 2i + 1), or NeoX's (i, i + half_rot).
uvec2 RopePairDims(uint i, uint half_rot, bool neox) {
  return neox ? uvec2(i, i + half_rot) : uvec2(2u * i, 2u * i + 1u);
}

vec2 RopePair(float x0, float x1, vec2 c) {
  precise float r0 = x0 * c.x - x1 * c.y;
  precise float r1 = x0 * c.y + x1 * c.x;
  return vec2(r0, r1);
}
