// libFuzzer target: the manifest parser must reject or accept any byte string without
// crashing, and whatever it accepts must serialize and parse back to the same manifest.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/store/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = kvfs::store::ParseManifest(text, "fuzz");
  if (!m.ok()) return 0;
  auto json = kvfs::store::SerializeManifest(*m);
  if (!json.ok()) __builtin_trap();  // accepted but not writable
  auto again = kvfs::store::ParseManifest(*json, "fuzz");
  if (!again.ok() || !(*again == *m)) __builtin_trap();  // not a faithful round trip
  return 0;
}
