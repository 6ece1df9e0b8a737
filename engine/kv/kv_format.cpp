#include "engine/kv/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <spdlog/fmt/fmt.h>

#include "engine/model/quants.h"

namespace kvfs {

namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

int64_t GroupBytes(const KvFormat& f) {
  switch (f.type) {
    case KvType::kF16: return 2 * f.group;
    case KvType::kQ8: return 2 + f.group;
    case KvType::kQ4: return 4 + f.group / 2;
  }
  return 0;
}

}  // namespace

uint32_t KvFormatId(const KvFormat& f) {
  return static_cast<uint32_t>(f.type) | (f.rotate ? 1u : 0u) << 8 | static_cast<uint32_t>(f.group) << 16;
}

bool IsPowerOfTwo(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

int64_t KvFormat::RowBytes(int64_t n) const { return n / group * GroupBytes(*this); }

std::string KvFormat::Name() const {
  std::string base = type == KvType::kF16 ? "f16" : type == KvType::kQ8 ? "q8" : "q4";
  if (type != KvType::kF16 && !rotate) base += "-norot";
  return base;
}

Result<KvFormat> MakeKvFormat(std::string_view type_name, std::string_view rotate, int64_t n_head_kv,
                              int64_t head_dim) {
  KvFormat f;
  if (type_name == "f16") f.type = KvType::kF16;
  else if (type_name == "q8") f.type = KvType::kQ8;
  else if (type_name == "q4") f.type = KvType::kQ4;
  else return InvalidArgument(fmt::format("unknown KV type '{}' (f16, q8, q4)", type_name));
  const int64_t n = n_head_kv * head_dim;
  f.group = 1;
  for (int64_t g = std::min<int64_t>(64, n); g >= 1; --g) {
    // q4 packs two values per byte: keep groups even.
    if (n % g == 0 && (f.type != KvType::kQ4 || g % 2 == 0)) {
      f.group = g;
      break;
    }
  }
  if (f.type == KvType::kQ4 && f.group % 2 != 0) {
    return InvalidArgument(fmt::format("q4 KV needs an even vector length, the model has {}", n));
  }
  const bool can_rotate = IsPowerOfTwo(head_dim);
  if (rotate == "on") {
    if (!can_rotate) return InvalidArgument(fmt::format("KV rotation needs a power-of-two head_dim, not {}", head_dim));
    f.rotate = f.type != KvType::kF16;
  } else if (rotate == "off") {
    f.rotate = false;
  } else if (rotate.empty()) {
    f.rotate = f.type != KvType::kF16 && can_rotate;
  } else {
    return InvalidArgument(fmt::format("--kv-rotate must be on or off, not '{}'", rotate));
  }
  return f;
}

void KvQuantizeRow(const KvFormat& f, const float* x, uint8_t* row, int64_t n) {
  const int64_t G = f.group, gb = GroupBytes(f);
  for (int64_t g0 = 0; g0 < n; g0 += G, row += gb) {
    const float* v = x + g0;
    if (f.type == KvType::kF16) {
      for (int64_t i = 0; i < G; ++i) StoreU16(row + 2 * i, Fp32ToFp16(v[i]));
    } else if (f.type == KvType::kQ8) {
      float amax = 0.0f;
      for (int64_t i = 0; i < G; ++i) amax = std::max(amax, std::fabs(v[i]));
      const uint16_t dh = Fp32ToFp16(amax / 127.0f);
      const float d = Fp16ToFp32(dh);
      const float id = d > 0.0f ? 1.0f / d : 0.0f;
      StoreU16(row, dh);
      for (int64_t i = 0; i < G; ++i) {
        const float q = std::nearbyint(v[i] * id);
        row[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
      }
    } else {
      float lo = v[0], hi = v[0];
      for (int64_t i = 1; i < G; ++i) {
        lo = std::min(lo, v[i]);
        hi = std::max(hi, v[i]);
      }
      // Codes are computed against the f16-rounded scale and minimum that decoding will use.
      const uint16_t mh = Fp32ToFp16(lo);
      const float m = Fp16ToFp32(mh);
      const uint16_t dh = Fp32ToFp16((hi - m) / 15.0f);
      const float d = Fp16ToFp32(dh);
      const float id = d > 0.0f ? 1.0f / d : 0.0f;
      StoreU16(row, dh);
      StoreU16(row + 2, mh);
      uint8_t* codes = row + 4;
      for (int64_t i = 0; i < G; i += 2) {
        const int q0 = static_cast<int>(std::clamp(std::nearbyint((v[i] - m) * id), 0.0f, 15.0f));
        const int q1 = static_cast<int>(std::clamp(std::nearbyint((v[i + 1] - m) * id), 0.0f, 15.0f));
        codes[i / 2] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
    }
  }
}

void KvDequantize(const KvFormat& f, const uint8_t* row, int64_t begin, int64_t n, float* out) {
  const int64_t G = f.group, gb = GroupBytes(f);
  for (int64_t i = begin; i < begin + n; ++i) {
    const uint8_t* grp = row + (i / G) * gb;
    const int64_t j = i % G;
    switch (f.type) {
      case KvType::kF16: *out++ = Fp16ToFp32(LoadU16(grp + 2 * j)); break;
      case KvType::kQ8: *out++ = Fp16ToFp32(LoadU16(grp)) * static_cast<int8_t>(grp[2 + j]); break;
      case KvType::kQ4: {
        const uint8_t byte = grp[4 + j / 2];
        const int q = (j % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
        *out++ = Fp16ToFp32(LoadU16(grp + 2)) + Fp16ToFp32(LoadU16(grp)) * static_cast<float>(q);
        break;
      }
    }
  }
}

void HadamardTransform(float* x, int64_t n) {
  for (int64_t len = 1; len < n; len <<= 1) {
    for (int64_t i = 0; i < n; i += 2 * len) {
      for (int64_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= norm;
}

}  // namespace kvfs
