#include "engine/model/fingerprint.h"

#include <algorithm>

#include <xxhash.h>

namespace kvfs {
namespace {

// Versioned domain tag: changing what is hashed must change every fingerprint.
constexpr char kDomain[] = "kvfs-model-fingerprint-v1";
constexpr uint64_t kMinSample = 4096;

class Hasher {
 public:
  Hasher() : state_(XXH3_createState()) { XXH3_128bits_reset(state_); }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Bytes(const void* p, size_t n) { XXH3_128bits_update(state_, p, n); }
  template <typename T>
  void Pod(T v) { Bytes(&v, sizeof v); }
  // Length-prefixed, so that ("ab","c") and ("a","bc") differ.
  void Str(const std::string& s) { Pod<uint64_t>(s.size()); Bytes(s.data(), s.size()); }
  std::string Hex() {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(state_));
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char b : c.digest) {
      out += kDigits[b >> 4];
      out += kDigits[b & 0xF];
    }
    return out;
  }

 private:
  XXH3_state_t* state_;
};

}  // namespace

std::string ModelFingerprint(const GgufFile& file, const FingerprintOptions& options) {
  Hasher h;
  h.Bytes(kDomain, sizeof kDomain);
  h.Pod<uint32_t>(file.version());
  h.Pod<uint64_t>(file.alignment());
  h.Pod<uint64_t>(file.data_offset());
  // The header region holds the metadata and the tensor table exactly as stored.
  const std::span<const uint8_t> bytes = file.bytes();
  const uint64_t header = std::min<uint64_t>(file.data_offset(), bytes.size());
  h.Pod<uint64_t>(header);
  h.Bytes(bytes.data(), header);

  const auto& tensors = file.tensors();
  h.Pod<uint64_t>(tensors.size());
  for (const GgufTensor& t : tensors) {
    h.Str(t.name);
    h.Pod<uint32_t>(static_cast<uint32_t>(t.type));
    h.Pod<int32_t>(t.n_dims);
    for (int64_t d : t.ne) h.Pod<int64_t>(d);
    h.Pod<uint64_t>(t.file_offset);
    h.Pod<uint64_t>(t.n_bytes);
  }

  uint64_t sample = std::max<uint64_t>(options.sample_bytes, 1);
  if (!tensors.empty()) {
    const uint64_t budget = options.max_total_sample_bytes / (3 * tensors.size());
    if (budget < sample) sample = std::max(budget, std::min(kMinSample, sample));
  }
  for (const GgufTensor& t : tensors) {
    const uint64_t n = t.n_bytes;
    if (n <= 3 * sample) {
      h.Bytes(t.data, n);
      continue;
    }
    h.Bytes(t.data, sample);
    h.Bytes(t.data + (n - sample) / 2, sample);
    h.Bytes(t.data + n - sample, sample);
  }
  return h.Hex();
}

}  // namespace kvfs
