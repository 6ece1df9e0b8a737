// The split sums of attention spread over positions: row t's HEADS heads from h0 into `hvec`,
// each value the splits' partial sums added in split order. attn_reduce.comp and attn_output's
// one-pass path both call it, so they give the same bits. Needs the buffer `partials`
// ([n_tokens][n_head][n_splits][HD] from p.partial0), `hvec`, WG, HEADS, HD and p.n_head,
// p.n_splits. Ends with a barrier.
//
// One workgroup per (token, heads) adds every split's sums, at the end of a decode layer's
// attention with the rest of the device idle: a long context has many splits (3500 positions
// in splits of 32 are 110), and a load per split, each added before the next is read, would
// be a chain of that many memory latencies. So an invocation loads kSplitBatch splits' sums of
// each of its values before it adds any (splits past the last load the last one again and are
// not added), and adds them in split order: the same sums as one at a time.
const uint kSumValues = (HEADS * HD + WG - 1u) / WG;  // values an invocation adds up
const uint kSplitBatch = kSumValues <= 2u ? 16u : (kSumValues <= 4u ? 8u : 4u);  // (registers: 32 floats)

void SumSplits(uint t, uint h0, uint tid) {
  uint base[kSumValues];
  float sum[kSumValues];
  for (uint j = 0u; j < kSumValues; ++j) {
    const uint x = min(tid + j * WG, HEADS * HD - 1u);  // (past the heads' values: a copy, not stored)
    base[j] = p.partial0 + (t * p.n_head + h0 + x / HD) * p.n_splits * HD + x % HD;
    sum[j] = 0.0;
  }
  for (uint s0 = 0u; s0 < p.n_splits; s0 += kSplitBatch) {
    float v[kSumValues * kSplitBatch];  // value j, split s0 + b at j * kSplitBatch + b
    for (uint j = 0u; j < kSumValues; ++j) {
      for (uint b = 0u; b < kSplitBatch; ++b) v[j * kSplitBatch + b] = partials[base[j] + min(s0 + b, p.n_splits - 1u) * HD];
    }
    for (uint j = 0u; j < kSumValues; ++j) {
      for (uint b = 0u; b < kSplitBatch; ++b) {
        if (s0 + b >= p.n_splits) break;  // after the loads: they stay in flight together
        sum[j] += v[j * kSplitBatch + b];
      }
    }
  }
  for (uint j = 0u; j < kSumValues; ++j) {
    if (tid + j * WG < HEADS * HD) hvec[tid + j * WG] = sum[j];
  }
  barrier();
}
