// kvfs status: prints a mounted kvfs's cache status (its .status file, or .status.json).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/mount_util.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

constexpr const char* kStatusUsage =
    "usage: kvfs status [--mount DIR] [--json]\n"
    "  prints the cache status of the kvfs mounted at DIR (default: $KVFS_MOUNT, else the first kvfs\n"
    "  mount listed in /proc/self/mountinfo): memory used/budget, agents by state, hit rate, turns,\n"
    "  tokens reused vs computed and the top entries. --json prints .status.json instead.\n";

}  // namespace

int ShowStatus(int argc, char** argv) {
  Args args(argc, argv, {"--mount"}, {"--json", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kStatusUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) {
    std::fprintf(stderr, "kvfs status: %s (see kvfs status --help)\n", args.error().c_str());
    return 2;
  }
  std::string mount = args.get("--mount").value_or("");
  if (mount.empty()) {
    if (const char* env = std::getenv("KVFS_MOUNT"); env != nullptr) mount = env;
  }
  if (mount.empty()) {
    std::vector<std::string> mounts = daemon::KvfsMountpoints();
    if (mounts.empty()) {
      std::fprintf(stderr, "kvfs status: no kvfs mount found (start kvfsd, or pass --mount DIR)\n");
      return 1;
    }
    mount = mounts.front();
  }
  // Only a kvfs mount's status file is read: elsewhere `.status` may be anything (a FIFO that
  // would block forever, some other program's file).
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(mount, ec);
  const std::vector<std::string> mounts = daemon::KvfsMountpoints();
  const auto is_mount = [&](const std::string& dir) { return std::find(mounts.begin(), mounts.end(), dir) != mounts.end(); };
  if (!is_mount(daemon::AbsolutePath(mount)) && (ec || !is_mount(real.string()))) {
    std::fprintf(stderr, "kvfs status: %s is not a kvfs mount (is kvfsd running there?)\n", mount.c_str());
    return 1;
  }
  std::string path = mount + (args.has("--json") ? "/.status.json" : "/.status");
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "kvfs status: cannot read %s (is kvfsd running there?)\n", path.c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  std::fputs(text.str().c_str(), stdout);
  return 0;
}

}  // namespace kvfs::cli
