#include "engine/backend/vulkan/device_weights.h"

#include <algorithm>
#include <string>

#include <spdlog/fmt/fmt.h>

#include "engine/backend/vulkan/weight_layout.h"
#include "engine/model/ggml_types.h"

namespace kvfs::vk {

namespace {

Result<DeviceVector> UploadVector(Context& ctx, Uploader& up, const Vector& v, int64_t& total) {
  DeviceVector d;
  if (v.empty()) return d;
  d.n = v.n;
  KVFS_ASSIGN_OR_RETURN(d.buffer, ctx.CreateBuffer(v.n * 4, MemoryKind::kDevice));
  KVFS_RETURN_IF_ERROR(up.Add(v.data, v.n * 4, d.buffer, 0));
  total += d.buffer.bytes();
  return d;
}

}  // namespace

Result<DeviceMatrix> UploadMatrix(Context& ctx, Uploader& up, const Matrix& m, const WeightUploadOptions& options,
                                  int64_t& total) {
  DeviceMatrix d;
  d.type = m.type;
  d.n_in = m.n_in;
  d.n_out = m.n_out;
  const bool split = options.split_rows && SplitRowsApplies(m.type);
  d.layout = split ? WeightLayout::kSplitRows : WeightLayout::kGguf;
  d.row_bytes = split ? SplitRowBytes(m.type, m.n_in) : m.row_bytes;
  // Byte offsets inside a part are 32-bit in the shaders; a binding is at most 4 GiB anyway.
  const int64_t limit = std::min<int64_t>(options.max_binding_bytes, int64_t{1} << 32) - 4;
  const int64_t rows_per_part = limit / d.row_bytes;
  if (rows_per_part < 1) {
    return Unsupported(fmt::format("a weight row of {} bytes exceeds the device's storage binding of {} bytes",
                                   d.row_bytes, options.max_binding_bytes));
  }
  // Split rows are rewritten on the host a slice at a time (the uploader copies them into its
  // staging buffer at once), so the rewrite never holds more than one slice.
  constexpr int64_t kSliceBytes = int64_t{16} << 20;
  std::vector<uint8_t> slice;
  for (int64_t r0 = 0; r0 < m.n_out; r0 += rows_per_part) {
    DeviceMatrixPart part;
    part.row0 = r0;
    part.n_rows = std::min(rows_per_part, m.n_out - r0);
    const int64_t bytes = part.n_rows * d.row_bytes;
    KVFS_ASSIGN_OR_RETURN(part.buffer, ctx.CreateBuffer(bytes, MemoryKind::kDevice));
    if (!split) {
      KVFS_RETURN_IF_ERROR(up.Add(m.row(r0), bytes, part.buffer, 0));
    } else {
      const int64_t rows_per_slice = std::max<int64_t>(1, kSliceBytes / d.row_bytes);
      for (int64_t s0 = 0; s0 < part.n_rows; s0 += rows_per_slice) {
        const int64_t n = std::min(rows_per_slice, part.n_rows - s0);
        slice.resize(static_cast<size_t>(n * d.row_bytes));
        SplitRows(m.type, m.n_in, m.row(r0 + s0), m.row_bytes, n, slice.data());
        KVFS_RETURN_IF_ERROR(up.Add(slice.data(), n * d.row_bytes, part.buffer, s0 * d.row_bytes));
      }
    }
    total += part.buffer.bytes();
    d.parts.push_back(std::move(part));
  }
  return d;
}

Status CheckWeightTypes(const ModelWeights& w) {
  auto check = [](const Matrix& m, const std::string& name) -> Status {
    if (SupportedWeightType(m.type)) return Status::Ok();
    const GgmlTypeTraits* info = GgmlTypeInfo(static_cast<uint32_t>(m.type));
    return Unsupported(fmt::format("the Vulkan backend has no kernels for {} weights (tensor {}); use --backend cpu",
                                   info != nullptr ? std::string(info->name) : "unknown", name));
  };
  KVFS_RETURN_IF_ERROR(check(w.token_embd, "token_embd"));
  KVFS_RETURN_IF_ERROR(check(w.output, "output"));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::pair<const Matrix*, const char*> mats[] = {{&l.wq, "attn_q"},      {&l.wk, "attn_k"},  {&l.wv, "attn_v"},
                                                          {&l.wo, "attn_output"}, {&l.w_gate, "ffn_gate"},
                                                          {&l.w_up, "ffn_up"},    {&l.w_down, "ffn_down"}};
    for (const auto& [m, name] : mats) KVFS_RETURN_IF_ERROR(check(*m, fmt::format("blk.{}.{}", i, name)));
  }
  return Status::Ok();
}

Result<std::unique_ptr<DeviceWeights>> UploadWeights(Context& ctx, Uploader& up, const ModelWeights& w,
                                                     const WeightUploadOptions& options) {
  KVFS_RETURN_IF_ERROR(CheckWeightTypes(w));
  auto d = std::make_unique<DeviceWeights>();
  int64_t& total = d->bytes;
  KVFS_ASSIGN_OR_RETURN(d->token_embd, UploadMatrix(ctx, up, w.token_embd, options, total));
  if (w.tied_output || w.output.data == w.token_embd.data) {
    d->output = &d->token_embd;
  } else {
    KVFS_ASSIGN_OR_RETURN(d->untied_output, UploadMatrix(ctx, up, w.output, options, total));
    d->output = &d->untied_output;
  }
  KVFS_ASSIGN_OR_RETURN(d->output_norm, UploadVector(ctx, up, w.output_norm, total));
  for (const LayerWeights& l : w.layers) {
    DeviceLayer dl;
    KVFS_ASSIGN_OR_RETURN(dl.attn_norm, UploadVector(ctx, up, l.attn_norm, total));
    KVFS_ASSIGN_OR_RETURN(dl.wq, UploadMatrix(ctx, up, l.wq, options, total));
    KVFS_ASSIGN_OR_RETURN(dl.wk, UploadMatrix(ctx, up, l.wk, options, total));
    KVFS_ASSIGN_OR_RETURN(dl.wv, UploadMatrix(ctx, up, l.wv, options, total));
    KVFS_ASSIGN_OR_RETURN(dl.bq, UploadVector(ctx, up, l.bq, total));
    KVFS_ASSIGN_OR_RETURN(dl.bk, UploadVector(ctx, up, l.bk, total));
    KVFS_ASSIGN_OR_RETURN(dl.bv, UploadVector(ctx, up, l.bv, total));
    KVFS_ASSIGN_OR_RETURN(dl.wo, UploadMatrix(ctx, up, l.wo, options, total));
    KVFS_ASSIGN_OR_RETURN(dl.ffn_norm, UploadVector(ctx, up, l.ffn_norm, total));
    KVFS_ASSIGN_OR_RETURN(dl.w_gate, UploadMatrix(ctx, up, l.w_gate, options, total));
    KVFS_ASSIGN_OR_RETURN(dl.w_up, UploadMatrix(ctx, up, l.w_up, options, total));
    KVFS_ASSIGN_OR_RETURN(dl.w_down, UploadMatrix(ctx, up, l.w_down, options, total));
    d->layers.push_back(std::move(dl));
  }
  KVFS_RETURN_IF_ERROR(up.Flush());
  return d;
}

}  // namespace kvfs::vk
