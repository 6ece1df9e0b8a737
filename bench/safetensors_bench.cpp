// kvfs_safetensors_bench: export and import speed of kv.safetensors for a TinyLlama-1.1B-shaped
// cache (22 layers, 4 KV heads of 64, blocks of 256 tokens; default 4096 tokens, q4 = ~26 MB),
// in memory: the cost `cat kv.safetensors` and an import add on top of the file system. MB/s is
// file bytes per second (1 MB = 1e6 bytes); a plain memcpy of the same bytes is the ceiling.
// The runs cycle through --copies independent caches (default 4) so that a q4 cache, smaller
// than a server's L3, is not read from cache every time (the pool's blocks would not be either).
// Usage: kvfs_safetensors_bench [--tokens N] [--reps R] [--copies K] [--type f16|q8|q4|all] [--csv]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/store/safetensors.h"

namespace {

using namespace kvfs::store;
using Clock = std::chrono::steady_clock;

constexpr char kFingerprint[] = "0123456789abcdef0123456789abcdef";
constexpr int64_t kBlockTokens = 256;

std::vector<uint8_t> Noise(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

template <typename F>
double MedianSeconds(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

bool Run(const std::string& type, int64_t tokens, int reps, int copies, bool csv) {
  const KvGeometry g{22, 4, 64, type, 64, type != "f16"};
  const int64_t token_bytes = g.n_layer * 2 * KvRowBytes(g);
  std::vector<std::vector<std::vector<uint8_t>>> blocks(static_cast<size_t>(copies));
  std::vector<std::vector<KvChunk>> chunks(static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    for (int64_t s = 0; s < tokens; s += kBlockTokens) {
      const int64_t n = std::min(kBlockTokens, tokens - s);
      blocks[c].push_back(Noise(static_cast<size_t>(n * token_bytes), static_cast<uint64_t>(s + c * tokens) + 1));
    }
    for (const auto& b : blocks[c]) chunks[c].push_back({b, static_cast<int64_t>(b.size()) / token_bytes});
  }
  CacheExportInfo info{
      kFingerprint, g, {}, tokens, {{"system", "You are a helpful assistant."}, {"user", std::string(20000, 'x')}}, ""};
  for (int64_t i = 0; i < tokens; ++i) info.tokens.push_back(static_cast<int32_t>(i * 7919 % 32000));

  std::vector<std::string> files;
  for (int c = 0; c < copies; ++c) {
    auto file = WriteKvSafetensors(info, chunks[c]);
    if (!file.ok()) {
      std::fprintf(stderr, "export: %s\n", file.status().message().c_str());
      return false;
    }
    files.push_back(std::move(*file));
  }
  const double mb = static_cast<double>(files[0].size()) / 1e6;
  size_t sink = 0;
  int turn = 0;
  const double t_export =
      MedianSeconds(reps, [&] { sink += WriteKvSafetensors(info, chunks[turn++ % copies])->size(); });
  const double t_import = MedianSeconds(reps, [&] {
    auto r = ReadKvSafetensors(files[turn++ % copies], kFingerprint, g, kBlockTokens);
    if (!r.ok()) std::fprintf(stderr, "import: %s\n", r.status().message().c_str());
    else sink += r->chunks.size();
  });
  std::string copy(files[0].size(), '\0');
  const double t_copy = MedianSeconds(reps, [&] {
    const std::string& f = files[turn++ % copies];
    std::memcpy(copy.data(), f.data(), f.size());
    sink += static_cast<uint8_t>(copy[sink % copy.size()]);
  });
  if (csv) {
    std::printf("%s,%lld,%.3f,%.1f,%.1f,%.1f\n", type.c_str(), static_cast<long long>(tokens), mb, mb / t_export,
                mb / t_import, mb / t_copy);
  } else {
    std::printf("%-4s %6lld tokens  %7.2f MB   export %7.1f MB/s (%6.2f ms)   import %7.1f MB/s (%6.2f ms)   "
                "memcpy %7.1f MB/s   [%zu]\n",
                type.c_str(), static_cast<long long>(tokens), mb, mb / t_export, t_export * 1e3, mb / t_import,
                t_import * 1e3, mb / t_copy, sink % 10);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 4096;
  int reps = 15, copies = 4;
  std::string type = "q4";
  bool csv = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokens" && i + 1 < argc) tokens = std::stoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::stoi(argv[++i]));
    else if (a == "--copies" && i + 1 < argc) copies = std::max(1, std::stoi(argv[++i]));
    else if (a == "--type" && i + 1 < argc) type = argv[++i];
    else if (a == "--csv") csv = true;
    else {
      std::fprintf(
          stderr,
          "usage: kvfs_safetensors_bench [--tokens N] [--reps R] [--copies K] [--type f16|q8|q4|all] [--csv]\n");
      return 2;
    }
  }
  if (csv) std::printf("type,tokens,mb,export_mb_s,import_mb_s,memcpy_mb_s\n");
  bool ok = true;
  for (const std::string t : {"f16", "q8", "q4"})
    if (type == "all" || type == t) ok = Run(t, tokens, reps, copies, csv) && ok;
  return ok ? 0 : 1;
}
