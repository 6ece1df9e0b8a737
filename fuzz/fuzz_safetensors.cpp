// libFuzzer target: the kv.safetensors reader must reject or accept any byte string without
// crashing or allocating beyond the input's size, and whatever it accepts must export (to a
// file of the size KvSafetensorsBytes gives) and read back to the same cache. Every input is
// tried against each KV type of one small geometry (the one fuzz/make_safetensors_seeds.py
// writes seeds for), so all tables of fields are reached.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/store/safetensors.h"

namespace {

constexpr char kFingerprint[] = "0123456789abcdef0123456789abcdef";
constexpr int64_t kBlockTokens = 2;

void Check(std::string_view bytes, const kvfs::store::KvGeometry& g) {
  auto r = kvfs::store::ReadKvSafetensors(bytes, kFingerprint, g, kBlockTokens);
  if (!r.ok()) return;
  if (r->chunks.size() != r->chunk_tokens.size()) __builtin_trap();
  std::vector<kvfs::store::KvChunk> spans;
  for (size_t i = 0; i < r->chunks.size(); ++i) spans.push_back({r->chunks[i], r->chunk_tokens[i]});
  auto file = kvfs::store::WriteKvSafetensors(r->info, spans);
  if (!file.ok()) __builtin_trap();  // accepted but not writable
  auto size = kvfs::store::KvSafetensorsBytes(r->info);
  if (!size.ok() || *size != file->size()) __builtin_trap();  // ls -l would not say the file's size
  auto again = kvfs::store::ReadKvSafetensors(*file, kFingerprint, g, kBlockTokens);
  if (!again.ok() || !(again->info == r->info) || again->chunks != r->chunks) __builtin_trap();  // not faithful
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes, {2, 2, 4, "f16", 8, false});
  Check(bytes, {2, 2, 4, "q8", 4, true});
  Check(bytes, {2, 2, 4, "q4", 4, true});
  Check(bytes, {2, 2, 4, "q4k", 4, true, 2});
  return 0;
}
