#include "engine/backend/vulkan_tuning.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "engine/core/median.h"
#include "engine/core/strict_json.h"
#include "engine/model/ggml_types.h"
#include "engine/store/fs.h"

namespace kvfs {
namespace {

using Json = nlohmann::json;

// A setting the search varies: its values, in the order tried.
struct Knob {
  std::string_view name;
  std::vector<int64_t> values;
  void (*set)(VulkanTuning&, int64_t);
};

// Matrix-vector shape first: it moves the most bytes. The values span what a GPU's subgroups
// (8 to 64 wide) and shared memory suggest; the backend refuses those the device cannot run.
std::vector<Knob> Knobs() {
  return {
      {"matvec_group", {32, 64, 128, 256}, [](VulkanTuning& t, int64_t v) { t.matvec.group = v; }},
      {"matvec_lanes", {0, 32, 16, 8}, [](VulkanTuning& t, int64_t v) { t.matvec.lanes = v; }},
      {"matvec_rows", {2, 4, 8, 16}, [](VulkanTuning& t, int64_t v) { t.matvec.rows = v; }},
      {"matvec_min_groups", {256, 1024, 4096}, [](VulkanTuning& t, int64_t v) { t.matvec.min_groups = v; }},
      {"matvec_ahead", {1, 2, 4}, [](VulkanTuning& t, int64_t v) { t.matvec.ahead = v; }},
      {"matvec_norm_group", {0, 256, 512, 1024}, [](VulkanTuning& t, int64_t v) { t.matvec.norm_group = v; }},
      {"swiglu_in_matvec", {1, 0}, [](VulkanTuning& t, int64_t v) { t.swiglu_in_matvec = v != 0; }},
      {"fuse_softmax", {1, 0}, [](VulkanTuning& t, int64_t v) { t.fuse_softmax = v != 0; }},
      {"subgroup_trees", {1, 0}, [](VulkanTuning& t, int64_t v) { t.subgroup_trees = v != 0; }},
      {"attention_split", {32, 64, 128, 256, 512}, [](VulkanTuning& t, int64_t v) { t.attention_split = v; }},
      // After the shapes it reads ahead for. How much pays depends on the cache size (which the
      // device does not report) and on how long the phases it runs beside last.
      {"prefetch_mib", {0, 4, 8, 16}, [](VulkanTuning& t, int64_t v) { t.prefetch_mib = v; }},
  };
}

// Medians of paired measurements of `current` and `candidate`, alternating which goes first.
struct Comparison {
  double ratio = 0;  // median of candidate / current
  double current_seconds = 0, candidate_seconds = 0;
  Status current_failed, candidate_failed;
};
Comparison Compare(const TuningMeasure& measure, const VulkanTuning& current, const VulkanTuning& candidate,
                   int rounds) {
  Comparison c;
  std::vector<double> ratios, cur, cand;
  for (int r = 0; r < rounds; ++r) {
    double t[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      const bool candidate_turn = (i == 0) == (r % 2 == 1);
      Result<double> s = measure(candidate_turn ? candidate : current);
      if (!s.ok() || !(*s > 0) || !std::isfinite(*s)) {
        Status why = s.ok() ? Internal(fmt::format("a measurement of {} seconds", *s)) : s.status();
        (candidate_turn ? c.candidate_failed : c.current_failed) = std::move(why);
        return c;
      }
      t[candidate_turn ? 1 : 0] = *s;
    }
    cur.push_back(t[0]);
    cand.push_back(t[1]);
    ratios.push_back(t[1] / t[0]);
  }
  c.ratio = Median(ratios);
  c.current_seconds = Median(cur);
  c.candidate_seconds = Median(cand);
  return c;
}

Status Expect(bool ok, std::string_view what) {
  return ok ? Status::Ok() : InvalidArgument(fmt::format("tuning file: {}", what));
}

Result<int64_t> IntField(const Json& j, const char* key, int64_t lo, int64_t hi) {
  if (!j.contains(key)) return InvalidArgument(fmt::format("tuning file: missing \"{}\"", key));
  const Json& v = j.at(key);
  if (!v.is_number_integer()) return InvalidArgument(fmt::format("tuning file: \"{}\" must be an integer", key));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return InvalidArgument(fmt::format("tuning file: \"{}\" = {} is outside [{}, {}]", key, x, lo, hi));
  return x;
}
Result<bool> BoolField(const Json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_boolean()) {
    return InvalidArgument(fmt::format("tuning file: \"{}\" must be true or false", key));
  }
  return j.at(key).get<bool>();
}
Result<std::string> StringField(const Json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_string()) {
    return InvalidArgument(fmt::format("tuning file: \"{}\" must be a string", key));
  }
  return j.at(key).get<std::string>();
}
Result<double> NumberField(const Json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_number() || !(j.at(key).get<double>() >= 0)) {
    return InvalidArgument(fmt::format("tuning file: \"{}\" must be a number >= 0", key));
  }
  return j.at(key).get<double>();
}
Status OnlyKeys(const Json& j, std::initializer_list<std::string_view> keys, std::string_view where) {
  if (!j.is_object()) return InvalidArgument(fmt::format("tuning file: {} must be an object", where));
  for (const auto& [k, v] : j.items()) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      return InvalidArgument(fmt::format("tuning file: unknown key \"{}\" in {}", k, where));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string TuningModelKey(const Model& model) {
  const HParams& hp = model.hparams();
  const ModelWeights& w = model.weights();
  // The types of the first layer's q and down matrices: the mixes (e.g. Q4_K_M) differ there.
  std::string types = "?";
  if (!w.layers.empty()) {
    const GgmlTypeTraits* q = GgmlTypeInfo(static_cast<uint32_t>(w.layers[0].wq.type));
    const GgmlTypeTraits* d = GgmlTypeInfo(static_cast<uint32_t>(w.layers[0].w_down.type));
    types = fmt::format("{}/{}", q != nullptr ? q->name : "?", d != nullptr ? d->name : "?");
  }
  return fmt::format("{} L{} E{} F{} H{}/{}x{} V{} {}", ArchitectureName(hp.arch), hp.n_layer, hp.n_embd, hp.n_ff,
                     hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab, types);
}

std::string TuningToJson(const TuningRecord& r) {
  const VulkanTuning& t = r.tuning;
  Json j = {{"format", kTuningFormat},
            {"version", kTuningVersion},
            {"device", r.device},
            {"api_version", r.api_version},
            {"model", r.model},
            {"kv", r.kv},
            {"depth", r.depth},
            {"tuning",
             {{"attention_split", t.attention_split},
              {"fuse_softmax", t.fuse_softmax},
              {"swiglu_in_matvec", t.swiglu_in_matvec},
              {"subgroup_trees", t.subgroup_trees},
              {"prefetch_mib", t.prefetch_mib},
              {"matvec",
               {{"group", t.matvec.group}, {"lanes", t.matvec.lanes}, {"min_groups", t.matvec.min_groups},
                {"rows", t.matvec.rows}, {"ahead", t.matvec.ahead}, {"norm_group", t.matvec.norm_group}}}}},
            {"decode_step_ms", {{"default", r.default_step_ms}, {"tuned", r.tuned_step_ms}}}};
  return j.dump(2) + "\n";
}

Result<TuningRecord> ParseTuningJson(std::string_view text) {
  KVFS_ASSIGN_OR_RETURN(Json j, ParseStrictJson(text, "tuning file"));
  KVFS_RETURN_IF_ERROR(
      OnlyKeys(j, {"format", "version", "device", "api_version", "model", "kv", "depth", "tuning", "decode_step_ms"},
               "the file"));
  KVFS_ASSIGN_OR_RETURN(std::string format, StringField(j, "format"));
  KVFS_RETURN_IF_ERROR(Expect(format == kTuningFormat, fmt::format("format is \"{}\", not \"{}\"", format, kTuningFormat)));
  KVFS_ASSIGN_OR_RETURN(int64_t version, IntField(j, "version", 0, 1 << 30));
  KVFS_RETURN_IF_ERROR(Expect(version == kTuningVersion,
                              fmt::format("version {} (this kvfs reads version {}; run kvfs tune again)", version,
                                          kTuningVersion)));
  TuningRecord r;
  KVFS_ASSIGN_OR_RETURN(r.device, StringField(j, "device"));
  KVFS_ASSIGN_OR_RETURN(r.api_version, StringField(j, "api_version"));
  KVFS_ASSIGN_OR_RETURN(r.model, StringField(j, "model"));
  KVFS_ASSIGN_OR_RETURN(r.kv, StringField(j, "kv"));
  KVFS_ASSIGN_OR_RETURN(r.depth, IntField(j, "depth", 0, int64_t{1} << 40));
  if (!j.contains("tuning")) return InvalidArgument("tuning file: missing \"tuning\"");
  const Json& t = j.at("tuning");
  KVFS_RETURN_IF_ERROR(OnlyKeys(
      t, {"attention_split", "fuse_softmax", "swiglu_in_matvec", "subgroup_trees", "prefetch_mib", "matvec"},
      "\"tuning\""));
  KVFS_ASSIGN_OR_RETURN(r.tuning.attention_split, IntField(t, "attention_split", 0, 1 << 20));
  if (Status s = CheckAttentionSplit(r.tuning.attention_split); !s.ok())
    return InvalidArgument("tuning file: \"attention_split\": " + s.message());
  KVFS_ASSIGN_OR_RETURN(r.tuning.fuse_softmax, BoolField(t, "fuse_softmax"));
  KVFS_ASSIGN_OR_RETURN(r.tuning.swiglu_in_matvec, BoolField(t, "swiglu_in_matvec"));
  KVFS_ASSIGN_OR_RETURN(r.tuning.subgroup_trees, BoolField(t, "subgroup_trees"));
  // Optional: files written before the knob existed read as "off", as they were measured.
  if (t.contains("prefetch_mib")) {
    KVFS_ASSIGN_OR_RETURN(r.tuning.prefetch_mib, IntField(t, "prefetch_mib", 0, 1 << 16));
  }
  if (!t.contains("matvec")) return InvalidArgument("tuning file: missing \"matvec\"");
  const Json& m = t.at("matvec");
  KVFS_RETURN_IF_ERROR(OnlyKeys(m, {"group", "lanes", "min_groups", "rows", "ahead", "norm_group"}, "\"matvec\""));
  KVFS_ASSIGN_OR_RETURN(r.tuning.matvec.group, IntField(m, "group", 0, 1 << 16));
  KVFS_ASSIGN_OR_RETURN(r.tuning.matvec.lanes, IntField(m, "lanes", 0, 1 << 16));
  KVFS_ASSIGN_OR_RETURN(r.tuning.matvec.min_groups, IntField(m, "min_groups", 0, 1 << 30));
  KVFS_ASSIGN_OR_RETURN(r.tuning.matvec.rows, IntField(m, "rows", 0, 1 << 16));
  if (m.contains("ahead")) {  // optional: files written before the knob existed had 1
    KVFS_ASSIGN_OR_RETURN(r.tuning.matvec.ahead, IntField(m, "ahead", 0, 8));
  }
  if (m.contains("norm_group")) {  // optional: files written before the knob existed had it off
    KVFS_ASSIGN_OR_RETURN(r.tuning.matvec.norm_group, IntField(m, "norm_group", 0, 1 << 16));
  }
  if (!j.contains("decode_step_ms")) return InvalidArgument("tuning file: missing \"decode_step_ms\"");
  const Json& ms = j.at("decode_step_ms");
  KVFS_RETURN_IF_ERROR(OnlyKeys(ms, {"default", "tuned"}, "\"decode_step_ms\""));
  KVFS_ASSIGN_OR_RETURN(r.default_step_ms, NumberField(ms, "default"));
  KVFS_ASSIGN_OR_RETURN(r.tuned_step_ms, NumberField(ms, "tuned"));
  return r;
}

Status CheckAttentionSplit(int64_t split) {
  if (split == 0 || (split >= 8 && split <= 65536 && (split & (split - 1)) == 0)) return Status::Ok();
  return InvalidArgument(
      fmt::format("the attention split {} is not 0 (the default) or a power of two from 8 to 65536", split));
}

Result<TuningRecord> ReadTuningFile(const std::string& path) {
  store::PosixFileSystem fs;
  // A tuning file is a few hundred bytes; anything huge is not one (and is not read).
  Result<uint64_t> size = fs.FileSize(path);
  if (!size.ok()) return Status(size.status().code(), "tuning file: " + size.status().message());
  if (*size > (1 << 20)) return InvalidArgument(fmt::format("tuning file {}: over 1 MiB", path));
  Result<std::vector<uint8_t>> bytes = fs.ReadFile(path);
  if (!bytes.ok()) return Status(bytes.status().code(), "tuning file: " + bytes.status().message());
  Result<TuningRecord> r = ParseTuningJson(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  if (!r.ok()) return Status(r.status().code(), fmt::format("{} ({})", r.status().message(), path));
  return r;
}

Status WriteTuningFile(const std::string& path, const TuningRecord& record) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty()) return InvalidArgument(fmt::format("tuning file: '{}' names a directory", path));
  const std::string text = TuningToJson(record);
  store::PosixFileSystem fs;
  return store::WriteFileAtomic(fs, dir, name, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

std::optional<VulkanTuning> TuningFor(const TuningRecord& record, const std::string& device_name, const Model& model,
                                      std::string* why) {
  const std::string key = TuningModelKey(model);
  if (record.device != device_name) {
    *why = fmt::format("it was measured on \"{}\", not \"{}\"", record.device, device_name);
  } else if (record.model != key) {
    *why = fmt::format("it was measured with a model \"{}\", not \"{}\"", record.model, key);
  } else {
    return record.tuning;
  }
  return std::nullopt;
}

VulkanTuning ResolvedTuning(const VulkanTuning& tuning, std::string_view device_type) {
  VulkanTuning t = tuning;
  const bool gpu = device_type != "cpu";
  if (t.attention_split <= 0) {
    t.attention_split = gpu ? VulkanTuning::kGpuAttentionSplit : VulkanTuning::kDefaultAttentionSplit;
  }
  if (t.matvec.group <= 0) t.matvec.group = gpu ? VulkanMatvecShape::kGpuGroup : VulkanMatvecShape::kDefaultGroup;
  if (t.matvec.lanes >= t.matvec.group) t.matvec.lanes = 0;  // 0: as many as the group
  if (t.matvec.min_groups <= 0) t.matvec.min_groups = VulkanMatvecShape::kDefaultMinGroups;
  if (t.matvec.rows <= 0) t.matvec.rows = gpu ? VulkanMatvecShape::kGpuRows : VulkanMatvecShape::kDefaultRows;
  if (t.matvec.ahead <= 0) t.matvec.ahead = VulkanMatvecShape::kDefaultAhead;
  return t;
}

std::vector<std::string> TuningKnobNames() {
  std::vector<std::string> names;
  for (const Knob& k : Knobs()) names.emplace_back(k.name);
  return names;
}

Result<TuningOutcome> SearchVulkanTuning(const VulkanTuning& start, const TuningSearchOptions& options,
                                         const TuningMeasure& measure) {
  if (options.rounds < 1 || options.passes < 1 || !(options.min_gain >= 0 && options.min_gain < 1)) {
    return InvalidArgument("tuning: rounds and passes must be at least 1, the gain in [0, 1)");
  }
  TuningOutcome out;
  out.start = ResolvedTuning(start, options.device_type);
  VulkanTuning best = out.start;
  const std::set<std::string> skip(options.skip.begin(), options.skip.end());
  for (int pass = 0; pass < options.passes; ++pass) {
    bool changed = false;
    for (const Knob& knob : Knobs()) {
      if (skip.count(std::string(knob.name)) != 0) continue;
      for (int64_t value : knob.values) {
        VulkanTuning candidate = best;
        knob.set(candidate, value);
        candidate = ResolvedTuning(candidate, options.device_type);
        if (candidate == best) continue;  // the current value, or one that resolves to it
        TuningTrial trial;
        trial.knob = std::string(knob.name);
        trial.value = value;
        Comparison c = Compare(measure, best, candidate, options.rounds);
        if (!c.current_failed.ok()) {
          return Status(c.current_failed.code(), "tuning: the current setting failed: " + c.current_failed.message());
        }
        if (!c.candidate_failed.ok()) {
          trial.refused = c.candidate_failed.message();
        } else {
          trial.ratio = c.ratio;
          trial.taken = c.ratio < 1.0 - options.min_gain;
          if (trial.taken) {
            best = candidate;
            changed = true;
          }
        }
        out.trials.push_back(std::move(trial));
      }
    }
    if (!changed) break;
  }
  // The final word: the result against the start, measured afresh.
  if (best == out.start) {
    std::vector<double> t;
    for (int r = 0; r < options.rounds; ++r) {
      KVFS_ASSIGN_OR_RETURN(double s, measure(best));
      t.push_back(s);
    }
    out.start_seconds = out.best_seconds = Median(t);
  } else {
    Comparison c = Compare(measure, out.start, best, options.rounds);
    if (!c.current_failed.ok()) return Status(c.current_failed.code(), "tuning: " + c.current_failed.message());
    if (!c.candidate_failed.ok()) return Status(c.candidate_failed.code(), "tuning: " + c.candidate_failed.message());
    out.final_ratio = c.ratio;
    out.start_seconds = c.current_seconds;
    out.best_seconds = c.candidate_seconds;
    // Steps that each won by min_gain should add up to a clear win; if they do not, the
    // machine moved under the search and the start is the safer choice.
    if (c.ratio >= 1.0 - options.min_gain / 2) {
      best = out.start;
      out.best_seconds = out.start_seconds;
    }
  }
  out.best = best;
  return out;
}

}  // namespace kvfs
