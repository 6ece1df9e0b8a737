// AgentStore over a FakeEngine: edits of system and config.json (limits, truncation, validation)
// and the order of a prompt's writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "tests/fs/store_test_util.h"

namespace kvfs::fs {
namespace {

using testing::FakeEngine;

// Edits over the size limit: a truncation to a huge size is refused (it once allocated it and
// ended the daemon on bad_alloc), and a write past the limit applies nothing of the file at
// close, not the part before the limit.
TEST_F(StoreTest, EditsOverTheLimitAreRefusedWhole) {
  StoreConfig config;
  config.max_text_bytes = 64;
  Start(testing::FakeEngineOptions{}, config);
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  InodeId system = *File("alice", "system");
  HandleId h = *store_->Open(system, OpenFlags{false, true, false, false}, kRoot);
  EXPECT_EQ(store_->Truncate(system, uint64_t{1} << 50, h, kRoot).status().code(), StatusCode::kTooLarge);
  EXPECT_EQ(store_->Truncate(system, 65, h, kRoot).status().code(), StatusCode::kTooLarge);
  EXPECT_TRUE(store_->Truncate(system, 64, h, kRoot).ok());
  ASSERT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(Cat("alice", "system")->size(), 64u);
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  // 100 bytes in 4 writes: the first two fit, the third does not.
  EXPECT_EQ(Echo("alice", "system", std::string(100, 'x'), kRoot, 4).code(), StatusCode::kTooLarge);
  EXPECT_EQ(*Cat("alice", "system"), "Be brief.");
}

// `: > system` (open with O_TRUNC, no write) empties the system prompt, as on any file.
TEST_F(StoreTest, TruncatingOpenWithoutWritesEmptiesTheSystemPrompt) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  ASSERT_EQ(*Cat("alice", "system"), "Be brief.");
  HandleId h = *store_->Open(*File("alice", "system"), WriteTruncFlags(), kRoot);
  ASSERT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "system"), "");
  EXPECT_EQ(engine_->GetAgent("alice")->system, "");
  // A shell's `: > system` closes twice (its dup2, then its restore of stdout): emptied at the
  // second, before the command returns, not at the release the kernel sends later.
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  h = *store_->Open(*File("alice", "system"), WriteTruncFlags(), kRoot);
  ASSERT_TRUE(store_->Flush(h).ok());
  EXPECT_EQ(*Cat("alice", "system"), "Be brief.");
  ASSERT_TRUE(store_->Flush(h).ok());
  EXPECT_EQ(*Cat("alice", "system"), "");
  store_->Release(h);
  // Another writer's edit after the O_TRUNC open stands (POSIX truncates at the open).
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  h = *store_->Open(*File("alice", "system"), WriteTruncFlags(), kRoot);
  ASSERT_TRUE(Echo("alice", "system", "Theirs.").ok());
  ASSERT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "system"), "Theirs.");
}

// A shell's `> system` and dd open with O_TRUNC, dup2 and close the first descriptor (a flush
// before any write, which changes nothing: the emptying waits for the last close), then write
// and close again. When a write is then refused (too large, not UTF-8), the text from before the
// open stays; when it is not, the written text is applied, as one edit. Another writer's edit
// made in between is not undone.
TEST_F(StoreTest, ARefusedWriteAfterAShellsTruncatingFlushPutsTheTextBack) {
  StoreConfig config;
  config.max_text_bytes = 64;
  Start(testing::FakeEngineOptions{}, config);
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "system", "Keep me.").ok());
  const InodeId system = *File("alice", "system");
  auto shell_write = [&](const std::string& text, StatusCode expected, const std::string& between = "") {
    const std::string before = *Cat("alice", "system");
    HandleId h = *store_->Open(system, WriteTruncFlags(), kRoot);
    ASSERT_TRUE(store_->Flush(h).ok());  // close(3) after dup2(3, 1)
    EXPECT_EQ(*Cat("alice", "system"), before);  // not emptied: a turn now still has it
    if (!between.empty()) {
      ASSERT_TRUE(Echo("alice", "system", between).ok());
    }
    uint64_t at = 0;
    for (size_t i = 0; i < text.size(); i += 16, at += 16) {
      (void)store_->Write(h, at, text.substr(i, 16));
    }
    EXPECT_EQ(store_->Flush(h).code(), expected);  // the command's exit
    store_->Release(h);
  };
  shell_write(std::string(100, 'x'), StatusCode::kTooLarge);  // dd: EFBIG
  EXPECT_EQ(*Cat("alice", "system"), "Keep me.");
  EXPECT_EQ(engine_->GetAgent("alice")->system, "Keep me.");
  shell_write("caf\xc3", StatusCode::kIllegalSequence);  // printf 'caf\xc3' > system
  EXPECT_EQ(*Cat("alice", "system"), "Keep me.");
  shell_write("New text.", StatusCode::kOk);
  EXPECT_EQ(*Cat("alice", "system"), "New text.");
  shell_write("\xff", StatusCode::kIllegalSequence, "Someone else's.");
  EXPECT_EQ(*Cat("alice", "system"), "Someone else's.");
}

// truncate(2) by path (no open file) does what an open without O_TRUNC, an ftruncate to that
// size and a close do: system cut (or padded with NULs) and applied; config.json cut and applied
// if still valid JSON, else EINVAL with nothing changed, and emptied merging nothing; a prefix cut
// and prefilled again, and left as it was when emptied (as by `: >`). kv.safetensors is not truncated; a prompt only to 0.
TEST_F(StoreTest, TruncatingByPathActsAsAnOpenFtruncateAndClose) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  const InodeId system = *File("alice", "system");
  Result<Attr> cut = store_->Truncate(system, 2, std::nullopt, kRoot);
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  EXPECT_EQ(cut->size, 2u);
  EXPECT_EQ(*Cat("alice", "system"), "Be");
  EXPECT_EQ(engine_->GetAgent("alice")->system, "Be");
  ASSERT_TRUE(store_->Truncate(system, 4, std::nullopt, kRoot).ok());
  EXPECT_EQ(engine_->GetAgent("alice")->system, std::string("Be\0\0", 4));
  EXPECT_EQ(store_->Truncate(system, uint64_t{1} << 40, std::nullopt, kRoot).status().code(), StatusCode::kTooLarge);
  ASSERT_TRUE(store_->Truncate(system, 0, std::nullopt, kRoot).ok());
  EXPECT_EQ(*Cat("alice", "system"), "");
  EXPECT_EQ(engine_->GetAgent("alice")->system, "");
  ASSERT_TRUE(Echo("alice", "config.json", "{\"max_tokens\": 7}").ok());
  const std::string config = *Cat("alice", "config.json");
  const InodeId config_ino = *File("alice", "config.json");
  ASSERT_TRUE(store_->Truncate(config_ino, 0, std::nullopt, kRoot).ok());  // merges nothing
  EXPECT_EQ(*Cat("alice", "config.json"), config);
  EXPECT_EQ(engine_->GetAgent("alice")->settings.max_tokens, 7);
  EXPECT_EQ(store_->Truncate(config_ino, 5, std::nullopt, kRoot).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*Cat("alice", "config.json"), config);  // nothing changed
  EXPECT_EQ(nlohmann::json::parse(*Cat("alice", "status.json"))["last_refused_write"]["file"], "config.json");
  EXPECT_EQ(store_->Truncate(*File("alice", "kv.safetensors"), 0, std::nullopt, kRoot).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Truncate(*File("alice", "prompt"), 3, std::nullopt, kRoot).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Truncate(system, 0, std::nullopt, kBob).status().code(), StatusCode::kPermissionDenied);

  Result<InodeId> written = WritePrefix("story.txt", "Once upon a time", kRoot);
  ASSERT_TRUE(written.ok()) << written.status().message();
  const InodeId story = *written;
  ASSERT_TRUE(store_->Truncate(story, 9, std::nullopt, kRoot).ok());
  EXPECT_EQ(*engine_->PrefixText("story.txt"), "Once upon");
  ASSERT_TRUE(store_->Truncate(story, 0, std::nullopt, kRoot).ok());  // as `: >`: rm it instead
  EXPECT_EQ(*engine_->PrefixText("story.txt"), "Once upon");
}

// `echo '{...}' >> config.json` (write-only, O_APPEND) merges what it appends, as a write to an
// emptied file does; the rendered settings are not part of what it holds.
TEST_F(StoreTest, AppendingToConfigMergesTheAppendedJson) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "config.json", R"({"max_tokens": 7, "temperature": 0.5})").ok());
  const OpenFlags append{false, true, false, true};
  HandleId h = *store_->Open(*File("alice", "config.json"), append, kRoot);
  ASSERT_TRUE(store_->Write(h, 0, "{\"max_tokens\": 9}\n").ok());
  ASSERT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  const AgentSettings settings = engine_->GetAgent("alice")->settings;
  EXPECT_EQ(settings.max_tokens, 9);
  EXPECT_FLOAT_EQ(settings.sampling.temperature, 0.5f);
  // Invalid appended JSON is refused at the write, and changes nothing.
  h = *store_->Open(*File("alice", "config.json"), append, kRoot);
  EXPECT_EQ(store_->Write(h, 0, "x y").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(engine_->GetAgent("alice")->settings.max_tokens, 9);
}

// However config.json is emptied (an open with O_TRUNC and no write, ftruncate on the open file,
// a lone newline written), its close succeeds and the settings stay: empty text merges nothing.
TEST_F(StoreTest, AnEmptiedConfigChangesNothing) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "config.json", "{\"max_tokens\": 7, \"temperature\": 0.5}").ok());
  const std::string config = *Cat("alice", "config.json");
  const InodeId ino = *File("alice", "config.json");
  HandleId h = *store_->Open(ino, WriteTruncFlags(), kRoot);
  EXPECT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  h = *store_->Open(ino, OpenFlags{false, true, false, false}, kRoot);  // truncate(1): open, then ftruncate
  ASSERT_TRUE(store_->Truncate(ino, 0, h, kRoot).ok());
  EXPECT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  ASSERT_TRUE(Echo("alice", "config.json", "\n").ok());
  EXPECT_EQ(*Cat("alice", "config.json"), config);
  EXPECT_EQ(engine_->GetAgent("alice")->settings.max_tokens, 7);
  EXPECT_FALSE(Echo("alice", "config.json", "{\"max_tokens\": ").ok());  // still: bad JSON is refused
}

// A prompt is its bytes in the order written: a write that is not at the end of them (pwrite
// back, a seek forward) refuses the whole prompt rather than reorder it.
TEST_F(StoreTest, PromptWritesOutOfOrderRefuseThePrompt) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "in three pieces", kRoot, 3).ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  const uint64_t turns = engine_->GetAgent("alice")->turns;
  for (uint64_t bad_offset : {uint64_t{0}, uint64_t{20}}) {
    HandleId h = *store_->Open(*File("alice", "prompt"), WriteTruncFlags(), kRoot);
    ASSERT_TRUE(store_->Write(h, 0, "hello world").ok());
    EXPECT_EQ(store_->Write(h, bad_offset, "J").status().code(), StatusCode::kInvalidArgument) << bad_offset;
    EXPECT_EQ(store_->Write(h, 11, "!").status().code(), StatusCode::kInvalidArgument);  // refused for good
    EXPECT_EQ(store_->Flush(h).code(), StatusCode::kInvalidArgument);
    store_->Release(h);
  }
  // An ftruncate to anything but 0 refuses it too (the text would not be what was meant).
  HandleId h = *store_->Open(*File("alice", "prompt"), WriteTruncFlags(), kRoot);
  ASSERT_TRUE(store_->Write(h, 0, "hello world").ok());
  EXPECT_EQ(store_->Truncate(*File("alice", "prompt"), 5, h, kRoot).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Flush(h).code(), StatusCode::kInvalidArgument);
  store_->Release(h);
  EXPECT_EQ(engine_->GetAgent("alice")->turns, turns);
  EXPECT_EQ(nlohmann::json::parse(*Cat("alice", "status.json"))["last_refused_write"]["file"], "prompt");
  // Emptied, it starts again: what is written next (at the writer's offset, which ftruncate
  // does not move) is the turn.
  h = *store_->Open(*File("alice", "prompt"), WriteTruncFlags(), kRoot);
  ASSERT_TRUE(store_->Write(h, 0, "discarded").ok());
  ASSERT_TRUE(store_->Truncate(*File("alice", "prompt"), 0, h, kRoot).ok());
  ASSERT_TRUE(store_->Write(h, 9, "kept").ok());
  EXPECT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  ASSERT_TRUE(Cat("alice", "response").ok());
  EXPECT_EQ(engine_->GetAgent("alice")->turns, turns + 1);
}

TEST_F(StoreTest, ConfigIsValidatedAtCloseAndBadInputChangesNothing) {
  Mkdir("alice");
  std::string before = *Cat("alice", "config.json");
  EXPECT_EQ(Echo("alice", "config.json", "{not json").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Echo("alice", "config.json", R"({"temperature": "hot"})").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Echo("alice", "config.json", R"({"max_tokens": 0})").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Echo("alice", "config.json", R"({"colour": 1})").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Echo("alice", "config.json", R"({"max_tokens": 8, "max_tokens": 9})").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*Cat("alice", "config.json"), before);
  ASSERT_TRUE(Echo("alice", "config.json", R"({"temperature": 0, "max_tokens": 32})").ok());
  auto config = nlohmann::json::parse(*Cat("alice", "config.json"));
  EXPECT_EQ(config["temperature"], 0.0);
  EXPECT_EQ(config["max_tokens"], 32);
  EXPECT_EQ(config["top_k"], 40);  // keys not written keep their values
  std::string audit = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
  EXPECT_NE(audit.find("\"action\":\"config\""), std::string::npos);
}

// An editor's in-place save (`r+`: write from 0, then ftruncate to the new length) briefly holds
// the new text followed by the old one's tail. That is judged at close, whole, not at the write.
TEST_F(StoreTest, AnInPlaceEditOfConfigIsJudgedAtClose) {
  Mkdir("alice");
  const InodeId config = *File("alice", "config.json");
  const OpenFlags read_write{true, true, false, false};
  const std::string edit = R"({"max_tokens": 7})";
  ASSERT_GT(Cat("alice", "config.json")->size(), edit.size());
  HandleId h = *store_->Open(config, read_write, kRoot);
  ASSERT_TRUE(store_->Write(h, 0, edit).ok());
  ASSERT_TRUE(store_->Truncate(config, edit.size(), h, kRoot).ok());
  EXPECT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(nlohmann::json::parse(*Cat("alice", "config.json"))["max_tokens"], 7);
  // Left with the old tail (no truncation): not JSON, refused at close; nothing changes.
  const std::string before = *Cat("alice", "config.json");
  h = *store_->Open(config, read_write, kRoot);
  ASSERT_TRUE(store_->Write(h, 0, R"({"max_tokens": 9})").ok());
  EXPECT_EQ(store_->Flush(h).code(), StatusCode::kInvalidArgument);
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "config.json"), before);
}

// An edit of system or config.json moves the agent's files' mtime, so that `cp -u` and rsync see
// it; writing what a file already says changes nothing and logs nothing.
TEST_F(StoreTest, EditsMoveTheMtimeAndNoOpEditsLogNothing) {
  Mkdir("alice");
  const InodeId system = *File("alice", "system"), config = *File("alice", "config.json");
  auto audit_lines = [&] {
    const std::string audit = *CatInode(store_->Lookup(kRootInode, ".audit.log")->ino);
    return std::count(audit.begin(), audit.end(), '\n');
  };
  int64_t mtime = store_->GetAttr(system)->mtime_ms;
  for (const auto& [file, text] : {std::pair{"system", "Be brief."}, std::pair{"config.json", R"({"max_tokens": 5})"}}) {
    SCOPED_TRACE(file);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(Echo("alice", file, text).ok());
    const int64_t edited = store_->GetAttr(system)->mtime_ms;
    EXPECT_GT(edited, mtime);
    EXPECT_EQ(store_->GetAttr(config)->mtime_ms, edited);  // every file of the agent shows it
    mtime = edited;
  }
  const auto lines = audit_lines();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(Echo("alice", "system", "Be brief.").ok());
  ASSERT_TRUE(Echo("alice", "config.json", "{}").ok());
  ASSERT_TRUE(Echo("alice", "config.json", R"({"max_tokens": 5})").ok());
  EXPECT_EQ(audit_lines(), lines);
  EXPECT_EQ(store_->GetAttr(system)->mtime_ms, mtime);
}

// Settings that parse but that the engine cannot run (kvfsd refuses kv "q4k" when its blocks are
// not whole 64-token chunks) fail at the write, where `echo ... > config.json` reports it: the
// shell never reports what close returns. Text that is not yet complete JSON still passes.
TEST_F(StoreTest, ConfigTheEngineRefusesFailsAtWrite) {
  testing::FakeEngineOptions options;
  options.refused_kv = {"q4k"};
  Start(options);
  Mkdir("alice");
  EXPECT_TRUE(nlohmann::json::parse(*Cat("alice", "status.json"))["last_refused_write"].is_null());
  std::string before = *Cat("alice", "config.json");
  InodeId ino = *File("alice", "config.json");
  HandleId h = *store_->Open(ino, WriteTruncFlags(), kRoot);
  Result<size_t> refused = store_->Write(h, 0, R"({"kv": "q4k", "max_tokens": 20})");
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("q4k"), std::string::npos) << refused.status().message();
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "config.json"), before);
  auto status = nlohmann::json::parse(*Cat("alice", "status.json"));
  ASSERT_TRUE(status["last_refused_write"].is_object()) << status.dump();
  EXPECT_EQ(status["last_refused_write"]["file"], "config.json");
  EXPECT_EQ(status["last_refused_write"]["code"], "EINVAL");
  EXPECT_EQ(status["last_refused_write"]["error"], refused.status().message());
  // Written in two pieces: the first is not complete JSON yet, the second completes it.
  EXPECT_EQ(Echo("alice", "config.json", R"({"max_tokens": 20, "kv": "q4k"})", kRoot, 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(*Cat("alice", "config.json"), before);
  ASSERT_TRUE(Echo("alice", "config.json", R"({"kv": "q8", "max_tokens": 20})").ok());
  auto config = nlohmann::json::parse(*Cat("alice", "config.json"));
  EXPECT_EQ(config["kv"], "q8");
  EXPECT_EQ(config["max_tokens"], 20);
}

TEST_F(StoreTest, SystemChangeKeepsTheConversation) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "hi").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  ASSERT_TRUE(Echo("alice", "system", "You are terse.").ok());
  EXPECT_EQ(*Cat("alice", "system"), "You are terse.");
  std::string transcript = *Cat("alice", "transcript");
  EXPECT_EQ(transcript.rfind("[system]\nYou are terse.\n\n", 0), 0u) << transcript;
  EXPECT_NE(transcript.find("[user]\nhi\n"), std::string::npos);
  EXPECT_EQ(Echo("alice", "system", "bad \xFF").code(), StatusCode::kIllegalSequence);
  EXPECT_EQ(*Cat("alice", "system"), "You are terse.");
}

}  // namespace
}  // namespace kvfs::fs
