// kvfsd's options, config file and defaults.
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <gtest/gtest.h>

#include "daemon/config.h"
#include "daemon/mount_util.h"

namespace kvfs::daemon {
namespace {

Result<DaemonConfig> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "kvfsd");
  return ParseDaemonArgs(args);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid());
  std::ofstream(path) << text;
  return path;
}

TEST(DaemonConfig, CommandLine) {
  auto c = Parse({"-m", "m.gguf", "--mount", "/mnt/k", "--store", "/s", "-t", "3", "--kv", "q8", "--kv-budget", "2G",
                  "--foreground", "--log-level", "debug"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_path, "m.gguf");
  EXPECT_EQ(c->mountpoint, "/mnt/k");
  EXPECT_EQ(c->store_dir, "/s");
  EXPECT_EQ(c->threads, 3);
  EXPECT_EQ(c->kv, "q8");
  EXPECT_EQ(c->kv_budget_bytes, int64_t{2} << 30);
  EXPECT_TRUE(c->foreground);
  EXPECT_EQ(c->log_level, "debug");
  EXPECT_EQ(c->max_prompt_bytes, 1 << 20);
  EXPECT_EQ(c->backend, "cpu");
  EXPECT_EQ(c->device, -1);
  EXPECT_EQ(c->vulkan_tuning, "");
  EXPECT_EQ(c->kv_device_budget_bytes, 0);
  auto v = Parse({"--mount", "/m", "--backend", "vulkan", "--device", "1", "--vulkan-tuning", "/etc/kvfs/h100.json",
                  "--kv-device-budget", "1536M"});
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->kv_device_budget_bytes, int64_t{1536} << 20);
  EXPECT_EQ(v->backend, "vulkan");
  EXPECT_EQ(v->device, 1);
  EXPECT_EQ(v->vulkan_tuning, "/etc/kvfs/h100.json");
}

TEST(DaemonConfig, BadOptionsNameThemselves) {
  auto check = [](std::vector<std::string> args, const std::string& needle) {
    auto c = Parse(args);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  };
  check({"--mount", "/m", "--bogus"}, "--bogus");
  check({"--mount", "/m", "--kv", "q5"}, "--kv");
  check({"--mount", "/m", "-t", "many"}, "-t");
  check({"--mount", "/m", "--kv-budget", "lots"}, "--kv-budget");
  check({"--mount", "/m", "--kv-device-budget", "-1"}, "--kv-device-budget");
  check({"--mount", "/m", "--log-level", "loud"}, "--log-level");
  check({"--mount", "/m", "--backend", "tpu"}, "--backend");
  check({"--mount", "/m", "--device", "-2"}, "--device");
  check({"--mount"}, "needs a value");
  check({"-m", "x"}, "--mount");
}

TEST(DaemonConfig, ConfigFileThenCommandLine) {
  std::string path = WriteTemp("kvfsd.json", R"({"model": "a.gguf", "mount": "/mnt/a", "threads": 2,
      "kv_budget": "512M", "max_prompt_bytes": 4096, "foreground": true, "log_level": "warn",
      "vulkan_tuning": "/etc/kvfs/tuning.json"})");
  auto c = Parse({"--config", path, "-t", "4"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_path, "a.gguf");
  EXPECT_EQ(c->mountpoint, "/mnt/a");
  EXPECT_EQ(c->threads, 4);  // the command line wins
  EXPECT_EQ(c->kv_budget_bytes, int64_t{512} << 20);
  EXPECT_EQ(c->max_prompt_bytes, 4096);
  EXPECT_TRUE(c->foreground);
  EXPECT_EQ(c->log_level, "warn");
  EXPECT_EQ(c->vulkan_tuning, "/etc/kvfs/tuning.json");
  std::filesystem::remove(path);
}

// `--backend cpu` on the command line overrides a config file's Vulkan backend with its Vulkan
// settings (a GPU problem being looked into, without editing the service's file); those given
// again on the command line still say they need --backend vulkan.
TEST(DaemonConfig, BackendCpuOnTheCommandLineOverridesTheConfigFilesVulkanSettings) {
  std::string path = WriteTemp("kvfsd_vulkan.json", R"({"mount": "/mnt/a", "backend": "vulkan", "device": 1,
      "kv_device_budget": "1G", "vulkan_tuning": "/etc/kvfs/tuning.json"})");
  auto c = Parse({"--config", path, "--backend", "cpu"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->backend, "cpu");
  EXPECT_EQ(c->device, -1);
  EXPECT_EQ(c->kv_device_budget_bytes, 0);
  EXPECT_EQ(c->vulkan_tuning, "");
  auto with_device = Parse({"--config", path, "--backend", "cpu", "--device", "0"});
  ASSERT_TRUE(with_device.ok());
  EXPECT_EQ(with_device->device, 0);  // given: ResolveDefaults refuses it with the CPU backend
  auto vulkan = Parse({"--config", path});
  ASSERT_TRUE(vulkan.ok());
  EXPECT_EQ(vulkan->device, 1);
  EXPECT_EQ(vulkan->vulkan_tuning, "/etc/kvfs/tuning.json");
  std::filesystem::remove(path);
}

TEST(DaemonConfig, ConfigFileErrorsNameTheKey) {
  DaemonConfig c;
  auto expect_error = [&](const std::string& json, const std::string& needle) {
    Status s = ApplyConfigJson(json, c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  expect_error("{", "not valid JSON");
  expect_error("[]", "object");
  expect_error(R"({"modle": "x"})", "\"modle\"");
  expect_error(R"({"threads": "two"})", "\"threads\"");
  expect_error(R"({"threads": -1})", "\"threads\"");
  expect_error(R"({"kv": "q2"})", "\"kv\"");
  expect_error(R"({"foreground": 1})", "\"foreground\"");
  expect_error(R"({"kv_budget": true})", "\"kv_budget\"");
  EXPECT_EQ(c.threads, 0);  // nothing applied
}

TEST(DaemonConfig, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("1048576"), 1048576);
  EXPECT_EQ(*ParseByteSize("64K"), 64 << 10);
  EXPECT_EQ(*ParseByteSize("3g"), int64_t{3} << 30);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("-5").ok());
  EXPECT_EQ(*ParseByteSize("1.5G"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("512MB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("100b"), 100);
  EXPECT_EQ(*ParseByteSize(".5k"), 512);
  EXPECT_EQ(*ParseByteSize("0.001K"), 1);  // rounded down to whole bytes
  EXPECT_FALSE(ParseByteSize("1.2.3G").ok());
  EXPECT_FALSE(ParseByteSize("G").ok());
  EXPECT_FALSE(ParseByteSize(".").ok());
  EXPECT_FALSE(ParseByteSize("5X").ok());
  EXPECT_FALSE(ParseByteSize("1 G").ok());
  EXPECT_FALSE(ParseByteSize("99999999999T").ok());  // past int64
}

TEST(DaemonConfig, DefaultStoreAndModel) {
  Environment env;
  env.uid = 0;
  EXPECT_EQ(DefaultStoreDir(env), "/var/lib/kvfs");
  env.uid = 1000;
  env.home = "/home/u";
  EXPECT_EQ(DefaultStoreDir(env), "/home/u/.local/share/kvfs");
  env.xdg_data_home = "/xdg";
  EXPECT_EQ(DefaultStoreDir(env), "/xdg/kvfs");

  // models/default.gguf found from a build tree inside the checkout (build/daemon/kvfsd).
  std::string root = ::testing::TempDir() + "/kvfs_checkout_" + std::to_string(::getpid());
  std::filesystem::create_directories(root + "/build/daemon");
  std::filesystem::create_directories(root + "/models");
  std::ofstream(root + "/models/default.gguf") << "GGUF";
  env.exe_path = root + "/build/daemon/kvfsd";
  EXPECT_EQ(FindDefaultModel(env, "/nonexistent"), root + "/models/default.gguf");
  env.kvfs_model = "/env/model.gguf";
  EXPECT_EQ(FindDefaultModel(env, "/nonexistent"), "/env/model.gguf");
  env.kvfs_model.clear();
  env.exe_path = "/usr/bin/kvfsd";
  EXPECT_EQ(FindDefaultModel(env, "/nonexistent"), std::nullopt);

  DaemonConfig c;
  c.mountpoint = "/m";
  env.exe_path = root + "/build/daemon/kvfsd";
  ASSERT_TRUE(ResolveDefaults(c, env).ok());
  EXPECT_EQ(c.model_path, root + "/models/default.gguf");
  EXPECT_EQ(c.store_dir, "/xdg/kvfs");
  EXPECT_EQ(c.log_file, "/xdg/kvfs/kvfsd.log");
  DaemonConfig missing;
  missing.model_path = "/no/such.gguf";
  EXPECT_EQ(ResolveDefaults(missing, env).code(), StatusCode::kInvalidArgument);
  // A tuning file is for the Vulkan backend: with the CPU's it is a mistake, said at start.
  DaemonConfig tuned_cpu;
  tuned_cpu.mountpoint = "/m";
  tuned_cpu.vulkan_tuning = "/etc/kvfs/h100.json";
  const Status cpu_tuned = ResolveDefaults(tuned_cpu, env);
  EXPECT_EQ(cpu_tuned.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cpu_tuned.message().find("--vulkan-tuning (vulkan_tuning) applies to --backend vulkan only"), std::string::npos);
  tuned_cpu.backend = "vulkan";
  EXPECT_TRUE(ResolveDefaults(tuned_cpu, env).ok());
  // So is a device KV budget.
  DaemonConfig budget_cpu;
  budget_cpu.mountpoint = "/m";
  budget_cpu.kv_device_budget_bytes = int64_t{1} << 30;
  const Status cpu_budget = ResolveDefaults(budget_cpu, env);
  EXPECT_NE(cpu_budget.message().find("--kv-device-budget (kv_device_budget) applies to --backend vulkan only"), std::string::npos)
      << cpu_budget.message();
  budget_cpu.backend = "vulkan";
  EXPECT_TRUE(ResolveDefaults(budget_cpu, env).ok());
  // And a device index (config.json "device": 0 with the CPU backend was taken and ignored).
  DaemonConfig device_cpu;
  device_cpu.mountpoint = "/m";
  device_cpu.device = 0;
  const Status cpu_device = ResolveDefaults(device_cpu, env);
  EXPECT_NE(cpu_device.message().find("--device (device) applies to --backend vulkan only"), std::string::npos)
      << cpu_device.message();
  device_cpu.backend = "vulkan";
  EXPECT_TRUE(ResolveDefaults(device_cpu, env).ok());
  // A context in which no turn fits is refused at start, not at every turn.
  DaemonConfig tiny;
  tiny.mountpoint = "/m";
  tiny.context_tokens = 2;
  const Status too_small = ResolveDefaults(tiny, env);
  EXPECT_NE(too_small.message().find("context 2: too small for any turn"), std::string::npos) << too_small.message();
  tiny.context_tokens = 16;
  EXPECT_TRUE(ResolveDefaults(tiny, env).ok());
  std::filesystem::remove_all(root);
}

TEST(MountUtil, AbsolutePaths) {
  EXPECT_EQ(AbsolutePath("/a/b/../c/./d/"), "/a/c/d");
  EXPECT_EQ(AbsolutePath("/"), "/");
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(AbsolutePath("x"), std::string(cwd) == "/" ? "/x" : std::string(cwd) + "/x");
  EXPECT_EQ(MountedTypeAt("/definitely/not/mounted"), std::nullopt);
}

// The store or log inside the mount point would hang kvfsd on its own mount: found by path, by
// a symlink into the mount point, but not for a sibling whose name merely starts alike.
TEST(MountUtil, PathIsWithinFollowsLinksToTheMountPoint) {
  const std::filesystem::path root = std::filesystem::temp_directory_path() / ("kvfs_within_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "mnt");
  std::filesystem::create_directory_symlink(root / "mnt", root / "link");
  const std::string mnt = (root / "mnt").string();
  EXPECT_TRUE(PathIsWithin(mnt, mnt));
  EXPECT_TRUE(PathIsWithin(mnt + "/store", mnt));
  EXPECT_TRUE(PathIsWithin(mnt + "/a/b/kvfsd.log", mnt));
  EXPECT_TRUE(PathIsWithin((root / "link" / "store").string(), mnt));  // through the link
  EXPECT_TRUE(PathIsWithin(mnt + "/../mnt/store", mnt));
  EXPECT_FALSE(PathIsWithin(mnt + "2/store", mnt));
  EXPECT_FALSE(PathIsWithin((root / "store").string(), mnt));
  EXPECT_FALSE(PathIsWithin(root.string(), mnt));  // the mount point inside the store is fine
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kvfs::daemon
