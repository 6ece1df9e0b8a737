// The engine makes a lost device again while it is idle, so that the next turn does not wait
// for it (a new VkDevice and its weight upload): a scripted device behind the FallbackBackend,
// lost during a turn, comes back with no pass run, and what the engine reports (Stats, which
// .status.json and .metrics show) follows. Replies equal the uncached reference's throughout:
// the device, the CPU in its place and the remade device run the same kernels.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/backend/fallback_backend.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/scripted_device.h"

namespace kvfs {
namespace {

using testing::RunTurn;
using testing::ScriptedDevice;
using testing::TurnOutcome;

class EngineRecoveryTest : public testing::EngineTestBase {
 protected:
  // Options whose backend is a scripted device with the CPU behind it; tries to make a lost
  // device again start `first_delay_ms` after the loss, and the first `failures` fail.
  EngineOptions RecoveringOptions(int64_t first_delay_ms, int failures) {
    fail_makes_ = failures;
    EngineOptions o = Options();
    o.make_backend = [this, first_delay_ms](const Model& model) -> Result<std::unique_ptr<Backend>> {
      DeviceRecovery recovery;
      recovery.first_delay_ms = first_delay_ms;
      recovery.max_delay_ms = 60000;
      recovery.make = [this, &model]() -> Result<std::unique_ptr<Backend>> {
        ++make_calls_;
        if (fail_makes_ > 0) {
          --fail_makes_;
          return Unavailable("no Vulkan device 0 (scripted)");
        }
        auto device = std::make_unique<ScriptedDevice>(model, Kernels());
        device_ = device.get();
        return std::unique_ptr<Backend>(std::move(device));
      };
      auto device = std::make_unique<ScriptedDevice>(model, Kernels());
      device_ = device.get();
      return std::unique_ptr<Backend>(
          std::make_unique<FallbackBackend>(model, std::move(device), Kernels(), std::move(recovery)));
    };
    return o;
  }
  // The kernels of the fixture's reference (the best this CPU has).
  static CpuOptions Kernels() { return CpuOptions{1, nullptr}; }

  // Polls the engine's status until `done` holds (at most 20 s).
  static EngineStatus WaitFor(AgentEngine& engine, const std::function<bool(const EngineStatus&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    EngineStatus st = engine.Stats();
    while (!done(st) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      st = engine.Stats();
    }
    return st;
  }

  // A greedy turn whose reply must equal the reference's. Returns the engine's status and the
  // tries to make a device so far, as they were when the turn ended (before the reference run).
  std::pair<EngineStatus, int> Turn(AgentEngine& engine, const char* text) {
    TurnOutcome out = RunTurn(engine, "alice", text);
    const std::pair<EngineStatus, int> after{engine.Stats(), make_calls_.load()};
    EXPECT_TRUE(out.stats.ok()) << out.stats.status().message();
    if (!out.stats.ok()) return after;
    EXPECT_EQ(out.reply, Reference(testing::ReadManifest(Options().store_dir, "alice"), *out.stats, 20));
    return after;
  }

  // An engine over RecoveringOptions with agent "alice" (greedy) after its first turn, on the
  // device; null after a failure (reported).
  std::unique_ptr<AgentEngine> StartWithOneTurn(int64_t first_delay_ms, int failures) {
    auto engine = CreateEngine(RecoveringOptions(first_delay_ms, failures));
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    if (!engine.ok()) return nullptr;
    EXPECT_TRUE((*engine)->CreateAgent("alice", 1000).ok());
    Greedy(**engine, "alice");
    Turn(**engine, testing::kTurns[0]);
    return std::move(*engine);
  }

  std::atomic<ScriptedDevice*> device_{nullptr};  // the device made last (set on the engine thread)
  std::atomic<int> make_calls_{0};
  std::atomic<int> fail_makes_{0};
};

TEST_F(EngineRecoveryTest, ALostDeviceIsMadeAgainWhileIdle) {
  // The wait (1.5 s) is far longer than a turn of this tiny model, also under sanitizers.
  auto engine = StartWithOneTurn(/*first_delay_ms=*/1500, /*failures=*/0);
  ASSERT_NE(engine, nullptr);
  AgentEngine& e = *engine;
  ScriptedDevice* first = device_.load();
  EXPECT_GT(first->passes.load(), 0);
  EXPECT_EQ(e.Stats().cpu_fallback_steps, 0);

  // Lost while idle: the loss shows at the next turn's first pass, which the CPU reruns.
  first->lost = true;
  const EngineStatus lost = Turn(e, testing::kTurns[1]).first;
  EXPECT_GT(lost.cpu_fallback_steps, 0);
  EXPECT_EQ(lost.device_losses, 1);
  ASSERT_EQ(lost.device_remakes, 0) << "made again within the turn: the turn outlasted the wait";
  EXPECT_TRUE(lost.device_lost);

  // With no turn to run, the engine makes the device again once the wait is over.
  const EngineStatus back = WaitFor(e, [](const EngineStatus& st) { return st.device_remakes > 0; });
  ASSERT_EQ(back.device_remakes, 1) << "not made again while idle";
  EXPECT_FALSE(back.device_lost);
  EXPECT_EQ(back.device_losses, 1);
  EXPECT_EQ(back.device_remake_failures, 0);
  EXPECT_EQ(back.forward_passes, lost.forward_passes);  // no pass made it
  EXPECT_EQ(make_calls_.load(), 1);
  ScriptedDevice* remade = device_.load();
  EXPECT_EQ(remade->passes.load(), 0);  // (the first device ran passes)

  // The next turn runs on it, with no step on the CPU.
  Turn(e, testing::kTurns[2]);
  EXPECT_GT(remade->passes.load(), 0);
  EXPECT_EQ(e.Stats().cpu_fallback_steps, lost.cpu_fallback_steps);
}

// Failed tries while idle back off (400 ms after the loss, then 800 and 1600 ms later) and are
// reported; the third makes it. An idle engine with a healthy device has nothing to do (no
// tries at all).
TEST_F(EngineRecoveryTest, FailedTriesWhileIdleBackOffAndAreReported) {
  auto engine = StartWithOneTurn(/*first_delay_ms=*/400, /*failures=*/2);
  ASSERT_NE(engine, nullptr);
  AgentEngine& e = *engine;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(make_calls_.load(), 0);

  device_.load()->lost = true;
  const auto lost_at = std::chrono::steady_clock::now();
  const auto [lost, makes_in_turn] = Turn(e, testing::kTurns[1]);
  ASSERT_EQ(makes_in_turn, 0) << "a try within the turn: the turn outlasted the wait";
  const EngineStatus back = WaitFor(e, [](const EngineStatus& st) { return st.device_remakes > 0; });
  const auto waited = std::chrono::steady_clock::now() - lost_at;
  ASSERT_EQ(back.device_remakes, 1);
  EXPECT_EQ(back.device_remake_failures, 2);
  EXPECT_EQ(make_calls_.load(), 3);
  EXPECT_EQ(back.forward_passes, lost.forward_passes);  // all three tries while idle
  EXPECT_GE(waited, std::chrono::milliseconds(400 + 800 + 1600));
  EXPECT_FALSE(back.device_lost);
  Turn(e, testing::kTurns[2]);
  EXPECT_EQ(e.Stats().device_remakes, 1);
}

}  // namespace
}  // namespace kvfs
