// kvfs_store_bench: figures for the on-disk cache store.
//   1. zstd on KV-like block payloads (f16, q8, q4 affine, uniform random 4-bit): stored/raw
//      ratio, compression and decompression speed, and whether the store keeps the
//      compressed form (kMinCompressionSaving).
//   2. CacheStore on the real file system: commit and load of one agent of N tokens (default
//      4096, TinyLlama-1.1B KV shape: 22 layers, 4 KV heads of 64), against a plain read of
//      the same bytes.
//   3. --model PATH: model fingerprint time.
// Usage: kvfs_store_bench [--dir DIR] [--tokens N] [--model GGUF] [--csv]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <zstd.h>

#include "engine/model/fingerprint.h"
#include "engine/store/block_file.h"
#include "engine/store/cache_store.h"

namespace {

using namespace kvfs::store;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

uint16_t ToHalf(float f) {  // round-to-nearest-even, normals and zero only (inputs are small)
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = x & 0x7FFFFF;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7BFF);
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(h);
}

void PutHalf(std::vector<uint8_t>& out, float f) {
  const uint16_t h = ToHalf(f);
  out.push_back(static_cast<uint8_t>(h));
  out.push_back(static_cast<uint8_t>(h >> 8));
}

// Activations of one block: tokens x dims, per-channel scales vary (K has outlier channels).
std::vector<float> KvValues(size_t tokens, size_t dims, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> channel(dims);
  for (auto& c : channel) c = std::exp(0.8f * n(rng));
  std::vector<float> v(tokens * dims);
  for (size_t t = 0; t < tokens; ++t)
    for (size_t d = 0; d < dims; ++d) v[t * dims + d] = channel[d] * n(rng);
  return v;
}

constexpr size_t kGroup = 64;

std::vector<uint8_t> AsF16(const std::vector<float>& v) {
  std::vector<uint8_t> out;
  out.reserve(v.size() * 2);
  for (float f : v) PutHalf(out, f);
  return out;
}

// Per group: int8 codes, then one f16 scale.
std::vector<uint8_t> AsQ8(const std::vector<float>& v) {
  std::vector<uint8_t> out;
  for (size_t g = 0; g < v.size(); g += kGroup) {
    float amax = 0;
    for (size_t i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(v[g + i]));
    const float scale = amax / 127.f;
    for (size_t i = 0; i < kGroup; ++i)
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::lround(scale > 0 ? v[g + i] / scale : 0))));
    PutHalf(out, scale);
  }
  return out;
}

// Per group: 4-bit codes (two per byte), then f16 scale and f16 minimum (affine).
std::vector<uint8_t> AsQ4(const std::vector<float>& v) {
  std::vector<uint8_t> out;
  for (size_t g = 0; g < v.size(); g += kGroup) {
    float lo = v[g], hi = v[g];
    for (size_t i = 0; i < kGroup; ++i) lo = std::min(lo, v[g + i]), hi = std::max(hi, v[g + i]);
    const float scale = (hi - lo) / 15.f;
    for (size_t i = 0; i < kGroup; i += 2) {
      auto q = [&](float x) { return static_cast<uint8_t>(std::clamp<long>(std::lround(scale > 0 ? (x - lo) / scale : 0), 0, 15)); };
      out.push_back(static_cast<uint8_t>(q(v[g + i]) | (q(v[g + i + 1]) << 4)));
    }
    PutHalf(out, scale);
    PutHalf(out, lo);
  }
  return out;
}

void CompressionTable(size_t dims, bool csv) {
  const size_t tokens = 256;
  const std::vector<float> values = KvValues(tokens, dims, 42);
  std::vector<uint8_t> random4(values.size() / 2);
  std::mt19937_64 rng(7);
  for (auto& b : random4) b = static_cast<uint8_t>(rng());
  struct Sample {
    const char* name;
    std::vector<uint8_t> bytes;
  };
  const Sample samples[] = {{"f16", AsF16(values)}, {"q8 (g64)", AsQ8(values)}, {"q4 affine (g64)", AsQ4(values)},
                            {"random 4-bit", random4}};
  if (csv) std::printf("payload,raw_bytes,zstd_level,stored_over_raw,compress_MBps,decompress_MBps,kept\n");
  else std::printf("zstd on one 256-token block (%zu values/token):\n%-16s %10s %5s %9s %11s %13s %5s\n", dims,
                   "payload", "raw bytes", "level", "stored/raw", "comp MB/s", "decomp MB/s", "kept");
  for (const Sample& s : samples) {
    for (int level : {1, 3}) {
      std::vector<uint8_t> dst(ZSTD_compressBound(s.bytes.size()));
      std::vector<uint8_t> back(s.bytes.size());
      size_t n = 0;
      const int reps = 5;
      auto t0 = Clock::now();
      for (int r = 0; r < reps; ++r) n = ZSTD_compress(dst.data(), dst.size(), s.bytes.data(), s.bytes.size(), level);
      auto t1 = Clock::now();
      for (int r = 0; r < reps; ++r) (void)ZSTD_decompress(back.data(), back.size(), dst.data(), n);
      auto t2 = Clock::now();
      const double mb = static_cast<double>(s.bytes.size()) * reps / 1e6;
      BlockEncodeOptions opt;
      opt.zstd_level = level;
      auto image = EncodeBlockFile(BlockKind::kBlock, {}, 0, tokens, s.bytes, opt);
      const bool kept = image.ok() && DecodeBlockFile(*image, "x")->header.compressed();
      const double ratio = static_cast<double>(n) / static_cast<double>(s.bytes.size());
      if (csv)
        std::printf("%s,%zu,%d,%.4f,%.0f,%.0f,%d\n", s.name, s.bytes.size(), level, ratio, mb / (Ms(t0, t1) / 1e3),
                    mb / (Ms(t1, t2) / 1e3), kept);
      else
        std::printf("%-16s %10zu %5d %9.3f %11.0f %13.0f %5s\n", s.name, s.bytes.size(), level, ratio,
                    mb / (Ms(t0, t1) / 1e3), mb / (Ms(t1, t2) / 1e3), kept ? "yes" : "no");
    }
  }
}

void StoreFigures(const std::string& dir, size_t n_tokens, size_t dims, double min_saving) {
  PosixFileSystem fs;
  std::filesystem::remove_all(dir);
  const uint32_t block_size = 256;
  const size_t n_blocks = n_tokens / block_size;
  Manifest m;
  m.name = "bench";
  m.model_fingerprint = "0123456789abcdef0123456789abcdef";
  m.kv_format = "q4";
  m.block_size = block_size;
  for (size_t i = 0; i < n_tokens; ++i) m.tokens.push_back(static_cast<int32_t>(i % 32000));
  m.conversation = {{"user", std::string(n_tokens * 4, 'x')}};
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<NewBlock> blocks;
  for (size_t b = 0; b < n_blocks; ++b) {
    payloads.push_back(AsQ4(KvValues(block_size, dims, 100 + b)));
    m.blocks.push_back(BlockHash{b + 1, 0x1234});
  }
  for (size_t b = 0; b < n_blocks; ++b) blocks.push_back({m.blocks[b], 4, block_size, payloads[b]});
  StoreOptions options;
  options.encode.min_saving = min_saving;
  auto store = CacheStore::Open(dir, fs, options);
  if (!store.ok()) {
    std::fprintf(stderr, "open %s: %s\n", dir.c_str(), store.status().message().c_str());
    return;
  }
  auto t0 = Clock::now();
  auto commit = (*store)->CommitTurn("bench", m, blocks, std::nullopt);
  auto t1 = Clock::now();
  if (!commit.ok()) {
    std::fprintf(stderr, "commit: %s\n", commit.status().message().c_str());
    return;
  }
  double load_ms = 1e9;
  for (int r = 0; r < 5; ++r) {
    auto a = Clock::now();
    auto loaded = (*store)->LoadAgent("bench", m.model_fingerprint);
    load_ms = std::min(load_ms, Ms(a, Clock::now()));
    if (!loaded.ok() || loaded->blocks.size() != n_blocks) std::fprintf(stderr, "load failed\n");
  }
  // A plain read of the same bytes (all block files), also from the page cache.
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir + "/blocks"))
    if (e.is_regular_file()) files.push_back(e.path().string());
  double read_ms = 1e9;
  for (int r = 0; r < 5; ++r) {
    auto a = Clock::now();
    for (const std::string& f : files) (void)fs.ReadFile(f);
    read_ms = std::min(read_ms, Ms(a, Clock::now()));
  }
  const uint64_t disk = (*store)->Stats().block_bytes;
  std::printf("\nCacheStore, one agent of %zu tokens (%zu q4 blocks of %u tokens, %zu values/token), dir %s,\n"
              "compression kept when it saves >= %.0f%%:\n",
              n_tokens, n_blocks, block_size, dims, dir.c_str(), min_saving * 100);
  std::printf("  block bytes on disk %.2f MB (%.0f B/token), commit %.1f ms (%zu files, each fsynced)\n", disk / 1e6,
              static_cast<double>(disk) / static_cast<double>(n_tokens), Ms(t0, t1), n_blocks + 1);
  std::printf("  load+verify from page cache %.2f ms (%.0f MB/s); plain read of the block files %.2f ms (%.0f MB/s)\n",
              load_ms, disk / 1e3 / load_ms, read_ms, disk / 1e3 / read_ms);
  auto erased = (*store)->EraseAgent("bench");
  if (erased.ok())
    std::printf("  erase: %zu files, %.2f MB overwritten and unlinked\n", erased->files_removed, erased->bytes_freed / 1e6);
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = (std::filesystem::temp_directory_path() / "kvfs-store-bench").string();
  std::string model;
  size_t tokens = 4096;
  bool csv = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--tokens" && i + 1 < argc) tokens = std::stoul(argv[++i]);
    else if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--csv") csv = true;
    else {
      std::fprintf(stderr, "usage: %s [--dir DIR] [--tokens N] [--model GGUF] [--csv]\n", argv[0]);
      return 2;
    }
  }
  const size_t dims = 22 * 2 * 256;  // TinyLlama-1.1B: layers x (K, V) x (4 KV heads x 64)
  CompressionTable(dims, csv);
  if (!csv) {
    StoreFigures(dir, tokens, dims, kMinCompressionSaving);  // the store's default
    StoreFigures(dir, tokens, dims, 0.03);
    StoreFigures(dir, tokens, dims, 1.0);  // never compress
  }
  if (!model.empty()) {
    auto f = kvfs::GgufFile::Open(model);
    if (!f.ok()) {
      std::fprintf(stderr, "%s\n", f.status().message().c_str());
      return 1;
    }
    for (int r = 0; r < 2; ++r) {
      auto t0 = Clock::now();
      std::string fp = kvfs::ModelFingerprint(**f);
      std::printf("\nfingerprint %s (%.2f GB, %zu tensors) = %s in %.1f ms (%s)\n", model.c_str(),
                  (*f)->bytes().size() / 1e9, (*f)->tensors().size(), fp.c_str(), Ms(t0, Clock::now()),
                  r == 0 ? "first run" : "second run");
    }
  }
  return 0;
}
