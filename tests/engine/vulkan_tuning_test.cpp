// kvfs tune's search and file (engine/backend/vulkan_tuning.h), against synthetic cost models
// whose best setting is known: the search must find it, keep to min_gain, skip what it is told
// to and what the backend refuses, and fall back to the start when the final check does not
// confirm a win. The file: a round trip, and clear refusals of every kind of bad content.
#include <cmath>
#include <fstream>
#include <map>
#include <random>

#include "engine/backend/vulkan_tuning.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

// The best values of the synthetic cost model; every other value costs its knob's penalty.
VulkanTuning Optimum() {
  VulkanTuning t;
  t.matvec = {.group = 128, .lanes = 32, .min_groups = 4096, .rows = 4, .ahead = 2, .norm_group = 256};
  t.swiglu_in_matvec = false;
  t.fuse_softmax = false;
  t.subgroup_trees = false;
  t.attention_split = 256;
  t.prefetch_mib = 8;
  return t;
}

// Seconds per step: 1 ms times (1 + penalty) for each knob away from Optimum(). Penalties are
// separable, so coordinate descent reaches the optimum from anywhere.
double Cost(const VulkanTuning& t, double penalty = 0.1) {
  const VulkanTuning best = Optimum();
  double c = 1e-3;
  auto away = [&](bool differs) { c *= differs ? 1 + penalty : 1.0; };
  away(t.matvec.group != best.matvec.group);
  away(t.matvec.lanes != best.matvec.lanes);
  away(t.matvec.min_groups != best.matvec.min_groups);
  away(t.matvec.rows != best.matvec.rows);
  away(t.matvec.ahead != best.matvec.ahead);
  away(t.matvec.norm_group != best.matvec.norm_group);
  away(t.swiglu_in_matvec != best.swiglu_in_matvec);
  away(t.fuse_softmax != best.fuse_softmax);
  away(t.subgroup_trees != best.subgroup_trees);
  away(t.attention_split != best.attention_split);
  away(t.prefetch_mib != best.prefetch_mib);
  return c;
}

TEST(VulkanTuningSearch, FindsTheOptimumOfASeparableCost) {
  int calls = 0;
  auto outcome = SearchVulkanTuning(VulkanTuning{}, TuningSearchOptions{.rounds = 3, .skip = {}},
                                    [&](const VulkanTuning& t) -> Result<double> {
                                      ++calls;
                                      return Cost(t);
                                    });
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_TRUE(outcome->best == Optimum());
  EXPECT_TRUE(outcome->start == ResolvedTuning(VulkanTuning{}));
  // All eleven knobs start away from the optimum: 1.1^11 times the optimum's time.
  EXPECT_NEAR(outcome->final_ratio, 1.0 / std::pow(1.1, 11), 1e-9);
  EXPECT_NEAR(outcome->start_seconds, 1e-3 * std::pow(1.1, 11), 1e-12);
  EXPECT_NEAR(outcome->best_seconds, 1e-3, 1e-12);
  int taken = 0;
  for (const TuningTrial& t : outcome->trials) taken += t.taken;
  EXPECT_EQ(taken, 11);
  // Each trial measures both settings in every round, plus the final comparison.
  EXPECT_EQ(calls, static_cast<int>(outcome->trials.size()) * 2 * 3 + 2 * 3);
}

// What a tuning's 0s stand for depends on the device: a CPU's (lavapipe) the shapes the
// shaders were first written for, a GPU's the finer attention splits and warp-sized
// matrix-vector groups measured faster on an H200. Values that are set stay as they are.
TEST(VulkanTuningDefaults, GpusSplitFinerAndUseWarpSizedGroups) {
  const VulkanTuning cpu = ResolvedTuning(VulkanTuning{}, "cpu");
  EXPECT_EQ(cpu.attention_split, 128);
  EXPECT_EQ(cpu.matvec.group, 64);
  EXPECT_EQ(cpu.matvec.rows, 8);
  for (const char* type : {"discrete", "integrated", "virtual", "other"}) {
    const VulkanTuning gpu = ResolvedTuning(VulkanTuning{}, type);
    EXPECT_EQ(gpu.attention_split, 32) << type;
    EXPECT_EQ(gpu.matvec.group, 32) << type;
    EXPECT_EQ(gpu.matvec.rows, 2) << type;
    EXPECT_EQ(gpu.matvec.min_groups, cpu.matvec.min_groups) << type;
    EXPECT_EQ(gpu.matvec.ahead, 1) << type;
  }
  VulkanTuning set;
  set.attention_split = 256;
  set.matvec = {.group = 128, .lanes = 0, .min_groups = 512, .rows = 4, .ahead = 4};
  for (const char* type : {"cpu", "discrete"}) {
    const VulkanTuning t = ResolvedTuning(set, type);
    EXPECT_EQ(t.attention_split, 256) << type;
    EXPECT_TRUE(t.matvec == set.matvec) << type;
  }
  // The search starts from the device's defaults and never measures one of them twice.
  int calls = 0;
  auto outcome = SearchVulkanTuning(VulkanTuning{}, TuningSearchOptions{.rounds = 1, .passes = 1, .skip = {}, .device_type = "discrete"},
                                    [&](const VulkanTuning& t) -> Result<double> {
                                      ++calls;
                                      return Cost(t);
                                    });
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_TRUE(outcome->start == ResolvedTuning(VulkanTuning{}, "discrete"));
  for (const TuningTrial& trial : outcome->trials) {
    if (trial.knob == "attention_split") {
      EXPECT_NE(trial.value, 32);
    }
    if (trial.knob == "matvec_group") {
      EXPECT_NE(trial.value, 32);
    }
    if (trial.knob == "matvec_rows") {
      EXPECT_NE(trial.value, 2);
    }
  }
}

TEST(VulkanTuningSearch, NoiseBelowTheGainDoesNotMisleadIt) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(-0.01, 0.01);
  auto outcome = SearchVulkanTuning(VulkanTuning{}, TuningSearchOptions{.rounds = 5, .min_gain = 0.02, .skip = {}},
                                    [&](const VulkanTuning& t) -> Result<double> { return Cost(t) * (1 + noise(rng)); });
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_TRUE(outcome->best == Optimum());
}

TEST(VulkanTuningSearch, WinsSmallerThanTheMinimumGainAreNotTaken) {
  // Every better value is only 1% better: below a 2% minimum gain, nothing changes.
  auto outcome = SearchVulkanTuning(VulkanTuning{}, TuningSearchOptions{.rounds = 3, .min_gain = 0.02, .skip = {}},
                                    [&](const VulkanTuning& t) -> Result<double> { return Cost(t, 0.01); });
  ASSERT_TRUE(outcome.ok());
  EXPECT_TRUE(outcome->best == outcome->start);
  for (const TuningTrial& t : outcome->trials) EXPECT_FALSE(t.taken) << t.knob << " " << t.value;
  // Nothing taken: one sweep only, of every value but the start's (3 groups, 3 lane counts,
  // 3 row counts, 2 minimum group counts, 2 units ahead, 3 norm groups, 3 switches, 4 attention
  // splits, 3 read-ahead sizes).
  EXPECT_EQ(outcome->trials.size(), 26u);
}

TEST(VulkanTuningSearch, SkipsKnobsAndRecordsRefusals) {
  std::map<std::string, int> seen;
  auto outcome = SearchVulkanTuning(
      VulkanTuning{}, TuningSearchOptions{.rounds = 1, .skip = {"subgroup_trees", "attention_split"}},
      [&](const VulkanTuning& t) -> Result<double> {
        if (t.matvec.group == 128) return InvalidArgument("too much shared memory");
        if (!t.subgroup_trees) ++seen["trees off"];
        if (t.attention_split != 128) ++seen["split"];
        return Cost(t);
      });
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_EQ(seen["trees off"], 0);
  EXPECT_EQ(seen["split"], 0);
  bool refused = false;
  for (const TuningTrial& t : outcome->trials) {
    if (t.knob == "matvec_group" && t.value == 128) {
      refused = true;
      EXPECT_FALSE(t.taken);
      EXPECT_EQ(t.refused, "too much shared memory");
    }
    EXPECT_NE(t.knob, "subgroup_trees");
    EXPECT_NE(t.knob, "attention_split");
  }
  EXPECT_TRUE(refused);
  VulkanTuning want = Optimum();
  want.matvec.group = 64;  // 128 cannot run; 64 is as good as any other that can
  want.subgroup_trees = true;
  want.attention_split = 128;
  // group: 32, 64 and 256 cost the same; the start's 64 stays.
  EXPECT_TRUE(outcome->best == want);
}

TEST(VulkanTuningSearch, AWinTheFinalCheckDoesNotConfirmIsDropped) {
  // The machine "drifts": during the search the candidate looks 10% faster, but by the final
  // comparison every setting runs at the same speed.
  int calls = 0;
  auto outcome = SearchVulkanTuning(VulkanTuning{}, TuningSearchOptions{.rounds = 3, .passes = 1, .skip = {}},
                                    [&](const VulkanTuning& t) -> Result<double> {
                                      ++calls;
                                      if (calls > 6) return 1e-3;
                                      return t.matvec.group == 32 ? 0.9e-3 : 1e-3;
                                    });
  ASSERT_TRUE(outcome.ok());
  EXPECT_TRUE(outcome->trials[0].taken);  // matvec_group 32, in the first trial
  EXPECT_NEAR(outcome->final_ratio, 1.0, 1e-12);
  EXPECT_TRUE(outcome->best == outcome->start);
}

TEST(VulkanTuningSearch, AStartThatCannotRunIsAnError) {
  auto outcome = SearchVulkanTuning(VulkanTuning{}, TuningSearchOptions{},
                                    [](const VulkanTuning&) -> Result<double> { return IoError("device lost"); });
  ASSERT_FALSE(outcome.ok());
  EXPECT_NE(outcome.status().message().find("device lost"), std::string::npos);
  auto bad = SearchVulkanTuning(VulkanTuning{}, TuningSearchOptions{.rounds = 0, .skip = {}},
                                [](const VulkanTuning&) -> Result<double> { return 1.0; });
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TuningRecord SampleRecord() {
  return TuningRecord{.device = "NVIDIA H100 80GB HBM3",
                      .api_version = "1.4.312",
                      .model = "llama L32 E4096 F14336 H32/8x128 V128256 Q4_0/Q4_0",
                      .kv = "q4k",
                      .depth = 1024,
                      .tuning = Optimum(),
                      .default_step_ms = 7.5,
                      .tuned_step_ms = 6.25};
}

TEST(VulkanTuningFile, RoundTrips) {
  const TuningRecord r = SampleRecord();
  auto back = ParseTuningJson(TuningToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->device, r.device);
  EXPECT_EQ(back->api_version, r.api_version);
  EXPECT_EQ(back->model, r.model);
  EXPECT_EQ(back->kv, r.kv);
  EXPECT_EQ(back->depth, r.depth);
  EXPECT_TRUE(back->tuning == r.tuning);
  EXPECT_EQ(back->default_step_ms, r.default_step_ms);
  EXPECT_EQ(back->tuned_step_ms, r.tuned_step_ms);

  const testing::TempDir dir;
  const std::string path = dir / "tuning.json";
  ASSERT_TRUE(WriteTuningFile(path, r).ok());
  auto read = ReadTuningFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_TRUE(read->tuning == r.tuning);
  EXPECT_EQ(ReadTuningFile(path + ".absent").status().code(), StatusCode::kNotFound);
}

TEST(VulkanTuningFile, BadContentIsRefusedWithItsReason) {
  const std::string good = TuningToJson(SampleRecord());
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  const std::pair<std::string, std::string> cases[] = {
      {"{", "not valid JSON"},
      {"[1, 2]", "the file must be an object"},
      {"\xff\xfe", "not valid JSON"},
      {edit("\"kvfs-vulkan-tuning\"", "\"something-else\""), "format is \"something-else\""},
      {edit("\"version\": 1", "\"version\": 2"), "version 2"},
      {edit("\"depth\": 1024", "\"depth\": 1024, \"colour\": 3"), "unknown key \"colour\" in the file"},
      {edit("\"rows\": 4", "\"rows\": 4, \"x\": 1"), "unknown key \"x\" in \"matvec\""},
      {edit("\"fuse_softmax\": false", "\"fuse_softmax\": 1"), "\"fuse_softmax\" must be true or false"},
      {edit("\"group\": 128", "\"group\": -128"), "\"group\" = -128 is outside"},
      {edit("\"group\": 128", "\"group\": 1.5"), "\"group\" must be an integer"},
      {edit("\"attention_split\": 256,", ""), "missing \"attention_split\""},
      {edit("\"device\": \"NVIDIA H100 80GB HBM3\"", "\"device\": 7"), "\"device\" must be a string"},
      {edit("\"tuned\": 6.25", "\"tuned\": -1"), "\"tuned\" must be a number >= 0"},
      {edit("\"prefetch_mib\": 8", "\"prefetch_mib\": -8"), "\"prefetch_mib\" = -8 is outside"},
      {edit("\"prefetch_mib\": 8", "\"prefetch_mib\": true"), "\"prefetch_mib\" must be an integer"},
      {edit("\"ahead\": 2", "\"ahead\": 9"), "\"ahead\" = 9 is outside"},
      {edit("\"norm_group\": 256", "\"norm_group\": -1"), "\"norm_group\" = -1 is outside"},
  };
  for (const auto& [text, why] : cases) {
    auto r = ParseTuningJson(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message() << " / want: " << why;
  }
  // A huge file is not read into a tuning at all.
  const testing::TempDir dir;
  const std::string path = dir / "tuning.json";
  {
    std::ofstream out(path);
    out << good << std::string(2 << 20, ' ');
  }
  auto huge = ReadTuningFile(path);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("over 1 MiB"), std::string::npos) << huge.status().message();
}

// The sample record's file with one entry ("key": value, with its comma) left out.
std::string SampleWithout(const std::string& entry) {
  std::string text = TuningToJson(SampleRecord());
  const size_t at = text.find(entry);
  EXPECT_NE(at, std::string::npos) << text;
  return at == std::string::npos ? text : text.erase(at, entry.size());
}

// Files written before the read-ahead knob existed have no "prefetch_mib": they read as it
// was then, off, with every other setting as written.
TEST(VulkanTuningFile, AFileWithoutTheReadAheadKeyReadsAsOff) {
  auto r = ParseTuningJson(SampleWithout("\"prefetch_mib\": 8,"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  VulkanTuning want = Optimum();
  want.prefetch_mib = 0;
  EXPECT_TRUE(r->tuning == want);
}

TEST(VulkanTuningFile, AppliesOnlyToTheDeviceAndModelMeasured) {
  const std::string path = testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf";
  KVFS_REQUIRE_DATA(path);
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  // tests/make_test_models: 2 llama layers of width 256, feed-forward 768, 4 query heads of 64
  // and 2 KV heads, 32000 tokens, Q4_0 throughout.
  EXPECT_EQ(TuningModelKey(**model), "llama L2 E256 F768 H4/2x64 V32000 Q4_0/Q4_0");
  TuningRecord r = SampleRecord();
  r.model = TuningModelKey(**model);
  std::string why;
  auto same = TuningFor(r, "NVIDIA H100 80GB HBM3", **model, &why);
  ASSERT_TRUE(same.has_value());
  EXPECT_TRUE(*same == Optimum());
  EXPECT_FALSE(TuningFor(r, "AMD Radeon RX 7900 XTX", **model, &why).has_value());
  EXPECT_NE(why.find("measured on \"NVIDIA H100 80GB HBM3\", not \"AMD Radeon RX 7900 XTX\""), std::string::npos)
      << why;
  r.model = "llama L32 E4096 F14336 H32/8x128 V128256 Q4_0/Q4_0";
  EXPECT_FALSE(TuningFor(r, "NVIDIA H100 80GB HBM3", **model, &why).has_value());
  EXPECT_NE(why.find("with a model \"llama L32"), std::string::npos) << why;
}

// Files written before the matrix-vector read-ahead knob existed have no "ahead": they read as
// 0, the default (one unit a round, as the shader then was).
TEST(VulkanTuningFile, AFileWithoutTheMatvecAheadKeyReadsAsTheDefault) {
  auto r = ParseTuningJson(SampleWithout("\"ahead\": 2,"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  VulkanTuning want = Optimum();
  want.matvec.ahead = 0;
  EXPECT_TRUE(r->tuning == want);
  EXPECT_EQ(ResolvedTuning(r->tuning).matvec.ahead, VulkanMatvecShape::kDefaultAhead);
}

// Files written before the norm's knob existed have no "norm_group": they read as off, as the
// norms then were (a dispatch of their own).
TEST(VulkanTuningFile, AFileWithoutTheNormGroupKeyReadsAsOff) {
  auto r = ParseTuningJson(SampleWithout("\"norm_group\": 256,"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  VulkanTuning want = Optimum();
  want.matvec.norm_group = 0;
  EXPECT_TRUE(r->tuning == want);
}

}  // namespace
}  // namespace kvfs
