#include "fs/utf8.h"

namespace kvfs::fs {

bool Utf8Validator::Feed(std::string_view bytes) {
  for (unsigned char c : bytes) {
    if (!valid_) return false;
    if (needed_ == 0) {
      if (c < 0x80) continue;
      if (c >= 0xC2 && c <= 0xDF) {
        needed_ = 1, code_ = c & 0x1F, min_code_ = 0x80;
      } else if (c >= 0xE0 && c <= 0xEF) {
        needed_ = 2, code_ = c & 0x0F, min_code_ = 0x800;
      } else if (c >= 0xF0 && c <= 0xF4) {
        needed_ = 3, code_ = c & 0x07, min_code_ = 0x10000;
      } else {
        valid_ = false;  // continuation byte without a lead, or 0xC0/0xC1/0xF5..0xFF
      }
      continue;
    }
    if ((c & 0xC0) != 0x80) {
      valid_ = false;
      continue;
    }
    code_ = (code_ << 6) | (c & 0x3F);
    if (--needed_ == 0) {
      bool surrogate = code_ >= 0xD800 && code_ <= 0xDFFF;
      if (code_ < min_code_ || code_ > 0x10FFFF || surrogate) valid_ = false;
    }
  }
  return valid_;
}

}  // namespace kvfs::fs
