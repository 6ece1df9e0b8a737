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

// Vectors one after another in one buffer (the stacked matrices' biases).
Result<DeviceVector> UploadVectors(Context& ctx, Uploader& up, std::initializer_list<const Vector*> vs, int64_t& total) {
  DeviceVector d;
  for (const Vector* v : vs) d.n += v->n;
  KVFS_ASSIGN_OR_RETURN(d.buffer, ctx.CreateBuffer(d.n * 4, MemoryKind::kDevice));
  int64_t at = 0;
  for (const Vector* v : vs) {
    KVFS_RETURN_IF_ERROR(up.Add(v->data, v->n * 4, d.buffer, at * 4));
    at += v->n;
  }
  total += d.buffer.bytes();
  return d;
}

}  // namespace

Result<DeviceMatrix> UploadMatrix(Context& ctx, Uploader& up, const Matrix& m, const WeightUploadOptions& options,
                                  int64_t& total) {
  const Matrix* one[] = {&m};
  return UploadStacked(ctx, up, one, options, total);
}

bool Stackable(std::span<const Matrix* const> ms) {
  if (ms.empty() || ms.size() > 3) return false;
  for (const Matrix* m : ms) {
    if (m->empty() || m->type != ms[0]->type || m->n_in != ms[0]->n_in || m->row_bytes != ms[0]->row_bytes) {
      return false;
    }
  }
  return true;
}

Result<DeviceMatrix> PlanStacked(std::span<const Matrix* const> ms, const WeightUploadOptions& options) {
  for (const Matrix* m : ms) {
    if (m->empty()) return InvalidArgument("an empty weight matrix cannot go to the device");
  }
  if (!Stackable(ms)) return Internal("matrices of different types or row lengths cannot be stacked");
  const Matrix& first = *ms[0];
  DeviceMatrix d;
  d.type = first.type;
  d.n_in = first.n_in;
  for (size_t i = 0; i < ms.size(); ++i) {
    if (i > 0) d.segment_rows.push_back(d.n_out);
    d.n_out += ms[i]->n_out;
  }
  const bool split = options.split_rows && SplitRowsApplies(first.type);
  d.layout = split ? WeightLayout::kSplitRows : WeightLayout::kGguf;
  d.row_bytes = split ? SplitRowBytes(first.type, first.n_in) : first.row_bytes;
  // Byte offsets inside a part are 32-bit in the shaders; a binding is at most 4 GiB anyway.
  const int64_t limit = std::min<int64_t>(options.max_binding_bytes, int64_t{1} << 32) - 4;
  const int64_t rows_per_part = limit / d.row_bytes;
  if (rows_per_part < 1) {
    return Unsupported(fmt::format("a weight row of {} bytes exceeds the device's storage binding of {} bytes",
                                   d.row_bytes, options.max_binding_bytes));
  }
  for (int64_t r0 = 0; r0 < d.n_out; r0 += rows_per_part) {
    DeviceMatrixPart part;
    part.row0 = r0;
    part.n_rows = std::min(rows_per_part, d.n_out - r0);
    d.parts.push_back(std::move(part));
  }
  return d;
}

bool StacksQkv(const LayerWeights& l, const WeightUploadOptions& options) {
  const Matrix* qkv[] = {&l.wq, &l.wk, &l.wv};
  const bool biases_agree = l.bq.empty() == l.bk.empty() && l.bk.empty() == l.bv.empty();
  return options.stack_matrices && Stackable(qkv) && biases_agree;
}

bool StacksGateUp(const LayerWeights& l, const WeightUploadOptions& options) {
  const Matrix* gate_up[] = {&l.w_gate, &l.w_up};
  return options.stack_matrices && Stackable(gate_up);
}

Result<DeviceMatrix> UploadStacked(Context& ctx, Uploader& up, std::span<const Matrix* const> ms,
                                   const WeightUploadOptions& options, int64_t& total) {
  KVFS_ASSIGN_OR_RETURN(DeviceMatrix d, PlanStacked(ms, options));
  const bool split = d.layout == WeightLayout::kSplitRows;
  // Split rows are rewritten on the host a slice at a time (the uploader copies them into its
  // staging buffer at once), so the rewrite never holds more than one slice.
  constexpr int64_t kSliceBytes = int64_t{16} << 20;
  const int64_t rows_per_copy = split ? std::max<int64_t>(1, kSliceBytes / d.row_bytes) : d.n_out;
  std::vector<uint8_t> slice;
  for (DeviceMatrixPart& part : d.parts) {
    const int64_t r0 = part.row0;
    KVFS_ASSIGN_OR_RETURN(part.buffer, ctx.CreateBuffer(part.n_rows * d.row_bytes, MemoryKind::kDevice));
    // Copies of rows that lie in one source matrix (and one slice).
    for (int64_t r = r0; r < r0 + part.n_rows;) {
      size_t k = 0;
      int64_t m_row0 = 0;  // stacked row of source k's row 0
      while (r >= m_row0 + ms[k]->n_out) m_row0 += ms[k++]->n_out;
      const Matrix& m = *ms[k];
      const int64_t n = std::min({r0 + part.n_rows - r, m_row0 + m.n_out - r, rows_per_copy});
      const int64_t at = (r - r0) * d.row_bytes;
      if (!split) {
        KVFS_RETURN_IF_ERROR(up.Add(m.row(r - m_row0), n * d.row_bytes, part.buffer, at));
      } else {
        slice.resize(static_cast<size_t>(n * d.row_bytes));
        SplitRows(m.type, m.n_in, m.row(r - m_row0), m.row_bytes, n, slice.data());
        KVFS_RETURN_IF_ERROR(up.Add(slice.data(), n * d.row_bytes, part.buffer, at));
      }
      r += n;
    }
    total += part.buffer.bytes();
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
    const auto matrices = l.Matrices();
    for (size_t k = 0; k < matrices.size(); ++k)
      KVFS_RETURN_IF_ERROR(check(*matrices[k], fmt::format("blk.{}.{}", i, LayerWeights::kMatrixNames[k])));
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
    if (StacksQkv(l, options)) {
      const Matrix* qkv[] = {&l.wq, &l.wk, &l.wv};
      KVFS_ASSIGN_OR_RETURN(dl.wqkv, UploadStacked(ctx, up, qkv, options, total));
      if (!l.bq.empty()) {
        KVFS_ASSIGN_OR_RETURN(dl.bqkv, UploadVectors(ctx, up, {&l.bq, &l.bk, &l.bv}, total));
      }
    } else {
      KVFS_ASSIGN_OR_RETURN(dl.wq, UploadMatrix(ctx, up, l.wq, options, total));
      KVFS_ASSIGN_OR_RETURN(dl.wk, UploadMatrix(ctx, up, l.wk, options, total));
      KVFS_ASSIGN_OR_RETURN(dl.wv, UploadMatrix(ctx, up, l.wv, options, total));
      KVFS_ASSIGN_OR_RETURN(dl.bq, UploadVector(ctx, up, l.bq, total));
      KVFS_ASSIGN_OR_RETURN(dl.bk, UploadVector(ctx, up, l.bk, total));
      KVFS_ASSIGN_OR_RETURN(dl.bv, UploadVector(ctx, up, l.bv, total));
    }
    KVFS_ASSIGN_OR_RETURN(dl.wo, UploadMatrix(ctx, up, l.wo, options, total));
    KVFS_ASSIGN_OR_RETURN(dl.ffn_norm, UploadVector(ctx, up, l.ffn_norm, total));
    if (StacksGateUp(l, options)) {
      const Matrix* gate_up[] = {&l.w_gate, &l.w_up};
      KVFS_ASSIGN_OR_RETURN(dl.w_gate_up, UploadStacked(ctx, up, gate_up, options, total));
    } else {
      KVFS_ASSIGN_OR_RETURN(dl.w_gate, UploadMatrix(ctx, up, l.w_gate, options, total));
      KVFS_ASSIGN_OR_RETURN(dl.w_up, UploadMatrix(ctx, up, l.w_up, options, total));
    }
    KVFS_ASSIGN_OR_RETURN(dl.w_down, UploadMatrix(ctx, up, l.w_down, options, total));
    d->layers.push_back(std::move(dl));
  }
  KVFS_RETURN_IF_ERROR(up.Flush());
  return d;
}

}  // namespace kvfs::vk
