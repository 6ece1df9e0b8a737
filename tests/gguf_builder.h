// Serialises small GGUF v3 (or v2) images in memory for tests: hand-made and deliberately
// malformed metadata and tensor tables. Written from the GGUF spec, independently of the
// reader under test. Methods chain: GgufBuilder().Str("k", "v").U32("n", 3).Bytes().
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/gguf.h"

namespace kvfs::testing {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3, uint64_t alignment = 32) : version_(version), alignment_(alignment) {}

  GgufBuilder& Str(std::string_view key, std::string_view v) { Key(key, GgufValueType::kString); PutStr(v); return *this; }
  GgufBuilder& U32(std::string_view key, uint32_t v) { Key(key, GgufValueType::kU32); Put(v); return *this; }
  GgufBuilder& I32(std::string_view key, int32_t v) { Key(key, GgufValueType::kI32); Put(v); return *this; }
  GgufBuilder& F32(std::string_view key, float v) { Key(key, GgufValueType::kF32); Put(v); return *this; }
  GgufBuilder& Bool(std::string_view key, bool v) { Key(key, GgufValueType::kBool); Put(static_cast<uint8_t>(v)); return *this; }
  GgufBuilder& StrArray(std::string_view key, const std::vector<std::string>& v) {
    ArrayHeader(key, GgufValueType::kString, v.size());
    for (const auto& s : v) PutStr(s);
    return *this;
  }
  GgufBuilder& F32Array(std::string_view key, const std::vector<float>& v) {
    ArrayHeader(key, GgufValueType::kF32, v.size());
    for (float f : v) Put(f);
    return *this;
  }
  GgufBuilder& I32Array(std::string_view key, const std::vector<int32_t>& v) {
    ArrayHeader(key, GgufValueType::kI32, v.size());
    for (int32_t x : v) Put(x);
    return *this;
  }
  // A tensor with the given ggml type id and dims; its data is appended (aligned) in order.
  GgufBuilder& Tensor(const std::string& name, uint32_t type, std::vector<uint64_t> dims, std::vector<uint8_t> data) {
    tensors_.push_back({name, type, std::move(dims), std::move(data)});
    return *this;
  }

  // The whole file: header, metadata, tensor table, padding, tensor data.
  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> out;
    auto put = [&out](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    const uint32_t magic = 0x46554747;
    const uint64_t n_tensors = tensors_.size();
    put(&magic, 4);
    put(&version_, 4);
    put(&n_tensors, 8);
    put(&n_kv_, 8);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      const uint64_t len = t.name.size();
      put(&len, 8);
      put(t.name.data(), len);
      const uint32_t nd = static_cast<uint32_t>(t.dims.size());
      put(&nd, 4);
      for (uint64_t d : t.dims) put(&d, 8);
      put(&t.type, 4);
      put(&offset, 8);
      offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
    }
    while (out.size() % alignment_) out.push_back(0);
    for (const auto& t : tensors_) {
      out.insert(out.end(), t.data.begin(), t.data.end());
      while (out.size() % alignment_) out.push_back(0);
    }
    return out;
  }

 private:
  struct TensorEntry {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> data;
  };
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

  uint32_t version_;
  uint64_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<TensorEntry> tensors_;
};

}  // namespace kvfs::testing
