// libFuzzer target: the JSON records (the store's manifests and prefix records, kvfs tune's
// tuning files). Each parser must reject or accept any byte string without crashing, and
// whatever it accepts must serialize and parse back to the same record. (One target for all:
// the store's share the checksum code, all share the seeds, and the CI smoke run stays one.)
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/backend/vulkan_tuning.h"
#include "engine/store/manifest.h"
#include "engine/store/prefix_record.h"

namespace {

template <typename Parse, typename Serialize>
void RoundTrip(std::string_view text, Parse parse, Serialize serialize) {
  auto record = parse(text, "fuzz");
  if (!record.ok()) return;
  auto json = serialize(*record);
  if (!json.ok()) __builtin_trap();  // accepted but not writable
  auto again = parse(*json, "fuzz");
  if (!again.ok() || !(*again == *record)) __builtin_trap();  // not a faithful round trip
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  RoundTrip(text, kvfs::store::ParseManifest, kvfs::store::SerializeManifest);
  RoundTrip(text, kvfs::store::ParsePrefix, kvfs::store::SerializePrefix);
  if (auto tuning = kvfs::ParseTuningJson(text); tuning.ok()) {
    auto again = kvfs::ParseTuningJson(kvfs::TuningToJson(*tuning));
    if (!again.ok() || !(*again == *tuning)) __builtin_trap();  // not a faithful round trip
  }
  return 0;
}
