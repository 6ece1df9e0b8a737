// The integer attention paths of the SIMD tables (attention.h): q4 K rows against int8 queries
// (DotRowsQ8), q4k K chunks against int8 query-times-scale codes (DotChunksQ8), and q4 V rows
// weighted by int8 weight-times-scale codes (AxpyRowsQ8). Part of
// attention_simd_impl.h: included by it, inside its anonymous namespace and namespace detail,
// after the helpers these use (Min64, Slice, PrefetchSlice, kPrefetchRows, kMaxHd); include it
// nowhere else.
//
// Traits they need besides the float ones: IV (W int32 lanes), kQ8Blocks (32-value blocks held
// in registers at a time), ZeroI, SetI, AddI, CvtI, CvtRound, ClampI127, StoreI8, ReduceAddI,
// DotU8S8 (acc += 4 u8 x s8 products per lane), DotU8S8Dword (the same against one dword from
// memory in every lane), Low/HighNibbles, LoadRowDwords, LoadOffsets, GatherDwords,
// HalvesLow/High, BcastDwords4, BcastDword, ChannelQuad, Abs; for q4 values (AxpyRowsQ8)
// kAxpyQ8Queries, kAxpyQ8Blocks, InterleaveRows4, InterleaveLanes, CentreCodes,
// Min, AnyNegative.

// NBP blocks (b0 .. b0 + NBP) of one panel, every query: scores of block b0 > 0 are added to
// what the earlier blocks stored. NBP is a compile-time count so the code vectors stay in
// registers.
template <class T, int NBP>
void DotPanelQ8(const uint8_t* base, const int32_t* row_off, const typename T::IV& gather_off, int n_valid,
                const int64_t* header, const int64_t* codes, int64_t b0, const Int8Queries& q, int64_t nq, int64_t hd,
                float* scores, int64_t ss) {
  using V = typename T::V;
  using IV = typename T::IV;
  const int64_t nb = hd / kQueryBlock;
  IV c[NBP][8];
  V d[NBP], m8[NBP];  // per row: the group's scale, and its minimum + 8 * scale
  for (int j = 0; j < NBP; ++j) {
    IV dw[4];
    T::LoadRowDwords(base + codes[b0 + j], row_off, dw);
    for (int w = 0; w < 4; ++w) {
      c[j][2 * w] = T::LowNibbles(dw[w]);
      c[j][2 * w + 1] = T::HighNibbles(dw[w]);
    }
    if (j > 0 && header[b0 + j] == header[b0 + j - 1]) {
      d[j] = d[j - 1];
      m8[j] = m8[j - 1];
    } else {
      const IV dm = T::GatherDwords(base + header[b0 + j], gather_off);
      d[j] = T::HalvesLow(dm);
      m8[j] = T::Add(T::HalvesHigh(dm), T::Mul(T::Bcast(8.0f), d[j]));
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* s_out = scores + i * ss;
    V s = b0 == 0 ? T::Zero() : T::LoadN(s_out, n_valid);
    for (int j = 0; j < NBP; ++j) {
      const int64_t b = b0 + j;
      const int8_t* qc = q.codes + i * hd + b * kQueryBlock;
      // Steps 0-3 broadcast by shuffles of one 16-byte load, 4-7 from memory (embedded in the
      // dpbusd where the ISA has it): each alone bounds the loop, both competing with dpbusd.
      // Two chains (half the dpbusd latency); the first starts at -8 x the code sum, which
      // centres the key codes (attention.h).
      IV qd[4];
      T::BcastDwords4(qc, qd);
      IV even = T::SetI(-8 * q.code_sums[i * nb + b]), odd = T::ZeroI();
      for (int w = 0; w < 4; w += 2) {
        even = T::DotU8S8(even, c[j][w], qd[w]);
        odd = T::DotU8S8(odd, c[j][w + 1], qd[w + 1]);
      }
      for (int w = 4; w < 8; w += 2) {
        even = T::DotU8S8Dword(even, c[j][w], qc + 4 * w);
        odd = T::DotU8S8Dword(odd, c[j][w + 1], qc + 4 * (w + 1));
      }
      const V isum = T::CvtI(T::AddI(even, odd));
      const V scale = T::Mul(d[j], T::Bcast(q.scales[i * nb + b]));
      const V t = T::Fma(m8[j], T::Bcast(q.sums[i * nb + b]), T::Mul(isum, scale));
      s = b == 0 ? t : T::Add(s, t);
    }
    T::StoreN(s_out, s, n_valid);
  }
}

// Rows ahead that the integer score path prefetches: it moves through rows faster than the float
// path, and from half kPrefetchRows the lines still arrive in time while fewer are in flight.
// Measured in whole decode steps (8 agents, tinyllama Q4_0, q4 KV, ~1.2k-token contexts, the
// distance alternated step by step in one process, medians of 150 steps each): 32 rows 1.4%
// faster per step than 64, 16 rows 1.4% slower than 32, 128 rows 2.9% slower than 64; no
// prefetch at all (either path) 10% slower.
constexpr int64_t kPrefetchRowsQ8 = 32;

// q4 keys with int8 queries (attention.h: the integer path). A panel of W rows is read block by
// block: the 16 code bytes of W rows are transposed as dwords (lane r = 4 bytes of row r, 8
// nibbles), so one dpbusd against a broadcast dword of query codes advances W rows by 4 values;
// the low nibbles of dword j are values 8j, 8j+2, .. and the high ones 8j+1, .., which is the
// order Int8Queries stores the query codes in. T::kQ8Blocks blocks are held in registers at a
// time, then every query runs over them; scores of a longer head slice are summed in place.
template <class T>
void DotRowsQ8(const KvFormat& f, const KvRows& k, const Int8Queries& q, int64_t nq, float* scores, int64_t ss) {
  constexpr int W = T::W, NB = T::kQ8Blocks;
  const int64_t nb = k.hd / kQueryBlock, G = f.group;
  int64_t header[kMaxHd / kQueryBlock], codes[kMaxHd / kQueryBlock];
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t v0 = k.head * k.hd + b * kQueryBlock;
    header[b] = v0 / G * (G / 2 + 4);
    codes[b] = header[b] + 4 + v0 % G / 2;
  }
  const Slice slice{header[0], codes[nb - 1] + kQueryBlock / 2};
  // Byte offsets of the panel's rows; rows past the last valid one repeat it (read, not stored).
  int32_t row_off[W];
  auto set_offsets = [&](int n_valid) {
    for (int r = 0; r < W; ++r) row_off[r] = static_cast<int32_t>((r < n_valid ? r : n_valid - 1) * k.row_bytes);
    return T::LoadOffsets(row_off);
  };
  int n_set = W;
  typename T::IV gather_off = set_offsets(W);
  for (int64_t p0 = 0; p0 < k.n_rows; p0 += W) {
    const int n_valid = static_cast<int>(Min64(W, k.n_rows - p0));
    if (n_valid != n_set) {
      gather_off = set_offsets(n_valid);
      n_set = n_valid;
    }
    const uint8_t* base = k.rows + p0 * k.row_bytes;
    for (int64_t p = p0 + kPrefetchRowsQ8; p < Min64(p0 + kPrefetchRowsQ8 + W, k.n_rows); ++p) {
      PrefetchSlice(k.rows + p * k.row_bytes, slice);
    }
    for (int64_t b0 = 0; b0 < nb; b0 += NB) {
      if (nb - b0 >= NB) {
        DotPanelQ8<T, NB>(base, row_off, gather_off, n_valid, header, codes, b0, q, nq, k.hd, scores + p0, ss);
      } else {
        DotPanelQ8<T, 1>(base, row_off, gather_off, n_valid, header, codes, b0, q, nq, k.hd, scores + p0, ss);
      }
    }
  }
}

// QuantizeInt8Block of the 32 values held in a[0 .. 32/W) (natural order), the same bits:
// amax = the largest |a|, the vector conversion rounds half to even as the scalar
// add-and-subtract does, the scale comes from BlockScaleFor; a block whose codes need ldexp
// takes the scalar function.
template <class T>
[[gnu::noinline]] QuantizedBlock QuantizeBlockScalar(const typename T::V* a, int8_t* codes) {
  constexpr int W = T::W, BV = static_cast<int>(kQueryBlock) / W;
  alignas(64) float x[kQueryBlock];
  for (int v = 0; v < BV; ++v) T::Store(x + v * W, a[v]);
  return QuantizeInt8Block(x, codes);
}
// kCodeSum false skips the codes' sum (code_sum is then 0; the value path needs no sum).
template <class T, bool kCodeSum = true>
[[gnu::always_inline]] inline QuantizedBlock QuantizeBlockT(const typename T::V* a, float amax, int8_t* codes) {
  constexpr int W = T::W, BV = static_cast<int>(kQueryBlock) / W;
  Int8BlockScale bs{0, 0.0f, 0.0f};  // all zero: codes 0 (inv 0), scale 0
  if (amax > 0.0f) {
    bs = BlockScaleFor(amax);
    if (bs.inv == 0.0f) [[unlikely]] return QuantizeBlockScalar<T>(a, codes);
  }
  const typename T::V inv = T::Bcast(bs.inv);
  typename T::IV sum = T::ZeroI();
  for (int v = 0; v < BV; ++v) {
    const typename T::IV r = T::ClampI127(T::CvtRound(T::Mul(a[v], inv)));
    T::StoreI8(codes + v * W, r);
    if constexpr (kCodeSum) sum = T::AddI(sum, r);
  }
  return {bs.scale, kCodeSum ? T::ReduceAddI(sum) : 0};
}

// QuantizeQueries, vectorised, the same bits: the same maximum, exponent, roundings and code
// sum (QuantizeBlockT); the float sum keeps the rule's left-to-right order. Codes go to
// Int8QueryCodeIndex's order: within each 8 values, the even ones then the odd ones (one byte
// shuffle per 16).
template <class T>
void QuantizeQueriesT(const float* q, int64_t nq, int64_t hd, int8_t* codes, float* scales, float* sums,
                      int32_t* code_sums) {
  using V = typename T::V;
  constexpr int W = T::W, BV = static_cast<int>(kQueryBlock) / W;
  const int64_t nb = hd / kQueryBlock;
  const __m128i evens_then_odds = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* x = q + i * hd + b * kQueryBlock;
      const int64_t at = i * nb + b;
      int8_t* out = codes + i * hd + b * kQueryBlock;
      V v[BV], vmax = T::Zero();
      for (int k = 0; k < BV; ++k) {
        v[k] = T::Load(x + k * W);
        vmax = T::Max(vmax, T::Abs(v[k]));
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < kQueryBlock; ++j) sum += x[j];
      alignas(32) int8_t natural[kQueryBlock];
      const QuantizedBlock qb = QuantizeBlockT<T>(v, T::ReduceMax(vmax), natural);
      for (int h = 0; h < 2; ++h) {
        const __m128i n16 = _mm_load_si128(reinterpret_cast<const __m128i*>(natural + 16 * h));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * h), _mm_shuffle_epi8(n16, evens_then_odds));
      }
      scales[at] = qb.scale;
      sums[at] = sum;
      code_sums[at] = qb.code_sum;
    }
  }
}

// QuantizeChunkQuery, vectorised, the same bits: the same products, the same 16 partial sums
// reduced in the same order, each block quantized by QuantizeBlockT. m8 = m + 8 * d per channel.
template <class T>
void QuantizeChunkQueryT(const float* q, const float* d, const float* m8, int64_t hd, ChunkQueryQ8* out) {
  using V = typename T::V;
  constexpr int W = T::W, NV = 16 / W, BV = kQueryBlock / W;
  V lanes[NV];
  for (int v = 0; v < NV; ++v) lanes[v] = T::Zero();
  for (int64_t c0 = 0; c0 < hd; c0 += 16) {
    for (int v = 0; v < NV; ++v) lanes[v] = T::Fma(T::Load(q + c0 + v * W), T::Load(m8 + c0 + v * W), lanes[v]);
  }
  const float base = T::PairwiseSum16(lanes);
  for (int64_t b = 0; b < hd / kQueryBlock; ++b) {
    V a[BV], vmax = T::Zero();
    for (int v = 0; v < BV; ++v) {
      const int64_t c = b * kQueryBlock + v * W;
      a[v] = T::Mul(T::Load(q + c), T::Load(d + c));
      vmax = T::Max(vmax, T::Abs(a[v]));
    }
    const QuantizedBlock qb = QuantizeBlockT<T>(a, T::ReduceMax(vmax), out->codes + b * kQueryBlock);
    out->scales[b] = qb.scale;
    out->code_sums[b] = qb.code_sum;
  }
  out->base = base;
}

// NBP blocks (b0 ..) of 32 channels for one panel of W tokens [t0, t0 + W) of a q4k chunk slice,
// every query: score = base, then fma(float(isum_b), sa_b, score) block by block (continued from
// the stored scores when b0 > 0).
template <class T, int NBP>
void DotChunkPanelQ8(const uint8_t* slice, int64_t record, int64_t t0, int n_valid, int64_t b0, const ChunkQueryQ8* cq,
                     int64_t nq, float* scores, int64_t ss) {
  using V = typename T::V;
  using IV = typename T::IV;
  IV quad[NBP][8];  // lane t: the codes of channels 4g..4g+3 of the block for token t0 + t
  for (int j = 0; j < NBP; ++j) {
    for (int g = 0; g < 8; ++g) {
      quad[j][g] = T::ChannelQuad(slice + ((b0 + j) * kQueryBlock + 4 * g) * record + 4 + t0 / 2, record);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* s_out = scores + i * ss;
    V s = b0 == 0 ? T::Bcast(cq[i].base) : T::LoadN(s_out, n_valid);
    for (int j = 0; j < NBP; ++j) {
      const int64_t b = b0 + j;
      const int8_t* qc = cq[i].codes + b * kQueryBlock;
      IV qd[4];
      T::BcastDwords4(qc, qd);  // half shuffled, half from memory (DotPanelQ8)
      IV even = T::SetI(-8 * cq[i].code_sums[b]), odd = T::ZeroI();
      for (int g = 0; g < 4; g += 2) {
        even = T::DotU8S8(even, quad[j][g], qd[g]);
        odd = T::DotU8S8(odd, quad[j][g + 1], qd[g + 1]);
      }
      for (int g = 4; g < 8; g += 2) {
        even = T::DotU8S8Dword(even, quad[j][g], qc + 4 * g);
        odd = T::DotU8S8Dword(odd, quad[j][g + 1], qc + 4 * (g + 1));
      }
      s = T::Fma(T::CvtI(T::AddI(even, odd)), T::Bcast(cq[i].scales[b]), s);
    }
    T::StoreN(s_out, s, n_valid);
  }
}

// q4k keys, the integer path (attention.h): per chunk, every query quantized against the chunk's
// channel scales, then panels of W tokens whose codes are transposed to one dword of 4 channels
// per token lane, so one dpbusd advances W tokens by 4 channels.
template <class T>
void DotChunksQ8(const KvFormat& f, const KvChunks& k, const float* q, int64_t nq, float* scores, int64_t ss) {
  constexpr int W = T::W, NB = T::kQ8Blocks;
  const int64_t C = f.chunk, record = 4 + C / 2, slice_bytes = k.hd * record, nb = k.hd / kQueryBlock;
  std::vector<ChunkQueryQ8> cq(static_cast<size_t>(nq));
  alignas(64) float d[kMaxChunkHd], m8[kMaxChunkHd];
  int32_t record_off[W];
  for (int r = 0; r < W; ++r) record_off[r] = static_cast<int32_t>(r * record);
  const typename T::IV gather_off = T::LoadOffsets(record_off);
  const int64_t n_chunks = (k.n_tokens + C - 1) / C;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const uint8_t* slice = k.chunks + c * k.chunk_bytes + k.head * slice_bytes;
    if (c + 1 < n_chunks) PrefetchSlice(slice + k.chunk_bytes, Slice{0, slice_bytes});
    // The channels' (f16 d, f16 m) headers, W at a time (hd is a multiple of 32).
    for (int64_t ch = 0; ch < k.hd; ch += W) {
      const typename T::IV dm = T::GatherDwords(slice + ch * record, gather_off);
      const typename T::V dv = T::HalvesLow(dm);
      T::Store(d + ch, dv);
      T::Store(m8 + ch, T::Add(T::HalvesHigh(dm), T::Mul(T::Bcast(8.0f), dv)));
    }
    for (int64_t i = 0; i < nq; ++i) QuantizeChunkQueryT<T>(q + i * k.hd, d, m8, k.hd, &cq[i]);
    const int64_t in_chunk = Min64(C, k.n_tokens - c * C);
    for (int64_t t0 = 0; t0 < in_chunk; t0 += W) {
      const int n_valid = static_cast<int>(Min64(W, in_chunk - t0));
      float* s = scores + c * C + t0;
      for (int64_t b0 = 0; b0 < nb; b0 += NB) {
        if (nb - b0 >= NB) DotChunkPanelQ8<T, NB>(slice, record, t0, n_valid, b0, cq.data(), nq, s, ss);
        else DotChunkPanelQ8<T, 1>(slice, record, t0, n_valid, b0, cq.data(), nq, s, ss);
      }
    }
  }
}

// q4 values with int8 weights (attention.h: ValuesUseInt8Weights), span by span:
//  1. the code bytes of every 4 rows are interleaved (T::InterleaveRows4: lane k of vector n is
//     byte nW + k of the 4 rows) and split into low nibbles (value 2k of the block at 4
//     positions) and high ones (value 2k + 1), centred (c - 8, signed bytes), into an L1
//     buffer; each group's d and m + 8d per row go to float arrays;
//  2. per query and group: the weights a_p = w_p d_p quantized per tile, and the base sum;
//  3. per QN queries x NB blocks: one dpbusd of a broadcast dword of 4 positions' weight codes
//     (unsigned: softmax weights and q4 scales are >= 0, so the codes are in 0..127) against a
//     vector of centred codes advances W values by 4 positions: isum = sum k_p (c_p - 8)
//     directly, with no code sums; each tile's integer sums are scaled into float accumulators,
//     which the span adds to out.
// A span where some a_p < 0 (a negative weight, or a negative scale in a foreign cache) would
// need signed weight codes: that span's queries take the scalar code, which gives the same bits.
constexpr int kSpanQuads = static_cast<int>(kValueSpan / 4);
constexpr int kSpanTiles = static_cast<int>(kValueSpan / kQueryBlock);
constexpr int kMaxValueBlocks = kMaxHd / static_cast<int>(kQueryBlock);

struct SpanWeights {  // one query's weights against one q4 group, over a span
  alignas(64) int8_t codes[kValueSpan];  // k_p, position order
  float scales[kSpanTiles];              // sa per tile
  float base;
};

// Step 2 for n <= kValueSpan positions: w, d and m8 hold them from position 0 (d and m8 are
// valid up to n rounded up to W). Returns false when some a_p < 0 (then `out` is not usable).
template <class T>
bool QuantizeSpanWeights(const float* w, const float* d, const float* m8, int64_t n, SpanWeights* out) {
  using V = typename T::V;
  constexpr int W = T::W, NL = 16 / W, TV = static_cast<int>(kQueryBlock) / W;
  V lanes[NL];
  for (int l = 0; l < NL; ++l) lanes[l] = T::Zero();
  V amin = T::Zero();
  for (int64_t t0 = 0, t = 0; t0 < n; t0 += kQueryBlock, ++t) {
    V a[TV], vmax = T::Zero();
    for (int v = 0; v < TV; ++v) {
      const int64_t p = t0 + v * W;
      const int valid = static_cast<int>(p < n ? Min64(W, n - p) : 0);
      if (valid == 0) {
        a[v] = T::Zero();
        continue;
      }
      const V wv = T::LoadN(w + p, valid);
      a[v] = T::Mul(wv, T::Load(d + p));
      vmax = T::Max(vmax, T::Abs(a[v]));
      amin = T::Min(amin, a[v]);
      V& lane = lanes[v % NL];  // position p + k into lane (p + k) % 16
      lane = T::Select(valid, T::Fma(wv, T::Load(m8 + p), lane), lane);
    }
    out->scales[t] = QuantizeBlockT<T, false>(a, T::ReduceMax(vmax), out->codes + t0).scale;
  }
  out->base = T::PairwiseSum16(lanes);
  return !T::AnyNegative(amin);
}

// Step 3 for QN queries x NB blocks (b0 ..) over n positions: vt holds the span's centred code
// vectors, [(quad * nb + block) * NV + 2 * n + h]; sw[q * NB + b] the weights of query q against
// block b0 + b's group; out[q] the query's output at block b0.
template <class T, int QN, int NB>
void AccumulateSpanQ8(const typename T::IV* vt, int nb, int b0, int64_t n, const SpanWeights* const* sw,
                      float* const* out) {
  using V = typename T::V;
  using IV = typename T::IV;
  constexpr int W = T::W, NI = 16 / W, NV = 2 * NI;
  V facc[QN][NB][NV];
  for (int q = 0; q < QN; ++q) {
    for (int b = 0; b < NB; ++b) {
      for (int j = 0; j < NV; ++j) facc[q][b][j] = T::Zero();
    }
  }
  const int64_t quads = (n + 3) / 4;
  for (int64_t t = 0; t * kQueryBlock < n; ++t) {
    IV acc[QN][NB][NV];
    for (int q = 0; q < QN; ++q) {
      for (int b = 0; b < NB; ++b) {
        for (int j = 0; j < NV; ++j) acc[q][b][j] = T::ZeroI();
      }
    }
    for (int64_t quad = t * 8; quad < Min64(quads, t * 8 + 8); ++quad) {
      const IV* codes = vt + (quad * nb + b0) * NV;
      IV wq[QN][NB];
      for (int q = 0; q < QN; ++q) {
        for (int b = 0; b < NB; ++b) {
          // Blocks of one group share the weights (and their broadcast).
          wq[q][b] = b > 0 && sw[q * NB + b] == sw[q * NB + b - 1] ? wq[q][b - 1]
                                                                   : T::BcastDword(sw[q * NB + b]->codes + 4 * quad);
        }
      }
      for (int b = 0; b < NB; ++b) {
        for (int j = 0; j < NV; ++j) {
          const IV c = codes[b * NV + j];
          for (int q = 0; q < QN; ++q) acc[q][b][j] = T::DotU8S8(acc[q][b][j], wq[q][b], c);
        }
      }
    }
    for (int q = 0; q < QN; ++q) {
      for (int b = 0; b < NB; ++b) {
        const V sa = T::Bcast(sw[q * NB + b]->scales[t]);
        for (int j = 0; j < NV; ++j) facc[q][b][j] = T::Fma(T::CvtI(acc[q][b][j]), sa, facc[q][b][j]);
      }
    }
  }
  // out_c = out_c + (acc_c + base); vector 2n + h, lane k holds value 2 (nW + k) + h.
  for (int q = 0; q < QN; ++q) {
    for (int b = 0; b < NB; ++b) {
      const V base = T::Bcast(sw[q * NB + b]->base);
      float* o = out[q] + b * kQueryBlock;
      for (int n2 = 0; n2 < NI; ++n2) {
        V first, second;  // values 2nW .. 2nW + W - 1, then the next W
        T::InterleaveLanes(T::Add(facc[q][b][2 * n2], base), T::Add(facc[q][b][2 * n2 + 1], base), &first, &second);
        T::Store(o + 2 * n2 * W, T::Add(T::Load(o + 2 * n2 * W), first));
        T::Store(o + 2 * n2 * W + W, T::Add(T::Load(o + 2 * n2 * W + W), second));
      }
    }
  }
}

template <class T>
void AxpyRowsQ8(const KvFormat& f, const KvRows& v, const float* w, int64_t nq, int64_t ws, float* out) {
  using IV = typename T::IV;
  constexpr int W = T::W, NI = 16 / W, NV = 2 * NI, QN = T::kAxpyQ8Queries, NB = T::kAxpyQ8Blocks;
  const int nb = static_cast<int>(v.hd / kQueryBlock);
  const int64_t G = f.group;
  int64_t header[kMaxValueBlocks], codes[kMaxValueBlocks];
  int group_of[kMaxValueBlocks];  // the first block of the same q4 group (whose weights it shares)
  for (int b = 0; b < nb; ++b) {
    const int64_t v0 = v.head * v.hd + b * kQueryBlock;
    header[b] = v0 / G * (G / 2 + 4);
    codes[b] = header[b] + 4 + v0 % G / 2;
    group_of[b] = b > 0 && header[b] == header[b - 1] ? group_of[b - 1] : b;
  }
  const Slice slice{header[0], codes[nb - 1] + kQueryBlock / 2};
  alignas(64) IV vt[kSpanQuads * kMaxValueBlocks * NV];
  alignas(64) float d[kMaxValueBlocks][kValueSpan], m8[kMaxValueBlocks][kValueSpan];
  alignas(64) int32_t dm_raw[kMaxValueBlocks][kValueSpan];  // (f16 d, f16 m) per row
  SpanWeights sw[QN][kMaxValueBlocks];
  for (int64_t s0 = 0; s0 < v.n_rows; s0 += kValueSpan) {
    const int64_t n = Min64(kValueSpan, v.n_rows - s0);
    const uint8_t* span = v.rows + s0 * v.row_bytes;
    // 1. Codes and group headers; rows past the last one repeat it (their weights are 0).
    for (int64_t quad = 0; quad * 4 < n; ++quad) {
      const uint8_t* r[4];
      for (int j = 0; j < 4; ++j) r[j] = span + (quad * 4 + j) * v.row_bytes;
      if (quad * 4 + 4 > n) {
        for (int j = 0; j < 4; ++j) r[j] = span + Min64(quad * 4 + j, n - 1) * v.row_bytes;
      }
      const int64_t ahead = s0 + quad * 4 + kPrefetchRows;
      for (int64_t p = ahead; p < ahead + 4 && p < v.n_rows; ++p) PrefetchSlice(v.rows + p * v.row_bytes, slice);
      for (int b = 0; b < nb; ++b) {
        if (group_of[b] == b) {  // the header dwords (a gather is slower than 4 loads here)
          for (int j = 0; j < 4; ++j) std::memcpy(&dm_raw[b][quad * 4 + j], r[j] + header[b], 4);
        }
        const uint8_t* at[4] = {r[0] + codes[b], r[1] + codes[b], r[2] + codes[b], r[3] + codes[b]};
        IV iv[NI];
        T::InterleaveRows4(at, iv);
        IV* dst = vt + (quad * nb + b) * NV;
        for (int n2 = 0; n2 < NI; ++n2) {
          dst[2 * n2] = T::CentreCodes(T::LowNibbles(iv[n2]));
          dst[2 * n2 + 1] = T::CentreCodes(T::HighNibbles(iv[n2]));
        }
      }
    }
    for (int b = 0; b < nb; ++b) {
      if (group_of[b] != b) continue;
      for (int64_t p = n; p % W != 0; ++p) dm_raw[b][p] = dm_raw[b][n - 1];
      for (int64_t p = 0; p < n; p += W) {
        const IV dm = T::LoadOffsets(dm_raw[b] + p);
        const typename T::V dv = T::HalvesLow(dm);
        T::Store(d[b] + p, dv);
        T::Store(m8[b] + p, T::Add(T::HalvesHigh(dm), T::Mul(T::Bcast(8.0f), dv)));
      }
    }
    for (int64_t i0 = 0; i0 < nq; i0 += QN) {
      const int qc = static_cast<int>(Min64(QN, nq - i0));
      // 2. Weights.
      bool unsigned_codes = true;
      for (int q = 0; q < qc; ++q) {
        for (int b = 0; b < nb; ++b) {
          if (group_of[b] != b) continue;
          unsigned_codes &= QuantizeSpanWeights<T>(w + (i0 + q) * ws + s0, d[b], m8[b], n, &sw[q][b]);
        }
      }
      if (!unsigned_codes) {
        ScalarAttentionKernels().axpy_rows(f, KvRows{span, v.row_bytes, n, v.head, v.hd}, w + i0 * ws + s0, qc, ws,
                                           out + i0 * v.hd);
        continue;
      }
      // 3. Sums, QN x NB at a time where they fill the tile.
      for (int b0 = 0; b0 < nb; b0 += NB) {
        const int bc = nb - b0 < NB ? nb - b0 : NB;
        auto run = [&](auto qn_tag, auto nb_tag, int q0, int bb) {
          constexpr int QT = decltype(qn_tag)::value, BT = decltype(nb_tag)::value;
          const SpanWeights* ptrs[QT * BT];
          float* outs[QT];
          for (int q = 0; q < QT; ++q) {
            for (int b = 0; b < BT; ++b) ptrs[q * BT + b] = &sw[q0 + q][group_of[bb + b]];
            outs[q] = out + (i0 + q0 + q) * v.hd + bb * kQueryBlock;
          }
          AccumulateSpanQ8<T, QT, BT>(vt, nb, bb, n, ptrs, outs);
        };
        using One = std::integral_constant<int, 1>;
        using QFull = std::integral_constant<int, QN>;
        using BFull = std::integral_constant<int, NB>;
        if (qc == QN && bc == NB) {
          run(QFull{}, BFull{}, 0, b0);
        } else if (qc == QN) {
          for (int b = 0; b < bc; ++b) run(QFull{}, One{}, 0, b0 + b);
        } else if (bc == NB) {
          for (int q = 0; q < qc; ++q) run(One{}, BFull{}, q, b0);
        } else {
          for (int q = 0; q < qc; ++q) {
            for (int b = 0; b < bc; ++b) run(One{}, One{}, q, b0 + b);
          }
        }
      }
    }
  }
}
