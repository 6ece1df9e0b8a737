// Host -> device copies through a host-visible staging buffer: the rows are packed into the
// staging buffer, copy commands are queued in one command buffer and run (submitted and
// waited for) when the staging buffer is full or at Flush. Used to upload the weights once and
// the KV rows a device copy lacks.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/backend/vulkan/vk_commands.h"
#include "engine/backend/vulkan/vk_context.h"
#include "engine/core/status.h"

namespace kvfs::vk {

class Uploader {
 public:
  static Result<std::unique_ptr<Uploader>> Create(Context& ctx, int64_t staging_bytes);

  // Copies n_rows rows of row_bytes from host memory (src_stride apart) into dst, at
  // dst_offset, dst_stride apart (dst_stride >= row_bytes; padding bytes are left as they are
  // in the staging buffer). Runs at the next flush.
  Status AddRows(const uint8_t* src, int64_t n_rows, int64_t src_stride, int64_t row_bytes, const Buffer& dst,
                 int64_t dst_offset, int64_t dst_stride);
  Status Add(const void* src, int64_t bytes, const Buffer& dst, int64_t dst_offset);
  // Runs every queued copy and waits for them.
  Status Flush();

 private:
  explicit Uploader(Context& ctx) : rec_(ctx) {}
  Status Open();

  Recorder rec_;
  Buffer staging_;  // host-visible
  int64_t used_ = 0;
  bool open_ = false;
};

}  // namespace kvfs::vk
