// Export side of kv.safetensors (format: safetensors.h). The whole file is built in one
// preallocated string: a small JSON header, then each tensor filled by a tight gather loop over
// the chunks' rows. `cat kv.safetensors` is served from this, so the data path does no per-value
// formatting and touches each byte once.
#include "engine/store/safetensors.h"

#include <charconv>
#include <limits>
#include <cstring>

#include <nlohmann/json.hpp>

#include "engine/kv/kv_format.h"
#include "engine/store/safetensors_layout.h"

namespace kvfs::store {
namespace {

using OrderedJson = nlohmann::ordered_json;

Status Bad(const std::string& what) { return InvalidArgument(std::string(st::kSource) + " export: " + what); }

// "[1,2,3]" without a JSON value per token.
std::string TokenIdsJson(const std::vector<int32_t>& tokens) {
  std::string s;
  s.reserve(tokens.size() * 7 + 2);
  s += '[';
  char buf[16];
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i) s += ',';
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, tokens[i]);
    s.append(buf, end);
  }
  s += ']';
  return s;
}

Status ValidateInfo(const CacheExportInfo& info) {
  if (!IsHex128(info.model_fingerprint)) return Bad("model fingerprint is not 32 lowercase hex digits");
  Status g = ValidateKvGeometry(info.geometry);
  if (!g.ok()) return Bad(g.message());
  if (info.n_cached < 0 || static_cast<uint64_t>(info.n_cached) > info.tokens.size())
    return Bad("n_cached " + std::to_string(info.n_cached) + " is not in [0, " + std::to_string(info.tokens.size()) +
               "] (the token count)");
  for (size_t i = 0; i < info.tokens.size(); ++i)
    if (info.tokens[i] < 0) return Bad("token_ids[" + std::to_string(i) + "] is negative");
  for (size_t i = 0; i < info.conversation.size(); ++i) {
    const auto& t = info.conversation[i];
    if (t.role.empty() || !ValidUtf8(t.role))
      return Bad("conversation[" + std::to_string(i) + "].role is empty or not UTF-8");
    if (!ValidUtf8(t.text)) return Bad("conversation[" + std::to_string(i) + "].text is not valid UTF-8");
  }
  if (!ValidUtf8(info.context_text)) return Bad("context_text is not valid UTF-8");
  if (!info.token_end_deltas.empty()) {
    if (info.context_text.empty() || info.token_end_deltas.size() != info.tokens.size())
      return Bad("token_end_deltas needs context_text and one entry per token");
    for (int64_t d : info.token_end_deltas)
      if (d < -1 || d > std::numeric_limits<int32_t>::max()) return Bad("token_end_deltas has " + std::to_string(d));
  }
  return Status::Ok();
}

}  // namespace

int64_t KvRowBytes(const KvGeometry& g) {
  const st::KvTypeSpec* t = st::FindKvType(g.kv_type);
  if (!t || g.group <= 0 || g.n_head_kv <= 0 || g.head_dim <= 0) return 0;
  if (t->name == st::kQ4kType) return KvFormat{KvType::kQ4K, g.group, g.rotate, g.chunk}.RowBytes(g.n_head_kv * g.head_dim);
  return g.n_head_kv * g.head_dim / g.group * st::GroupBytes(*t, g.group);
}

KvPayloadGeometry KvPayloadOf(const KvGeometry& g) {
  KvPayloadGeometry p;
  p.n_layer = g.n_layer;
  p.row_bytes = KvRowBytes(g);
  if (g.kv_type == st::kQ4kType) {
    const KvFormat f{KvType::kQ4K, g.group, g.rotate, g.chunk};
    p.chunk_tokens = g.chunk;
    p.chunk_bytes = f.ChunkBytes(g.n_head_kv * g.head_dim);
    p.staged_row_bytes = g.n_head_kv * g.head_dim * 2;
  }
  return p;
}

Status ValidateKvGeometry(const KvGeometry& g) {
  auto bad = [](const std::string& what) { return InvalidArgument("KV geometry: " + what); };
  const st::KvTypeSpec* t = st::FindKvType(g.kv_type);
  if (!t) return bad("unknown kv type \"" + g.kv_type + "\"");
  if (g.n_layer <= 0 || g.n_layer > st::kMaxDim) return bad("n_layer " + std::to_string(g.n_layer) + " out of range");
  if (g.n_head_kv <= 0 || g.n_head_kv > st::kMaxDim)
    return bad("n_head_kv " + std::to_string(g.n_head_kv) + " out of range");
  if (g.head_dim <= 0 || g.head_dim > st::kMaxDim)
    return bad("head_dim " + std::to_string(g.head_dim) + " out of range");
  const int64_t n = g.n_head_kv * g.head_dim;
  if (g.group <= 0 || g.group > n || n % g.group != 0)
    return bad("group " + std::to_string(g.group) + " does not divide the row of " + std::to_string(n) + " values");
  if (t->needs_even_group && g.group % 2 != 0)
    return bad(g.kv_type + " needs an even group, not " + std::to_string(g.group));
  if (t->name == st::kQ4kType) {
    // A V sub-block never spans two heads; K chunks pack two tokens per byte.
    if (g.head_dim % g.group != 0)
      return bad("q4k sub-blocks of " + std::to_string(g.group) + " do not divide head_dim " + std::to_string(g.head_dim));
    if (g.chunk < 2 || g.chunk > st::kQ4kMaxChunk || g.chunk % 2 != 0)
      return bad("q4k k_chunk_tokens " + std::to_string(g.chunk) + " is not an even number in [2, " +
                 std::to_string(st::kQ4kMaxChunk) + "]");
  } else if (g.chunk != 0) {
    return bad(g.kv_type + " has no K chunks (chunk " + std::to_string(g.chunk) + ")");
  }
  return Status::Ok();
}

namespace {

// The header text, padded with spaces (allowed by the format) so that the data buffer starts
// 8-byte aligned; info must be valid (ValidateInfo).
Result<std::string> HeaderText(const CacheExportInfo& info, const std::vector<st::TensorPlan>& plan) {
  const KvGeometry& g = info.geometry;
  OrderedJson header = OrderedJson::object();
  std::string text;
  try {
    // Metadata first: `head -c 4096 kv.safetensors` then shows what the file is.
    OrderedJson meta = OrderedJson::object();
    meta["format"] = st::kFormat;
    meta["format_version"] = st::kFormatVersion;
    // A placeholder of the hash's width, filled in by WriteKvSafetensors once the data is
    // written (so KvSafetensorsBytes knows the size without the data). First of the keys that
    // follow, so its text is the first match in the header.
    meta[std::string(st::kPayloadHashKey)] = std::string(st::kPayloadHashDigits, '0');
    meta["model_fingerprint"] = info.model_fingerprint;
    meta["kv_format"] = g.kv_type;
    meta["group_size"] = std::to_string(g.group);
    meta["rotation"] = g.rotate ? "on" : "off";
    meta["n_layer"] = std::to_string(g.n_layer);
    meta["n_head_kv"] = std::to_string(g.n_head_kv);
    meta["head_dim"] = std::to_string(g.head_dim);
    meta["n_cached"] = std::to_string(info.n_cached);
    if (g.kv_type == st::kQ4kType) meta[std::string(st::kChunkMetaKey)] = std::to_string(g.chunk);
    meta["token_ids"] = TokenIdsJson(info.tokens);
    OrderedJson conv = OrderedJson::array();
    for (const auto& t : info.conversation) conv.push_back({{"role", t.role}, {"text", t.text}});
    meta["conversation"] = conv.dump();
    if (!info.context_text.empty()) meta[std::string(st::kContextTextKey)] = info.context_text;
    if (!info.token_end_deltas.empty()) meta[std::string(st::kTokenEndsKey)] = OrderedJson(info.token_end_deltas).dump();
    header[std::string(st::kMetadataKey)] = std::move(meta);
    int64_t offset = 0;
    for (const auto& p : plan) {
      header[p.name] = {{"dtype", p.dtype}, {"shape", p.shape}, {"data_offsets", {offset, offset + p.bytes}}};
      offset += p.bytes;
    }
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // unreachable after ValidateInfo; kept local
    return Bad(std::string("header: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

Result<uint64_t> KvSafetensorsBytes(const CacheExportInfo& info) {
  KVFS_RETURN_IF_ERROR(ValidateInfo(info));
  const KvGeometry& g = info.geometry;
  KVFS_ASSIGN_OR_RETURN(std::string text, HeaderText(info, st::PlanTensors(g, *st::FindKvType(g.kv_type), info.n_cached)));
  return 8 + text.size() + static_cast<uint64_t>(KvPayloadOf(g).bytes(info.n_cached));
}

Result<std::string> WriteKvSafetensors(const CacheExportInfo& info, std::span<const KvChunk> chunks) {
  KVFS_RETURN_IF_ERROR(ValidateInfo(info));
  const KvGeometry& g = info.geometry;
  const st::KvTypeSpec& type = *st::FindKvType(g.kv_type);
  const int64_t row_bytes = KvRowBytes(g);
  const int64_t group_bytes = st::GroupBytes(type, g.group);
  const KvPayloadGeometry pg = KvPayloadOf(g);
  int64_t total_tokens = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const KvChunk& ch = chunks[c];
    if (ch.n_tokens < 0 || ch.n_tokens > info.n_cached - total_tokens)
      return Bad("chunk " + std::to_string(c) + " brings the cached tokens past n_cached " +
                 std::to_string(info.n_cached));
    if (static_cast<int64_t>(ch.payload.size()) != pg.bytes(ch.n_tokens))
      return Bad("chunk " + std::to_string(c) + " is " + std::to_string(ch.payload.size()) + " bytes, " +
                 std::to_string(ch.n_tokens) + " tokens need " + std::to_string(pg.bytes(ch.n_tokens)));
    // q4k: K chunks (and the tensors' chunk index) must not straddle two payload chunks.
    if (pg.staged_rows(ch.n_tokens) != 0 && c + 1 != chunks.size())
      return Bad("chunk " + std::to_string(c) + " of " + std::to_string(ch.n_tokens) + " tokens is not the last but "
                 "ends inside a K chunk of " + std::to_string(g.chunk));
    total_tokens += ch.n_tokens;
  }
  if (total_tokens != info.n_cached)
    return Bad("chunks hold " + std::to_string(total_tokens) + " tokens, n_cached is " + std::to_string(info.n_cached));

  std::vector<st::TensorPlan> plan = st::PlanTensors(g, type, info.n_cached);
  KVFS_ASSIGN_OR_RETURN(std::string text, HeaderText(info, plan));
  const int64_t data_bytes = pg.bytes(info.n_cached);
  std::string out;
  out.resize(8 + text.size() + static_cast<size_t>(data_bytes));
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);  // little-endian host (checked at configure time)
  std::memcpy(out.data() + 8, text.data(), text.size());
  auto* dst = reinterpret_cast<uint8_t*>(out.data() + 8 + text.size());
  const int64_t groups_per_row = g.n_head_kv * g.head_dim / g.group;
  for (const auto& p : plan) {
    if (p.part != st::Q4kPart::kNone) {
      int64_t first = 0;
      for (const KvChunk& ch : chunks) {
        st::CopyQ4kPart(p, g, const_cast<uint8_t*>(ch.payload.data()), ch.n_tokens, first, dst, /*to_tensor=*/true);
        first += ch.n_tokens;
      }
      dst += p.bytes;
      continue;
    }
    const int64_t len = p.field->Bytes(g.group);
    for (const KvChunk& ch : chunks) {
      const uint8_t* plane = ch.payload.data() + (p.layer * 2 + p.plane) * ch.n_tokens * row_bytes;
      st::GatherField(plane, ch.n_tokens * groups_per_row, group_bytes, p.field->offset, len, dst);
      dst += ch.n_tokens * groups_per_row * len;
    }
  }
  const std::string placeholder =
      "\"" + std::string(st::kPayloadHashKey) + "\":\"" + std::string(st::kPayloadHashDigits, '0') + "\"";
  const size_t at = std::string_view(out.data() + 8, text.size()).find(placeholder);
  if (at == std::string_view::npos) return Bad("header: no payload hash placeholder");  // unreachable
  const std::string hash = st::PayloadHashHex(out.data() + 8 + text.size(), static_cast<size_t>(data_bytes));
  std::memcpy(out.data() + 8 + at + placeholder.size() - 1 - hash.size(), hash.data(), hash.size());
  return out;
}

}  // namespace kvfs::store
