// GGUF reader (versions 2 and 3). The file is mmapped read-only; every count, offset, size,
// alignment and type is validated while parsing, so a GgufFile that exists is safe to use:
// tensor data pointers lie inside the mapping and strings are within bounds.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/ggml_types.h"

namespace kvfs {

// On-disk value type ids of GGUF metadata (gguf spec); do not renumber.
enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
std::string_view GgufValueTypeName(GgufValueType type);

// A metadata array. Elements are read on demand from the mapping; string arrays keep a
// pre-validated view per element.
class GgufArray {
 public:
  GgufValueType elem_type() const { return elem_type_; }
  uint64_t size() const { return count_; }
  bool is_integer() const;
  bool is_float() const { return elem_type_ == GgufValueType::kF32 || elem_type_ == GgufValueType::kF64; }
  // Element access; the caller checks elem_type first (asserts otherwise).
  int64_t int_at(uint64_t i) const;
  double float_at(uint64_t i) const;
  std::string_view string_at(uint64_t i) const { return strings_[i]; }

 private:
  friend class GgufParser;
  GgufValueType elem_type_ = GgufValueType::kU8;
  uint64_t count_ = 0;
  const uint8_t* data_ = nullptr;          // fixed-size element data (not for strings)
  std::vector<std::string_view> strings_;  // string elements
};

struct GgufValue {
  GgufValueType type;
  // uint64_t for unsigned ints and bool, int64_t for signed, double for floats.
  std::variant<uint64_t, int64_t, double, std::string_view, GgufArray> value;
};

struct GgufTensor {
  std::string name;
  GgmlType type;
  int n_dims;                // 1..4
  int64_t ne[4];             // ne[0] = elements per row (contiguous), unused dims are 1
  uint64_t file_offset;      // absolute offset of the data in the file
  uint64_t n_bytes;          // exact size of the data
  const uint8_t* data;       // into the mapping
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
};

// How a file's bytes are held. kMapped maps the file: nothing is read until used and the page
// cache is shared, but the bytes are the file's, so a file truncated or rewritten in place
// under the process changes them (or faults with SIGBUS). kPrivateCopy reads the whole file
// into anonymous memory once: what a long-running daemon needs, whatever happens to the file.
enum class GgufLoad { kMapped, kPrivateCopy };

class GgufFile {
 public:
  // Maps (or reads) and parses a file. Errors name the file and what is wrong, with byte offsets.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path, GgufLoad how = GgufLoad::kMapped);
  // Parses an in-memory image (the bytes must outlive the GgufFile). Used by the fuzzer.
  static Result<std::unique_ptr<GgufFile>> Parse(std::span<const uint8_t> bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  std::span<const uint8_t> bytes() const { return bytes_; }
  // True when the bytes are this process's own copy (GgufLoad::kPrivateCopy).
  bool private_copy() const { return private_copy_; }

  // Gives the whole pages inside [p, p + n) back to the system: a backend that made its own
  // copy of some weights (packed, or on a device) and never reads these bytes again. A mapped
  // file's pages come back from the file when read. A private copy's read as zeros until
  // Refill(): its hash is kept, and a range already given back is left alone. Thread-safe.
  void GiveBack(const uint8_t* p, size_t n) const;
  // Private copies: reads every range given back in again, from the file as opened at start
  // (kept open: a file renamed over it does not matter), and checks each against its hash. A
  // file rewritten in place since is an error naming it, and those ranges stay given back.
  // Whoever reads weights that another backend may have given back calls this first. A failure
  // is final (the file will not turn back): later calls return it at once. `restored`, when
  // given, gets the ranges read back (to be given back again if they turn out not needed).
  Status Refill(std::vector<std::span<const uint8_t>>* restored = nullptr) const;
  int64_t given_back_bytes() const;  // of a private copy, now

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kvs_; }
  const GgufValue* Find(std::string_view key) const;
  // Typed getters: nullopt when absent or of an incompatible type (any integer type is
  // accepted where an integer is asked for, as long as the value fits).
  std::optional<int64_t> GetInt(std::string_view key) const;
  std::optional<double> GetFloat(std::string_view key) const;  // float or integer
  std::optional<bool> GetBool(std::string_view key) const;
  std::optional<std::string_view> GetString(std::string_view key) const;
  const GgufArray* GetArray(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;

 private:
  friend class GgufParser;
  GgufFile() = default;

  void* map_ = nullptr;  // non-null when we own an mmap (of the file, or anonymous)
  size_t map_size_ = 0;
  bool private_copy_ = false;
  int fd_ = -1;  // a private copy's file, for Refill
  std::string path_;
  struct GivenBack {
    size_t length;
    uint64_t xxh3;  // of the bytes before they were given back
  };
  mutable std::mutex give_back_mu_;
  mutable std::map<size_t, GivenBack> given_back_;  // by offset in bytes_, whole pages
  mutable Status refill_failure_;                   // the first failed Refill's
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Renders a value for `kvfs inspect`: arrays show their type, length and first elements.
std::string GgufValueToString(const GgufValue& value, size_t max_array_elems = 8);

}  // namespace kvfs
