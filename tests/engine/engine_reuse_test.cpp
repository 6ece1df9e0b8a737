// What a turn reuses of its agent's cache when the context it renders is not a plain extension
// of the cached text (context_text.h), on the real stories260K model: the cache is kept up to
// the first character that differs, across restarts too, and nothing a user would not expect
// (a newline echo adds, a control token, a stop string) costs a recomputation.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "engine/runtime/engine.h"
#include "engine/store/manifest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

using testing::ReadManifest;
using testing::RunTurn;
using testing::TurnOutcome;
using testing::kTurns;

using EngineReuseTest = testing::EngineTestBase;

// As a prompt's, a system prompt's one trailing newline (what `echo > system` writes) is not part
// of the message: the model sees the same context with and without it, and the file keeps it.
TEST_F(EngineReuseTest, OneTrailingNewlineOfTheSystemPromptIsNotPartOfIt) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  std::map<std::string, std::string> replies;
  std::map<std::string, int64_t> tokens;
  for (const auto& [name, system] : std::map<std::string, std::string>{
           {"plain", "Tom had a red car."}, {"echoed", "Tom had a red car.\n"}, {"none", ""}, {"newline", "\n"}}) {
    ASSERT_TRUE((*engine)->CreateAgent(name, 0).ok());
    Greedy(**engine, name);
    if (!system.empty()) {
      ASSERT_TRUE((*engine)->SetSystem(name, system).ok());
    }
    TurnOutcome out = RunTurn(**engine, name, kTurns[0]);
    ASSERT_TRUE(out.stats.ok()) << name;
    replies[name] = out.reply;
    tokens[name] = (*engine)->GetAgent(name)->context_tokens;
  }
  EXPECT_EQ(replies["echoed"], replies["plain"]);
  EXPECT_EQ(tokens["echoed"], tokens["plain"]);
  EXPECT_EQ(replies["newline"], replies["none"]);
  EXPECT_EQ(tokens["newline"], tokens["none"]);
  EXPECT_GT(tokens["plain"], tokens["none"]);  // the system text itself is in the context
  EXPECT_EQ((*engine)->GetAgent("echoed")->system, "Tom had a red car.\n");
  // Adding the newline changes nothing the model sees: the next turn extends the cache.
  ASSERT_TRUE((*engine)->SetSystem("plain", "Tom had a red car.\n").ok());
  TurnOutcome next = RunTurn(**engine, "plain", kTurns[1]);
  ASSERT_TRUE(next.stats.ok());
  EXPECT_EQ(next.stats->match, "extend");
}

// A control token generated inside a reply (stories260K, greedy, emits <s> between two stories)
// is in the cache but not in the reply's text, which is what the next turn renders: the text
// kept behind the cache must be the reply's too, so that the next turn still extends the whole
// cache instead of diverging at that token.
TEST_F(EngineReuseTest, AControlTokenInsideAReplyLeavesTheNextTurnExtending) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice", "f16", 360);
  TurnOutcome first = RunTurn(**engine, "alice", "Once upon a time");
  ASSERT_TRUE(first.stats.ok());
  const store::Manifest m = ReadManifest(Options().store_dir, "alice");
  const TokenId bos = model_->tokenizer().bos();
  ASSERT_GT(std::count(m.tokens.begin() + 1, m.tokens.end(), bos), 0) << "the reply holds no <s>: pick another prompt";
  EXPECT_EQ(first.reply.find("<s>"), std::string::npos);
  TurnOutcome next = RunTurn(**engine, "alice", " The end.");
  ASSERT_TRUE(next.stats.ok());
  EXPECT_EQ(next.stats->match, "extend");
  EXPECT_EQ(next.stats->reused_tokens, static_cast<int64_t>(m.tokens.size()));
}

// A stop string of several tokens: its first tokens were fed to the model (in the cache), but the
// reply ends before the stop string, and the next turn renders the reply. The cache is kept up
// to where the texts part, not recomputed from the first reply on (as when the context was
// matched by re-encoding it), and the same holds after a restart and for an agent that imports
// the cache (kv.safetensors carries where each token's text ends).
TEST_F(EngineReuseTest, AStopStringOfSeveralTokensCostsOnlyItsOwnTokens) {
  enum class Then { kSameEngine, kRestart, kImport };
  for (const Then then : {Then::kSameEngine, Then::kRestart, Then::kImport}) {
    const bool restart = then == Then::kRestart;
    SCOPED_TRACE(then == Then::kRestart  ? "restart before the next turn"
                 : then == Then::kImport ? "an agent that imported the cache"
                                         : "same engine");
    std::filesystem::remove_all(dir_ / "store");
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    // Two agents with the same history; bob's third reply shows where a stop string of several
    // tokens (". X") would end alice's.
    for (const char* name : {"alice", "bob"}) {
      ASSERT_TRUE((*engine)->CreateAgent(name, 0).ok());
      Greedy(**engine, name, "f16", 64);
      ASSERT_TRUE(RunTurn(**engine, name, "Once upon a time").stats.ok());
      ASSERT_TRUE(RunTurn(**engine, name, " The dog").stats.ok());
    }
    TurnOutcome probe = RunTurn(**engine, "bob", " Then");
    ASSERT_TRUE(probe.stats.ok());
    const size_t dot = probe.reply.find('.');
    ASSERT_TRUE(dot != std::string::npos && dot + 2 <= probe.reply.size()) << probe.reply;
    AgentSettings s = (*engine)->GetAgent("alice")->settings;
    s.stop = {probe.reply.substr(dot, 2)};
    ASSERT_TRUE((*engine)->SetSettings("alice", s).ok());
    TurnOutcome stopped = RunTurn(**engine, "alice", " Then");
    ASSERT_TRUE(stopped.stats.ok());
    ASSERT_EQ(stopped.stats->stop_reason, "stop_string");
    ASSERT_EQ(stopped.reply, probe.reply.substr(0, dot));
    // The case at hand: the stop string's first token (the '.') was fed, so the cache holds text
    // that the reply, and so the next turn's context, does not.
    const std::string cached = ReadManifest(Options().store_dir, "alice").config["context_text"].get<std::string>();
    ASSERT_TRUE(cached.ends_with(stopped.reply + ".")) << cached;
    const int64_t before = (*engine)->GetAgent("alice")->context_tokens;
    if (restart) {
      engine->reset();
      engine = CreateEngine(Options());
      ASSERT_TRUE(engine.ok());
    }
    s.stop.clear();
    std::string agent = "alice";
    if (then == Then::kImport) {
      auto exported = (*engine)->ExportCache("alice");
      ASSERT_TRUE(exported.ok()) << exported.status().message();
      agent = "carol";
      ASSERT_TRUE((*engine)->CreateAgent(agent, 0).ok());
      ASSERT_TRUE((*engine)->ImportCache(agent, *exported).ok());
    }
    ASSERT_TRUE((*engine)->SetSettings(agent, s).ok());
    TurnOutcome next = RunTurn(**engine, agent, " Hi");
    ASSERT_TRUE(next.stats.ok());
    // The stop string's fed tokens (its first characters) are all that is recomputed.
    EXPECT_GE(next.stats->reused_tokens, before - 3);
    // And what is kept is what an uncached run over the same tokens gives: the reply equals it.
    EXPECT_EQ(next.reply, Reference(ReadManifest(Options().store_dir, agent), *next.stats, 64));
  }
}

// A cache dropped whole (rm kv.safetensors, another kv format in config.json, a restart with
// another --block-tokens) is recomputed from the tokens it held, not from the conversation's text
// encoded again: the <s> the model generated inside its reply has no text, so the text alone
// would give the model another context (one token fewer) and other replies.
TEST_F(EngineReuseTest, ADroppedCacheIsRecomputedFromItsTokens) {
  const TokenId bos = model_->tokenizer().bos();
  store::Manifest original;
  uint32_t uid = 0;  // one per agent: agents of one uid share blocks of the same tokens
  auto first_turn = [&](AgentEngine& e, const std::string& name) {
    ASSERT_TRUE(e.CreateAgent(name, ++uid).ok());
    Greedy(e, name, "f16", 360);
    ASSERT_TRUE(RunTurn(e, name, "Once upon a time").stats.ok());
    original = ReadManifest(Options().store_dir, name);
    ASSERT_GT(std::count(original.tokens.begin() + 1, original.tokens.end(), bos), 0)
        << "the reply holds no <s>: pick another prompt";
  };
  auto expect_rebuilt = [&](AgentEngine& e, const std::string& name, const char* how) {
    SCOPED_TRACE(how);
    TurnOutcome next = RunTurn(e, name, " The end.");
    ASSERT_TRUE(next.stats.ok()) << next.stats.status().message();
    EXPECT_EQ(next.stats->match, "rebuild");
    EXPECT_EQ(next.stats->reused_tokens, 0);
    const store::Manifest m = ReadManifest(Options().store_dir, name);
    ASSERT_GT(m.tokens.size(), original.tokens.size());
    EXPECT_TRUE(std::equal(original.tokens.begin(), original.tokens.end(), m.tokens.begin()))
        << "the context the model sees changed";
  };
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    first_turn(**engine, "erased");
    ASSERT_TRUE((*engine)->EraseCache("erased").ok());
    EXPECT_EQ((*engine)->GetAgent("erased")->context_tokens, 0);  // nothing cached
    expect_rebuilt(**engine, "erased", "rm kv.safetensors");

    first_turn(**engine, "reformatted");
    AgentSettings s = (*engine)->GetAgent("reformatted")->settings;
    s.kv = "q8";
    ASSERT_TRUE((*engine)->SetSettings("reformatted", s).ok());
    expect_rebuilt(**engine, "reformatted", "another kv format");

    // Dropped and then restarted before the next turn: the tokens are in the manifest.
    first_turn(**engine, "erased_then_restarted");
    ASSERT_TRUE((*engine)->EraseCache("erased_then_restarted").ok());
    first_turn(**engine, "reblocked");
  }
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  original = ReadManifest(Options().store_dir, "erased_then_restarted");
  EXPECT_TRUE(original.blocks.empty() && !original.tail);
  expect_rebuilt(**engine, "erased_then_restarted", "rm kv.safetensors, then a restart");
  engine->reset();
  original = ReadManifest(Options().store_dir, "reblocked");
  block_tokens_ *= 2;
  engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  expect_rebuilt(**engine, "reblocked", "a restart with another block size");
}

}  // namespace
}  // namespace kvfs
