// Import side of kv.safetensors (format: safetensors.h). The input is hostile until proven
// otherwise (it is whatever a user wrote into the file): every length is checked against the
// input before it is used, the JSON is depth-bounded before parsing, and the only large
// allocation is the output, whose size must equal the data buffer's.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "engine/core/strict_json.h"
#include "engine/store/safetensors.h"
#include "engine/store/safetensors_layout.h"

namespace kvfs::store {
namespace {

using Json = nlohmann::json;

std::string Src() { return std::string(st::kSource) + ": "; }
Status Malformed(const std::string& what) { return Corrupt(Src() + what); }
Status Mismatch(const std::string& what) { return InvalidArgument(Src() + what); }

std::string Quoted(std::string_view s) { return ClipForMessage(s, 48, '"'); }

// ParseStrictJson (bounded depth checked before parsing, so that a hostile header cannot drive
// recursive code deep; no duplicate keys; at most `max_events` parser events: the caller knows
// how many a valid text can have), its errors as this file's corruption.
Result<Json> ParseJson(std::string_view text, int max_depth, int64_t max_events, const std::string& what) {
  Result<Json> j = ParseStrictJson(text, what, JsonLimits{max_depth, max_events, /*quote_text=*/false});
  if (!j.ok()) return Malformed(j.status().message());
  return j;
}

// Strict decimal: digits only, no sign, no leading zero, at most 18 digits (fits int64).
std::optional<int64_t> ParseDecimal(std::string_view s) {
  if (s.empty() || s.size() > 18 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// A JSON array of integers in [lo, hi], parsed by hand: a long agent has hundreds of thousands
// of token ids, and this keeps the cost to one pass without a JSON value per element. `what`
// names the key; `below` says what a value under lo is.
Result<std::vector<int64_t>> ParseIntArray(std::string_view s, std::string_view what, int64_t lo, int64_t hi,
                                           std::string_view below) {
  const std::string err = "__metadata__ " + std::string(what) + ": ";
  std::vector<int64_t> out;
  size_t i = 0;
  auto ws = [&] { while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i; };
  ws();
  if (i >= s.size() || s[i] != '[') return Malformed(err + "not a JSON array");
  ++i;
  ws();
  if (i < s.size() && s[i] == ']') {
    ++i;
  } else {
    while (true) {
      const std::string at = err + "element " + std::to_string(out.size()) + ": ";
      ws();
      const bool negative = i < s.size() && s[i] == '-';
      if (negative) ++i;
      const size_t digits = i;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      if (i == digits) return Malformed(at + "not an integer");
      if (i < s.size() && (s[i] == '.' || s[i] == 'e' || s[i] == 'E')) return Malformed(at + "not an integer");
      if (i - digits > 1 && s[digits] == '0') return Malformed(at + "leading zero");
      const std::string_view text = s.substr(digits, std::min<size_t>(i - digits, 24));
      const int64_t limit = negative ? -lo : hi;  // on the magnitude
      int64_t v = 0;
      for (size_t k = digits; k < i; ++k) {
        v = v * 10 + (s[k] - '0');
        if (v > limit) {
          if (negative) return Malformed(at + std::string(below));
          return Malformed(at + std::string(text) + " is out of int32 range");
        }
      }
      if (negative) v = -v;
      if (v < lo) return Malformed(at + std::string(below));
      out.push_back(v);
      ws();
      if (i < s.size() && s[i] == ',') { ++i; continue; }
      if (i < s.size() && s[i] == ']') { ++i; break; }
      return Malformed(err + "expected ',' or ']' after element " + std::to_string(out.size() - 1));
    }
  }
  ws();
  if (i != s.size()) return Malformed(err + "trailing characters after the array");
  return out;
}

Result<std::vector<int32_t>> ParseTokenIds(std::string_view s) {
  KVFS_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                        ParseIntArray(s, "token_ids", 0, std::numeric_limits<int32_t>::max(), "negative token id"));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

// At most one turn per token id, plus slack (a turn costs 6 parser events).
Result<std::vector<ConversationTurn>> ParseConversation(const std::string& s, size_t n_tokens) {
  const int64_t max_events = 6 * (static_cast<int64_t>(n_tokens) + 1024) + 2;
  KVFS_ASSIGN_OR_RETURN(Json j, ParseJson(s, 2, max_events, "__metadata__ conversation"));
  if (!j.is_array()) return Malformed("__metadata__ conversation: not a JSON array");
  std::vector<ConversationTurn> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = "__metadata__ conversation[" + std::to_string(i) + "]: ";
    const Json& t = j[i];
    if (!t.is_object() || t.size() != 2 || !t.contains("role") || !t.contains("text"))
      return Malformed(at + "expected an object with exactly \"role\" and \"text\"");
    if (!t["role"].is_string() || !t["text"].is_string()) return Malformed(at + "role and text must be strings");
    ConversationTurn turn{t["role"].get<std::string>(), t["text"].get<std::string>()};
    // The JSON parser has already rejected ill-formed UTF-8 and lone surrogate escapes.
    if (turn.role.empty()) return Malformed(at + "empty role");
    out.push_back(std::move(turn));
  }
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A (depth-bounded) JSON value for a message.
std::string Brief(const Json& j) { return ClipForMessage(j.dump(), 64); }

std::optional<int64_t> NonNegative(const Json& j) {
  if (j.is_number_unsigned()) {
    const auto v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return j.get<int64_t>();
  return std::nullopt;
}

// Header metadata -> export info, checking identity against what the caller expects.
Result<CacheExportInfo> ReadMetadata(const Json& header, std::string_view expected_fp, const KvGeometry& expected) {
  auto it = header.find(std::string(st::kMetadataKey));
  if (it == header.end()) return Malformed("no __metadata__ (not a kvfs KV cache export)");
  if (!it->is_object()) return Malformed("__metadata__ is not an object");
  for (const auto& [key, value] : it->items())
    if (!value.is_string()) return Malformed("__metadata__ " + Quoted(key) + " is not a string");
  for (std::string_view key : st::kMetaKeys)
    if (!it->contains(std::string(key))) return Malformed("__metadata__ is missing \"" + std::string(key) + "\"");
  auto get = [&](std::string_view key) -> const std::string& {
    return (*it)[std::string(key)].get_ref<const std::string&>();
  };
  auto number = [&](std::string_view key) -> Result<int64_t> {
    auto v = ParseDecimal(get(key));
    if (!v) return Malformed("__metadata__ " + std::string(key) + " " + Quoted(get(key)) + " is not a decimal number");
    return *v;
  };

  if (get("format") != st::kFormat) return Mismatch("format " + Quoted(get("format")) + " is not \"kvfs-kv\"");
  const std::string& version = get("format_version");
  if (version != st::kFormatVersion && version != st::kFormatVersionOptionalHash)
    return Mismatch("format_version " + Quoted(version) + " is not supported (this build reads 1 and 2)");
  // Malformed, as any missing key (EINVAL at the import's close): without it the data, damaged
  // or not, would be imported unchecked.
  if (version != st::kFormatVersionOptionalHash && !it->contains(std::string(st::kPayloadHashKey)))
    return Malformed("__metadata__ is missing \"" + std::string(st::kPayloadHashKey) +
                     "\", the checksum of the data, which format_version " + version + " requires");
  CacheExportInfo info;
  info.model_fingerprint = get("model_fingerprint");
  if (!IsHex128(info.model_fingerprint)) return Malformed("model_fingerprint is not 32 lowercase hex digits");
  if (info.model_fingerprint != expected_fp)
    return Mismatch("made for model " + info.model_fingerprint + ", this model is " + std::string(expected_fp));
  KvGeometry& g = info.geometry;
  g.kv_type = get("kv_format");
  if (g.kv_type != expected.kv_type)
    return Mismatch("kv_format " + Quoted(g.kv_type) + " != expected \"" + expected.kv_type + "\"");
  KVFS_ASSIGN_OR_RETURN(g.group, number("group_size"));
  if (g.group != expected.group)
    return Mismatch("group_size " + std::to_string(g.group) + " != expected " + std::to_string(expected.group));
  if (get("rotation") != "on" && get("rotation") != "off") return Malformed("rotation is neither \"on\" nor \"off\"");
  g.rotate = get("rotation") == "on";
  if (g.rotate != expected.rotate)
    return Mismatch(std::string("rotation ") + (g.rotate ? "on" : "off") + " != expected " +
                    (expected.rotate ? "on" : "off"));
  if (g.kv_type == st::kQ4kType) {
    if (!it->contains(std::string(st::kChunkMetaKey)))
      return Malformed("__metadata__ is missing \"" + std::string(st::kChunkMetaKey) + "\" (q4k)");
    KVFS_ASSIGN_OR_RETURN(g.chunk, number(st::kChunkMetaKey));
    if (g.chunk != expected.chunk)
      return Mismatch("k_chunk_tokens " + std::to_string(g.chunk) + " != expected " + std::to_string(expected.chunk));
  }
  KVFS_ASSIGN_OR_RETURN(g.n_layer, number("n_layer"));
  KVFS_ASSIGN_OR_RETURN(g.n_head_kv, number("n_head_kv"));
  KVFS_ASSIGN_OR_RETURN(g.head_dim, number("head_dim"));
  if (g != expected)
    return Mismatch("geometry n_layer/n_head_kv/head_dim " + std::to_string(g.n_layer) + "/" +
                    std::to_string(g.n_head_kv) + "/" + std::to_string(g.head_dim) + " != expected " +
                    std::to_string(expected.n_layer) + "/" + std::to_string(expected.n_head_kv) + "/" +
                    std::to_string(expected.head_dim));
  KVFS_ASSIGN_OR_RETURN(info.n_cached, number("n_cached"));
  KVFS_ASSIGN_OR_RETURN(info.tokens, ParseTokenIds(get("token_ids")));
  if (static_cast<uint64_t>(info.n_cached) > info.tokens.size())
    return Malformed("n_cached " + std::to_string(info.n_cached) + " > " + std::to_string(info.tokens.size()) +
                     " token ids");
  KVFS_ASSIGN_OR_RETURN(info.conversation, ParseConversation(get("conversation"), info.tokens.size()));
  if (it->contains(std::string(st::kContextTextKey))) info.context_text = get(st::kContextTextKey);
  if (it->contains(std::string(st::kTokenEndsKey))) {
    KVFS_ASSIGN_OR_RETURN(info.token_end_deltas, ParseIntArray(get(st::kTokenEndsKey), st::kTokenEndsKey, -1,
                                                               std::numeric_limits<int32_t>::max(), "below -1"));
    if (info.token_end_deltas.size() != info.tokens.size())
      return Malformed(std::string(st::kTokenEndsKey) + " has " + std::to_string(info.token_end_deltas.size()) +
                       " entries for " + std::to_string(info.tokens.size()) + " token ids");
  }
  return info;
}

// Checks one tensor entry against its plan; returns its begin offset in the data buffer.
Result<int64_t> CheckTensor(const std::string& name, const Json& t, const st::TensorPlan& p, int64_t data_size) {
  const std::string at = "tensor " + name + ": ";
  if (!t.is_object()) return Malformed(at + "not an object");
  for (const auto& [key, value] : t.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      return Malformed(at + "unknown field " + Quoted(key));
  if (!t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
    return Malformed(at + "needs dtype, shape and data_offsets");
  const Json& dtype = t["dtype"];
  if (!dtype.is_string() || dtype.get_ref<const std::string&>() != p.dtype)
    return Malformed(at + "dtype " + Brief(dtype) + " != expected \"" + std::string(p.dtype) + "\"");
  const Json& shape = t["shape"];
  bool same = shape.is_array() && shape.size() == p.shape.size();
  for (size_t i = 0; same && i < p.shape.size(); ++i) same = NonNegative(shape[i]) == p.shape[i];
  if (!same) return Malformed(at + "shape " + Brief(shape) + " != expected " + ShapeString(p.shape));
  const Json& off = t["data_offsets"];
  std::optional<int64_t> begin, end;
  if (off.is_array() && off.size() == 2) {
    begin = NonNegative(off[0]);
    end = NonNegative(off[1]);
  }
  if (!begin || !end || *begin > *end)
    return Malformed(at + "data_offsets " + Brief(off) + " is not [begin, end] with begin <= end");
  if (*end > data_size)
    return Malformed(at + "data_offsets " + Brief(off) + " out of range (data buffer is " + std::to_string(data_size) +
                     " bytes)");
  if (*end - *begin != p.bytes)
    return Malformed(at + "data_offsets " + Brief(off) + " hold " + std::to_string(*end - *begin) +
                     " bytes, dtype and shape need " + std::to_string(p.bytes));
  return *begin;
}

}  // namespace

Result<ImportedCache> ReadKvSafetensors(std::string_view bytes, std::string_view expected_fingerprint,
                                        const KvGeometry& expected, int64_t block_tokens) {
  KVFS_RETURN_IF_ERROR(ValidateKvGeometry(expected));
  if (!IsHex128(expected_fingerprint)) return InvalidArgument("expected fingerprint is not 32 lowercase hex digits");
  if (block_tokens <= 0 || block_tokens > kMaxBlockSize) return InvalidArgument("block_tokens out of range");

  if (bytes.size() < 8)
    return Malformed("file is " + std::to_string(bytes.size()) + " bytes, shorter than its 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > bytes.size() - 8)
    return Malformed("header length " + std::to_string(header_len) + " is larger than the file (" +
                     std::to_string(bytes.size() - 8) + " bytes follow it)");
  if (header_len > st::kMaxHeaderBytes)
    return Malformed("header length " + std::to_string(header_len) + " exceeds the limit");
  // Top object > tensor entry > shape array: three levels are all the format has. A tensor entry
  // is 16 parser events; allow twice that per tensor and up to 4096 metadata entries.
  const st::KvTypeSpec& expected_type = *st::FindKvType(expected.kv_type);
  const auto per_layer = static_cast<int64_t>(expected_type.name == st::kQ4kType ? std::size(st::kQ4kTensors)
                                                                                 : 2 * expected_type.fields.size());
  const int64_t max_events = 32 * (expected.n_layer * per_layer + 1) + 2 * 4096 + 16;
  KVFS_ASSIGN_OR_RETURN(Json header, ParseJson(bytes.substr(8, header_len), 3, max_events, "header"));
  if (!header.is_object()) return Malformed("header is not a JSON object");
  const std::string_view data = bytes.substr(8 + header_len);
  const auto data_size = static_cast<int64_t>(data.size());

  ImportedCache out;
  KVFS_ASSIGN_OR_RETURN(out.info, ReadMetadata(header, expected_fingerprint, expected));
  const KvGeometry& g = out.info.geometry;
  const int64_t n_cached = out.info.n_cached;
  const st::KvTypeSpec& type = *st::FindKvType(g.kv_type);
  const int64_t row_bytes = KvRowBytes(g);
  const KvPayloadGeometry pg = KvPayloadOf(g);
  // Divide rather than multiply: n_cached comes from the file and may be huge. Every token has
  // at least its V rows.
  const bool too_many = n_cached > data_size / (g.n_layer * row_bytes);
  if (too_many || pg.bytes(n_cached) != data_size)
    return Malformed("data buffer is " + std::to_string(data_size) + " bytes, n_cached " + std::to_string(n_cached) +
                     " needs " + (too_many ? "more" : std::to_string(pg.bytes(n_cached))) + " (truncated or padded?)");
  // The data's checksum (every export has one; ReadMetadata required it unless the file is of
  // version 1): a damaged copy is refused here rather than imported as attention state.
  if (const auto meta = header.find(std::string(st::kMetadataKey)); meta->contains(std::string(st::kPayloadHashKey))) {
    const std::string& want = (*meta)[std::string(st::kPayloadHashKey)].get_ref<const std::string&>();
    if (want.size() != st::kPayloadHashDigits ||
        want.find_first_not_of("0123456789abcdef") != std::string::npos)
      return Malformed(std::string(st::kPayloadHashKey) + " " + Quoted(want) + " is not 16 lowercase hex digits");
    if (st::PayloadHashHex(data.data(), data.size()) != want)
      return Malformed("the data does not match its checksum (" + std::string(st::kPayloadHashKey) +
                       "): the file is damaged");
  }
  if (pg.keys_by_chunk() && block_tokens % g.chunk != 0)
    return InvalidArgument("q4k K chunks of " + std::to_string(g.chunk) + " tokens do not divide blocks of " +
                           std::to_string(block_tokens));

  const std::vector<st::TensorPlan> plan = st::PlanTensors(g, type, n_cached);
  std::unordered_map<std::string_view, size_t> index;
  for (size_t i = 0; i < plan.size(); ++i) index.emplace(plan[i].name, i);
  std::vector<int64_t> begin(plan.size(), -1);
  for (const auto& [name, value] : header.items()) {
    if (name == st::kMetadataKey) continue;
    auto it = index.find(name);
    if (it == index.end()) return Malformed("unknown tensor " + Quoted(name));
    KVFS_ASSIGN_OR_RETURN(begin[it->second], CheckTensor(name, value, plan[it->second], data_size));
  }
  for (size_t i = 0; i < plan.size(); ++i)
    if (begin[i] < 0) return Malformed("missing tensor " + plan[i].name);
  // Tensors must tile the buffer: sorted by offset, each starts where the previous ended. Empty
  // tensors (q4k's K chunks of a cache shorter than one chunk) sort before a tensor that starts
  // at the same offset.
  std::vector<size_t> order(plan.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return begin[a] != begin[b] ? begin[a] < begin[b] : plan[a].bytes < plan[b].bytes;
  });
  int64_t cursor = 0;
  for (size_t i : order) {
    if (begin[i] < cursor)
      return Malformed("tensor " + plan[i].name + " overlaps the tensor before it at offset " +
                       std::to_string(begin[i]));
    if (begin[i] > cursor)
      return Malformed("tensor " + plan[i].name + " starts at " + std::to_string(begin[i]) +
                       ", leaving a gap after offset " + std::to_string(cursor) + " (offsets are not contiguous)");
    cursor += plan[i].bytes;
  }

  const int64_t groups_per_row = g.n_head_kv * g.head_dim / g.group;
  const int64_t group_bytes = st::GroupBytes(type, g.group);
  const auto* base = reinterpret_cast<const uint8_t*>(data.data());
  for (int64_t start = 0; start < n_cached; start += block_tokens) {
    const int64_t n = std::min(block_tokens, n_cached - start);
    std::vector<uint8_t> chunk(static_cast<size_t>(pg.bytes(n)));
    for (size_t i = 0; i < plan.size(); ++i) {
      const st::TensorPlan& p = plan[i];
      if (p.part != st::Q4kPart::kNone) {
        st::CopyQ4kPart(p, g, chunk.data(), n, start, const_cast<uint8_t*>(base) + begin[i], /*to_tensor=*/false);
        continue;
      }
      const int64_t len = p.field->Bytes(g.group);
      st::ScatterField(base + begin[i] + start * groups_per_row * len, n * groups_per_row, group_bytes, p.field->offset,
                       len, chunk.data() + (p.layer * 2 + p.plane) * n * row_bytes);
    }
    out.chunks.push_back(std::move(chunk));
    out.chunk_tokens.push_back(n);
  }
  return out;
}

}  // namespace kvfs::store
