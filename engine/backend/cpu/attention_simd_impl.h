// The SIMD attention kernels, written once over a vector-traits class and instantiated by one
// translation unit per instruction set (attention_avx2.cpp, attention_avx512.cpp), each compiled
// with its own ISA flags. Include it only from such a file, after defining the traits, and only
// inside an anonymous namespace: every function here must have internal linkage, or the linker
// could pick an AVX-512 copy of an inline function for a caller on a CPU without AVX-512.
//
// Shapes (attention.h): K/V rows hold every KV head; a kernel reads one head's slice of hd
// values. The fast path needs hd % 16 == 0, hd <= kMaxHd and, for q8/q4/q4k rows, G % 16 == 0,
// so that every chunk of W (8 or 16) consecutive slice values lies inside one quantization group
// (q4k: sub-block); the caller falls back to the scalar kernel otherwise (e.g. stories260K's
// hd 8). q4k K chunks (dot_chunks) need the same hd and a chunk of a multiple of W tokens.
//
// dot_rows is a small GEMM S[nq x rows] = Q[nq x hd] . K^T: a panel of W rows is decoded once
// into registers, transposed (value-major: kt[d][r]) and stored to a stack buffer that stays in
// L1; then every query tile runs over it with W rows in the lanes of one accumulator, a
// broadcast query element per FMA, and no horizontal reduction at all. The transpose (about 4
// shuffles per value) is paid once per row and shared by every query (8 in decode with GQA, up
// to 128 in a prefill tile).
// q4 K rows with int8 queries (dot_rows_q8) and q4k K chunks where head_dim is a multiple of 32
// (dot_chunks) take the integer paths of attention_simd_int8.h instead; the float ones below
// serve the other formats and shapes.
// dot_chunks (float) is the same GEMM over q4k K chunks, which are channel-major already: a panel of W
// tokens is one load of W/2 code bytes per channel, decoded straight into kt[d][r].
// axpy_rows is O[nq x hd] += W[nq x rows] . V: a block of rows is decoded once (row-major) into a
// stack buffer, then tiles of (queries x hd chunks) accumulate in registers with one broadcast
// weight per (query, row). q4 values where ValuesUseInt8Weights take the integer path of
// attention_simd_int8.h (AxpyRowsQ8) instead.

namespace detail {

// Largest head_dim of the fast path (stack buffers are sized for it).
constexpr int kMaxHd = 256;
// Floats in the axpy block buffer: 16 KiB, a third of L1d, so the block stays resident while
// every query tile reads it.
constexpr int kAxpyBlockFloats = 4096;

inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Where chunk c (values [c*W, (c+1)*W) of the head slice) lives in a row.
struct Chunk {
  int32_t codes;   // byte offset of its first code (f16: of its first half)
  int32_t header;  // byte offset of its group's scale (q8, q4; the minimum follows for q4);
                   // q4k: of the 16 bits holding its sub-block's field
  int32_t shift;   // q4k: the field's bit offset in those 16 bits
};

// Bytes [begin, end) of a row that one head's slice reads (codes and group headers).
struct Slice {
  int64_t begin, end;
};

// Rows this far ahead are prefetched: a head's slice is a short piece of every row (128 of 512
// bytes for f16 on tinyllama), a strided pattern the hardware prefetchers follow poorly, and
// decode (few queries per row) is then bound by memory latency rather than bandwidth.
constexpr int64_t kPrefetchRows = 64;

inline void PrefetchSlice(const uint8_t* row, const Slice& sl) {
  for (int64_t o = sl.begin; o < sl.end; o += 64) _mm_prefetch(reinterpret_cast<const char*>(row + o), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(row + sl.end - 1), _MM_HINT_T0);  // a misaligned last line
}

template <class T>
bool FastPathOk(const KvFormat& f, int64_t hd) {
  if (hd % 16 != 0 || hd > kMaxHd || hd <= 0) return false;
  if (f.type == KvType::kF16) return true;
  return f.group % 16 == 0;  // q4k: sub-blocks of 16, so a chunk of W lies in one
}

// Chunk offsets for the head slice; returns the number of chunks.
template <class T>
int MakeChunks(const KvFormat& f, int64_t head, int64_t hd, Chunk* out) {
  constexpr int W = T::W;
  const int n = static_cast<int>(hd / W);
  const int64_t G = f.group;
  for (int c = 0; c < n; ++c) {
    const int64_t v = head * hd + static_cast<int64_t>(c) * W;  // value index in the row
    const int64_t g = v / G, off = v % G;
    switch (f.type) {
      case KvType::kF16: out[c] = {static_cast<int32_t>(2 * v), 0, 0}; break;
      case KvType::kQ8:
        out[c] = {static_cast<int32_t>(g * (G + 2) + 2 + off), static_cast<int32_t>(g * (G + 2)), 0};
        break;
      case KvType::kQ4:
        out[c] = {static_cast<int32_t>(g * (G / 2 + 4) + 4 + off / 2), static_cast<int32_t>(g * (G / 2 + 4)), 0};
        break;
      case KvType::kQ4K: {  // V rows: g is the sub-block, k its place in the quad
        const int64_t k = g % 4;
        out[c] = {static_cast<int32_t>(Q4kCodesOffset(G, g) + off / 2),
                  static_cast<int32_t>(Q4kFieldsOffset(G, g) + (10 * k) / 8), static_cast<int32_t>((10 * k) % 8)};
        break;
      }
    }
  }
  return n;
}

template <class T>
Slice SliceOf(const KvFormat& f, const Chunk* chunks, int n_chunks) {
  constexpr int W = T::W;
  const int64_t code_bytes = f.type == KvType::kF16 ? 2 * W : f.type == KvType::kQ8 ? W : W / 2;
  // q4k: from the row's units (its first 4 bytes) on.
  const int64_t begin = f.type == KvType::kF16 ? chunks[0].codes : f.type == KvType::kQ4K ? 0 : chunks[0].header;
  return {begin, chunks[n_chunks - 1].codes + code_bytes};
}

// q4k V rows: W values of a chunk, given the row's units D and M (converted once per row).
template <class T>
typename T::V DecodeChunkQ4k(const uint8_t* row, const Chunk& ch, float D, float M) {
  uint16_t bits;
  std::memcpy(&bits, row + ch.header, 2);
  const uint32_t field = (static_cast<uint32_t>(bits) >> ch.shift) & 0x3FF;
  const float d = D * static_cast<float>(field & 31);
  const float m = M * static_cast<float>(static_cast<int>(field >> 5) - 15);
  return T::Add(T::Bcast(m), T::Mul(T::Bcast(d), T::LoadU4(row + ch.codes)));
}

// W decoded values of one chunk of one row. q4/q8 compute exactly what KvDequantize does
// (d * q, and m + d * q with two roundings), so only summation order separates the kernels.
template <class T, KvType K>
typename T::V DecodeChunk(const uint8_t* row, const Chunk& ch) {
  if constexpr (K == KvType::kF16) {
    return T::LoadF16(row + ch.codes);
  } else if constexpr (K == KvType::kQ8) {
    return T::Mul(T::Bcast(HalfToFloat(row + ch.header)), T::LoadI8(row + ch.codes));
  } else if constexpr (K == KvType::kQ4K) {
    return DecodeChunkQ4k<T>(row, ch, HalfToFloat(row), HalfToFloat(row + 2));
  } else {
    const typename T::V d = T::Bcast(HalfToFloat(row + ch.header));
    const typename T::V m = T::Bcast(HalfToFloat(row + ch.header + 2));
    return T::Add(m, T::Mul(d, T::LoadU4(row + ch.codes)));
  }
}

// Decodes rows [0, n_valid) of a panel of W rows (the rest read as zero) and stores them
// transposed: kt[d * W + r] = value d of row r.
template <class T, KvType K>
void DecodePanelTransposed(const uint8_t* rows, int64_t row_bytes, int n_valid, const Chunk* chunks, int n_chunks,
                           float* kt) {
  constexpr int W = T::W;
  for (int c = 0; c < n_chunks; ++c) {
    typename T::V r[W];
    for (int j = 0; j < W; ++j) r[j] = j < n_valid ? DecodeChunk<T, K>(rows + j * row_bytes, chunks[c]) : T::Zero();
    T::Transpose(r);
    for (int j = 0; j < W; ++j) T::Store(kt + (c * W + j) * W, r[j]);
  }
}

// Scores of Q queries against P panels of W rows: s[i * ss + p * W + r] for r < n_valid - p*W.
template <class T, int P, int Q>
void DotTile(const float* kt, int64_t hd, const float* q, float* s, int64_t ss, int n_valid) {
  constexpr int W = T::W;
  typename T::V acc[P][Q];
  for (int p = 0; p < P; ++p) {
    for (int i = 0; i < Q; ++i) acc[p][i] = T::Zero();
  }
  for (int64_t d = 0; d < hd; ++d) {
    typename T::V k[P];
    for (int p = 0; p < P; ++p) k[p] = T::Load(kt + (p * hd + d) * W);
    for (int i = 0; i < Q; ++i) {
      const typename T::V b = T::Bcast(q[i * hd + d]);
      for (int p = 0; p < P; ++p) acc[p][i] = T::Fma(k[p], b, acc[p][i]);
    }
  }
  for (int p = 0; p < P; ++p) {
    const int n = n_valid - p * W;
    for (int i = 0; i < Q; ++i) {
      if (n >= W) T::Store(s + i * ss + p * W, acc[p][i]);
      else T::StoreN(s + i * ss + p * W, acc[p][i], n);
    }
  }
}

template <class T, int P, int Q>
void DotTileN(int q_count, const float* kt, int64_t hd, const float* q, float* s, int64_t ss, int n_valid) {
  if constexpr (Q >= 1) {
    if (q_count == Q) return DotTile<T, P, Q>(kt, hd, q, s, ss, n_valid);
    return DotTileN<T, P, Q - 1>(q_count, kt, hd, q, s, ss, n_valid);
  }
}

// Query tiles of at most T::kDotQ, balanced so decode's 8 queries run as one tile.
inline int64_t BalancedTile(int64_t n, int64_t max_tile) {
  const int64_t tiles = (n + max_tile - 1) / max_tile;
  return (n + tiles - 1) / tiles;
}

template <class T, KvType K>
void DotRows(const KvFormat& f, const KvRows& k, const float* q, int64_t nq, float* scores, int64_t s_stride) {
  constexpr int W = T::W;
  Chunk chunks[kMaxHd / W];
  const int n_chunks = MakeChunks<T>(f, k.head, k.hd, chunks);
  alignas(64) float kt[2 * kMaxHd * W];  // two panels, each hd x W
  const int64_t qt = BalancedTile(nq, T::kDotQ);
  const Slice slice = SliceOf<T>(f, chunks, n_chunks);
  for (int64_t p0 = 0; p0 < k.n_rows; p0 += 2 * W) {
    const int n_valid = static_cast<int>(Min64(2 * W, k.n_rows - p0));
    const uint8_t* base = k.rows + p0 * k.row_bytes;
    for (int64_t p = p0 + kPrefetchRows; p < Min64(p0 + kPrefetchRows + 2 * W, k.n_rows); ++p) {
      PrefetchSlice(k.rows + p * k.row_bytes, slice);
    }
    DecodePanelTransposed<T, K>(base, k.row_bytes, n_valid < W ? n_valid : W, chunks, n_chunks, kt);
    const bool two = n_valid > W;
    if (two) DecodePanelTransposed<T, K>(base + W * k.row_bytes, k.row_bytes, n_valid - W, chunks, n_chunks, kt + k.hd * W);
    for (int64_t i0 = 0; i0 < nq; i0 += qt) {
      const int qc = static_cast<int>(Min64(qt, nq - i0));
      float* s = scores + i0 * s_stride + p0;
      if (two) DotTileN<T, 2, T::kDotQ>(qc, kt, k.hd, q + i0 * k.hd, s, s_stride, n_valid);
      else DotTileN<T, 1, T::kDotQ>(qc, kt, k.hd, q + i0 * k.hd, s, s_stride, n_valid);
    }
  }
}

// q4k keys: the fast path needs, besides FastPathOk, chunks of a multiple of W tokens.
template <class T>
bool ChunkFastPathOk(const KvFormat& f, int64_t hd) {
  return hd % 16 == 0 && hd <= kMaxHd && hd > 0 && f.chunk > 0 && f.chunk % T::W == 0;
}

// q4k: decodes tokens [t0, t0 + W) of one chunk's head slice (hd records of `record` bytes from
// `slice`) into kt[d * W + r] = m_d + s_d * q (KvDequantizeKChunk's two roundings). dm holds the
// slice's scales, then its minimums, as floats. The slice is already channel-major, so unlike
// DecodePanelTransposed there is nothing to transpose: one load of W/2 code bytes per channel.
template <class T>
void DecodeKeyPanel(const uint8_t* slice, int64_t record, int64_t hd, int64_t t0, const float* dm, float* kt) {
  constexpr int W = T::W;
  const uint8_t* codes = slice + 4 + t0 / 2;
  for (int64_t d = 0; d < hd; ++d) {
    T::Store(kt + d * W, T::Add(T::Bcast(dm[hd + d]), T::Mul(T::Bcast(dm[d]), T::LoadU4(codes + d * record))));
  }
}

template <class T>
void DotChunks(const KvFormat& f, const KvChunks& k, const float* q, int64_t nq, float* scores, int64_t s_stride) {
  constexpr int W = T::W;
  const int64_t C = f.chunk, record = 4 + C / 2, slice_bytes = k.hd * record;
  alignas(64) float kt[2 * kMaxHd * W];  // two panels, each hd x W
  alignas(64) float dm[2 * kMaxHd];      // the chunk slice's scales, then minimums
  const int64_t qt = BalancedTile(nq, T::kDotQ);
  const int64_t n_chunks = (k.n_tokens + C - 1) / C;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const uint8_t* slice = k.chunks + c * k.chunk_bytes + k.head * slice_bytes;
    // The next chunk's slice is one contiguous run, a chunk_bytes stride away: fetch it now
    // (decode is bound by memory latency; the stride defeats the hardware prefetchers).
    if (c + 1 < n_chunks) PrefetchSlice(slice + k.chunk_bytes, Slice{0, slice_bytes});
    for (int64_t d = 0; d < k.hd; ++d) {
      dm[d] = HalfToFloat(slice + d * record);
      dm[k.hd + d] = HalfToFloat(slice + d * record + 2);
    }
    const int64_t in_chunk = Min64(C, k.n_tokens - c * C);
    for (int64_t t0 = 0; t0 < in_chunk;) {
      const int64_t left = in_chunk - t0;
      // Two panels where the chunk has two more (C may be an odd multiple of W).
      const bool two = left > W && t0 + 2 * W <= C;
      const int n_used = static_cast<int>(Min64(two ? 2 * W : W, left));
      DecodeKeyPanel<T>(slice, record, k.hd, t0, dm, kt);
      if (two) DecodeKeyPanel<T>(slice, record, k.hd, t0 + W, dm, kt + k.hd * W);
      for (int64_t i0 = 0; i0 < nq; i0 += qt) {
        const int qc = static_cast<int>(Min64(qt, nq - i0));
        float* s = scores + i0 * s_stride + c * C + t0;
        if (two) DotTileN<T, 2, T::kDotQ>(qc, kt, k.hd, q + i0 * k.hd, s, s_stride, n_used);
        else DotTileN<T, 1, T::kDotQ>(qc, kt, k.hd, q + i0 * k.hd, s, s_stride, n_used);
      }
      t0 += two ? 2 * W : W;
    }
  }
}

// out[i * hd + c * W ...] += sum_p w[i * ws + p] * vf[p * hd + c * W ...] for C chunks, Q queries.
template <class T, int C, int Q>
void AxpyTile(const float* vf, int64_t hd, int64_t n_rows, const float* w, int64_t ws, float* out) {
  constexpr int W = T::W;
  // Start from zero and add to out once: out may already hold a large sum (earlier blocks),
  // and accumulating this block's small terms onto it would lose their low bits.
  typename T::V acc[Q][C];
  for (int i = 0; i < Q; ++i) {
    for (int c = 0; c < C; ++c) acc[i][c] = T::Zero();
  }
  for (int64_t p = 0; p < n_rows; ++p) {
    typename T::V v[C];
    for (int c = 0; c < C; ++c) v[c] = T::Load(vf + p * hd + c * W);
    for (int i = 0; i < Q; ++i) {
      const typename T::V b = T::Bcast(w[i * ws + p]);
      for (int c = 0; c < C; ++c) acc[i][c] = T::Fma(v[c], b, acc[i][c]);
    }
  }
  for (int i = 0; i < Q; ++i) {
    for (int c = 0; c < C; ++c) T::Store(out + i * hd + c * W, T::Add(T::Load(out + i * hd + c * W), acc[i][c]));
  }
}

template <class T, int C, int Q>
void AxpyTileQ(int q_count, const float* vf, int64_t hd, int64_t n_rows, const float* w, int64_t ws, float* out) {
  if constexpr (Q >= 1) {
    if (q_count == Q) return AxpyTile<T, C, Q>(vf, hd, n_rows, w, ws, out);
    return AxpyTileQ<T, C, Q - 1>(q_count, vf, hd, n_rows, w, ws, out);
  }
}

template <class T, int C>
void AxpyTileCQ(int c_count, int q_count, const float* vf, int64_t hd, int64_t n_rows, const float* w, int64_t ws,
                float* out) {
  if constexpr (C >= 1) {
    if (c_count == C) return AxpyTileQ<T, C, T::kAxpyQ>(q_count, vf, hd, n_rows, w, ws, out);
    return AxpyTileCQ<T, C - 1>(c_count, q_count, vf, hd, n_rows, w, ws, out);
  }
}

template <class T, KvType K>
void AxpyRows(const KvFormat& f, const KvRows& v, const float* w, int64_t nq, int64_t w_stride, float* out) {
  constexpr int W = T::W;
  Chunk chunks[kMaxHd / W];
  const int n_chunks = MakeChunks<T>(f, v.head, v.hd, chunks);
  alignas(64) float vf[kAxpyBlockFloats];
  const int64_t block = kAxpyBlockFloats / v.hd;  // >= 16 rows
  const int64_t qt = BalancedTile(nq, T::kAxpyQ);
  const Slice slice = SliceOf<T>(f, chunks, n_chunks);
  // q4k with sub-blocks of 16 and whole quads per head: the table may decode a quad at once.
  const bool quads = K == KvType::kQ4K && f.group == 16 && v.hd % 64 == 0;
  const int64_t first_quad = v.head * v.hd / 64;
  for (int64_t p0 = 0; p0 < v.n_rows; p0 += block) {
    const int64_t n = Min64(block, v.n_rows - p0);
    for (int64_t p = 0; p < n; ++p) {
      const uint8_t* row = v.rows + (p0 + p) * v.row_bytes;
      if (p0 + p + kPrefetchRows < v.n_rows) PrefetchSlice(row + kPrefetchRows * v.row_bytes, slice);
      if constexpr (K == KvType::kQ4K) {
        const float D = HalfToFloat(row), M = HalfToFloat(row + 2);
        if constexpr (T::kQ4kQuads) {
          if (quads) {
            for (int64_t qd = 0; qd < v.hd / 64; ++qd) {
              T::DecodeQuadQ4k(row + Q4kFieldsOffset(16, 4 * (first_quad + qd)), D, M, vf + p * v.hd + 64 * qd);
            }
            continue;
          }
        }
        for (int c = 0; c < n_chunks; ++c) T::Store(vf + p * v.hd + c * W, DecodeChunkQ4k<T>(row, chunks[c], D, M));
      } else if constexpr (K == KvType::kQ4) {
        // The group's scale and minimum once for all its chunks (a head slice is often one
        // group): the same values and operations as DecodeChunk, fewer conversions.
        int32_t header = -1;
        typename T::V d = T::Zero(), m = T::Zero();
        for (int c = 0; c < n_chunks; ++c) {
          if (chunks[c].header != header) {
            header = chunks[c].header;
            d = T::Bcast(HalfToFloat(row + header));
            m = T::Bcast(HalfToFloat(row + header + 2));
          }
          T::Store(vf + p * v.hd + c * W, T::Add(m, T::Mul(d, T::LoadU4(row + chunks[c].codes))));
        }
      } else {
        for (int c = 0; c < n_chunks; ++c) T::Store(vf + p * v.hd + c * W, DecodeChunk<T, K>(row, chunks[c]));
      }
    }
    for (int64_t i0 = 0; i0 < nq; i0 += qt) {
      const int qc = static_cast<int>(Min64(qt, nq - i0));
      for (int c0 = 0; c0 < n_chunks; c0 += T::kAxpyC) {
        const int cc = n_chunks - c0 < T::kAxpyC ? n_chunks - c0 : T::kAxpyC;
        AxpyTileCQ<T, T::kAxpyC>(cc, qc, vf + c0 * W, v.hd, n, w + i0 * w_stride + p0, w_stride,
                                 out + i0 * v.hd + c0 * W);
      }
    }
  }
}

// The softmax of attention.h, vectorised: exactly cpu::Softmax's arithmetic (T::Exp is the same
// polynomial with the same roundings; sums are taken per chunk of 16 values reduced pairwise in
// float, then accumulated in double), so every table gives the same bits.
template <class T>
void SoftmaxRow(float* s, int64_t n, int64_t n_total, float scale, bool round_f16) {
  using V = typename T::V;
  constexpr int W = T::W;
  const V vscale = T::Bcast(scale);
  // Pass 1: scale, and the maximum (masked lanes of the tail read as -inf).
  V vmax = T::Bcast(-__builtin_inff());
  for (int64_t i = 0; i < n; i += W) {
    const int r = static_cast<int>(Min64(W, n - i));
    const V x = T::Mul(T::LoadN(s + i, r), vscale);
    T::StoreN(s + i, x, r);
    vmax = T::Max(vmax, T::Select(r, x, T::Bcast(-__builtin_inff())));
  }
  const V m = T::Bcast(T::ReduceMax(vmax));
  // Pass 2: exponentials and their sum, in the reference's chunks of 16.
  double sum = 0.0;
  int64_t i = 0;
  if constexpr (T::W == 16) {
    // 16 chunks at a time: their pairwise sums reduced together, then added in order.
    for (; i + 256 <= n; i += 256) {
      V e[16];
      for (int k = 0; k < 16; ++k) {
        e[k] = T::Exp(T::Sub(T::Load(s + i + 16 * k), m));
        T::Store(s + i + 16 * k, e[k]);
      }
      alignas(64) float chunk_sums[16];
      T::PairwiseSums16x16(e, chunk_sums);
      for (float c : chunk_sums) sum += static_cast<double>(c);
    }
  }
  for (; i < n; i += 16) {
    V e[16 / W];
    for (int k = 0; k < 16 / W; ++k) {
      const int64_t off = i + k * W;
      const int r = off >= n ? 0 : static_cast<int>(Min64(W, n - off));
      if (r == 0) {
        e[k] = T::Zero();
        continue;
      }
      e[k] = T::Select(r, T::Exp(T::Sub(T::LoadN(s + off, r), m)), T::Zero());
      T::StoreN(s + off, e[k], r);
    }
    sum += static_cast<double>(T::PairwiseSum16(e));
  }
  // Pass 3: normalise (and round to f16 for the f16 path); zero what this query may not see.
  const V inv = T::Bcast(static_cast<float>(1.0 / sum));
  for (int64_t i = 0; i < n; i += W) {
    const int r = static_cast<int>(Min64(W, n - i));
    V x = T::Mul(T::LoadN(s + i, r), inv);
    if (round_f16) x = T::RoundF16(x);
    T::StoreN(s + i, x, r);
  }
  for (int64_t i = n; i < n_total; ++i) s[i] = 0.0f;
}

template <class T>
void RoundF16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += T::W) {
    const int r = static_cast<int>(Min64(T::W, n - i));
    T::StoreN(x + i, T::RoundF16(T::LoadN(x + i, r)), r);
  }
}

// HadamardTransform's butterflies in its order (stages of growing span, a + b then a - b, the
// scale last), so the results are its bits: spans below W inside each vector, the rest across
// the NV vectors (a compile-time count, so they stay in registers).
template <class T, int NV>
void HadamardN(float* x, int64_t n) {
  constexpr int W = T::W;
  typename T::V v[NV];
  for (int k = 0; k < NV; ++k) v[k] = T::Load(x + k * W);
  for (int len = 1; len < W; len <<= 1) {
    for (int k = 0; k < NV; ++k) v[k] = T::Butterfly(v[k], len);
  }
  for (int len = 1; len < NV; len <<= 1) {
    for (int i = 0; i < NV; i += 2 * len) {
      for (int j = i; j < i + len; ++j) {
        const typename T::V a = v[j], b = v[j + len];
        v[j] = T::Add(a, b);
        v[j + len] = T::Sub(a, b);
      }
    }
  }
  const typename T::V norm = T::Bcast(1.0f / __builtin_sqrtf(static_cast<float>(n)));
  for (int k = 0; k < NV; ++k) T::Store(x + k * W, T::Mul(v[k], norm));
}

// Lengths of 1 to 16 vectors; others go to the scalar function.
template <class T>
void Hadamard(float* x, int64_t n) {
  switch (n / T::W * (n % T::W == 0 ? 1 : 0)) {
    case 1: return HadamardN<T, 1>(x, n);
    case 2: return HadamardN<T, 2>(x, n);
    case 4: return HadamardN<T, 4>(x, n);
    case 8: return HadamardN<T, 8>(x, n);
    case 16: return HadamardN<T, 16>(x, n);
    default: return HadamardTransform(x, n);
  }
}

template <class T>
void DotRowsAny(const KvFormat& f, const KvRows& k, const float* q, int64_t nq, float* scores, int64_t s_stride) {
  if (!FastPathOk<T>(f, k.hd)) return ScalarAttentionKernels().dot_rows(f, k, q, nq, scores, s_stride);
  switch (f.type) {
    case KvType::kF16: return DotRows<T, KvType::kF16>(f, k, q, nq, scores, s_stride);
    case KvType::kQ8: return DotRows<T, KvType::kQ8>(f, k, q, nq, scores, s_stride);
    case KvType::kQ4: return DotRows<T, KvType::kQ4>(f, k, q, nq, scores, s_stride);
    case KvType::kQ4K: return DotRows<T, KvType::kQ4K>(f, k, q, nq, scores, s_stride);
  }
}

#include "engine/backend/cpu/attention_simd_int8.h"

template <class T>
void DotRowsQ8Any(const KvFormat& f, const KvRows& k, const Int8Queries& q, int64_t nq, float* scores,
                  int64_t s_stride) {
  if (!KeysUseInt8Queries(f, k.hd) || k.hd > kMaxHd) {
    return ScalarAttentionKernels().dot_rows_q8(f, k, q, nq, scores, s_stride);
  }
  DotRowsQ8<T>(f, k, q, nq, scores, s_stride);
}

template <class T>
void DotChunksAny(const KvFormat& f, const KvChunks& k, const float* q, int64_t nq, float* scores, int64_t s_stride) {
  if (KeyChunksUseInt8(k.hd)) {
    if (f.chunk > 0 && f.chunk % T::W == 0) return DotChunksQ8<T>(f, k, q, nq, scores, s_stride);
    return ScalarAttentionKernels().dot_chunks(f, k, q, nq, scores, s_stride);
  }
  if (!ChunkFastPathOk<T>(f, k.hd)) return ScalarAttentionKernels().dot_chunks(f, k, q, nq, scores, s_stride);
  DotChunks<T>(f, k, q, nq, scores, s_stride);
}

template <class T>
void AxpyRowsAny(const KvFormat& f, const KvRows& v, const float* w, int64_t nq, int64_t w_stride, float* out) {
  if (!FastPathOk<T>(f, v.hd)) return ScalarAttentionKernels().axpy_rows(f, v, w, nq, w_stride, out);
  if (ValuesUseInt8Weights(f, v.hd)) return AxpyRowsQ8<T>(f, v, w, nq, w_stride, out);
  switch (f.type) {
    case KvType::kF16: return AxpyRows<T, KvType::kF16>(f, v, w, nq, w_stride, out);
    case KvType::kQ8: return AxpyRows<T, KvType::kQ8>(f, v, w, nq, w_stride, out);
    case KvType::kQ4: return AxpyRows<T, KvType::kQ4>(f, v, w, nq, w_stride, out);
    case KvType::kQ4K: return AxpyRows<T, KvType::kQ4K>(f, v, w, nq, w_stride, out);
  }
}

template <class T>
void AxpyBlocksAny(const KvFormat& f, std::span<const KvRows> blocks, const float* w, int64_t nq, int64_t w_stride,
                   float* out) {
  if (blocks.empty()) return;
  if (!FastPathOk<T>(f, blocks[0].hd)) return ScalarAttentionKernels().axpy_blocks(f, blocks, w, nq, w_stride, out);
  for (const KvRows& rows : blocks) {
    AxpyRowsAny<T>(f, rows, w, nq, w_stride, out);
    w += rows.n_rows;
  }
}

}  // namespace detail
