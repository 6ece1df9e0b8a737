// Serialises small GGUF images in memory for tests (malformed-input and metadata cases).
// Written from the GGUF spec independently of the reader under test.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kvfs::testing {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3, uint64_t alignment = 32) : version_(version), alignment_(alignment) {}

  void AddU32(const std::string& key, uint32_t v) { Key(key, 4); Put(v); ++n_kv_; }
  void AddI32(const std::string& key, int32_t v) { Key(key, 5); Put(v); ++n_kv_; }
  void AddF32(const std::string& key, float v) { Key(key, 6); Put(v); ++n_kv_; }
  void AddBool(const std::string& key, bool v) { Key(key, 7); Put(static_cast<uint8_t>(v)); ++n_kv_; }
  void AddString(const std::string& key, const std::string& v) { Key(key, 8); Str(v); ++n_kv_; }
  void AddStringArray(const std::string& key, const std::vector<std::string>& v) {
    Key(key, 9); Put(uint32_t{8}); Put(static_cast<uint64_t>(v.size()));
    for (const auto& s : v) Str(s);
    ++n_kv_;
  }
  void AddF32Array(const std::string& key, const std::vector<float>& v) {
    Key(key, 9); Put(uint32_t{6}); Put(static_cast<uint64_t>(v.size()));
    for (float f : v) Put(f);
    ++n_kv_;
  }
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
    Key(key, 9); Put(uint32_t{5}); Put(static_cast<uint64_t>(v.size()));
    for (int32_t x : v) Put(x);
    ++n_kv_;
  }
  // A tensor with the given ggml type id and dims; data is appended (aligned) in order.
  void AddTensor(const std::string& name, uint32_t type, std::vector<uint64_t> dims, std::vector<uint8_t> data) {
    tensors_.push_back({name, type, std::move(dims), std::move(data)});
  }

  std::vector<uint8_t> Build() const {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
    uint32_t magic = 0x46554747;
    put(&magic, 4);
    put(&version_, 4);
    uint64_t nt = tensors_.size(), nkv = n_kv_;
    put(&nt, 8);
    put(&nkv, 8);
    put(kv_.data(), kv_.size());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      uint64_t len = t.name.size();
      put(&len, 8);
      put(t.name.data(), len);
      uint32_t nd = static_cast<uint32_t>(t.dims.size());
      put(&nd, 4);
      for (uint64_t d : t.dims) put(&d, 8);
      put(&t.type, 4);
      put(&offset, 8);
      offsets.push_back(offset);
      offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
    }
    while (out.size() % alignment_) out.push_back(0);
    for (const auto& t : tensors_) {
      put(t.data.data(), t.data.size());
      while (out.size() % alignment_) out.push_back(0);
    }
    return out;
  }

 private:
  struct Tensor { std::string name; uint32_t type; std::vector<uint64_t> dims; std::vector<uint8_t> data; };
  template <typename T> void Put(T v) { const uint8_t* p = reinterpret_cast<const uint8_t*>(&v); kv_.insert(kv_.end(), p, p + sizeof(T)); }
  void Str(const std::string& s) { Put(static_cast<uint64_t>(s.size())); kv_.insert(kv_.end(), s.begin(), s.end()); }
  void Key(const std::string& key, uint32_t type) { Str(key); Put(type); }

  uint32_t version_;
  uint64_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvfs::testing
