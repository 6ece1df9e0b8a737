// Helpers for AgentStore tests: a FakeEngine, a store over it, and shorthands for the calls a
// shell would make (mkdir, echo > prompt, cat).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "fs/agent_store.h"
#include "tests/fs/fake_engine.h"

namespace kvfs::fs {

class StoreTest : public ::testing::Test {
 protected:
  static constexpr Caller kRoot{0, 0};
  static constexpr Caller kAlice{1000, 1000};
  static constexpr Caller kBob{2000, 2000};

  void SetUp() override { Start(testing::FakeEngineOptions{}); }

  void Start(testing::FakeEngineOptions options, StoreConfig config = {}) {
    store_.reset();
    engine_.reset();
    auto engine = testing::FakeEngine::Open(std::move(options));
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    engine_ = std::move(engine).value();
    auto store = AgentStore::Create(*engine_, std::move(config));
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_ = std::move(store).value();
  }

  void TearDown() override {
    if (store_) store_->BeginShutdown();
    if (engine_) engine_->Shutdown();
    if (store_) store_->WakeAllReaders();
    store_.reset();
    engine_.reset();
  }

  InodeId Mkdir(const std::string& name, Caller caller = kRoot) {
    Result<Attr> attr = store_->MakeAgent(kRootInode, name, caller);
    EXPECT_TRUE(attr.ok()) << attr.status().message();
    return attr.ok() ? attr->ino : 0;
  }

  Result<InodeId> File(const std::string& agent, const std::string& file) {
    KVFS_ASSIGN_OR_RETURN(Attr dir, store_->Lookup(kRootInode, agent));
    KVFS_ASSIGN_OR_RETURN(Attr f, store_->Lookup(dir.ino, file));
    return f.ino;
  }

  // A new agent whose turn is held (it never finishes) and a thread blocked reading its
  // response into *result, given time to block.
  std::thread BlockedResponseReader(const std::string& agent, Result<std::string>* result) {
    Mkdir(agent);
    engine_->HoldTurns(true);
    EXPECT_TRUE(Echo(agent, "prompt", "never").ok());
    std::thread reader([this, agent, result] { *result = Cat(agent, "response"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return reader;
  }

  static OpenFlags ReadFlags() { return OpenFlags{true, false, false, false}; }
  static OpenFlags WriteTruncFlags() { return OpenFlags{false, true, true, false}; }

  // echo TEXT > agent/file: open(O_WRONLY|O_TRUNC), write in `pieces` calls, close (flush).
  Status Echo(const std::string& agent, const std::string& file, const std::string& text, Caller caller = kRoot,
              size_t pieces = 1) {
    KVFS_ASSIGN_OR_RETURN(InodeId ino, File(agent, file));
    KVFS_ASSIGN_OR_RETURN(HandleId h, store_->Open(ino, WriteTruncFlags(), caller));
    size_t step = pieces <= 1 ? text.size() : (text.size() + pieces - 1) / pieces;
    Status result = Status::Ok();
    for (size_t at = 0; at < text.size() && result.ok(); at += step) {
      Result<size_t> n = store_->Write(h, at, std::string_view(text).substr(at, step));
      if (!n.ok()) result = n.status();
    }
    Status flushed = store_->Flush(h);
    store_->Release(h);
    return result.ok() ? flushed : result;
  }

  // echo TEXT > .prefixes/NAME for a new prefix: create, write, close. Its inode.
  Result<InodeId> WritePrefix(const std::string& name, const std::string& text, Caller caller = kRoot) {
    KVFS_ASSIGN_OR_RETURN(Attr prefixes, store_->Lookup(kRootInode, ".prefixes"));
    KVFS_ASSIGN_OR_RETURN(auto created, store_->Create(prefixes.ino, name, WriteTruncFlags(), caller));
    Result<size_t> written = store_->Write(created.second, 0, text);
    Status flushed = store_->Flush(created.second);
    store_->Release(created.second);
    if (!written.ok()) return written.status();
    KVFS_RETURN_IF_ERROR(flushed);
    return created.first.ino;
  }

  // cat agent/file (reads until EOF).
  Result<std::string> Cat(const std::string& agent, const std::string& file, Caller caller = kRoot,
                          Interrupt* interrupt = nullptr) {
    KVFS_ASSIGN_OR_RETURN(InodeId ino, File(agent, file));
    return CatInode(ino, caller, interrupt);
  }

  Result<std::string> CatInode(InodeId ino, Caller caller = kRoot, Interrupt* interrupt = nullptr) {
    KVFS_ASSIGN_OR_RETURN(HandleId h, store_->Open(ino, ReadFlags(), caller));
    std::string out;
    while (true) {
      Result<std::string> chunk = store_->Read(h, out.size(), 4096, interrupt);
      if (!chunk.ok()) {
        store_->Release(h);
        return chunk.status();
      }
      if (chunk->empty()) break;
      out += *chunk;
    }
    store_->Release(h);
    return out;
  }

  std::unique_ptr<testing::FakeEngine> engine_;
  std::unique_ptr<AgentStore> store_;
};

}  // namespace kvfs::fs
