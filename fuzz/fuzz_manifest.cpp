// libFuzzer target: the store's JSON records, manifests and prefix records. Each parser must
// reject or accept any byte string without crashing, and whatever it accepts must serialize
// and parse back to the same record. (One target for both: they share the checksum code and
// their seeds, and the CI smoke run stays one run.)
#include <cstddef>
#include <cstdint>
#include <string_view>

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
  return 0;
}
