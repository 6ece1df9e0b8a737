// Text from a file (a name, a key, a string value) quoted for an error message or a log line.
// A damaged file's "name" may hold any bytes: control bytes would reach a terminal or log as
// such (a NUL cuts a C string, so the reason after it is lost), and a length field hit by a bit
// flip makes a name of megabytes. So the text is escaped and clipped, and what follows the
// quote (the reason) is always there.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvfs {

// `s` between single quotes: printable ASCII and well-formed UTF-8 of printable characters
// stay as they are; a backslash or quote is escaped with a backslash; any other byte (C0
// controls, DEL, the bytes of C1 controls, bytes that form no UTF-8) is written \xNN. At most
// `max_bytes` bytes of `s` are shown (cut between characters); a longer text is followed by
// "... (N bytes)" after the closing quote. The result never holds a byte below 0x20 or 0x7f.
std::string QuoteForMessage(std::string_view s, size_t max_bytes = 64);

}  // namespace kvfs
