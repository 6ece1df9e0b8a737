// Helpers for the cache store tests: deterministic payloads, a simulated agent that produces
// the inputs of CommitTurn turn after turn (hash-chained blocks like the KV layer's), and
// checks that a reopened store holds an agent at exactly one expected state.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "engine/store/cache_store.h"
#include "engine/store/fault_fs.h"
#include "tests/test_support.h"

namespace kvfs::store::testing {

// Silences the store's info/warning lines while a test loops over hundreds of reopenings.
class QuietLogs {
 public:
  QuietLogs() : saved_(spdlog::get_level()) { spdlog::set_level(spdlog::level::err); }
  ~QuietLogs() { spdlog::set_level(saved_); }

 private:
  spdlog::level::level_enum saved_;
};

inline constexpr char kFingerprint[] = "0123456789abcdef0123456789abcdef";
inline constexpr uint32_t kKvFormatId = 7;

// A clock that advances a second at each reading, so timestamps differ and are reproducible.
inline StoreOptions FixedClock() {
  StoreOptions o;
  auto t = std::make_shared<std::atomic<int64_t>>(1700000000000);
  o.now_ms = [t] { return t->fetch_add(1000); };
  return o;
}

inline std::vector<int32_t> Range(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + i;
  return v;
}

// A prefix record of two 16-token blocks.
inline PrefixRecord StoryPrefix() {
  PrefixRecord r;
  r.name = "story.txt";
  r.owner_uid = 1000;
  r.text = "Once upon a time";
  r.model_fingerprint = kFingerprint;
  r.kv_format = "q4";
  r.block_size = 16;
  r.blocks = {BlockHash{1, 2}, BlockHash{3, 4}};
  return r;
}

inline std::unique_ptr<CacheStore> OpenOk(const std::string& dir, FileSystem& fs) {
  auto s = CacheStore::Open(dir, fs, FixedClock());
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(*s) : nullptr;
}

// One line per entry, for failure messages.
inline std::string Join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

inline std::vector<uint8_t> PseudoRandom(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x >> 32);
  }
  return out;
}

// Half of the blocks get compressible payloads, so both stored forms are exercised.
inline std::vector<uint8_t> BlockPayload(const BlockHash& h, size_t n) {
  std::vector<uint8_t> p = PseudoRandom(n, h.lo ^ h.hi);
  if (h.lo & 1)
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((p[i] & 0x3) + (i % 7));
  return p;
}

inline BlockHash ChainHash(const BlockHash& parent, const int32_t* tokens, size_t n) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, &parent, sizeof parent);
  XXH3_128bits_update(st, tokens, n * sizeof(int32_t));
  XXH3_128bits_update(st, kFingerprint, sizeof kFingerprint);
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return BlockHash{h.high64, h.low64};
}

// What an agent's store state should be after a commit.
struct AgentState {
  Manifest manifest;  // as passed to CommitTurn (turn/timestamps/tail filled by the store)
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<uint8_t> tail;  // empty: no tail
};

// A simulated agent: tokens grow each turn, full blocks are hash-chained.
class SimAgent {
 public:
  SimAgent(std::string name, uint32_t block_size = 4, size_t payload_bytes = 300)
      : name_(std::move(name)), block_size_(block_size), payload_bytes_(payload_bytes) {}

  // Appends tokens (and a conversation turn) and returns the state after it.
  AgentState Extend(const std::vector<int32_t>& new_tokens, const std::string& text) {
    tokens_.insert(tokens_.end(), new_tokens.begin(), new_tokens.end());
    conversation_.push_back({"user", text});
    return Build();
  }
  // Replaces the token list from `keep` on (a divergent turn).
  AgentState Diverge(size_t keep, const std::vector<int32_t>& new_tokens, const std::string& text) {
    tokens_.resize(keep);
    return Extend(new_tokens, text);
  }
  const std::string& name() const { return name_; }

 private:
  AgentState Build() const {
    AgentState s;
    Manifest& m = s.manifest;
    m.name = name_;
    m.model_fingerprint = kFingerprint;
    m.kv_format = "q4";
    m.block_size = block_size_;
    m.tokens = tokens_;
    m.conversation = conversation_;
    m.config = {{"temperature", 0.7}, {"max_tokens", 64}};
    BlockHash parent{};
    const size_t full = tokens_.size() / block_size_;
    for (size_t i = 0; i < full; ++i) {
      parent = ChainHash(parent, tokens_.data() + i * block_size_, block_size_);
      m.blocks.push_back(parent);
      s.blocks.push_back(BlockPayload(parent, payload_bytes_));
    }
    const size_t rest = tokens_.size() % block_size_;
    if (rest > 0) {
      s.tail = PseudoRandom(payload_bytes_ * rest / block_size_ + 1, tokens_.size() * 31 + tokens_.back());
      m.tail = TailRef{"", static_cast<uint32_t>(rest)};
    }
    return s;
  }

  std::string name_;
  uint32_t block_size_;
  size_t payload_bytes_;
  std::vector<int32_t> tokens_;
  std::vector<ConversationTurn> conversation_;
};

inline std::vector<NewBlock> AllBlocks(const AgentState& s) {
  std::vector<NewBlock> out;
  for (size_t i = 0; i < s.blocks.size(); ++i)
    out.push_back({s.manifest.blocks[i], kKvFormatId, s.manifest.block_size, s.blocks[i]});
  return out;
}

inline std::optional<TailData> TailOf(const AgentState& s) {
  if (s.tail.empty()) return std::nullopt;
  return TailData{kKvFormatId, s.manifest.tail->n_tokens, s.tail};
}

inline Result<CommitReport> Commit(CacheStore& store, const AgentState& s) {
  std::vector<NewBlock> blocks = AllBlocks(s);
  return store.CommitTurn(s.manifest.name, s.manifest, blocks, TailOf(s));
}

// True when the loaded agent is exactly `s` (text, tokens, every block and the tail verified).
inline ::testing::AssertionResult LoadedIs(const LoadedAgent& got, const AgentState& s) {
  const Manifest& m = got.manifest;
  if (got.rebuild_from_block) return ::testing::AssertionFailure() << "rebuild from block " << *got.rebuild_from_block;
  if (m.tokens != s.manifest.tokens) return ::testing::AssertionFailure() << "tokens differ";
  if (m.conversation != s.manifest.conversation) return ::testing::AssertionFailure() << "conversation differs";
  if (m.blocks != s.manifest.blocks) return ::testing::AssertionFailure() << "block list differs";
  if (got.blocks != s.blocks) return ::testing::AssertionFailure() << "block payloads differ";
  if (s.tail.empty() != !got.tail.has_value()) return ::testing::AssertionFailure() << "tail presence differs";
  if (got.tail && *got.tail != s.tail) return ::testing::AssertionFailure() << "tail payload differs";
  if (m.config != s.manifest.config) return ::testing::AssertionFailure() << "config differs";
  return ::testing::AssertionSuccess();
}

// The exact set of files a store holding `agents` (name -> loaded manifest) must contain: an
// agent past its first turn keeps the manifest before it too.
inline std::set<std::string> ExpectedFiles(const std::string& root, const std::vector<Manifest>& agents) {
  std::set<std::string> out;
  for (const Manifest& m : agents) {
    out.insert(root + "/agents/" + m.name + "/manifest.json");
    if (m.turn > 1) out.insert(root + "/agents/" + m.name + "/manifest.prev.json");
    if (m.tail) out.insert(root + "/agents/" + m.name + "/" + m.tail->file);
    for (const BlockHash& h : m.blocks) {
      const std::string hex = ToHex(h);
      out.insert(root + "/blocks/" + hex.substr(0, 2) + "/" + hex + ".kvb");
    }
  }
  return out;
}

using kvfs::testing::TempDir;

inline std::set<std::string> ListTree(const std::string& root) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    out.insert(e.path().string().substr(root.size()) + (e.is_directory() ? "/" : ""));
  return out;
}

// The checksum rule of manifests and prefix records (json_checksum.h) written out
// independently: XXH3-64 of the text without its checksum field, which is appended last.
template <typename Json>
std::string Stamped(Json j) {
  j.erase("checksum");
  std::string body = j.dump();
  const uint64_t h = XXH3_64bits(body.data(), body.size());
  body.pop_back();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return body + ",\"checksum\":\"" + hex + "\"}";
}

// Flips every bit of `good` in turn: each flip must be refused by `parse(text)` (kCorrupt, or
// kUnsupported where it changed the version). Returns how many refusals named the checksum
// field (most flips leave valid JSON, which only the checksum catches).
template <typename Parse>
size_t ExpectEveryBitFlipRefused(const std::string& good, Parse parse) {
  size_t by_checksum = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      const Status st = parse(bad).status();
      EXPECT_FALSE(st.ok()) << "flip of bit " << bit << " of byte " << i << " went unnoticed";
      if (st.ok()) return by_checksum;
      EXPECT_TRUE(st.code() == StatusCode::kCorrupt || st.code() == StatusCode::kUnsupported) << st.message();
      if (st.message().find("\"checksum\"") != std::string::npos) ++by_checksum;
    }
  }
  return by_checksum;
}

}  // namespace kvfs::store::testing
