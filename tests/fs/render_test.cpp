// The cache status and metrics report what became of a Vulkan device: steps the CPU ran in its
// place, a lost device and one made again; a machine where nothing fell back shows no device line.
#include <gtest/gtest.h>

#include "fs/render.h"

namespace kvfs::fs {
namespace {

// A generated file must stay readable whatever text it quotes (a strict dump would throw: EIO).
TEST(Render, JsonFileTextReplacesBytesThatAreNotUtf8) {
  nlohmann::json j = {{"last_error", std::string("bad \xff byte")}};
  const std::string text = JsonFileText(j);
  EXPECT_EQ(text, "{\n  \"last_error\": \"bad \xef\xbf\xbd byte\"\n}\n");
  EXPECT_EQ(nlohmann::json::parse(text)["last_error"], "bad \xef\xbf\xbd byte");
}

TEST(Render, DeviceFallbackIsReported) {
  EngineStatus s;
  EXPECT_EQ(EngineStatusText(s, FsMetrics{}).find("device"), std::string::npos);
  EXPECT_EQ(EngineStatusJson(s, FsMetrics{})["device_lost"], false);
  EXPECT_EQ(EngineStatusJson(s, FsMetrics{})["device_losses"], 0);
  EXPECT_EQ(EngineStatusJson(s, FsMetrics{})["backend_warming_up"], false);
  s.backend_warming_up = true;
  EXPECT_EQ(EngineStatusJson(s, FsMetrics{})["backend_warming_up"], true);
  s.backend_warming_up = false;
  EXPECT_NE(MetricsText(s, FsMetrics{}, 0).find("kvfs_cpu_fallback_steps_total 0\n"), std::string::npos);
  EXPECT_NE(MetricsText(s, FsMetrics{}, 0).find("kvfs_device_losses_total 0\n"), std::string::npos);

  s.cpu_fallback_steps = 3;
  EXPECT_NE(EngineStatusText(s, FsMetrics{}).find("device     3 steps ran on the CPU instead\n"), std::string::npos)
      << EngineStatusText(s, FsMetrics{});
  s.device_lost = true;
  s.device_losses = 1;
  s.device_remake_failures = 1;
  s.cpu_fallback_steps = 17;
  EXPECT_NE(EngineStatusText(s, FsMetrics{}).find("device     lost, every pass runs on the CPU (1 loss, 1 failed try to make it "
                                     "again); 17 steps ran on the CPU instead\n"),
            std::string::npos)
      << EngineStatusText(s, FsMetrics{});
  const nlohmann::json j = EngineStatusJson(s, FsMetrics{});
  EXPECT_EQ(j["device_lost"], true);
  EXPECT_EQ(j["device_losses"], 1);
  EXPECT_EQ(j["cpu_fallback_steps"], 17);
  EXPECT_NE(MetricsText(s, FsMetrics{}, 0).find("kvfs_cpu_fallback_steps_total 17\n"), std::string::npos);

  EXPECT_EQ(j["device_remake_failures"], 1);

  // Made again after two losses (and three failed tries).
  s.device_lost = false;
  s.device_losses = 2;
  s.device_remakes = 2;
  s.device_remake_failures = 3;
  EXPECT_NE(EngineStatusText(s, FsMetrics{}).find("device     made again (2 losses, 3 failed tries to make it again); 17 steps "
                                     "ran on the CPU instead\n"),
            std::string::npos)
      << EngineStatusText(s, FsMetrics{});
  EXPECT_EQ(EngineStatusJson(s, FsMetrics{})["device_lost"], false);
  EXPECT_EQ(EngineStatusJson(s, FsMetrics{})["device_remakes"], 2);
  const std::string metrics = MetricsText(s, FsMetrics{}, 0);
  EXPECT_NE(metrics.find("kvfs_device_losses_total 2\n"), std::string::npos);
  EXPECT_NE(metrics.find("kvfs_device_remakes_total{result=\"ok\"} 2\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("kvfs_device_remakes_total{result=\"failed\"} 3\n"), std::string::npos) << metrics;
}

}  // namespace
}  // namespace kvfs::fs
