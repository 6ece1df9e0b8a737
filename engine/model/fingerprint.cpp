#include "engine/model/fingerprint.h"

#include <algorithm>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

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
  // The regions to hash, in file order.
  std::vector<std::pair<const uint8_t*, uint64_t>> regions;
  for (const GgufTensor& t : tensors) {
    const uint64_t n = t.n_bytes;
    if (n <= 3 * sample) {
      regions.emplace_back(t.data, n);
    } else {
      regions.emplace_back(t.data, sample);
      regions.emplace_back(t.data + (n - sample) / 2, sample);
      regions.emplace_back(t.data + n - sample, sample);
    }
  }
  // From a cold page cache each region would be one synchronous page-fault read (~1 ms on an
  // SSD: 0.8 s for an 8B model's ~900 regions). Ask for all of them up front so the reads are
  // queued together; this is only advice, so errors are ignored.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& [p, n] : regions) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    (void)::posix_madvise(reinterpret_cast<void*>(start), reinterpret_cast<uintptr_t>(p) + n - start,
                          POSIX_MADV_WILLNEED);
  }
  for (const auto& [p, n] : regions) h.Bytes(p, n);
  return h.Hex();
}

}  // namespace kvfs
