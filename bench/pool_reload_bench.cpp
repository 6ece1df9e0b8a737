// kvfs_pool_reload_bench: the engine's reload path (BlockPool::Allocate + CacheStore::ReadBlockInto
// per block, from the page cache) for one agent's cache, split into its parts:
//   fresh  a new pool each time: the blocks' memory is new to the process (after a restart)
//   reuse  the same pool, its blocks freed before: memory from the pool's free list
//   read   ReadBlockInto into memory that is already faulted (the copy and checksum alone)
//   alloc  Allocate alone in a new pool (mapping and faulting the memory)
// Median of --reps runs each. TinyLlama-1.1B shape by default (22 layers x 4 KV heads x 64, q4:
// 1.62 MB per 256-token block, 16 blocks = 4096 tokens).
// Usage: kvfs_pool_reload_bench [--dir DIR] [--blocks 16] [--block-bytes N] [--reps 9]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/kv/block_pool.h"
#include "engine/store/cache_store.h"

namespace {

using namespace kvfs;
using namespace kvfs::store;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = (std::filesystem::temp_directory_path() / "kvfs-pool-reload-bench").string();
  size_t n_blocks = 16;
  // 22 layers * 2 (K, V) * 4 heads * 256 tokens * (64 codes / 2 + 4 bytes of scale and minimum)
  int64_t block_bytes = int64_t{22} * 2 * 4 * 256 * (32 + 4);
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    else if (a == "--blocks") n_blocks = std::strtoul(argv[i + 1], nullptr, 10);
    else if (a == "--block-bytes") block_bytes = std::strtoll(argv[i + 1], nullptr, 10);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: kvfs_pool_reload_bench [--dir DIR] [--blocks N] [--block-bytes N] [--reps N]\n");
      return 2;
    }
  }
  PosixFileSystem fs;
  std::filesystem::remove_all(dir);
  Manifest m;
  m.name = "bench";
  m.model_fingerprint = "0123456789abcdef0123456789abcdef";
  m.kv_format = "q4";
  m.block_size = 256;
  m.tokens.assign(n_blocks * m.block_size, 1);
  m.conversation = {{"user", "x"}};
  std::vector<std::vector<uint8_t>> payloads(n_blocks, std::vector<uint8_t>(static_cast<size_t>(block_bytes)));
  std::mt19937_64 rng(1);
  std::vector<NewBlock> blocks;
  for (size_t b = 0; b < n_blocks; ++b) {
    for (auto& x : payloads[b]) x = static_cast<uint8_t>(rng());  // incompressible, like q4 codes
    m.blocks.push_back(BlockHash{b + 1, 0x1234});
    blocks.push_back({m.blocks[b], 4, m.block_size, payloads[b]});
  }
  auto store = CacheStore::Open(dir, fs);
  if (!store.ok() || !(*store)->CommitTurn("bench", m, blocks, std::nullopt).ok()) {
    std::fprintf(stderr, "store setup failed in %s\n", dir.c_str());
    return 1;
  }
  auto load_all = [&](BlockPool& pool, std::vector<PoolBlock*>& out) {
    for (const BlockHash& h : m.blocks) {
      PoolBlock* b = pool.Allocate(block_bytes).value();
      if (!(*store)->ReadBlockInto(h, std::span<uint8_t>(b->data, static_cast<size_t>(block_bytes))).ok()) std::abort();
      out.push_back(b);
    }
  };
  auto release_all = [](BlockPool& pool, std::vector<PoolBlock*>& v) {
    for (PoolBlock* b : v) pool.Release(b);
    v.clear();
  };
  std::vector<double> fresh, reuse, read, alloc;
  for (int r = 0; r < reps + 1; ++r) {  // the first round warms the page cache and is not counted
    std::vector<PoolBlock*> held;
    {
      BlockPool pool(0);
      auto t0 = Clock::now();
      load_all(pool, held);
      if (r > 0) fresh.push_back(Ms(t0, Clock::now()));
      release_all(pool, held);
      t0 = Clock::now();
      load_all(pool, held);
      if (r > 0) reuse.push_back(Ms(t0, Clock::now()));
      // Read alone: into the same (faulted) blocks again.
      t0 = Clock::now();
      for (size_t i = 0; i < held.size(); ++i)
        if (!(*store)->ReadBlockInto(m.blocks[i], std::span<uint8_t>(held[i]->data, static_cast<size_t>(block_bytes))).ok())
          std::abort();
      if (r > 0) read.push_back(Ms(t0, Clock::now()));
      release_all(pool, held);
    }
    {
      BlockPool pool(0);
      auto t0 = Clock::now();
      for (size_t i = 0; i < n_blocks; ++i) held.push_back(pool.Allocate(block_bytes).value());
      if (r > 0) alloc.push_back(Ms(t0, Clock::now()));
      release_all(pool, held);
    }
  }
  const double mb = static_cast<double>(block_bytes) * static_cast<double>(n_blocks) / 1e6;
  std::printf("reload of %zu blocks of %lld bytes (%.1f MB) from the page cache, median of %d:\n", n_blocks,
              static_cast<long long>(block_bytes), mb, reps);
  std::printf("  fresh %.2f ms   reuse %.2f ms   read alone %.2f ms (%.0f MB/s)   alloc alone %.2f ms\n", Median(fresh),
              Median(reuse), Median(read), mb / (Median(read) / 1e3), Median(alloc));
  std::filesystem::remove_all(dir);
  return 0;
}
