#include "engine/backend/vulkan/vk_transfer.h"

#include <algorithm>
#include <cstring>

namespace kvfs::vk {

Result<std::unique_ptr<Uploader>> Uploader::Create(Context& ctx, int64_t staging_bytes) {
  std::unique_ptr<Uploader> up(new Uploader(ctx));
  KVFS_ASSIGN_OR_RETURN(up->staging_, ctx.CreateBuffer(staging_bytes, MemoryKind::kUpload));
  return up;
}

Status Uploader::Open() {
  if (open_) return Status::Ok();
  KVFS_RETURN_IF_ERROR(rec_.Begin());
  open_ = true;
  used_ = 0;
  return Status::Ok();
}

Status Uploader::AddRows(const uint8_t* src, int64_t n_rows, int64_t src_stride, int64_t row_bytes, const Buffer& dst,
                         int64_t dst_offset, int64_t dst_stride) {
  const int64_t capacity = staging_.bytes();
  int64_t row = 0;
  while (row < n_rows) {
    KVFS_RETURN_IF_ERROR(Open());
    // Whole rows that fit what is left of the staging buffer, at least one (a row longer than
    // the staging buffer is sent in pieces below).
    const int64_t fit = (capacity - used_) / dst_stride;
    if (fit == 0 && used_ > 0) {
      KVFS_RETURN_IF_ERROR(Flush());
      continue;
    }
    if (fit == 0) {  // one row larger than the whole staging buffer
      for (int64_t done = 0; done < row_bytes; done += capacity) {
        KVFS_RETURN_IF_ERROR(Open());
        const int64_t piece = std::min(capacity, row_bytes - done);
        std::memcpy(staging_.mapped(), src + row * src_stride + done, static_cast<size_t>(piece));
        rec_.Copy(staging_, 0, dst, dst_offset + row * dst_stride + done, piece);
        used_ = capacity;
        KVFS_RETURN_IF_ERROR(Flush());
      }
      ++row;
      continue;
    }
    const int64_t n = std::min(fit, n_rows - row);
    uint8_t* out = staging_.mapped() + used_;
    if (src_stride == row_bytes && dst_stride == row_bytes) {
      std::memcpy(out, src + row * src_stride, static_cast<size_t>(n * row_bytes));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(out + i * dst_stride, src + (row + i) * src_stride, static_cast<size_t>(row_bytes));
      }
    }
    rec_.Copy(staging_, used_, dst, dst_offset + row * dst_stride, (n - 1) * dst_stride + row_bytes);
    used_ += n * dst_stride;
    used_ = (used_ + 3) / 4 * 4;  // copy offsets stay word aligned
    row += n;
  }
  return Status::Ok();
}

Status Uploader::Add(const void* src, int64_t bytes, const Buffer& dst, int64_t dst_offset) {
  return AddRows(static_cast<const uint8_t*>(src), 1, bytes, bytes, dst, dst_offset, bytes);
}

Status Uploader::Flush() {
  if (!open_) return Status::Ok();
  open_ = false;
  used_ = 0;
  return rec_.SubmitAndWait();
}

}  // namespace kvfs::vk
