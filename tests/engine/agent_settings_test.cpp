// config.json <-> AgentSettings: strict parsing, round trip.
#include <gtest/gtest.h>

#include "engine/runtime/agent_engine.h"

namespace kvfs {
namespace {

TEST(AgentSettings, RoundTripsThroughJson) {
  AgentSettings s;
  s.sampling.temperature = 0.3f;
  s.sampling.top_k = 7;
  s.sampling.seed = 42;
  s.max_tokens = 99;
  s.stop = {"\n\n", "THE END"};
  s.kv = "q8";
  nlohmann::json j = AgentSettingsToJson(s);
  EXPECT_EQ(j["temperature"].dump(), "0.3");  // short decimals, not 0.30000001192092896
  auto back = ParseAgentSettings(j.dump(), AgentSettings{});
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(AgentSettingsToJson(*back), j);
  EXPECT_EQ(back->stop, s.stop);
  EXPECT_EQ(back->sampling.seed, 42u);
}

TEST(AgentSettings, MissingKeysKeepTheBase) {
  AgentSettings base;
  base.max_tokens = 12;
  auto s = ParseAgentSettings(R"({"top_p": 0.5})", base);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->max_tokens, 12);
  EXPECT_FLOAT_EQ(s->sampling.top_p, 0.5f);
  EXPECT_TRUE(ParseAgentSettings("{}", base).ok());
}

// JSON has one number type: 48.0 (as Python's json.dumps(48.0) writes it) is the integer 48.
TEST(AgentSettings, IntegralFloatsAreIntegers) {
  auto s = ParseAgentSettings(R"({"max_tokens": 48.0, "top_k": 4e1, "seed": 7.0})", AgentSettings{});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->max_tokens, 48);
  EXPECT_EQ(s->sampling.top_k, 40);
  EXPECT_EQ(s->sampling.seed, 7u);
  // The largest double below 2^64 is a seed; 2^64 is not.
  s = ParseAgentSettings(R"({"seed": 1.8446744073709550e19})", AgentSettings{});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->sampling.seed, 18446744073709549568u);
  EXPECT_FALSE(ParseAgentSettings(R"({"seed": 1.8446744073709552e19})", AgentSettings{}).ok());
}

TEST(AgentSettings, BadInputNamesTheKey) {
  auto expect_error = [](const std::string& json, const std::string& key) {
    auto s = ParseAgentSettings(json, AgentSettings{});
    ASSERT_FALSE(s.ok()) << json;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(key), std::string::npos) << s.status().message();
  };
  expect_error(R"({"temperature": -1})", "temperature");
  expect_error(R"({"temperature": "hot"})", "temperature");
  expect_error(R"({"top_k": 1.5})", "top_k");
  expect_error(R"({"max_tokens": 1e300})", "max_tokens");
  expect_error(R"({"max_tokens": 0.0})", "max_tokens");
  expect_error(R"({"top_p": 2})", "top_p");
  expect_error(R"({"max_tokens": 0})", "max_tokens");
  expect_error(R"({"seed": -3})", "seed");
  expect_error(R"({"seed": 1.5})", "seed");
  expect_error(R"({"seed": -1.0})", "seed");
  expect_error(R"({"stop": "x"})", "stop");
  expect_error(R"({"stop": [""]})", "stop");
  expect_error(R"({"kv": "q5"})", "kv");
  expect_error(R"({"tempreature": 1})", "tempreature");
  expect_error(R"([1])", "object");
  expect_error(R"({"a":)", "JSON");
  // Which of two values would count is up to the parser: refused, as the store's files are.
  expect_error(R"({"temperature": 0.5, "temperature": 0.7})", "duplicate key \"temperature\"");
}

TEST(AgentSettings, StateNames) {
  EXPECT_EQ(AgentStateName(AgentState::kCold), "cold");
  EXPECT_EQ(AgentStateName(AgentState::kGenerating), "generating");
  EXPECT_EQ(AgentStateName(AgentState::kError), "error");
}

}  // namespace
}  // namespace kvfs
