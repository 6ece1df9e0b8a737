#include "engine/backend/vulkan/device_weights.h"

#include <algorithm>
#include <string>

#include <spdlog/fmt/fmt.h>

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

Result<DeviceMatrix> UploadMatrix(Context& ctx, Uploader& up, const Matrix& m, int64_t max_binding_bytes,
                                  int64_t& total) {
  DeviceMatrix d;
  d.type = m.type;
  d.n_in = m.n_in;
  d.n_out = m.n_out;
  d.row_bytes = m.row_bytes;
  // Byte offsets inside a part are 32-bit in the shaders; a binding is at most 4 GiB anyway.
  const int64_t limit = std::min<int64_t>(max_binding_bytes, int64_t{1} << 32) - 4;
  const int64_t rows_per_part = limit / m.row_bytes;
  if (rows_per_part < 1) {
    return Unsupported(fmt::format("a weight row of {} bytes exceeds the device's storage binding of {} bytes",
                                   m.row_bytes, max_binding_bytes));
  }
  for (int64_t r0 = 0; r0 < m.n_out; r0 += rows_per_part) {
    DeviceMatrixPart part;
    part.row0 = r0;
    part.n_rows = std::min(rows_per_part, m.n_out - r0);
    const int64_t bytes = part.n_rows * m.row_bytes;
    KVFS_ASSIGN_OR_RETURN(part.buffer, ctx.CreateBuffer(bytes, MemoryKind::kDevice));
    KVFS_RETURN_IF_ERROR(up.Add(m.row(r0), bytes, part.buffer, 0));
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
                                                     int64_t max_binding_bytes) {
  KVFS_RETURN_IF_ERROR(CheckWeightTypes(w));
  auto d = std::make_unique<DeviceWeights>();
  int64_t& total = d->bytes;
  KVFS_ASSIGN_OR_RETURN(d->token_embd, UploadMatrix(ctx, up, w.token_embd, max_binding_bytes, total));
  if (w.tied_output || w.output.data == w.token_embd.data) {
    d->output = &d->token_embd;
  } else {
    KVFS_ASSIGN_OR_RETURN(d->untied_output, UploadMatrix(ctx, up, w.output, max_binding_bytes, total));
    d->output = &d->untied_output;
  }
  KVFS_ASSIGN_OR_RETURN(d->output_norm, UploadVector(ctx, up, w.output_norm, total));
  for (const LayerWeights& l : w.layers) {
    DeviceLayer dl;
    KVFS_ASSIGN_OR_RETURN(dl.attn_norm, UploadVector(ctx, up, l.attn_norm, total));
    KVFS_ASSIGN_OR_RETURN(dl.wq, UploadMatrix(ctx, up, l.wq, max_binding_bytes, total));
    KVFS_ASSIGN_OR_RETURN(dl.wk, UploadMatrix(ctx, up, l.wk, max_binding_bytes, total));
    KVFS_ASSIGN_OR_RETURN(dl.wv, UploadMatrix(ctx, up, l.wv, max_binding_bytes, total));
    KVFS_ASSIGN_OR_RETURN(dl.bq, UploadVector(ctx, up, l.bq, total));
    KVFS_ASSIGN_OR_RETURN(dl.bk, UploadVector(ctx, up, l.bk, total));
    KVFS_ASSIGN_OR_RETURN(dl.bv, UploadVector(ctx, up, l.bv, total));
    KVFS_ASSIGN_OR_RETURN(dl.wo, UploadMatrix(ctx, up, l.wo, max_binding_bytes, total));
    KVFS_ASSIGN_OR_RETURN(dl.ffn_norm, UploadVector(ctx, up, l.ffn_norm, total));
    KVFS_ASSIGN_OR_RETURN(dl.w_gate, UploadMatrix(ctx, up, l.w_gate, max_binding_bytes, total));
    KVFS_ASSIGN_OR_RETURN(dl.w_up, UploadMatrix(ctx, up, l.w_up, max_binding_bytes, total));
    KVFS_ASSIGN_OR_RETURN(dl.w_down, UploadMatrix(ctx, up, l.w_down, max_binding_bytes, total));
    d->layers.push_back(std::move(dl));
  }
  KVFS_RETURN_IF_ERROR(up.Flush());
  return d;
}

}  // namespace kvfs::vk
