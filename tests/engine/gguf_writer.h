// Test helper: serialises a metadata-only GGUF v3 image in memory, so tests can feed
// GgufFile::Parse hand-made (and deliberately malformed) tokenizer metadata.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/gguf.h"

namespace kvfs::testing {

class GgufWriter {
 public:
  GgufWriter& Str(std::string_view key, std::string_view value) {
    Key(key, GgufValueType::kString);
    PutStr(value);
    return *this;
  }
  GgufWriter& U32(std::string_view key, uint32_t value) {
    Key(key, GgufValueType::kU32);
    Put(value);
    return *this;
  }
  GgufWriter& Bool(std::string_view key, bool value) {
    Key(key, GgufValueType::kBool);
    Put(static_cast<uint8_t>(value));
    return *this;
  }
  GgufWriter& StrArray(std::string_view key, const std::vector<std::string>& values) {
    ArrayHeader(key, GgufValueType::kString, values.size());
    for (const auto& v : values) PutStr(v);
    return *this;
  }
  GgufWriter& F32Array(std::string_view key, const std::vector<float>& values) {
    ArrayHeader(key, GgufValueType::kF32, values.size());
    for (float v : values) Put(v);
    return *this;
  }
  GgufWriter& I32Array(std::string_view key, const std::vector<int32_t>& values) {
    ArrayHeader(key, GgufValueType::kI32, values.size());
    for (int32_t v : values) Put(v);
    return *this;
  }

  // The whole file: header (magic, version 3, no tensors, the key count) and the metadata.
  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    const uint32_t magic = 0x46554747, version = 3;
    const uint64_t n_tensors = 0;
    put(&magic, 4);
    put(&version, 4);
    put(&n_tensors, 8);
    put(&n_kv_, 8);
    out.insert(out.end(), kv_.begin(), kv_.end());
    return out;
  }

 private:
  template <typename T>
  void Put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // the project is little-endian only
    kv_.insert(kv_.end(), b, b + sizeof(T));
  }
  void PutStr(std::string_view s) {
    Put(static_cast<uint64_t>(s.size()));
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void Key(std::string_view key, GgufValueType type) {
    PutStr(key);
    Put(static_cast<uint32_t>(type));
    ++n_kv_;
  }
  void ArrayHeader(std::string_view key, GgufValueType elem, size_t n) {
    Key(key, GgufValueType::kArray);
    Put(static_cast<uint32_t>(elem));
    Put(static_cast<uint64_t>(n));
  }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
};

}  // namespace kvfs::testing
