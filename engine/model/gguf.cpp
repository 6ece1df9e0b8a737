#include "engine/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>

#include <spdlog/fmt/fmt.h>
#include <xxhash.h>

#include "engine/core/message_text.h"
#include "engine/model/gguf_format.h"

namespace kvfs {

namespace {

size_t FixedSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    default: return 0;
  }
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

template <typename T>
T LoadLE(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86/ARM little-endian hosts only (checked in CMake)
  return v;
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  static constexpr std::string_view kNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                                "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : std::string_view("?");
}

bool GgufArray::is_integer() const {
  switch (elem_type_) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kU16:
    case GgufValueType::kI16: case GgufValueType::kU32: case GgufValueType::kI32:
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kBool:
      return true;
    default:
      return false;
  }
}

int64_t GgufArray::int_at(uint64_t i) const {
  assert(i < count_ && is_integer());
  const uint8_t* p = data_ + i * FixedSize(elem_type_);
  switch (elem_type_) {
    case GgufValueType::kU8: case GgufValueType::kBool: return LoadLE<uint8_t>(p);
    case GgufValueType::kI8: return LoadLE<int8_t>(p);
    case GgufValueType::kU16: return LoadLE<uint16_t>(p);
    case GgufValueType::kI16: return LoadLE<int16_t>(p);
    case GgufValueType::kU32: return LoadLE<uint32_t>(p);
    case GgufValueType::kI32: return LoadLE<int32_t>(p);
    case GgufValueType::kU64: return static_cast<int64_t>(LoadLE<uint64_t>(p));
    case GgufValueType::kI64: return LoadLE<int64_t>(p);
    default: return 0;
  }
}

double GgufArray::float_at(uint64_t i) const {
  assert(i < count_);
  if (elem_type_ == GgufValueType::kF32) return LoadLE<float>(data_ + i * 4);
  if (elem_type_ == GgufValueType::kF64) return LoadLE<double>(data_ + i * 8);
  return static_cast<double>(int_at(i));
}

// Bounds-checked cursor over the file image. Every read names the offset on failure.
class GgufParser {
 public:
  explicit GgufParser(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  Status Run(GgufFile& file);

 private:
  uint64_t remaining() const { return bytes_.size() - pos_; }

  Status Need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      return Corrupt(fmt::format("truncated at byte {}: {} needs {} bytes, {} left", pos_, what, n,
                                 remaining()));
    }
    return Status::Ok();
  }

  template <typename T>
  Status Read(T& out, std::string_view what) {
    KVFS_RETURN_IF_ERROR(Need(sizeof(T), what));
    out = LoadLE<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status ReadString(std::string_view& out, std::string_view what) {
    uint64_t len = 0;
    uint64_t at = pos_;
    KVFS_RETURN_IF_ERROR(Read(len, what));
    if (len > gguf::kMaxStringBytes || len > remaining()) {
      return Corrupt(fmt::format("{} at byte {} has length {} but only {} bytes follow", what, at,
                                 len, remaining()));
    }
    out = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

  Status ReadValue(GgufValueType type, GgufValue& out, std::string_view key, int depth);

  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

Status GgufParser::ReadValue(GgufValueType type, GgufValue& out, std::string_view key,
                             int depth) {
  out.type = type;
  const std::string what = fmt::format("value of {}", QuoteForMessage(key));
  switch (type) {
    case GgufValueType::kU8: { uint8_t v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = uint64_t{v}; break; }
    case GgufValueType::kU16: { uint16_t v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = uint64_t{v}; break; }
    case GgufValueType::kU32: { uint32_t v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = uint64_t{v}; break; }
    case GgufValueType::kU64: { uint64_t v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = v; break; }
    case GgufValueType::kI8: { int8_t v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = int64_t{v}; break; }
    case GgufValueType::kI16: { int16_t v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = int64_t{v}; break; }
    case GgufValueType::kI32: { int32_t v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = int64_t{v}; break; }
    case GgufValueType::kI64: { int64_t v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = v; break; }
    case GgufValueType::kF32: { float v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = double{v}; break; }
    case GgufValueType::kF64: { double v; KVFS_RETURN_IF_ERROR(Read(v, what)); out.value = v; break; }
    case GgufValueType::kBool: {
      uint8_t v;
      uint64_t at = pos_;
      KVFS_RETURN_IF_ERROR(Read(v, what));
      if (v > 1) return Corrupt(fmt::format("{} at byte {}: bool byte is {}", what, at, v));
      out.value = uint64_t{v};
      break;
    }
    case GgufValueType::kString: {
      std::string_view s;
      KVFS_RETURN_IF_ERROR(ReadString(s, what));
      out.value = s;
      break;
    }
    case GgufValueType::kArray: {
      if (depth >= gguf::kMaxArrayNesting) {
        return Unsupported(fmt::format("{} at byte {}: nested arrays are not supported", what, pos_));
      }
      uint32_t elem_raw = 0;
      uint64_t count = 0;
      uint64_t at = pos_;
      KVFS_RETURN_IF_ERROR(Read(elem_raw, what));
      KVFS_RETURN_IF_ERROR(Read(count, what));
      if (!KnownValueType(elem_raw)) {
        return Corrupt(fmt::format("{} at byte {}: unknown array element type {}", what, at, elem_raw));
      }
      GgufArray arr;
      arr.elem_type_ = static_cast<GgufValueType>(elem_raw);
      arr.count_ = count;
      if (arr.elem_type_ == GgufValueType::kArray) {
        return Unsupported(fmt::format("{} at byte {}: nested arrays are not supported", what, at));
      }
      if (arr.elem_type_ == GgufValueType::kString) {
        // Each string needs at least its 8-byte length: bound the count before reserving.
        if (count > remaining() / 8) {
          return Corrupt(fmt::format("{} at byte {}: {} strings cannot fit in the {} bytes left",
                                     what, at, count, remaining()));
        }
        arr.strings_.resize(count);
        for (uint64_t i = 0; i < count; ++i) {
          KVFS_RETURN_IF_ERROR(ReadString(arr.strings_[i], what));
        }
      } else {
        size_t elem = FixedSize(arr.elem_type_);
        if (count > remaining() / elem) {
          return Corrupt(fmt::format("{} at byte {}: array of {} x {} bytes exceeds the {} bytes left",
                                     what, at, count, elem, remaining()));
        }
        arr.data_ = bytes_.data() + pos_;
        pos_ += count * elem;
        if (arr.elem_type_ == GgufValueType::kBool) {
          for (uint64_t i = 0; i < count; ++i) {
            if (arr.data_[i] > 1) return Corrupt(fmt::format("{}: bool element {} is {}", what, i, arr.data_[i]));
          }
        }
      }
      out.value = std::move(arr);
      break;
    }
    default:
      return Corrupt(fmt::format("{}: unknown value type {}", what, static_cast<uint32_t>(type)));
  }
  return Status::Ok();
}

Status GgufParser::Run(GgufFile& file) {
  uint32_t magic = 0;
  KVFS_RETURN_IF_ERROR(Read(magic, "magic"));
  if (magic != gguf::kMagic) {
    return Corrupt(fmt::format("not a GGUF file: magic at byte 0 is 0x{:08x}, expected 0x{:08x} (\"GGUF\")",
                               magic, gguf::kMagic));
  }
  KVFS_RETURN_IF_ERROR(Read(file.version_, "version"));
  if (file.version_ < gguf::kMinVersion || file.version_ > gguf::kMaxVersion) {
    return Unsupported(fmt::format("GGUF version {} is not supported (only {}..{})", file.version_,
                                   gguf::kMinVersion, gguf::kMaxVersion));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  KVFS_RETURN_IF_ERROR(Read(n_tensors, "tensor count"));
  KVFS_RETURN_IF_ERROR(Read(n_kv, "metadata count"));
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor entry at
  // least 8 + 4 + 8 + 4 + 8. Bound the counts by the file size before any allocation.
  if (n_kv > remaining() / 13) {
    return Corrupt(fmt::format("metadata count {} cannot fit in a {}-byte file", n_kv, bytes_.size()));
  }
  if (n_tensors > remaining() / 32) {
    return Corrupt(fmt::format("tensor count {} cannot fit in a {}-byte file", n_tensors, bytes_.size()));
  }

  file.kvs_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string_view key;
    uint64_t at = pos_;
    KVFS_RETURN_IF_ERROR(ReadString(key, fmt::format("key of metadata entry {}", i)));
    uint32_t type_raw = 0;
    KVFS_RETURN_IF_ERROR(Read(type_raw, "metadata value type"));
    if (!KnownValueType(type_raw)) {
      return Corrupt(fmt::format("metadata {} at byte {}: unknown value type {}", QuoteForMessage(key), at, type_raw));
    }
    GgufValue value;
    KVFS_RETURN_IF_ERROR(ReadValue(static_cast<GgufValueType>(type_raw), value, key, 0));
    std::string key_str(key);
    if (file.kv_index_.count(key_str)) {
      return Corrupt(fmt::format("metadata key {} at byte {} appears twice", QuoteForMessage(key), at));
    }
    file.kv_index_.emplace(key_str, file.kvs_.size());
    file.kvs_.emplace_back(std::move(key_str), std::move(value));
  }

  if (const GgufValue* a = file.Find(gguf::kAlignmentKey)) {
    const uint64_t* v = std::get_if<uint64_t>(&a->value);
    if (a->type != GgufValueType::kU32 || v == nullptr || *v == 0 || (*v & (*v - 1)) != 0) {
      return Corrupt(fmt::format("{} must be a u32 power of two", gguf::kAlignmentKey));
    }
    file.alignment_ = *v;
  }

  struct RawTensor {
    std::string_view name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t offset;
    uint64_t at;
  };
  std::vector<RawTensor> raw(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    RawTensor& t = raw[i];
    t.at = pos_;
    KVFS_RETURN_IF_ERROR(ReadString(t.name, fmt::format("name of tensor {}", i)));
    KVFS_RETURN_IF_ERROR(Read(t.n_dims, "tensor dimension count"));
    if (t.n_dims == 0 || t.n_dims > gguf::kMaxDims) {
      return Corrupt(fmt::format("tensor {} at byte {}: {} dimensions (1..{} allowed)", QuoteForMessage(t.name),
                                 t.at, t.n_dims, gguf::kMaxDims));
    }
    for (int d = 0; d < 4; ++d) t.ne[d] = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) KVFS_RETURN_IF_ERROR(Read(t.ne[d], "tensor dimension"));
    KVFS_RETURN_IF_ERROR(Read(t.type, "tensor type"));
    KVFS_RETURN_IF_ERROR(Read(t.offset, "tensor offset"));
  }

  // Data section starts at the next multiple of the alignment after the header.
  uint64_t data_offset = (pos_ + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  if (data_offset > bytes_.size() && n_tensors > 0) {
    return Corrupt(fmt::format("data section would start at byte {}, past the end of the {}-byte file",
                               data_offset, bytes_.size()));
  }
  file.data_offset_ = data_offset;
  const uint64_t data_size = data_offset <= bytes_.size() ? bytes_.size() - data_offset : 0;

  file.tensors_.reserve(n_tensors);
  for (const RawTensor& t : raw) {
    const GgmlTypeTraits* traits = GgmlTypeInfo(t.type);
    if (traits == nullptr) {
      return Corrupt(fmt::format("tensor {} at byte {}: unknown ggml type {}", QuoteForMessage(t.name), t.at, t.type));
    }
    uint64_t n_elem = 1;
    for (int d = 0; d < 4; ++d) {
      // Each dimension below 2^40 keeps the product check simple and exact.
      if (t.ne[d] == 0 || t.ne[d] >= (1ull << 40)) {
        return Corrupt(fmt::format("tensor {} at byte {}: dimension {} is {}", QuoteForMessage(t.name), t.at, d,
                                   t.ne[d]));
      }
      if (n_elem > (1ull << 48) / t.ne[d]) {
        return Corrupt(fmt::format("tensor {} at byte {}: element count overflows", QuoteForMessage(t.name), t.at));
      }
      n_elem *= t.ne[d];
    }
    if (t.ne[0] % traits->block_elems != 0) {
      return Corrupt(fmt::format("tensor {}: row length {} is not a multiple of the {} block size {}",
                                 QuoteForMessage(t.name), t.ne[0], traits->name, traits->block_elems));
    }
    uint64_t n_bytes = n_elem / traits->block_elems * traits->block_bytes;
    if (t.offset % file.alignment_ != 0) {
      return Corrupt(fmt::format("tensor {}: data offset {} is not a multiple of the alignment {}",
                                 QuoteForMessage(t.name), t.offset, file.alignment_));
    }
    if (t.offset > data_size || n_bytes > data_size - t.offset) {
      return Corrupt(fmt::format("tensor {}: data [{}, {}) lies outside the {}-byte data section (file truncated?)",
                                 QuoteForMessage(t.name), t.offset, t.offset + n_bytes, data_size));
    }
    GgufTensor out;
    out.name = std::string(t.name);
    out.type = static_cast<GgmlType>(t.type);
    out.n_dims = static_cast<int>(t.n_dims);
    for (int d = 0; d < 4; ++d) out.ne[d] = static_cast<int64_t>(t.ne[d]);
    out.file_offset = data_offset + t.offset;
    out.n_bytes = n_bytes;
    out.data = bytes_.data() + out.file_offset;
    if (file.tensor_index_.count(out.name)) {
      return Corrupt(fmt::format("tensor name {} appears twice", QuoteForMessage(out.name)));
    }
    file.tensor_index_.emplace(out.name, file.tensors_.size());
    file.tensors_.push_back(std::move(out));
  }
  return Status::Ok();
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(std::span<const uint8_t> bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = bytes;
  GgufParser parser(bytes);
  KVFS_RETURN_IF_ERROR(parser.Run(*file));
  return file;
}

namespace {

// Reads up to `n` bytes of `fd` at `offset` into `out`, through EINTR and short reads: the bytes
// read (fewer at the end of the file), or -1 with errno set.
ssize_t PreadFully(int fd, uint8_t* out, size_t n, size_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, std::min<size_t>(n - done, size_t{1} << 30), static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return static_cast<ssize_t>(done);
}

// Reads all `size` bytes of `fd` into fresh anonymous memory. The file must not change size or
// modification time meanwhile: a copy of a file half rewritten would be neither model.
Result<void*> ReadPrivateCopy(int fd, const std::string& path, const struct stat& before) {
  const size_t size = static_cast<size_t>(before.st_size);
  void* mem = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("{}: no memory for a copy of the file's {} MiB", path, size >> 20));
  }
  // No huge pages: the bytes given back later (GiveBack) are whole 4 KiB pages, and khugepaged
  // would fill a given-back 2 MiB span in again around any page still resident.
  madvise(mem, size, MADV_NOHUGEPAGE);
  auto fail = [&](Status s) -> Result<void*> {
    ::munmap(mem, size);
    return s;
  };
  const ssize_t done = PreadFully(fd, static_cast<uint8_t*>(mem), size, 0);
  if (done < 0) return fail(IoError(fmt::format("{}: read failed: {}", path, std::strerror(errno))));
  if (static_cast<size_t>(done) < size) {
    return fail(IoError(fmt::format("{}: the file shrank to {} bytes while being read (it was {}); "
                                    "is it being rewritten?", path, done, size)));
  }
  struct stat after {};
  if (::fstat(fd, &after) != 0 || after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
      after.st_mtim.tv_nsec != before.st_mtim.tv_nsec) {
    return fail(IoError(fmt::format("{}: the file changed while being read; is it being rewritten?", path)));
  }
  return mem;
}

}  // namespace

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path, GgufLoad how) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return Status(e == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                  fmt::format("{}: cannot open: {}", path, std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return IoError(fmt::format("{}: not a regular file", path));
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return Corrupt(fmt::format("{}: file is empty", path));
  }
  void* map = nullptr;
  if (how == GgufLoad::kPrivateCopy) {
    Result<void*> copy = ReadPrivateCopy(fd, path, st);
    if (!copy.ok()) {
      ::close(fd);
      return copy.status();
    }
    map = *copy;
  } else {
    map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    ::close(fd);
    if (map == MAP_FAILED) {
      return IoError(fmt::format("{}: mmap failed: {}", path, std::strerror(map_errno)));
    }
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->map_ = map;
  file->map_size_ = size;
  file->private_copy_ = how == GgufLoad::kPrivateCopy;
  file->fd_ = file->private_copy_ ? fd : -1;
  file->path_ = path;
  file->bytes_ = std::span<const uint8_t>(static_cast<const uint8_t*>(map), size);
  GgufParser parser(file->bytes_);
  Status s = parser.Run(*file);
  if (!s.ok()) return s.WithContext(path);
  return file;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  if (fd_ >= 0) ::close(fd_);
}

void GgufFile::GiveBack(const uint8_t* p, size_t n) const {
  if (map_ == nullptr || p < bytes_.data() || n > bytes_.size() || p - bytes_.data() > static_cast<ptrdiff_t>(bytes_.size() - n)) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end <= begin) return;
  if (!private_copy_) {
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // read back from the file
    return;
  }
  const size_t offset = begin - reinterpret_cast<uintptr_t>(bytes_.data());
  const size_t length = end - begin;
  std::lock_guard lock(give_back_mu_);
  // Overlapping a range given back already: those bytes are zeros now, not the file's.
  auto next = given_back_.lower_bound(offset);
  if (next != given_back_.end() && next->first < offset + length) return;
  if (next != given_back_.begin() && std::prev(next)->first + std::prev(next)->second.length > offset) return;
  given_back_.emplace(offset, GivenBack{length, XXH3_64bits(reinterpret_cast<const void*>(begin), length)});
  madvise(reinterpret_cast<void*>(begin), length, MADV_DONTNEED);
}

Status GgufFile::Refill(std::vector<std::span<const uint8_t>>* restored) const {
  std::lock_guard lock(give_back_mu_);
  if (!refill_failure_.ok()) return refill_failure_;
  auto* base = const_cast<uint8_t*>(bytes_.data());  // our own anonymous memory
  for (auto it = given_back_.begin(); it != given_back_.end();) {
    const size_t offset = it->first, length = it->second.length;
    const ssize_t done = PreadFully(fd_, base + offset, length, offset);
    if (done != static_cast<ssize_t>(length) || XXH3_64bits(base + offset, length) != it->second.xxh3) {
      madvise(base + offset, length, MADV_DONTNEED);  // not the model's bytes: zeros again
      refill_failure_ = IoError(fmt::format("{}: the model file changed since kvfsd read it (its bytes {}..{} differ "
                                            "or are gone); restart kvfsd to serve the file as it is now",
                                            path_, offset, offset + length));
      return refill_failure_;
    }
    if (restored != nullptr) restored->emplace_back(base + offset, length);
    it = given_back_.erase(it);
  }
  return Status::Ok();
}

int64_t GgufFile::given_back_bytes() const {
  std::lock_guard lock(give_back_mu_);
  int64_t total = 0;
  for (const auto& [offset, range] : given_back_) total += static_cast<int64_t>(range.length);
  return total;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].second;
}

std::optional<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr || v->type == GgufValueType::kBool) return std::nullopt;
  if (auto* u = std::get_if<uint64_t>(&v->value)) {
    if (*u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (auto* i = std::get_if<int64_t>(&v->value)) return *i;
  return std::nullopt;
}

std::optional<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (auto* d = std::get_if<double>(&v->value)) return *d;
  if (auto i = GetInt(key)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr || v->type != GgufValueType::kBool) return std::nullopt;
  return std::get<uint64_t>(v->value) != 0;
}

std::optional<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (auto* s = std::get_if<std::string_view>(&v->value)) return *s;
  return std::nullopt;
}

const GgufArray* GgufFile::GetArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? nullptr : std::get_if<GgufArray>(&v->value);
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
std::string Quoted(std::string_view s, size_t max_len = 60) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (s.size() > max_len) out += "...";
  return out + "\"";
}
}  // namespace

std::string GgufValueToString(const GgufValue& value, size_t max_array_elems) {
  if (value.type == GgufValueType::kBool) return std::get<uint64_t>(value.value) ? "true" : "false";
  if (auto* u = std::get_if<uint64_t>(&value.value)) return std::to_string(*u);
  if (auto* i = std::get_if<int64_t>(&value.value)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&value.value)) return fmt::format("{}", *d);
  if (auto* s = std::get_if<std::string_view>(&value.value)) return Quoted(*s);
  const auto& arr = std::get<GgufArray>(value.value);
  std::string out = fmt::format("[{} x {}]", GgufValueTypeName(arr.elem_type()), arr.size());
  uint64_t n = std::min<uint64_t>(arr.size(), max_array_elems);
  out += " {";
  for (uint64_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    if (arr.elem_type() == GgufValueType::kString) out += Quoted(arr.string_at(i), 24);
    else if (arr.is_float()) out += fmt::format("{}", arr.float_at(i));
    else out += std::to_string(arr.int_at(i));
  }
  if (arr.size() > n) out += ", ...";
  return out + "}";
}

}  // namespace kvfs
