// AgentStore over a FakeEngine, without a mount: names, files, turns, errors, privacy.
#include <atomic>
#include <filesystem>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "tests/fs/store_test_util.h"
#include "tests/test_support.h"

namespace kvfs::fs {
namespace {

using testing::FakeEngine;

TEST_F(StoreTest, MkdirCreatesAPrivateAgentListedInTheRoot) {
  InodeId dir = Mkdir("alice", kAlice);
  Result<Attr> attr = store_->GetAttr(dir);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->type, FileType::kDirectory);
  EXPECT_EQ(attr->mode, 0700u);
  EXPECT_EQ(attr->uid, kAlice.uid);
  Result<HandleId> h = store_->OpenDir(kRootInode, kRoot);
  ASSERT_TRUE(h.ok());
  std::set<std::string> names;
  for (const DirEntry& e : *store_->DirEntries(*h)) names.insert(e.name);
  store_->ReleaseDir(*h);
  for (const char* n : {".", "..", "alice", ".status", ".status.json", ".metrics", ".audit.log", ".model.json", ".prefixes"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  Result<HandleId> agent_dir = store_->OpenDir(dir, kAlice);
  ASSERT_TRUE(agent_dir.ok());
  std::set<std::string> files;
  for (const DirEntry& e : *store_->DirEntries(*agent_dir)) files.insert(e.name);
  store_->ReleaseDir(*agent_dir);
  EXPECT_EQ(files, (std::set<std::string>{".", "..", "prompt", "response", "transcript", "system", "config.json",
                                          "status.json", "kv.safetensors"}));
}

TEST_F(StoreTest, BadNamesAreRefused) {
  EXPECT_EQ(store_->MakeAgent(kRootInode, ".x", kRoot).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->MakeAgent(kRootInode, std::string(65, 'a'), kRoot).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->MakeAgent(kRootInode, "a b", kRoot).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->MakeAgent(kRootInode, std::string(64, 'a'), kRoot).ok());
  InodeId dir = Mkdir("alice");
  EXPECT_EQ(store_->MakeAgent(kRootInode, "alice", kRoot).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->MakeAgent(kRootInode, ".status", kRoot).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->MakeAgent(dir, "sub", kRoot).status().code(), StatusCode::kNotPermitted);
  EXPECT_EQ(store_->Create(dir, "notes", WriteTruncFlags(), kRoot).status().code(), StatusCode::kNotPermitted);
  EXPECT_EQ(store_->Create(kRootInode, "file", WriteTruncFlags(), kRoot).status().code(), StatusCode::kNotPermitted);
  EXPECT_EQ(store_->Lookup(dir, "notes").status().code(), StatusCode::kNotFound);
}

// statfs (df) of the mount reports the store directory's file system, where the agents'
// caches go, as statvfs(2) of that directory gives it; names of up to 64 bytes (the longest
// agent name mkdir takes, above). Without a store directory: zeros. A store directory that is
// gone: an I/O error, not figures of some other file system.
TEST_F(StoreTest, StatfsReportsTheStoresFileSystem) {
  const std::string dir = ::testing::TempDir() + "/kvfs_statfs_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  StoreConfig config;
  config.store_dir = dir;
  Start(testing::FakeEngineOptions{}, config);
  struct statvfs want {};
  ASSERT_EQ(::statvfs(dir.c_str(), &want), 0);
  Result<struct statvfs> got = store_->StatFs();
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_GT(got->f_blocks, 0u);
  EXPECT_EQ(got->f_blocks, want.f_blocks);
  EXPECT_EQ(got->f_bsize, want.f_bsize);
  EXPECT_EQ(got->f_frsize, want.f_frsize);
  EXPECT_EQ(got->f_files, want.f_files);
  EXPECT_LE(got->f_bavail, got->f_blocks);
  EXPECT_EQ(got->f_namemax, 64u);
  ASSERT_EQ(::rmdir(dir.c_str()), 0);
  EXPECT_EQ(store_->StatFs().status().code(), StatusCode::kIoError);

  Start(testing::FakeEngineOptions{}, StoreConfig{});
  got = store_->StatFs();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->f_blocks, 0u);
  EXPECT_EQ(got->f_namemax, 64u);
}

TEST_F(StoreTest, PromptBecomesATurnAndResponseStreamsTheReply) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "hello\n").ok());
  Result<std::string> reply = Cat("alice", "response");
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(*reply, FakeEngine::ReplyFor(1, "hello"));  // echo's trailing newline is dropped
  Result<std::string> transcript = Cat("alice", "transcript");
  ASSERT_TRUE(transcript.ok());
  EXPECT_EQ(*transcript, "[user]\nhello\n\n[assistant]\n" + FakeEngine::ReplyFor(1, "hello") + "\n\n");
  auto status = nlohmann::json::parse(*Cat("alice", "status.json"));
  EXPECT_EQ(status["turns"], 1);
  EXPECT_EQ(status["state"], "hot");
  EXPECT_EQ(status["last_error_code"], nullptr);
}

TEST_F(StoreTest, EmptyPromptIsNoTurn) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "").ok());
  ASSERT_TRUE(Echo("alice", "prompt", "\n").ok());
  EXPECT_EQ(engine_->GetAgent("alice")->turns, 0u);
  EXPECT_EQ(store_->Metrics().turns_submitted, 0u);
}

TEST_F(StoreTest, Utf8SplitAcrossWritesIsAccepted) {
  Mkdir("alice");
  std::string text = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";  // é, €, 😀
  ASSERT_TRUE(Echo("alice", "prompt", text, kRoot, text.size()).ok());  // one byte per write
  EXPECT_EQ(*Cat("alice", "response"), FakeEngine::ReplyFor(1, text));
}

TEST_F(StoreTest, InvalidUtf8IsRefusedAtWriteOrClose) {
  Mkdir("alice");
  EXPECT_EQ(Echo("alice", "prompt", "bad \xFF byte").code(), StatusCode::kIllegalSequence);
  EXPECT_EQ(Echo("alice", "prompt", "overlong \xC0\xAF").code(), StatusCode::kIllegalSequence);
  EXPECT_EQ(Echo("alice", "prompt", "surrogate \xED\xA0\x80").code(), StatusCode::kIllegalSequence);
  // A character cut at the end: only close can tell.
  InodeId ino = *File("alice", "prompt");
  HandleId h = *store_->Open(ino, WriteTruncFlags(), kRoot);
  EXPECT_TRUE(store_->Write(h, 0, "ends in \xE2\x82").ok());
  EXPECT_EQ(store_->Flush(h).code(), StatusCode::kIllegalSequence);
  store_->Release(h);
  EXPECT_EQ(engine_->GetAgent("alice")->turns, 0u);
  EXPECT_EQ(store_->Metrics().turns_submitted, 0u);
  // `printf ... > prompt` never reports that close: status.json says what was refused and why.
  auto status = nlohmann::json::parse(*Cat("alice", "status.json"));
  ASSERT_TRUE(status["last_refused_write"].is_object()) << status.dump();
  EXPECT_EQ(status["last_refused_write"]["file"], "prompt");
  EXPECT_EQ(status["last_refused_write"]["code"], "EILSEQ");
  EXPECT_EQ(status["last_refused_write"]["error"], "the prompt ends inside a UTF-8 character");
  EXPECT_TRUE(status["last_error"].get<std::string>().empty());  // no turn failed
}

TEST_F(StoreTest, PromptOverTheLimitIsTooLarge) {
  StoreConfig config;
  config.max_prompt_bytes = 100;
  Start(testing::FakeEngineOptions{}, config);
  Mkdir("alice");
  EXPECT_EQ(Echo("alice", "prompt", std::string(101, 'x')).code(), StatusCode::kTooLarge);
  EXPECT_EQ(Echo("alice", "prompt", std::string(120, 'x'), kRoot, 2).code(), StatusCode::kTooLarge);  // 60 + 60
  EXPECT_TRUE(Echo("alice", "prompt", std::string(100, 'x')).ok());
  EXPECT_EQ(store_->Metrics().turns_submitted, 1u);
}

TEST_F(StoreTest, ReadOnlyFilesRefuseWritesEvenForRoot) {
  Mkdir("alice");
  for (const char* file : {"response", "transcript", "status.json"}) {
    InodeId ino = *File("alice", file);
    EXPECT_EQ(store_->Open(ino, WriteTruncFlags(), kRoot).status().code(), StatusCode::kPermissionDenied) << file;
    EXPECT_EQ(store_->Open(ino, OpenFlags{true, true, false, false}, kRoot).status().code(),
              StatusCode::kPermissionDenied) << file;
    EXPECT_EQ(store_->Truncate(ino, 0, std::nullopt, kRoot).status().code(), StatusCode::kPermissionDenied) << file;
  }
  for (const char* special : {".status", ".status.json", ".metrics", ".audit.log", ".model.json"}) {
    InodeId ino = store_->Lookup(kRootInode, special)->ino;
    EXPECT_EQ(store_->Open(ino, WriteTruncFlags(), kRoot).status().code(), StatusCode::kPermissionDenied) << special;
  }
  EXPECT_EQ(store_->Open(*File("alice", "prompt"), ReadFlags(), kRoot).status().code(), StatusCode::kPermissionDenied);
}

TEST_F(StoreTest, AgentsArePrivateToTheirOwner) {
  InodeId dir = Mkdir("alice", kAlice);
  ASSERT_TRUE(Echo("alice", "prompt", "secret", kAlice).ok());
  EXPECT_EQ(store_->OpenDir(dir, kBob).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Cat("alice", "transcript", kBob).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Echo("alice", "prompt", "hi", kBob).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(store_->RemoveAgent(kRootInode, "alice", kBob).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(store_->Unlink(dir, "kv.safetensors", kBob).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Cat("alice", "transcript", kAlice).ok());
  EXPECT_TRUE(Cat("alice", "transcript", kRoot).ok());
  EXPECT_EQ(engine_->GetAgent("alice")->owner_uid, kAlice.uid);
}

// Modes and owners are fixed, but setting them to what they are succeeds (tar -x as root, cp -p).
TEST_F(StoreTest, ModeAndOwnerChangesOnlySucceedAsNoOps) {
  InodeId dir = Mkdir("alice", kAlice);
  const Attr d = *store_->GetAttr(dir), f = *store_->GetAttr(*File("alice", "system"));
  EXPECT_TRUE(store_->CheckModeAndOwner(dir, d.mode, d.uid, d.gid, kAlice).ok());
  EXPECT_TRUE(store_->CheckModeAndOwner(*File("alice", "system"), f.mode, std::nullopt, std::nullopt, kRoot).ok());
  EXPECT_EQ(store_->CheckModeAndOwner(dir, d.mode | 0044, std::nullopt, std::nullopt, kAlice).code(),
            StatusCode::kNotPermitted);
  EXPECT_EQ(store_->CheckModeAndOwner(dir, std::nullopt, kBob.uid, std::nullopt, kAlice).code(), StatusCode::kNotPermitted);
  EXPECT_EQ(store_->CheckModeAndOwner(dir, d.mode, std::nullopt, std::nullopt, kBob).code(), StatusCode::kPermissionDenied);
}

TEST_F(StoreTest, TurnsOfOneAgentRunInOrderAndTheQueueIsBounded) {
  Mkdir("alice");
  engine_->HoldTurns(true);
  for (int i = 1; i <= 8; ++i) ASSERT_TRUE(Echo("alice", "prompt", "turn " + std::to_string(i)).ok());
  EXPECT_EQ(Echo("alice", "prompt", "one too many").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Metrics().turns_rejected_queue_full, 1u);
  engine_->HoldTurns(false);
  EXPECT_EQ(*Cat("alice", "response"), FakeEngine::ReplyFor(8, "turn 8"));
  std::string expected;
  for (int i = 1; i <= 8; ++i) {
    std::string text = "turn " + std::to_string(i);
    expected += "[user]\n" + text + "\n\n[assistant]\n" + FakeEngine::ReplyFor(i, text) + "\n\n";
  }
  EXPECT_EQ(*Cat("alice", "transcript"), expected);
}

TEST_F(StoreTest, ManyAgentsAndWritersAtOnce) {
  constexpr int kAgents = 10, kTurns = 10;
  for (int a = 0; a < kAgents; ++a) Mkdir("agent" + std::to_string(a));
  std::atomic<int> accepted{0};
  std::vector<std::thread> writers;
  for (int a = 0; a < kAgents; ++a) {
    writers.emplace_back([&, a] {
      for (int t = 0; t < kTurns; ++t) {
        // fmt, not "literal" + std::string: GCC 12 warns falsely (-Wrestrict) on the latter.
        const std::string agent = fmt::format("agent{}", a), text = fmt::format("m{}", t);
        Status s = Echo(agent, "prompt", text);
        while (s.code() == StatusCode::kResourceExhausted) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          s = Echo(agent, "prompt", text);
        }
        if (s.ok()) ++accepted;
      }
    });
  }
  for (auto& w : writers) w.join();
  EXPECT_EQ(accepted.load(), kAgents * kTurns);
  for (int a = 0; a < kAgents; ++a) {
    const std::string agent = fmt::format("agent{}", a);
    // The last turn's reply, then the whole transcript in submission order.
    ASSERT_EQ(*Cat(agent, "response"), FakeEngine::ReplyFor(kTurns, fmt::format("m{}", kTurns - 1)));
    std::string expected;
    for (int t = 0; t < kTurns; ++t) {
      const std::string text = fmt::format("m{}", t);
      expected += "[user]\n" + text + "\n\n[assistant]\n" + FakeEngine::ReplyFor(t + 1, text) + "\n\n";
    }
    EXPECT_EQ(*Cat(agent, "transcript"), expected) << agent;
  }
}

// The memory all kv.safetensors being written hold together is bounded: a write or truncation
// that would pass it fails with ENOSPC (not for good: the file can go on once it fits), the gap
// of a sparse write counts, and a closed import gives its memory back.
TEST_F(StoreTest, ImportBuffersShareAMemoryBudget) {
  StoreConfig config;
  config.max_import_memory_bytes = 1000;
  Start(testing::FakeEngineOptions{}, config);
  Mkdir("alice");
  Mkdir("bob");
  const InodeId alice_kv = *File("alice", "kv.safetensors"), bob_kv = *File("bob", "kv.safetensors");
  const HandleId a = *store_->Open(alice_kv, WriteTruncFlags(), kRoot);
  const HandleId b = *store_->Open(bob_kv, WriteTruncFlags(), kRoot);
  ASSERT_TRUE(store_->Write(a, 0, std::string(600, 'a')).ok());
  EXPECT_EQ(store_->Write(b, 0, std::string(500, 'b')).status().code(), StatusCode::kNoSpace);
  EXPECT_EQ(store_->Write(b, 2000, "x").status().code(), StatusCode::kNoSpace);  // the gap counts
  ASSERT_TRUE(store_->Write(b, 0, std::string(400, 'b')).ok());
  EXPECT_EQ(store_->Truncate(bob_kv, 401, b, kRoot).status().code(), StatusCode::kNoSpace);
  ASSERT_TRUE(store_->Truncate(alice_kv, 100, a, kRoot).ok());  // shrinking gives memory back
  ASSERT_TRUE(store_->Write(b, 400, std::string(500, 'b')).ok());
  store_->Release(a);  // not a valid file: refused at close, and its memory is free
  ASSERT_TRUE(store_->Write(b, 900, std::string(100, 'b')).ok());
  store_->Release(b);
  const HandleId c = *store_->Open(alice_kv, WriteTruncFlags(), kRoot);
  EXPECT_TRUE(store_->Write(c, 0, std::string(1000, 'c')).ok());
  EXPECT_EQ(store_->Write(c, 1000, "c").status().code(), StatusCode::kNoSpace);
  store_->Release(c);
}

// A kv.safetensors whose write failed for want of room, closed anyway, is refused for that
// reason (ENOSPC, naming the failed write), not as the incomplete file it then is; the agent's
// cache is unchanged.
TEST_F(StoreTest, AnImportWhoseWriteFailedIsRefusedForThatReason) {
  StoreConfig config;
  config.max_import_memory_bytes = 1000;
  Start(testing::FakeEngineOptions{}, config);
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "hello").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  const std::string before = *Cat("alice", "kv.safetensors");
  const HandleId h = *store_->Open(*File("alice", "kv.safetensors"), WriteTruncFlags(), kRoot);
  ASSERT_TRUE(store_->Write(h, 0, std::string(600, 'a')).ok());
  EXPECT_EQ(store_->Write(h, 600, std::string(600, 'a')).status().code(), StatusCode::kNoSpace);
  const Status flushed = store_->Flush(h);
  EXPECT_EQ(flushed.code(), StatusCode::kNoSpace) << flushed.message();
  EXPECT_NE(flushed.message().find("a write to it failed"), std::string::npos) << flushed.message();
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "kv.safetensors"), before);
}

// With a spill directory, a kv.safetensors being written holds disk, not memory, past
// import_spill_bytes: two imports that would not fit the memory budget together are written at
// the same time, and each imports at its close, when it needs its size in memory for a while.
// One larger than the memory budget is refused at close (ENOSPC), the agent unchanged. Nothing
// is left in the directory.
TEST_F(StoreTest, LargeImportsWaitOnDiskWhileWritten) {
  const std::string dir = ::testing::TempDir() + "/kvfs_import_spill_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  StoreConfig config;
  config.max_import_memory_bytes = 10000;
  config.import_spill_dir = dir;
  config.import_spill_bytes = 200;
  Start(testing::FakeEngineOptions{}, config);
  for (const char* name : {"alice", "bob", "carol", "dave"}) Mkdir(name);
  ASSERT_TRUE(Echo("alice", "prompt", "remember this, and this, and this too, please").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  const std::string exported = *Cat("alice", "kv.safetensors");
  ASSERT_GT(exported.size(), 5000u);  // two of them pass the memory budget
  ASSERT_LT(exported.size(), 10000u);
  const HandleId bob = *store_->Open(*File("bob", "kv.safetensors"), WriteTruncFlags(), kRoot);
  const HandleId carol = *store_->Open(*File("carol", "kv.safetensors"), WriteTruncFlags(), kRoot);
  for (size_t at = 0; at < exported.size(); at += 1000) {  // interleaved, as two cp would
    ASSERT_TRUE(store_->Write(bob, at, exported.substr(at, 1000)).ok());
    ASSERT_TRUE(store_->Write(carol, at, exported.substr(at, 1000)).ok());
  }
  ASSERT_TRUE(store_->Flush(bob).ok());
  store_->Release(bob);
  ASSERT_TRUE(store_->Flush(carol).ok());
  store_->Release(carol);
  EXPECT_EQ(*Cat("bob", "transcript"), *Cat("alice", "transcript"));
  EXPECT_EQ(*Cat("carol", "kv.safetensors"), exported);
  // A bad large file is refused at close as one in memory is, bob's cache unchanged.
  std::string bad = exported;
  bad[0] ^= 1;
  EXPECT_EQ(Echo("bob", "kv.safetensors", bad, kRoot, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*Cat("bob", "kv.safetensors"), exported);
  // Larger than the memory budget: written, then refused at close.
  std::string longer = exported;
  while (longer.size() <= 10000) longer += exported;
  EXPECT_EQ(Echo("dave", "kv.safetensors", longer, kRoot, 4).code(), StatusCode::kNoSpace);
  EXPECT_EQ(*Cat("dave", "transcript"), "");
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << "the spill directory is not empty";
}

TEST_F(StoreTest, KvExportImportAndEraseCache) {
  Mkdir("alice");
  Mkdir("bob");
  ASSERT_TRUE(Echo("alice", "prompt", "remember this").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  Result<std::string> exported = Cat("alice", "kv.safetensors");
  ASSERT_TRUE(exported.ok());
  EXPECT_FALSE(exported->empty());
  // Garbage, truncated: EINVAL at close, bob unchanged.
  EXPECT_EQ(Echo("bob", "kv.safetensors", "garbage").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Echo("bob", "kv.safetensors", exported->substr(0, exported->size() - 5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*Cat("bob", "transcript"), "");
  ASSERT_TRUE(Echo("bob", "kv.safetensors", *exported).ok());
  EXPECT_EQ(*Cat("bob", "transcript"), *Cat("alice", "transcript"));
  // unlink kv.safetensors: the cache goes, the transcript stays.
  InodeId alice = store_->Lookup(kRootInode, "alice")->ino;
  ASSERT_TRUE(store_->Unlink(alice, "kv.safetensors", kRoot).ok());
  EXPECT_NE(Cat("alice", "transcript")->find("remember this"), std::string::npos);
  std::string audit = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  for (const char* action : {"export", "import", "erase_cache"}) {
    EXPECT_NE(audit.find(std::string("\"action\":\"") + action + "\""), std::string::npos) << action;
  }
  EXPECT_EQ(audit.find("remember"), std::string::npos);  // never any text
  EXPECT_EQ(store_->Metrics().imports, 1u);
  EXPECT_EQ(store_->Metrics().imports_refused, 2u);
  // An export is audited when it is read, once per open: an open closed unread exports nothing.
  auto exports = [&] {
    const std::string log = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
    size_t n = 0;
    for (size_t at = log.find("\"action\":\"export\""); at != std::string::npos; at = log.find("\"action\":\"export\"", at + 1)) ++n;
    return n;
  };
  const size_t before = exports();
  const InodeId bobs = *File("bob", "kv.safetensors");
  HandleId unread = *store_->Open(bobs, ReadFlags(), kRoot);
  store_->Release(unread);
  EXPECT_EQ(exports(), before);
  HandleId read = *store_->Open(bobs, ReadFlags(), kRoot);
  ASSERT_TRUE(store_->Read(read, 0, 10, nullptr).ok());
  ASSERT_TRUE(store_->Read(read, 10, 10, nullptr).ok());
  store_->Release(read);
  EXPECT_EQ(exports(), before + 1);
}

// tar and rsync copy as many bytes as a file's size says: the files an agent is backed up by
// (kv.safetensors, generated at open, included) have the size of what a read right after
// returns, in getattr and in the directory listing (readdirplus). The live status views keep
// size 0 (/proc-like: a reload started by any open changes them); prompt is write-only.
TEST_F(StoreTest, FilesHaveTheSizeOfWhatAReadReturns) {
  InodeId dir = Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  ASSERT_TRUE(Echo("alice", "prompt", "remember this").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  Result<HandleId> listing = store_->OpenDir(dir, kRoot);
  ASSERT_TRUE(listing.ok());
  std::map<std::string, uint64_t> listed;
  for (const DirEntry& e : *store_->DirEntries(*listing)) listed[e.name] = e.attr.size;
  store_->ReleaseDir(*listing);
  for (const char* f : {"response", "transcript", "system", "config.json", "kv.safetensors"}) {
    Result<InodeId> ino = File("alice", f);
    ASSERT_TRUE(ino.ok()) << f;
    const uint64_t size = store_->GetAttr(*ino)->size;
    Result<std::string> text = CatInode(*ino);
    ASSERT_TRUE(text.ok()) << f;
    EXPECT_GT(size, 0u) << f;
    EXPECT_EQ(size, text->size()) << f;
    EXPECT_EQ(listed[f], size) << f;
  }
  for (const char* f : {"prompt", "status.json"}) EXPECT_EQ(store_->GetAttr(*File("alice", f))->size, 0u) << f;
  for (const char* f : {".status", ".status.json", ".metrics", ".model.json"}) {
    Result<Attr> attr = store_->Lookup(kRootInode, f);
    ASSERT_TRUE(attr.ok()) << f;
    EXPECT_EQ(attr->size, 0u) << f;
  }
  Result<Attr> audit = store_->Lookup(kRootInode, ".audit.log");
  ASSERT_TRUE(audit.ok());
  EXPECT_EQ(audit->size, CatInode(audit->ino)->size());
}

// fstat of an open file: an export being read has the size of its snapshot, taken at open,
// though a turn has changed the cache since; a kv.safetensors being written has the size of
// what was written, or what it was cut to (ftruncate), until it is closed.
TEST_F(StoreTest, AnOpenFileHasTheSizeOfItsOwnBytes) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "remember this").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  const InodeId kv = *File("alice", "kv.safetensors");
  Result<HandleId> reading = store_->Open(kv, ReadFlags(), kRoot);
  ASSERT_TRUE(reading.ok());
  const uint64_t at_open = store_->GetAttr(kv)->size;
  ASSERT_TRUE(Echo("alice", "prompt", "and this too").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  EXPECT_GT(store_->GetAttr(kv)->size, at_open);                // the cache grew
  EXPECT_EQ(store_->GetAttr(kv, *reading)->size, at_open);      // the open file did not
  store_->Release(*reading);

  Result<HandleId> writing = store_->Open(kv, WriteTruncFlags(), kRoot);
  ASSERT_TRUE(writing.ok());
  EXPECT_EQ(store_->GetAttr(kv, *writing)->size, 0u);
  ASSERT_TRUE(store_->Write(*writing, 0, std::string(100, 'x')).ok());
  EXPECT_EQ(store_->GetAttr(kv, *writing)->size, 100u);
  Result<Attr> cut = store_->Truncate(kv, 40, *writing, kRoot);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->size, 40u);
  EXPECT_EQ(store_->GetAttr(kv, *writing)->size, 40u);
  EXPECT_GT(store_->GetAttr(kv)->size, 40u);  // the agent's cache, unchanged until the close
  store_->Release(*writing);                   // garbage: refused, nothing changes
}

// kv.safetensors opened for reading and writing without O_TRUNC is the export, as any file
// is what it holds: reads show it, writes change it in place, a close after writes imports what
// it has become (validated), and a close without writes imports nothing.
TEST_F(StoreTest, KvCacheOpenedForReadAndWriteStartsAsTheExport) {
  Mkdir("alice");
  Mkdir("bob");
  ASSERT_TRUE(Echo("alice", "prompt", "remember this").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  const std::string exported = *Cat("alice", "kv.safetensors");
  const std::string transcript = *Cat("alice", "transcript");
  const InodeId kv = *File("alice", "kv.safetensors");
  const OpenFlags read_write{true, true, false, false};
  auto read_all = [&](HandleId h) {
    std::string out;
    for (Result<std::string> chunk = store_->Read(h, 0, 7, nullptr); chunk.ok() && !chunk->empty();
         chunk = store_->Read(h, out.size(), 7, nullptr)) {
      out += *chunk;
    }
    return out;
  };

  HandleId h = *store_->Open(kv, read_write, kRoot);
  EXPECT_EQ(store_->GetAttr(kv, h)->size, exported.size());
  EXPECT_EQ(read_all(h), exported);
  EXPECT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(store_->Metrics().imports + store_->Metrics().imports_refused, 0u);  // no writes: no import

  // A byte changed in place: refused at close as a damaged file; alice keeps her cache.
  h = *store_->Open(kv, read_write, kRoot);
  ASSERT_TRUE(store_->Write(h, 0, std::string(1, static_cast<char>(exported[0] ^ 1))).ok());
  EXPECT_EQ(read_all(h).substr(1), exported.substr(1));
  EXPECT_EQ(store_->Flush(h).code(), StatusCode::kInvalidArgument);
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "kv.safetensors"), exported);

  // The same byte written back: the file is whole again and imports.
  h = *store_->Open(kv, read_write, kRoot);
  ASSERT_TRUE(store_->Write(h, 0, exported.substr(0, 1)).ok());
  const Status imported = store_->Flush(h);
  EXPECT_TRUE(imported.ok()) << imported.message();
  store_->Release(h);
  EXPECT_EQ(store_->Metrics().imports, 1u);
  EXPECT_EQ(*Cat("alice", "transcript"), transcript);

  // bob's (empty) cache overwritten by alice's longer file from offset 0 becomes hers.
  const InodeId bob_kv = *File("bob", "kv.safetensors");
  h = *store_->Open(bob_kv, read_write, kRoot);
  const uint64_t bob_export = store_->GetAttr(bob_kv, h)->size;
  ASSERT_LT(bob_export, exported.size());
  ASSERT_TRUE(store_->Write(h, 0, exported).ok());
  EXPECT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(*Cat("bob", "transcript"), transcript);
}

// Two writers of a new prefix name closing at once (two `cp` of it): the first close adds it and
// the second replaces it, as the last close of a file wins. The second used to fail to add it
// again and drop the name the first had added: a prefix neither listed nor erasable, yet shared.
TEST_F(StoreTest, TwoWritersOfANewPrefixClosingAtOnceLeaveOneListedPrefix) {
  testing::FakeEngineOptions options;
  options.prefix_delay = std::chrono::milliseconds(50);
  Start(options);
  const InodeId prefixes = store_->Lookup(kRootInode, ".prefixes")->ino;
  auto created = store_->Create(prefixes, "story.txt", WriteTruncFlags(), kRoot);
  ASSERT_TRUE(created.ok()) << created.status().message();
  const HandleId first = created->second;
  Result<HandleId> second = store_->Open(created->first.ino, WriteTruncFlags(), kRoot);
  ASSERT_TRUE(second.ok()) << second.status().message();
  ASSERT_TRUE(store_->Write(first, 0, "Once upon a time").ok());
  ASSERT_TRUE(store_->Write(*second, 0, "Long ago").ok());
  Status closed[2];
  std::thread other([&] { closed[1] = store_->Flush(*second); });
  closed[0] = store_->Flush(first);
  other.join();
  store_->Release(first);
  store_->Release(*second);
  EXPECT_TRUE(closed[0].ok()) << closed[0].message();
  EXPECT_TRUE(closed[1].ok()) << closed[1].message();
  Result<Attr> listed = store_->Lookup(prefixes, "story.txt");
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  const std::string text = *CatInode(listed->ino);
  EXPECT_TRUE(text == "Once upon a time" || text == "Long ago") << text;
  EXPECT_EQ(*engine_->PrefixText("story.txt"), text);
  ASSERT_TRUE(store_->Unlink(prefixes, "story.txt", kRoot).ok());
  EXPECT_TRUE(engine_->ListPrefixes().empty());
}

TEST_F(StoreTest, PrefixFilesAreAddedAndRemoved) {
  InodeId prefixes = store_->Lookup(kRootInode, ".prefixes")->ino;
  auto created = store_->Create(prefixes, "story.txt", WriteTruncFlags(), kAlice);
  ASSERT_TRUE(created.ok()) << created.status().message();
  HandleId h = created->second;
  ASSERT_TRUE(store_->Write(h, 0, "Once upon a time").ok());
  ASSERT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(*engine_->PrefixText("story.txt"), "Once upon a time");
  EXPECT_EQ(*CatInode(store_->Lookup(prefixes, "story.txt")->ino), "Once upon a time");
  // A rewrite replaces it (and moves its mtime); the old one's erasure is on record like an rm's.
  const int64_t written = store_->Lookup(prefixes, "story.txt")->mtime_ms;
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  h = *store_->Open(store_->Lookup(prefixes, "story.txt")->ino, WriteTruncFlags(), kAlice);
  ASSERT_TRUE(store_->Write(h, 0, "Long ago").ok());
  ASSERT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(*engine_->PrefixText("story.txt"), "Long ago");
  EXPECT_GT(store_->Lookup(prefixes, "story.txt")->mtime_ms, written);
  const std::string audit = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  // In the order of events: the first text added, the new one added, then the old erased.
  const size_t first_add = audit.find("\"action\":\"prefix_add\"");
  const size_t second_add = audit.find("\"action\":\"prefix_add\"", first_add + 1);
  const size_t removed = audit.find("\"action\":\"prefix_remove\"");
  ASSERT_NE(second_add, std::string::npos) << audit;
  ASSERT_NE(removed, std::string::npos) << audit;
  EXPECT_LT(second_add, removed) << audit;
  // A rewrite the engine refuses (longer than the context) fails and leaves the old text.
  h = *store_->Open(store_->Lookup(prefixes, "story.txt")->ino, WriteTruncFlags(), kAlice);
  ASSERT_TRUE(store_->Write(h, 0, std::string(5000, 'x')).ok());
  EXPECT_EQ(store_->Flush(h).code(), StatusCode::kOutOfRange);
  store_->Release(h);
  EXPECT_EQ(*engine_->PrefixText("story.txt"), "Long ago");
  EXPECT_EQ(*CatInode(store_->Lookup(prefixes, "story.txt")->ino), "Long ago");
  EXPECT_EQ(store_->Create(prefixes, ".hidden", WriteTruncFlags(), kRoot).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store_->Unlink(prefixes, "story.txt", kAlice).ok());
  EXPECT_TRUE(engine_->ListPrefixes().empty());
  EXPECT_EQ(store_->Lookup(prefixes, "story.txt").status().code(), StatusCode::kNotFound);
  // Every prefix_remove line of the audit log (the rewrite's, the rm's) is an erasure in the
  // status files too.
  const std::string log = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  size_t removes = 0;
  for (size_t at = log.find("\"prefix_remove\""); at != std::string::npos; at = log.find("\"prefix_remove\"", at + 1))
    ++removes;
  EXPECT_EQ(removes, 2u) << log;
  const nlohmann::json status = nlohmann::json::parse(*CatInode(store_->Lookup(kRootInode, ".status.json")->ino));
  EXPECT_EQ(status["erasures"], removes);
  EXPECT_EQ(status["erasures_by_kind"], nlohmann::json({{"agent", 0}, {"cache", 0}, {"prefix", removes}}));
  EXPECT_NE(CatInode(store_->Lookup(kRootInode, ".status")->ino)->find("2 erasures (0 agents, 0 caches, 2 prefixes)"),
            std::string::npos);
  EXPECT_NE(CatInode(store_->Lookup(kRootInode, ".metrics")->ino)->find("kvfs_erasures_total{what=\"prefix\"} 2\n"),
            std::string::npos);
}

TEST_F(StoreTest, OpeningAnAgentFileSchedulesAPrefetch) {
  Mkdir("alice");
  size_t before = engine_->PrefetchCount();
  ASSERT_TRUE(Cat("alice", "status.json").ok());
  EXPECT_GT(engine_->PrefetchCount(), before);
}

// ls -l, du, find and updatedb walk directories and stat files: none of that is using an agent,
// and a walk of the mount must not load every agent's cache into memory.
TEST_F(StoreTest, ListingAndStatingAnAgentScheduleNoPrefetch) {
  InodeId dir = Mkdir("alice");
  const size_t before = engine_->PrefetchCount();
  Result<HandleId> listing = store_->OpenDir(dir, kRoot);
  ASSERT_TRUE(listing.ok()) << listing.status().message();
  store_->ReleaseDir(*listing);
  for (const char* file : {"prompt", "response", "transcript", "status.json", "kv.safetensors", "config.json"}) {
    Result<Attr> entry = store_->Lookup(dir, file);
    ASSERT_TRUE(entry.ok()) << file;
    ASSERT_TRUE(store_->GetAttr(entry->ino).ok()) << file;
  }
  ASSERT_TRUE(store_->GetXattr(dir, "user.kvfs.state").ok());
  EXPECT_EQ(engine_->PrefetchCount(), before);
}

TEST_F(StoreTest, ExtendedAttributes) {
  InodeId dir = Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "hello").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  EXPECT_EQ(**store_->GetXattr(dir, "user.kvfs.state"), "hot");
  EXPECT_EQ(**store_->GetXattr(dir, "user.kvfs.tokens"), std::to_string(engine_->GetAgent("alice")->context_tokens));
  EXPECT_FALSE(store_->GetXattr(dir, "user.other")->has_value());
  EXPECT_EQ(store_->ListXattr(dir)->size(), 3u);
  // Setting one: kvfs's own are read-only; others are not supported (cp -p and cp -a then go on).
  EXPECT_EQ(store_->SetXattr(dir, "user.kvfs.state").code(), StatusCode::kNotPermitted);
  EXPECT_EQ(store_->SetXattr(*File("alice", "system"), "system.posix_acl_access").code(), StatusCode::kUnsupported);
  EXPECT_EQ(store_->SetXattr(dir, "security.selinux").code(), StatusCode::kUnsupported);
}

TEST_F(StoreTest, RootStatusFilesRender) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "hello").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  std::string text = *CatInode(store_->Lookup(kRootInode, ".status")->ino);
  EXPECT_NE(text.find("hit rate"), std::string::npos);
  EXPECT_NE(text.find("alice"), std::string::npos);
  auto json = nlohmann::json::parse(*CatInode(store_->Lookup(kRootInode, ".status.json")->ino));
  EXPECT_EQ(json["agents"]["hot"], 1);
  std::string metrics = *CatInode(store_->Lookup(kRootInode, ".metrics")->ino);
  for (const char* m : {"kvfs_turns_total{result=\"ok\"} 1", "kvfs_ttft_seconds_count 1", "kvfs_cache_evictions_total",
                        "kvfs_cache_reload_bytes_total", "kvfs_erasures_total", "kvfs_batch_size_count 3",
                        "kvfs_tokens_total{kind=\"generated\"}"}) {
    EXPECT_NE(metrics.find(m), std::string::npos) << m;
  }
  auto model = nlohmann::json::parse(*CatInode(store_->Lookup(kRootInode, ".model.json")->ino));
  EXPECT_EQ(model["fingerprint"], engine_->fingerprint());
}

// After a restart a prefix's mtime is the mount's start, not the root's (which every mkdir and
// rmdir moves: rsync and `cp -u` would see every prefix changed), and its group is its owner's.
TEST_F(StoreTest, RestoredPrefixesKeepTheMountsStartAsMtime) {
  const kvfs::testing::TempDir dir;
  testing::FakeEngineOptions options;
  options.store_dir = dir.path();
  Start(options);
  const InodeId prefixes = store_->Lookup(kRootInode, ".prefixes")->ino;
  Result<InodeId> written = WritePrefix("story.txt", "Once upon a time", kAlice);
  ASSERT_TRUE(written.ok()) << written.status().message();
  EXPECT_EQ(store_->Lookup(prefixes, "story.txt")->gid, kAlice.gid);
  Start(options);
  const InodeId restarted = store_->Lookup(kRootInode, ".prefixes")->ino;
  const Attr before = *store_->Lookup(restarted, "story.txt");
  EXPECT_EQ(before.uid, kAlice.uid);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Mkdir("bob");
  EXPECT_GT(store_->Lookup(kRootInode, "bob")->mtime_ms, before.mtime_ms);
  EXPECT_EQ(store_->Lookup(restarted, "story.txt")->mtime_ms, before.mtime_ms);
}

TEST_F(StoreTest, AgentsOfTheEngineAppearAfterARestart) {
  std::string dir = ::testing::TempDir() + "/kvfs_store_restart_" + std::to_string(::getpid());
  testing::FakeEngineOptions options;
  options.store_dir = dir;
  Start(options);
  Mkdir("alice", kAlice);
  ASSERT_TRUE(Echo("alice", "prompt", "persist me", kAlice).ok());
  ASSERT_TRUE(Cat("alice", "response", kAlice).ok());
  Start(options);
  Result<Attr> attr = store_->Lookup(kRootInode, "alice");
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->uid, kAlice.uid);
  EXPECT_EQ(*Cat("alice", "response", kAlice), FakeEngine::ReplyFor(1, "persist me"));
  EXPECT_NE(Cat("alice", "transcript", kAlice)->find("persist me"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfs::fs
