// Incremental UTF-8 validation: text arrives in write() calls that may split a character.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvfs::fs {

class Utf8Validator {
 public:
  // Feeds the next bytes. False once any byte sequence so far is invalid (overlong forms,
  // surrogates, code points above U+10FFFF, stray continuation bytes); stays false after.
  bool Feed(std::string_view bytes);
  // True when everything fed so far is valid and no character is left unfinished.
  bool Complete() const { return valid_ && needed_ == 0; }
  bool valid() const { return valid_; }

 private:
  bool valid_ = true;
  int needed_ = 0;         // continuation bytes still expected
  uint32_t code_ = 0;      // code point being assembled
  uint32_t min_code_ = 0;  // smallest code point allowed for this length (rejects overlong forms)
};

}  // namespace kvfs::fs
