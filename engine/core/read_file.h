// Reading a whole file that a user named (a prompt, a text to score, a config file).
#pragma once

#include <string>

#include "engine/core/status.h"

namespace kvfs {

// The bytes of the file at `path`. A directory is an error (reading one gives no bytes, which
// would pass for an empty file), as is anything open(2) or read(2) refuses, with errno's text;
// pipes and devices (/dev/stdin) are read to their end.
Result<std::string> ReadWholeFile(const std::string& path);

// Whether both paths exist and name the same file (device and inode, links followed): an output
// a user named that is one of the inputs (the model, a prompt file) is refused before it is
// truncated.
bool SameFile(const std::string& a, const std::string& b);

}  // namespace kvfs
