// Utf8Validator, AuditLog, InodeTable.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <csignal>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fs/audit_log.h"
#include "fs/inode_table.h"
#include "fs/utf8.h"
#include "tests/test_support.h"

namespace kvfs::fs {
namespace {

bool Valid(std::string_view s) {
  Utf8Validator v;
  return v.Feed(s) && v.Complete();
}

AuditEvent EventAt1700000000000(const char* agent, const char* action) {
  AuditEvent e;
  e.time_ms = 1700000000000;
  e.agent = agent;
  e.action = action;
  return e;
}

// The "agent" of each line of an audit log's text.
std::vector<std::string> AgentsOfLines(const std::string& text) {
  std::vector<std::string> agents;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    agents.push_back(nlohmann::json::parse(text.substr(at, end - at))["agent"].get<std::string>());
    at = end + 1;
  }
  return agents;
}

TEST(Utf8Validator, AcceptsValidText) {
  EXPECT_TRUE(Valid(""));
  EXPECT_TRUE(Valid("plain ascii\n"));
  EXPECT_TRUE(Valid("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"));  // é € 😀 U+10FFFF
}

TEST(Utf8Validator, RejectsInvalidSequences) {
  for (std::string_view bad : {"\x80", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                               "\xF5\x80\x80\x80", "\xFF", "\xC3\x28", "a\xE2\x82"}) {
    EXPECT_FALSE(Valid(bad)) << nlohmann::json(std::string(bad)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  }
}

TEST(Utf8Validator, CharactersMaySpanFeeds) {
  Utf8Validator v;
  EXPECT_TRUE(v.Feed("\xF0\x9F"));
  EXPECT_FALSE(v.Complete());
  EXPECT_TRUE(v.Feed("\x98"));
  EXPECT_TRUE(v.Feed("\x80 ok"));
  EXPECT_TRUE(v.Complete());
  EXPECT_FALSE(v.Feed("\xFF"));
  EXPECT_FALSE(v.Feed("fine"));  // stays invalid
}

TEST(AuditLog, AppendsJsonLinesToAFileThatSurvivesReopening) {
  const kvfs::testing::TempDir dir;  // with the log's intents directory
  const std::string path = dir / "audit.log";
  {
    auto log = AuditLog::Open(path);
    ASSERT_TRUE(log.ok());
    AuditEvent e;
    e.time_ms = 1700000000123;
    e.uid = 1000;
    e.agent = "alice";
    e.action = "erase";
    e.erased = store::EraseReport{4096, 2, 1, 3};
    ASSERT_TRUE((*log)->Append(e).ok());
  }
  auto log = AuditLog::Open(path);
  ASSERT_TRUE(log.ok());
  AuditEvent e;
  e.time_ms = 1700000000456;
  e.agent = "bob";
  e.action = "export";
  e.bytes = 77;
  ASSERT_TRUE((*log)->Append(e).ok());
  std::string text = *(*log)->Read(0, 1 << 20);
  EXPECT_EQ((*log)->Size(), text.size());
  auto first = nlohmann::json::parse(text.substr(0, text.find('\n')));
  EXPECT_EQ(first["time"], "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(first["uid"], 1000);
  EXPECT_EQ(first["bytes_freed"], 4096);
  EXPECT_EQ(first["blocks_freed"], 2);
  EXPECT_EQ(first["blocks_kept_shared"], 1);
  auto second = nlohmann::json::parse(text.substr(text.find('\n') + 1));
  EXPECT_EQ(second["action"], "export");
  EXPECT_EQ(second["bytes"], 77);
}

// A log whose last line was cut (a crash while another program appended, a partial copy): the
// next line starts on a line of its own, and parses.
TEST(AuditLog, ALineAfterACutLineStartsALineOfItsOwn) {
  const kvfs::testing::TempDir dir;
  const std::string path = dir / "audit.log";
  std::ofstream(path, std::ios::trunc) << "{\"action\":\"erase\",\"agent\":\"tor";
  {
    auto log = AuditLog::Open(path);
    ASSERT_TRUE(log.ok());
    AuditEvent e;
    e.time_ms = 1700000000123;
    e.agent = "g10";
    e.action = "erase_cache";
    ASSERT_TRUE((*log)->Append(e).ok());
    EXPECT_EQ((*log)->Size(), std::filesystem::file_size(path));
  }
  std::ifstream in(path);
  std::string cut, line;
  std::getline(in, cut);
  std::getline(in, line);
  EXPECT_EQ(cut, "{\"action\":\"erase\",\"agent\":\"tor");
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  ASSERT_TRUE(j.is_object()) << line;
  EXPECT_EQ(j["agent"], "g10");
}

// A line that cannot be appended (the disk is full: here the process's file size limit) is kept
// and written, in order, before the next one once there is room, not lost.
TEST(AuditLog, ALineThatCouldNotBeWrittenIsWrittenWithTheNext) {
  const kvfs::testing::TempDir dir;
  const std::string path = dir / "audit.log";
  auto log = AuditLog::Open(path);
  ASSERT_TRUE(log.ok());
  auto event = [](const char* agent) { return EventAt1700000000000(agent, "export"); };
  ASSERT_TRUE((*log)->Append(event("first")).ok());
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit full = before;
  full.rlim_cur = std::filesystem::file_size(path);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &full), 0);
  const Status failed = (*log)->Append(event("while_full"));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_FALSE(failed.ok());
  ASSERT_TRUE((*log)->Append(event("after")).ok());
  EXPECT_EQ(AgentsOfLines(*(*log)->Read(0, 1 << 20)), (std::vector<std::string>{"first", "while_full", "after"}));
}

// The audit log's fsync, failing while `g_failing_syncs` > 0 (EIO, as a disk's write error).
int g_failing_syncs = 0;
int FlakySync(int fd) {
  if (g_failing_syncs > 0) {
    --g_failing_syncs;
    errno = EIO;
    return -1;
  }
  return ::fsync(fd);
}

// A line whose write went through but whose fsync failed: an export's (AppendBefore), whose
// export is then refused and retried, is cut off, so the log holds one line for the one export
// that happened; a line of a change already made (Append) stays, once, not again with the next.
TEST(AuditLog, AFailedFsyncLeavesOneLinePerOperation) {
  const kvfs::testing::TempDir dir;
  const std::string path = dir / "audit.log";
  auto log = AuditLog::Open(path, FlakySync);
  ASSERT_TRUE(log.ok());
  auto event = EventAt1700000000000;
  auto agents = [&] {  // of the file itself
    std::ifstream in(path);
    return AgentsOfLines(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  };
  ASSERT_TRUE((*log)->Append(event("config_a", "config")).ok());
  g_failing_syncs = 1;
  EXPECT_FALSE((*log)->AppendBefore(event("export_x", "export")).ok());
  EXPECT_EQ(agents(), (std::vector<std::string>{"config_a"}));
  EXPECT_EQ((*log)->Size(), std::filesystem::file_size(path));
  ASSERT_TRUE((*log)->AppendBefore(event("export_x", "export")).ok());  // the retry
  g_failing_syncs = 1;
  EXPECT_FALSE((*log)->Append(event("config_b", "config")).ok());
  ASSERT_TRUE((*log)->Append(event("config_c", "config")).ok());
  EXPECT_EQ(agents(), (std::vector<std::string>{"config_a", "export_x", "config_b", "config_c"}));
  EXPECT_EQ((*log)->Size(), std::filesystem::file_size(path));
}

TEST(InodeTable, CountsReferencesAndDropsRemovedNodes) {
  InodeTable table;
  size_t fixed = table.size();
  InodeId p = table.AddPrefix("p");
  table.Ref(p);
  table.Ref(p);
  table.RemovePrefix(p);
  EXPECT_NE(table.Find(p), nullptr);
  table.Forget(p, 1);
  EXPECT_NE(table.Find(p), nullptr);
  table.Forget(p, 1);
  EXPECT_EQ(table.Find(p), nullptr);
  EXPECT_EQ(table.size(), fixed);
  EXPECT_DEATH(table.Forget(kRootInode, 1), "broken invariant");
  EXPECT_DEATH(table.Forget(999999, 1), "unknown inode");
}

// An erasure's intent is on disk before the erasure starts and until its line is written: a
// log reopened after a crash lists what was left, a completed or dropped intent is gone, and a
// half-written intent (a temporary file) is no intent.
TEST(AuditLog, IntentsOutliveACrashUntilCompletedOrDropped) {
  const std::string dir = ::testing::TempDir() + "/kvfs_intents_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/audit.log";
  auto event = [](const char* agent, const char* action) {
    AuditEvent e;
    e.uid = 1000;
    e.agent = agent;
    e.action = action;
    return e;
  };
  {
    auto log = AuditLog::Open(path);
    ASSERT_TRUE(log.ok());
    EXPECT_TRUE((*log)->LeftIntents().empty());
    Result<std::string> done = (*log)->Intend(event("alice", "erase"));
    Result<std::string> dropped = (*log)->Intend(event("bob", "erase_cache"));
    Result<std::string> left = (*log)->Intend(event("carol", "prefix_remove"));
    ASSERT_TRUE(done.ok() && dropped.ok() && left.ok());
    EXPECT_NE(*done, *dropped);
    // A second name for bob's intent shows what its bytes were when it went: zeros.
    const std::string second_name = dir + "/bob-intent.link";
    std::filesystem::create_hard_link(dir + "/audit.log.intents/" + *dropped + ".json", second_name);
    ASSERT_TRUE((*log)->Complete(*done, event("alice", "erase")).ok());
    (*log)->Drop(*dropped);
    std::ifstream linked(second_name, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(linked)), std::istreambuf_iterator<char>());
    EXPECT_FALSE(bytes.empty());
    EXPECT_EQ(bytes, std::string(bytes.size(), '\0')) << "an intent names its agent: zeroed before it goes";
    std::filesystem::remove(second_name);
    std::ofstream(dir + "/audit.log.intents/99-000000.tmp") << "{\"agent\": \"da";  // cut short by the crash
  }  // the crash: carol's intent stays
  auto log = AuditLog::Open(path);
  ASSERT_TRUE(log.ok());
  ASSERT_EQ((*log)->LeftIntents().size(), 1u);
  const AuditIntent& intent = (*log)->LeftIntents()[0];
  EXPECT_EQ(intent.event.agent, "carol");
  EXPECT_EQ(intent.event.action, "prefix_remove");
  EXPECT_EQ(intent.event.uid, 1000u);
  EXPECT_GT(intent.event.time_ms, 1700000000000);  // when it began: the line written now says so
  EXPECT_FALSE(std::filesystem::exists(dir + "/audit.log.intents/99-000000.tmp"));
  AuditEvent late = intent.event;
  late.completed_at_start = true;
  ASSERT_TRUE((*log)->Complete(intent.id, late).ok());
  const std::string text = *(*log)->Read(0, 1 << 20);
  const auto second = nlohmann::json::parse(text.substr(text.find('\n') + 1));
  EXPECT_EQ(second["agent"], "carol");
  EXPECT_EQ(second["completed_at_start"], true);
  EXPECT_EQ(nlohmann::json::parse(text.substr(0, text.find('\n'))).count("completed_at_start"), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/audit.log.intents"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfs::fs
