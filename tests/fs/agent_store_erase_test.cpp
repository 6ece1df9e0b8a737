// AgentStore over a FakeEngine: erasure (rmdir), what it leaves behind (inodes the kernel still
// holds, handles opened before it, readers blocked on the agent) and unlinks of agent files.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/fs/store_test_util.h"

namespace kvfs::fs {
namespace {

TEST_F(StoreTest, RmdirErasesTheAgentAndLogsItWithoutText) {
  InodeId dir = Mkdir("alice", kAlice);
  ASSERT_TRUE(Echo("alice", "prompt", "private words", kAlice).ok());
  ASSERT_TRUE(Cat("alice", "response", kAlice).ok());
  // rm -r: unlink every file (views: nothing happens but kv.safetensors), then rmdir.
  for (const char* f : {"prompt", "response", "transcript", "system", "config.json", "status.json"}) {
    EXPECT_TRUE(store_->Unlink(dir, f, kAlice).ok()) << f;
  }
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "alice", kAlice).ok());
  EXPECT_EQ(store_->Lookup(kRootInode, "alice").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->GetAgent("alice").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->GetAttr(dir).status().code(), StatusCode::kNotFound);
  std::string audit = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  auto line = nlohmann::json::parse(audit.substr(0, audit.find('\n')));
  EXPECT_EQ(line["action"], "erase");
  EXPECT_EQ(line["agent"], "alice");
  EXPECT_EQ(line["uid"], kAlice.uid);
  EXPECT_TRUE(line.contains("bytes_freed") && line.contains("blocks_freed") && line.contains("blocks_kept_shared"));
  EXPECT_EQ(audit.find("private"), std::string::npos);
  // The name can be used again: a new agent, a new inode.
  InodeId again = Mkdir("alice", kAlice);
  EXPECT_NE(again, dir);
  EXPECT_EQ(*Cat("alice", "transcript", kAlice), "");
}

// Files open when their agent is erased hold nothing of it after: an export, a snapshot of
// system or config.json, a finished turn's response and the last reply all fail their next read
// (ENOENT), wherever the reader was. `rm kv.safetensors` does the same to exports being read only.
TEST_F(StoreTest, FilesOpenAcrossAnErasureReadNothingOfIt) {
  InodeId dir = Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "system", "secret system").ok());
  ASSERT_TRUE(Echo("alice", "prompt", "private words").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  auto open_and_read = [&](const char* file) {
    HandleId h = *store_->Open(*File("alice", file), ReadFlags(), kRoot);
    EXPECT_TRUE(store_->Read(h, 0, 2, nullptr).ok()) << file;
    return h;
  };
  const HandleId early_export = open_and_read("kv.safetensors");
  ASSERT_TRUE(store_->Unlink(dir, "kv.safetensors", kRoot).ok());  // the cache only
  EXPECT_EQ(store_->Read(early_export, 2, 100, nullptr).status().code(), StatusCode::kNotFound);
  store_->Release(early_export);
  ASSERT_TRUE(Echo("alice", "prompt", "more private words").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());

  std::vector<HandleId> open;
  for (const char* f : {"kv.safetensors", "system", "config.json", "response", "status.json"}) open.push_back(open_and_read(f));
  EXPECT_TRUE(store_->Read(open[1], 0, 100, nullptr).ok());  // system: the cache's erasure left it
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "alice", kRoot).ok());
  for (HandleId h : open) {
    Result<std::string> after = store_->Read(h, 2, 4096, nullptr);
    EXPECT_EQ(after.status().code(), StatusCode::kNotFound) << (after.ok() ? *after : "");
    store_->Release(h);
  }
}

// A file opened for writing before its agent was erased must not change a new agent of the same
// name, whoever owns it: the engine knows agents by name, so the store checks at close that the
// handle's agent is still the one of that name.
TEST_F(StoreTest, HandlesOfAnErasedAgentNeverReachItsSuccessor) {
  Mkdir("alice", kAlice);
  auto open_for_write = [&](const char* file) { return *store_->Open(*File("alice", file), WriteTruncFlags(), kAlice); };
  const HandleId config = open_for_write("config.json"), system = open_for_write("system"),
                 prompt = open_for_write("prompt"), import = open_for_write("kv.safetensors");
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "alice", kAlice).ok());
  Mkdir("alice", kBob);
  const std::string config_before = *Cat("alice", "config.json", kBob);
  ASSERT_TRUE(store_->Write(config, 0, R"({"max_tokens": 3})").ok());
  EXPECT_EQ(store_->Flush(config).code(), StatusCode::kNotFound);
  ASSERT_TRUE(store_->Write(system, 0, "stale system").ok());
  EXPECT_EQ(store_->Flush(system).code(), StatusCode::kNotFound);
  ASSERT_TRUE(store_->Write(prompt, 0, "stale prompt").ok());
  EXPECT_EQ(store_->Flush(prompt).code(), StatusCode::kNotFound);
  const std::string exported = *engine_->ExportCache("alice");  // any well-formed file
  ASSERT_TRUE(store_->Write(import, 0, exported).ok());
  EXPECT_EQ(store_->Flush(import).code(), StatusCode::kNotFound);
  for (HandleId h : {config, system, prompt, import}) store_->Release(h);
  EXPECT_EQ(*Cat("alice", "config.json", kBob), config_before);
  EXPECT_EQ(*Cat("alice", "system", kBob), "");
  EXPECT_EQ(*Cat("alice", "transcript", kBob), "");
  std::string audit = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  EXPECT_EQ(audit.find("\"action\":\"system\""), std::string::npos) << audit;
  EXPECT_EQ(audit.find("\"action\":\"import\""), std::string::npos) << audit;
  // The live agent's own handles still work.
  ASSERT_TRUE(Echo("alice", "system", "fresh", kBob).ok());
  EXPECT_EQ(*Cat("alice", "system", kBob), "fresh");
}

// A crash between an erasure and its audit line (kill -9 of kvfsd) leaves the erasure's intent;
// the next start writes the line of each erasure that happened (marked completed_at_start) and
// none for one that erased nothing.
TEST_F(StoreTest, ErasuresACrashLeftOffTheLogAreLoggedAtTheNextStart) {
  const std::string dir = ::testing::TempDir() + "/kvfs_settle_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  StoreConfig config;
  config.audit_log_path = dir + "/audit.log";
  Start(testing::FakeEngineOptions{}, config);
  Mkdir("alice", kAlice);
  Mkdir("bob", kBob);
  Mkdir("carol", kBob);
  Mkdir("dave");
  ASSERT_TRUE(Echo("bob", "prompt", "hello", kBob).ok());
  ASSERT_TRUE(Cat("bob", "response", kBob).ok());
  {  // what the daemon that crashed had written
    auto log = AuditLog::Open(config.audit_log_path);
    ASSERT_TRUE(log.ok());
    for (const auto& [agent, action, uid] : std::vector<std::tuple<std::string, std::string, uint32_t>>{
             {"alice", "erase", 1000}, {"bob", "erase_cache", 2000}, {"carol", "erase", 0}, {"dave", "erase", 0}}) {
      AuditEvent e;
      e.uid = uid;
      e.agent = agent;
      e.action = action;
      ASSERT_TRUE((*log)->Intend(e).ok());
    }
  }
  ASSERT_TRUE(engine_->EraseAgent("alice").ok());  // alice's erasure happened; the others never started
  // dave's ran to its line, and the crash came before its intent went.
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "dave", kRoot).ok());
  const std::string before = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  store_.reset();
  auto store = AgentStore::Create(*engine_, config);
  ASSERT_TRUE(store.ok());
  store_ = std::move(*store);
  const std::string audit = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  ASSERT_EQ(audit.substr(0, before.size()), before);
  ASSERT_EQ(std::count(audit.begin(), audit.end(), '\n'), 2) << audit;  // dave's once, then alice's
  const auto line = nlohmann::json::parse(audit.substr(before.size()));
  EXPECT_EQ(line["agent"], "alice");
  EXPECT_EQ(line["action"], "erase");
  EXPECT_EQ(line["uid"], 1000);
  EXPECT_EQ(line["completed_at_start"], true);
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/audit.log.intents"));
  // An erasure that runs to its end leaves no intent, and its line is an ordinary one.
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "carol", kBob).ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/audit.log.intents"));
  const std::string after = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  const auto last = nlohmann::json::parse(after.substr(audit.size()));
  EXPECT_EQ(last["agent"], "carol");
  EXPECT_EQ(last.count("completed_at_start"), 0u);
  EXPECT_EQ(last["owner_uid"], 2000);
  // root erasing another user's agent: the line names both.
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "bob", kRoot).ok());
  const std::string end = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  const auto by_root = nlohmann::json::parse(end.substr(after.size()));
  EXPECT_EQ(by_root["uid"], 0);
  EXPECT_EQ(by_root["owner_uid"], 2000);
  std::filesystem::remove_all(dir);
}

// An export hands over the agent's conversation and cache: it is not served unless its line is
// in the audit log. A log that cannot be written (here /dev/full: ENOSPC, as a full disk) fails
// the read, and the log gets no line for an export that did not happen.
TEST_F(StoreTest, AnExportIsNotServedUnlessItsLineIsInTheAuditLog) {
  const std::string dir = ::testing::TempDir() + "/kvfs_audit_full_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink("/dev/full", dir + "/audit.log");
  StoreConfig config;
  config.audit_log_path = dir + "/audit.log";
  Start(testing::FakeEngineOptions{}, config);
  Mkdir("alice", kAlice);
  ASSERT_TRUE(Echo("alice", "prompt", "hello", kAlice).ok());
  ASSERT_TRUE(Cat("alice", "response", kAlice).ok());
  Result<std::string> exported = Cat("alice", "kv.safetensors", kAlice);
  EXPECT_EQ(exported.status().code(), StatusCode::kNoSpace) << exported.status().message();
  EXPECT_NE(exported.status().message().find("on record"), std::string::npos) << exported.status().message();
  const std::string audit = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  EXPECT_EQ(audit.find("\"export\""), std::string::npos) << audit;
  store_.reset();
  std::filesystem::remove_all(dir);
}

// Bytes written before the erasure and not yet applied are dropped with the agent: the close
// says so (ENOENT) instead of reporting success for data that went nowhere. A handle that wrote
// nothing closes quietly.
TEST_F(StoreTest, WritesThatAnErasureDroppedFailTheirClose) {
  Mkdir("alice", kAlice);
  auto open_for_write = [&](const char* file) { return *store_->Open(*File("alice", file), WriteTruncFlags(), kAlice); };
  const HandleId config = open_for_write("config.json"), system = open_for_write("system"),
                 prompt = open_for_write("prompt"), import = open_for_write("kv.safetensors"),
                 idle = open_for_write("prompt");
  ASSERT_TRUE(store_->Write(config, 0, R"({"max_tokens": 3})").ok());
  ASSERT_TRUE(store_->Write(system, 0, "before the erasure").ok());
  ASSERT_TRUE(store_->Write(prompt, 0, "hello").ok());
  ASSERT_TRUE(store_->Write(import, 0, "safetensors bytes").ok());
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "alice", kAlice).ok());
  for (HandleId h : {config, system, prompt, import}) {
    EXPECT_EQ(store_->Flush(h).code(), StatusCode::kNotFound);
    store_->Release(h);
  }
  EXPECT_TRUE(store_->Flush(idle).ok());
  store_->Release(idle);
  EXPECT_EQ(engine_->GetAgent("alice").status().code(), StatusCode::kNotFound);
}

// `tar -x` over an agent unlinks a file whose O_EXCL create failed and tries again, forever if
// the unlink keeps succeeding: a repeat by the same process at once is refused. rm -r's single
// unlinks, and other processes', still succeed.
TEST_F(StoreTest, AnAgentFileUnlinkedAgainAtOnceByOneProcessIsRefused) {
  std::atomic<int64_t> now_ms{1000000};
  StoreConfig config;
  config.now_ms = [&] { return now_ms.load(); };
  Start(testing::FakeEngineOptions{}, std::move(config));
  InodeId dir = Mkdir("alice", kAlice);
  const Caller tar{kAlice.uid, kAlice.gid, 4242}, other{kAlice.uid, kAlice.gid, 4343};
  ASSERT_TRUE(store_->Unlink(dir, "response", tar).ok());
  EXPECT_EQ(store_->Unlink(dir, "response", tar).code(), StatusCode::kNotPermitted);
  EXPECT_TRUE(store_->Unlink(dir, "response", other).ok());
  EXPECT_TRUE(store_->Unlink(dir, "transcript", tar).ok());  // another file
  ASSERT_TRUE(store_->Unlink(dir, "kv.safetensors", tar).ok());
  EXPECT_EQ(store_->Unlink(dir, "kv.safetensors", tar).code(), StatusCode::kNotFound);  // absent until a turn
  EXPECT_EQ(store_->Unlink(dir, "nonsense", tar).code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->GetAttr(*File("alice", "response")).ok());
  // A file an unlink hides, back after a turn, may be unlinked again at once (a cache reset, a
  // quick turn, then rm -r): tar's create of it succeeds, so it never loops on it.
  ASSERT_TRUE(Echo("alice", "prompt", "hi", kAlice).ok());
  ASSERT_TRUE(Cat("alice", "response", kAlice).ok());
  EXPECT_TRUE(store_->Unlink(dir, "kv.safetensors", tar).ok());
  // A later unlink of a view by the same process is no repeat.
  now_ms += 300;
  EXPECT_TRUE(store_->Unlink(dir, "response", tar).ok());
}

// An edit of system or config.json is applied at the close of the process that opened it (or at
// the last close), not at a child's (a fork that inherited the descriptor and exited): so an
// erasure between the two fails the opener's close with ENOENT, as for prompt and kv.safetensors,
// instead of a success whose edit had gone with the agent.
TEST_F(StoreTest, AnEditIsAppliedAtItsOpenersCloseNotAtAChilds) {
  Caller shell = kRoot;
  shell.process = 100;
  const OpenFlags write{false, true, true, false};  // O_WRONLY | O_TRUNC, as `cat x > system`
  for (const auto& [file, text] : {std::pair<const char*, const char*>{"system", "Be brief."},
                                   std::pair<const char*, const char*>{"config.json", R"({"max_tokens": 7})"}}) {
    SCOPED_TRACE(file);
    Mkdir("alice");
    const std::string before = *Cat("alice", file);
    HandleId h = *store_->Open(*File("alice", file), write, shell);
    ASSERT_TRUE(store_->Write(h, 0, text).ok());
    ASSERT_TRUE(store_->Flush(h, 200).ok());  // a child exits
    EXPECT_EQ(*Cat("alice", file), before);
    ASSERT_TRUE(store_->Flush(h, 100).ok());  // the opener closes
    store_->Release(h);
    EXPECT_NE(*Cat("alice", file), before);
    h = *store_->Open(*File("alice", file), write, shell);
    ASSERT_TRUE(store_->Write(h, 0, " ").ok());
    ASSERT_TRUE(store_->Flush(h, 200).ok());
    ASSERT_TRUE(store_->RemoveAgent(kRootInode, "alice", kRoot).ok());
    EXPECT_EQ(store_->Flush(h, 100).code(), StatusCode::kNotFound);
    store_->Release(h);
  }
}

TEST_F(StoreTest, InodesOfErasedAgentsLiveUntilForgotten) {
  InodeId dir = Mkdir("alice");  // one kernel reference
  size_t before = store_->InodeCount();
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "alice", kRoot).ok());
  EXPECT_EQ(store_->InodeCount(), before - 7);  // its files had no references
  store_->Forget(dir, 1);
  EXPECT_EQ(store_->InodeCount(), before - 8);
  // A readdirplus listing taken before the erasure must not hand the kernel the gone node.
  EXPECT_FALSE(store_->CountLookup(dir));
}

// Agent churn leaves nothing behind here: once agents made, used and erased are forgotten by the
// kernel, the inode and handle tables are as they were (the engine's records: its own test).
TEST_F(StoreTest, ErasedAgentsLeaveNoNodesOrHandlesOnceForgotten) {
  Mkdir("keeper");
  const size_t inodes = store_->InodeCount(), handles = store_->HandleCount();
  for (int i = 0; i < 20; ++i) {
    const std::string name = i % 2 == 0 ? "same" : "agent" + std::to_string(i);
    const InodeId dir = Mkdir(name);            // the kernel's references: mkdir,
    ASSERT_TRUE(Echo(name, "prompt", "hi").ok());  // a lookup of dir and prompt,
    ASSERT_TRUE(Cat(name, "response").ok());       // and of dir and response
    EXPECT_GT(store_->InodeCount(), inodes);
    ASSERT_TRUE(store_->RemoveAgent(kRootInode, name, kRoot).ok());
    store_->Forget(dir, 3);
    store_->Forget(InodeTable::AgentFileInode(dir, AgentFile::kPrompt), 1);
    store_->Forget(InodeTable::AgentFileInode(dir, AgentFile::kResponse), 1);
    EXPECT_EQ(store_->InodeCount(), inodes) << name;
    EXPECT_EQ(store_->HandleCount(), handles) << name;
  }
}

TEST_F(StoreTest, ForgettingMoreThanWasLookedUpAborts) {
  InodeId dir = Mkdir("alice");
  EXPECT_DEATH(store_->Forget(dir, 2), "broken invariant");
}

// rmdir during a turn wakes its readers with ENOENT, whether the turn's cancellation or the
// erasure reaches them first.
TEST_F(StoreTest, EraseWakesReadersOfTheAgent) {
  Result<std::string> result = Status(StatusCode::kInternal, "not run");
  std::thread reader = BlockedResponseReader("alice", &result);
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "alice", kRoot).ok());
  reader.join();
  // ENOENT (erased), not EIO (a failed turn): the reader can tell the two apart.
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound) << result.status().message();
  engine_->HoldTurns(false);
}

// An erasure that fails after cancelling the running turn keeps the agent: its readers get
// EIO (the turn failed), not the ENOENT that would tell them the agent is gone.
TEST_F(StoreTest, ReadersOfATurnCancelledByAFailedErasureGetEio) {
  Result<std::string> result = Status(StatusCode::kInternal, "not run");
  std::thread reader = BlockedResponseReader("alice", &result);
  engine_->FailNextErase(IoError("writing the erasure's record: Input/output error"));
  const Status removed = store_->RemoveAgent(kRootInode, "alice", kRoot);
  reader.join();
  EXPECT_EQ(removed.code(), StatusCode::kIoError) << removed.message();
  EXPECT_EQ(result.status().code(), StatusCode::kIoError) << result.status().message();
  engine_->HoldTurns(false);
  EXPECT_TRUE(Cat("alice", "status.json").ok()) << "the agent stays";
  EXPECT_TRUE(Echo("alice", "prompt", "again").ok());
  EXPECT_TRUE(Cat("alice", "response").ok());
}

// Tools that replace a file by unlink and create (tar -x without --overwrite, mv from another
// filesystem, install, cp --remove-destination) need the name free after the unlink, then a
// create that succeeds (with O_EXCL too). system, config.json and kv.safetensors are absent
// after an unlink until created again (opened from empty: kv.safetensors imports at close) or
// the agent's next turn; the views (status.json, ...) stay, and a create of one is refused.
TEST_F(StoreTest, AWritableFileUnlinkedIsAbsentUntilCreatedAgainOrTheNextTurn) {
  const InodeId dir = Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  ASSERT_TRUE(Echo("alice", "prompt", "hello").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());  // the turn ended: an import may run
  const std::string exported = *Cat("alice", "kv.safetensors");
  ASSERT_FALSE(exported.empty());
  auto listed = [&](const std::string& name) {
    const HandleId h = *store_->OpenDir(dir, kRoot);
    const auto entries = store_->DirEntries(h);
    store_->ReleaseDir(h);
    return std::any_of(entries->begin(), entries->end(), [&](const DirEntry& e) { return e.name == name; });
  };
  for (const char* f : {"kv.safetensors", "config.json", "system"}) {
    SCOPED_TRACE(f);
    ASSERT_TRUE(listed(f));
    EXPECT_EQ(store_->Create(dir, f, WriteTruncFlags(), kRoot).status().code(), StatusCode::kAlreadyExists);
    ASSERT_TRUE(store_->Unlink(dir, f, kRoot).ok());
    EXPECT_EQ(store_->Lookup(dir, f).status().code(), StatusCode::kNotFound);
    EXPECT_FALSE(listed(f));
  }
  // Created again: kv.safetensors imports what is written; config.json applies it.
  auto create_and_write = [&](const std::string& name, const std::string& text) -> Status {
    KVFS_ASSIGN_OR_RETURN(auto created, store_->Create(dir, name, WriteTruncFlags(), kRoot));
    EXPECT_EQ(created.first.ino, *File("alice", name));
    Result<size_t> written = store_->Write(created.second, 0, text);
    Status flushed = store_->Flush(created.second);
    store_->Release(created.second);
    store_->Forget(created.first.ino, 1);
    KVFS_RETURN_IF_ERROR(written.status());
    return flushed;
  };
  const Status imported = create_and_write("kv.safetensors", exported);
  ASSERT_TRUE(imported.ok()) << imported.message();
  EXPECT_TRUE(listed("kv.safetensors"));
  EXPECT_EQ(*Cat("alice", "kv.safetensors"), exported);  // the cache is back
  ASSERT_TRUE(create_and_write("config.json", R"({"max_tokens": 7})").ok());
  EXPECT_EQ(engine_->GetAgent("alice")->settings.max_tokens, 7);
  EXPECT_TRUE(listed("config.json"));
  EXPECT_FALSE(listed("system"));
  // A view cannot be created; the next turn shows system again, as it was.
  ASSERT_TRUE(store_->Unlink(dir, "status.json", kRoot).ok());
  EXPECT_TRUE(listed("status.json"));
  EXPECT_EQ(store_->Create(dir, "status.json", WriteTruncFlags(), kRoot).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->Create(dir, "notes.txt", WriteTruncFlags(), kRoot).status().code(), StatusCode::kNotPermitted);
  ASSERT_TRUE(Echo("alice", "prompt", "again").ok());
  EXPECT_TRUE(listed("system"));
  EXPECT_TRUE(store_->Lookup(dir, "system").ok());
  EXPECT_EQ(*Cat("alice", "system"), "Be brief.");
}

// kv.safetensors opened for writing without O_TRUNC (dd conv=notrunc, truncate -s) starts as the
// export, as any file starts as what it holds: a write in place imports what it became.
TEST_F(StoreTest, KvCacheOpenedWriteOnlyWithoutTruncStartsAsTheExport) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "hello").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  const std::string exported = *Cat("alice", "kv.safetensors");
  const InodeId ino = *File("alice", "kv.safetensors");
  const HandleId h = *store_->Open(ino, OpenFlags{false, true, false, false}, kRoot);
  EXPECT_EQ(store_->GetAttr(ino, h)->size, exported.size());
  ASSERT_EQ(*store_->Write(h, 0, exported.substr(0, 1)), 1u);  // the same byte: an import of the same cache
  EXPECT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "kv.safetensors"), exported);
}

}  // namespace
}  // namespace kvfs::fs
