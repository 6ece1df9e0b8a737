// The split sums of attention spread over positions: row t's HEADS heads from h0 into `hvec`,
// each value the splits' partial sums added in split order. attn_reduce.comp and attn_output's
// one-pass path both call it, so they give the same bits. Needs the buffer `partials`
// ([n_tokens][n_head][n_splits][HD] from p.partial0), `hvec`, WG, HEADS, HD and p.n_head,
// p.n_splits. Ends with a barrier.
void SumSplits(uint t, uint h0, uint tid) {
  for (uint x = tid; x < HEADS * HD; x += WG) {
    const uint base = p.partial0 + (t * p.n_head + h0 + x / HD) * p.n_splits * HD + x % HD;
    float sum = 0.0;
    for (uint s = 0u; s < p.n_splits; ++s) sum += partials[base + s * HD];
    hvec[x] = sum;
  }
  barrier();
}
