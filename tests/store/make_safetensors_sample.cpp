// Test-only: writes kv.safetensors exports whose every value follows a closed-form pattern, so
// that an independent reader (check_safetensors.py --pattern) can verify the tensor layout
// without sharing code with the writer.
//   make_safetensors_sample OUT_DIR   -> OUT_DIR/{f16,q8,q4,q4k}.safetensors (OUT_DIR is created)
// Geometry: 2 layers, 2 KV heads of 8 (rows of 16 values); f16 group 16, q8 and q4 groups of 8;
// 7 token ids of which 5 are cached, given as chunks of 2, 2 and 1 tokens. q4k: V sub-blocks of
// 8, K chunks of 4 tokens, 10 of 12 token ids cached, given as chunks of 4, 4 and 2 tokens (2
// complete K chunks, 2 staged rows).
// Pattern, for layer l, plane p (k = 0, v = 1), index t along the tensor's first dimension (the
// token; q4k: the K chunk for k.codes/scales/mins, the staged row for k.staged) and element e
// (the row-major index of the element within that slice of the tensor):
//   F16 tensors: sign * (4l + 2p + e % 4 + t/16), sign = -1 for ".mins", +1 otherwise
//   I8/U8 codes: the byte (31l + 17p + 7t + 3e) mod 256
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/quants.h"
#include "engine/store/safetensors.h"

namespace {

using namespace kvfs::store;

constexpr int64_t kLayers = 2, kHeads = 2, kHeadDim = 8, kRow = kHeads * kHeadDim;

void PutHalf(uint8_t* p, float v) {
  const uint16_t h = kvfs::Fp32ToFp16(v);
  std::memcpy(p, &h, 2);
}
float HalfValue(int64_t l, int p, int64_t t, int64_t e, bool negative) {
  const float v = static_cast<float>(4 * l + 2 * p + e % 4) + static_cast<float>(t) / 16.0f;
  return negative ? -v : v;
}
uint8_t CodeByte(int64_t l, int p, int64_t t, int64_t e) {
  return static_cast<uint8_t>((31 * l + 17 * p + 7 * t + 3 * e) & 0xFF);
}

// One KV row in the layout of engine/kv/kv_format.h.
void FillRow(const std::string& type, int64_t G, int64_t l, int p, int64_t t, uint8_t* row) {
  if (type == "f16") {
    for (int64_t e = 0; e < kRow; ++e) PutHalf(row + 2 * e, HalfValue(l, p, t, e, false));
    return;
  }
  const int64_t code_bytes = type == "q8" ? G : G / 2;
  const int64_t header = type == "q8" ? 2 : 4;  // d (q8); d, m (q4)
  for (int64_t g = 0; g < kRow / G; ++g) {
    uint8_t* grp = row + g * (header + code_bytes);
    PutHalf(grp, HalfValue(l, p, t, g, false));
    if (type == "q4") PutHalf(grp + 2, HalfValue(l, p, t, g, true));
    for (int64_t j = 0; j < code_bytes; ++j) grp[header + j] = CodeByte(l, p, t, g * code_bytes + j);
  }
}

// q4k (kv_format.h, kv_payload_layout.h): chunk payloads of n tokens starting at token `first`.
constexpr int64_t kQ4kChunk = 4, kQ4kSub = 8;
std::vector<uint8_t> Q4kPayload(int64_t first, int64_t n) {
  const int64_t C = kQ4kChunk, S = kQ4kSub, record = 4 + C / 2, nq = (kRow / S + 3) / 4;
  const int64_t v_row = 4 + 5 * nq + kRow / 2;
  const int64_t layer_bytes = n / C * kRow * record + n * v_row;
  std::vector<uint8_t> out(static_cast<size_t>(kLayers * (layer_bytes + n % C * kRow * 2)));
  for (int64_t l = 0; l < kLayers; ++l) {
    uint8_t* k = out.data() + l * layer_bytes;
    for (int64_t j = 0; j < n / C; ++j) {
      const int64_t c = first / C + j;
      for (int64_t ch = 0; ch < kRow; ++ch) {
        uint8_t* r = k + (j * kRow + ch) * record;
        PutHalf(r, HalfValue(l, 0, c, ch, false));
        PutHalf(r + 2, HalfValue(l, 0, c, ch, true));
        for (int64_t b = 0; b < C / 2; ++b) r[4 + b] = CodeByte(l, 0, c, ch * (C / 2) + b);
      }
    }
    uint8_t* v = k + n / C * kRow * record;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = first + i;
      uint8_t* row = v + i * v_row;
      PutHalf(row, HalfValue(l, 1, t, 0, false));
      PutHalf(row + 2, HalfValue(l, 1, t, 0, false));
      for (int64_t q = 0; q < nq; ++q) {
        // A quad: 5 bytes of fields, then up to 4 sub-blocks of S/2 bytes.
        uint8_t* quad = row + 4 + q * (5 + 2 * S);
        for (int64_t b = 0; b < 5; ++b) quad[b] = CodeByte(l, 1, t, q * 5 + b);
        for (int64_t s = 0; s < 4 && q * 4 + s < kRow / S; ++s)
          for (int64_t b = 0; b < S / 2; ++b) quad[5 + s * (S / 2) + b] = CodeByte(l, 1, t, (q * 4 + s) * (S / 2) + b);
      }
    }
    uint8_t* staged = out.data() + kLayers * layer_bytes + l * (n % C) * kRow * 2;
    for (int64_t r = 0; r < n % C; ++r)
      for (int64_t e = 0; e < kRow; ++e) PutHalf(staged + (r * kRow + e) * 2, HalfValue(l, 0, r, e, false));
  }
  return out;
}

bool WriteSample(const std::string& dir, const std::string& type) {
  const int64_t G = type == "f16" ? 16 : 8;
  const bool q4k = type == "q4k";
  const KvGeometry geom{kLayers, kHeads, kHeadDim, type, G, type != "f16", q4k ? kQ4kChunk : 0};
  const int64_t rb = KvRowBytes(geom);
  CacheExportInfo info{"00112233445566778899aabbccddeeff", geom, {1, 529, 29871, 13, 2147483647, 0, 42}, 5,
                       {{"system", "You are terse."}, {"user", "Caf\xC3\xA9? \"yes\"\n"}},
                       ""};
  std::vector<std::vector<uint8_t>> chunks;
  std::vector<KvChunk> spans;
  if (q4k) {
    info.tokens.insert(info.tokens.end(), {7, 8, 9, 10, 11});
    info.n_cached = 10;
    for (int64_t start = 0; start < info.n_cached; start += kQ4kChunk) {
      const int64_t n = std::min<int64_t>(kQ4kChunk, info.n_cached - start);
      chunks.push_back(Q4kPayload(start, n));
      spans.push_back({chunks.back(), n});
    }
  }
  for (int64_t start = 0; !q4k && start < info.n_cached; start += 2) {
    const int64_t n = std::min<int64_t>(2, info.n_cached - start);
    std::vector<uint8_t> c(static_cast<size_t>(kLayers * 2 * n * rb));
    for (int64_t l = 0; l < kLayers; ++l)
      for (int p = 0; p < 2; ++p)
        for (int64_t i = 0; i < n; ++i) FillRow(type, G, l, p, start + i, c.data() + ((l * 2 + p) * n + i) * rb);
    chunks.push_back(std::move(c));
  }
  for (size_t i = 0; !q4k && i < chunks.size(); ++i)
    spans.push_back({chunks[i], static_cast<int64_t>(chunks[i].size() / (kLayers * 2 * rb))});
  auto file = WriteKvSafetensors(info, spans);
  if (!file.ok()) {
    std::fprintf(stderr, "%s: %s\n", type.c_str(), file.status().message().c_str());
    return false;
  }
  const std::string path = dir + "/" + type + ".safetensors";
  std::ofstream out(path, std::ios::binary);
  out.write(file->data(), static_cast<std::streamsize>(file->size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  std::printf("wrote %s (%zu bytes)\n", path.c_str(), file->size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_safetensors_sample OUT_DIR\n");
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(argv[1], ec);
  bool ok = true;
  for (const char* type : {"f16", "q8", "q4", "q4k"}) ok = WriteSample(argv[1], type) && ok;
  return ok ? 0 : 1;
}
