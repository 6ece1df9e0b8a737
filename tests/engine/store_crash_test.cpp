// Crash and failure injection at every mutating file-system operation of a turn (and of an
// erasure): the reopened store holds each agent at exactly its old or its new state, every
// block of it verified, and nothing else (no temp files, no orphan blocks or tails).
#include <iostream>

#include <gtest/gtest.h>

#include "engine/store/cache_store.h"
#include "engine/store/fault_fs.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

using testing::AgentState;
using testing::Commit;
using testing::ExpectedFiles;
using testing::LoadedIs;
using testing::Range;
using testing::SimAgent;
using testing::kFingerprint;
using Mode = FaultInjectingFileSystem::CrashMode;

constexpr char kRoot[] = "/store";

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kPowerLoss: return "power-loss";
    case Mode::kMetadataJournaled: return "metadata-journaled";
    case Mode::kProcessKill: return "process-kill";
  }
  return "?";
}

// bob shares alice's first block. alice: turn 1 creates her (2 blocks + tail), turn 2 extends
// (4 blocks + tail), turn 3 diverges (keeps 2 blocks, drops 2, adds 1, new tail).
struct Scenario {
  AgentState bob;
  std::vector<AgentState> alice;  // alice[i] = state after turn i + 1
  Scenario() {
    SimAgent b("bob"), a("alice");
    bob = b.Extend(Range(1, 4), "bob");
    bob = b.Extend(Range(900, 6), "bob's own");
    alice.push_back(a.Extend(Range(1, 10), "turn one"));
    alice.push_back(a.Extend(Range(100, 7), "turn two"));
    alice.push_back(a.Diverge(8, Range(500, 6), "turn three diverges"));
  }
};

std::unique_ptr<CacheStore> Reopen(FaultInjectingFileSystem& fs) {
  auto s = CacheStore::Open(kRoot, fs);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(*s) : nullptr;
}

// A store with bob and alice's first `turns` turns committed, fault-free.
std::unique_ptr<CacheStore> Prepare(FaultInjectingFileSystem& fs, const Scenario& sc, size_t turns) {
  auto store = Reopen(fs);
  EXPECT_TRUE(Commit(*store, sc.bob).ok());
  for (size_t i = 0; i < turns; ++i) EXPECT_TRUE(Commit(*store, sc.alice[i]).ok());
  return store;
}

// Which state alice is in: 0 = absent, i + 1 = alice[i]; -1 = anything else (a failure).
// Also checks bob and that the store holds exactly the files of the agents present.
// `prev_optional`: a crash may leave alice without manifest.prev.json (between dropping the old
// one and linking the new one), which only costs the recovery copy of a turn already replaced.
int StateOf(CacheStore& store, FaultInjectingFileSystem& fs, const Scenario& sc, std::vector<size_t> candidates,
            const std::string& ctx, bool prev_optional = false) {
  std::vector<Manifest> present;
  auto bob = store.LoadAgent("bob", kFingerprint);
  EXPECT_TRUE(bob.ok() && LoadedIs(*bob, sc.bob)) << ctx;
  if (bob.ok()) present.push_back(bob->manifest);
  int state = -1;
  auto alice = store.LoadAgent("alice", kFingerprint);
  if (!alice.ok()) {
    if (alice.status().code() == StatusCode::kNotFound) state = 0;
  } else {
    present.push_back(alice->manifest);
    for (size_t c : candidates)
      if (c > 0 && LoadedIs(*alice, sc.alice[c - 1])) state = static_cast<int>(c);
  }
  if (std::find(candidates.begin(), candidates.end(), static_cast<size_t>(std::max(state, 0))) == candidates.end())
    state = -1;
  EXPECT_NE(state, -1) << ctx << ": alice is in neither the old nor the new state"
                       << (alice.ok() ? "" : ": " + alice.status().message());
  auto files = fs.ListFilesRecursive(kRoot);
  std::set<std::string> expected = ExpectedFiles(kRoot, present);
  const std::string alice_prev = std::string(kRoot) + "/agents/alice/manifest.prev.json";
  if (prev_optional && std::find(files.begin(), files.end(), alice_prev) == files.end()) expected.erase(alice_prev);
  EXPECT_EQ(std::set<std::string>(files.begin(), files.end()), expected)
      << ctx << ": files other than the agents' own remain";
  return state;
}

TEST(StoreCrash, CrashAtEveryOpOfATurn) {
  const Scenario sc;
  testing::QuietLogs quiet;
  for (Mode mode : {Mode::kPowerLoss, Mode::kMetadataJournaled, Mode::kProcessKill}) {
    for (size_t turn = 1; turn <= sc.alice.size(); ++turn) {
      size_t old_seen = 0, new_seen = 0;
      uint64_t k = 0;
      for (;; ++k) {
        const std::string ctx = std::string(ModeName(mode)) + ", turn " + std::to_string(turn) + ", crash at op " +
                                std::to_string(k);
        FaultInjectingFileSystem fs;
        auto store = Prepare(fs, sc, turn - 1);
        fs.ResetOpCount();
        fs.CrashAt(k);
        auto r = Commit(*store, sc.alice[turn - 1]);
        if (!fs.fault_fired()) {
          ASSERT_TRUE(r.ok()) << ctx << ": " << r.status().message();
          break;
        }
        // A crash after the commit point (during clean-up) may still return Ok: then the new
        // turn must be durable.
        std::vector<size_t> allowed = r.ok() ? std::vector<size_t>{turn} : std::vector<size_t>{turn - 1, turn};
        const std::string crashed_op = fs.op_log().back();
        store.reset();
        fs.Reboot(mode);
        store = Reopen(fs);
        ASSERT_NE(store, nullptr) << ctx;
        const int state = StateOf(*store, fs, sc, allowed, ctx + " (" + crashed_op + ")", /*prev_optional=*/true);
        ASSERT_NE(state, -1) << ctx;
        (state == static_cast<int>(turn) ? new_seen : old_seen)++;
        // What Open saw is durable: a power loss right now changes nothing.
        store.reset();
        fs.Reboot(Mode::kPowerLoss);
        store = Reopen(fs);
        ASSERT_EQ(StateOf(*store, fs, sc, {static_cast<size_t>(state)}, ctx + ", second reboot", true), state) << ctx;
        // And the store goes on: the turn can be committed now and survives a power loss.
        ASSERT_TRUE(Commit(*store, sc.alice[turn - 1]).ok()) << ctx;
        store.reset();
        fs.Reboot(Mode::kPowerLoss);
        store = Reopen(fs);
        ASSERT_EQ(StateOf(*store, fs, sc, {turn}, ctx + ", after the retry"), static_cast<int>(turn)) << ctx;
        ASSERT_TRUE(fs.released_unzeroed().empty()) << ctx << ": freed without zeros:\n"
                                                    << testing::Join(fs.released_unzeroed());
      }
      std::cout << "[ crash    ] " << ModeName(mode) << " turn " << turn << ": " << k << " crash points, " << old_seen
                << " old, " << new_seen << " new\n";
      EXPECT_GT(k, 5u);
      EXPECT_GT(old_seen, 0u);
      if (mode != Mode::kPowerLoss) {
        EXPECT_GT(new_seen, 0u);
      }
    }
  }
}

TEST(StoreCrash, FailAtEveryOpOfATurn) {
  const Scenario sc;
  testing::QuietLogs quiet;
  struct Fault {
    const char* name;
    StatusCode code;
    uint32_t sticky;
  };
  const Fault faults[] = {{"EIO once", StatusCode::kIoError, 0},
                          {"ENOSPC once", StatusCode::kNoSpace, 0},
                          {"disk full", StatusCode::kNoSpace, FaultInjectingFileSystem::kDiskFullOps},
                          // A device that stops completing metadata operations: the undo of a publish
                          // whose directory fsync failed cannot rename either.
                          {"fsync dir and rename fail", StatusCode::kIoError,
                           FaultInjectingFileSystem::kOpSyncDir | FaultInjectingFileSystem::kOpRename}};
  for (const Fault& f : faults) {
    for (size_t turn = 1; turn <= sc.alice.size(); ++turn) {
      uint64_t k = 0;
      size_t after_commit = 0;
      for (;; ++k) {
        const std::string ctx = std::string(f.name) + ", turn " + std::to_string(turn) + ", op " + std::to_string(k);
        FaultInjectingFileSystem fs;
        auto store = Prepare(fs, sc, turn - 1);
        fs.ResetOpCount();
        fs.FailAt(k, f.code, f.sticky);
        auto r = Commit(*store, sc.alice[turn - 1]);
        if (!fs.fault_fired()) {
          ASSERT_TRUE(r.ok()) << ctx << ": " << r.status().message();
          break;
        }
        if (r.ok()) {  // the fault hit the best-effort clean-up after the commit point
          ++after_commit;
          fs.ClearFaults();
          store.reset();
          fs.Reboot(Mode::kProcessKill);
          store = Reopen(fs);
          ASSERT_EQ(StateOf(*store, fs, sc, {turn}, ctx + " (after the commit point)"), static_cast<int>(turn));
          continue;
        }
        // kInternal: the publish and its undo both failed, so the agent may be at either turn.
        const bool either = r.status().code() == StatusCode::kInternal;
        EXPECT_TRUE(r.status().code() == f.code || either) << ctx << ": " << r.status().message();
        // In this process: still the old turn (or, after kInternal, the new one), every block readable.
        auto alice = store->LoadAgent("alice", kFingerprint);
        const bool is_new = alice.ok() && LoadedIs(*alice, sc.alice[turn - 1]);
        if (!(either && is_new)) {
          if (turn == 1) {
            EXPECT_EQ(alice.status().code(), StatusCode::kNotFound) << ctx << ": " << alice.status().message();
          } else {
            EXPECT_TRUE(alice.ok() && LoadedIs(*alice, sc.alice[turn - 2])) << ctx;
          }
        }
        auto bob = store->LoadAgent("bob", kFingerprint);
        EXPECT_TRUE(bob.ok() && LoadedIs(*bob, sc.bob)) << ctx;
        // Once space is back the same turn commits.
        fs.ClearFaults();
        auto retry = Commit(*store, sc.alice[turn - 1]);
        ASSERT_TRUE(retry.ok()) << ctx << ": " << retry.status().message();
        // Restarted on whatever the failure left behind: the new turn, and no garbage.
        store.reset();
        fs.Reboot(Mode::kProcessKill);
        store = Reopen(fs);
        ASSERT_EQ(StateOf(*store, fs, sc, {turn}, ctx), static_cast<int>(turn)) << ctx;
        ASSERT_TRUE(fs.released_unzeroed().empty()) << ctx << ": freed without zeros:\n"
                                                    << testing::Join(fs.released_unzeroed());
      }
      std::cout << "[ fail     ] " << f.name << " turn " << turn << ": " << k << " failure points (" << after_commit
                << " after the commit point)\n";
      EXPECT_GT(k, 5u);
    }
  }
}

// A failed turn followed by a restart (no retry): the old state, nothing left over.
TEST(StoreCrash, FailedTurnThenRestartIsTheOldTurn) {
  const Scenario sc;
  testing::QuietLogs quiet;
  for (uint64_t k = 0;; ++k) {
    FaultInjectingFileSystem fs;
    auto store = Prepare(fs, sc, 1);
    fs.ResetOpCount();
    fs.FailAt(k, StatusCode::kNoSpace, FaultInjectingFileSystem::kDiskFullOps);
    auto r = Commit(*store, sc.alice[1]);
    if (!fs.fault_fired()) break;
    const size_t expect = r.ok() ? 2 : 1;
    store.reset();
    fs.Reboot(Mode::kProcessKill);
    store = Reopen(fs);
    ASSERT_EQ(StateOf(*store, fs, sc, {expect}, "op " + std::to_string(k)), static_cast<int>(expect));
  }
}

TEST(StoreCrash, CrashAtEveryOpOfAnErasure) {
  const Scenario sc;
  testing::QuietLogs quiet;
  for (Mode mode : {Mode::kPowerLoss, Mode::kMetadataJournaled, Mode::kProcessKill}) {
    size_t kept = 0, gone = 0;
    uint64_t k = 0;
    for (;; ++k) {
      const std::string ctx = std::string(ModeName(mode)) + ", erase, crash at op " + std::to_string(k);
      FaultInjectingFileSystem fs;
      auto store = Prepare(fs, sc, 2);
      fs.ResetOpCount();
      fs.CrashAt(k);
      auto r = store->EraseAgent("alice");
      if (!fs.fault_fired()) {
        ASSERT_TRUE(r.ok()) << ctx;
        break;
      }
      store.reset();
      fs.Reboot(mode);
      store = Reopen(fs);
      ASSERT_NE(store, nullptr) << ctx;
      const int state = StateOf(*store, fs, sc, {0, 2}, ctx);
      ASSERT_NE(state, -1) << ctx;
      (state == 0 ? gone : kept)++;
      ASSERT_TRUE(fs.released_unzeroed().empty()) << ctx << ": freed without zeros:\n"
                                                  << testing::Join(fs.released_unzeroed());
    }
    std::cout << "[ crash    ] " << ModeName(mode) << " erase: " << k << " crash points, " << kept << " kept, " << gone
              << " erased\n";
    EXPECT_GT(gone, 0u);
    EXPECT_GT(kept, 0u);
  }
}

// The erasure of alice's cache (a manifest without blocks or tail) on a disk too full for it:
// her own block files and tail go first, to make room. At every crash point she keeps her
// conversation and tokens, with her cache whole (old state), cut short where its files are gone
// (the rest is rebuilt from the text), or erased; bob keeps the block he shares; nothing is
// freed unzeroed; and the erasure, tried again, completes.
TEST(StoreCrash, CrashAtEveryOpOfACacheErasureOnAFullDisk) {
  const Scenario sc;
  testing::QuietLogs quiet;
  Manifest erased = sc.alice[1].manifest;
  erased.blocks.clear();
  for (Mode mode : {Mode::kPowerLoss, Mode::kMetadataJournaled, Mode::kProcessKill}) {
    size_t whole = 0, cut = 0, gone = 0;
    uint64_t k = 0;
    for (;; ++k) {
      const std::string ctx = std::string(ModeName(mode)) + ", cache erasure, crash at op " + std::to_string(k);
      FaultInjectingFileSystem fs;
      auto store = Prepare(fs, sc, 2);
      constexpr uint64_t kLarge = uint64_t{1} << 40;
      fs.SetCapacity(kLarge);
      fs.SetCapacity(kLarge - *fs.FreeBytes(kRoot) + 64);
      fs.ResetOpCount();
      fs.CrashAt(k);
      auto r = store->CommitTurn("alice", erased, {}, std::nullopt);
      if (!fs.fault_fired()) {
        ASSERT_TRUE(r.ok()) << ctx << ": " << r.status().message();
        break;
      }
      store.reset();
      fs.Reboot(mode);
      store = Reopen(fs);
      ASSERT_NE(store, nullptr) << ctx;
      auto bob = store->LoadAgent("bob", kFingerprint);
      ASSERT_TRUE(bob.ok() && LoadedIs(*bob, sc.bob)) << ctx;
      auto alice = store->LoadAgent("alice", kFingerprint);
      ASSERT_TRUE(alice.ok()) << ctx << ": " << alice.status().message();
      EXPECT_EQ(alice->manifest.conversation, sc.alice[1].manifest.conversation) << ctx;
      EXPECT_EQ(alice->manifest.tokens, sc.alice[1].manifest.tokens) << ctx;
      if (alice->manifest.blocks.empty()) {
        ++gone;
      } else if (LoadedIs(*alice, sc.alice[1])) {
        ++whole;
      } else {
        ASSERT_TRUE(alice->rebuild_from_block.has_value()) << ctx;
        ASSERT_LE(alice->blocks.size(), sc.alice[1].blocks.size()) << ctx;
        EXPECT_TRUE(std::equal(alice->blocks.begin(), alice->blocks.end(), sc.alice[1].blocks.begin())) << ctx;
        ++cut;
      }
      auto files = fs.ListFilesRecursive(kRoot);
      std::set<std::string> named = ExpectedFiles(kRoot, {bob->manifest, alice->manifest});
      named.insert(std::string(kRoot) + "/agents/alice/manifest.prev.json");
      for (const std::string& f : files) EXPECT_TRUE(named.count(f)) << ctx << ": " << f << " is left over";
      ASSERT_TRUE(fs.released_unzeroed().empty()) << ctx << ": freed without zeros:\n"
                                                  << testing::Join(fs.released_unzeroed());
      auto retry = store->CommitTurn("alice", erased, {}, std::nullopt);
      ASSERT_TRUE(retry.ok()) << ctx << ": the retry: " << retry.status().message();
      ASSERT_TRUE(store->LoadAgent("alice", kFingerprint)->manifest.blocks.empty()) << ctx;
    }
    std::cout << "[ crash    ] " << ModeName(mode) << " cache erasure on a full disk: " << k << " crash points, "
              << whole << " whole, " << cut << " cut short, " << gone << " erased\n";
    EXPECT_GT(k, 3u);
    EXPECT_GT(cut, 0u);
  }
}

}  // namespace
}  // namespace kvfs::store
