#include "daemon/mount_util.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <spdlog/spdlog.h>

extern char** environ;

namespace kvfs::daemon {

namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool ok = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = s[i + k];
        if (c < '0' || c > '7') ok = false;
        v = v * 8 + (c - '0');
      }
      if (ok) {
        out += static_cast<char>(v);
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

Status RunFusermountDetach(const std::string& dir) {
  std::vector<std::string> args = {"fusermount3", "-u", "-z", dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, "fusermount3", nullptr, nullptr, argv.data(), environ);
  if (rc != 0) return IoError(std::string("cannot run fusermount3: ") + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return IoError("fusermount3 -u -z " + dir + " failed");
  return Status::Ok();
}

}  // namespace

std::string AbsolutePath(const std::string& path) {
  std::string full = path;
  if (full.empty() || full[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) != nullptr) full = std::string(cwd) + "/" + full;
  }
  std::vector<std::string> parts;
  std::stringstream ss(full);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

namespace {

// The real path of the longest existing prefix of the absolute `path`, with the rest appended.
std::string ResolveExisting(const std::string& path) {
  std::string head = path, tail;
  while (head.size() > 1) {
    char resolved[PATH_MAX];
    if (::realpath(head.c_str(), resolved) != nullptr) return AbsolutePath(std::string(resolved) + tail);
    const size_t slash = head.rfind('/');
    tail = head.substr(slash) + tail;
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
  return path;
}

bool LexicallyWithin(const std::string& path, const std::string& dir) {
  return path == dir || dir == "/" || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

}  // namespace

bool PathIsWithin(const std::string& path, const std::string& dir) {
  const std::string p = AbsolutePath(path), d = AbsolutePath(dir);
  if (LexicallyWithin(p, d)) return true;
  // The mount point's parent resolved, its own name kept (not looked up through the mount).
  const size_t slash = d.rfind('/');
  const std::string parent = slash == 0 ? "/" : d.substr(0, slash);
  const std::string resolved_dir = AbsolutePath(ResolveExisting(parent) + d.substr(slash));
  return LexicallyWithin(ResolveExisting(p), resolved_dir);
}

namespace {

struct MountEntry {
  std::string mountpoint;
  std::string fstype;
};

std::vector<MountEntry> ReadMounts() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  std::vector<MountEntry> out;
  while (std::getline(in, line)) {
    // id parent major:minor root mountpoint options [optional...] - fstype source super-options
    std::istringstream fields(line);
    std::string id, parent, dev, root, mountpoint;
    fields >> id >> parent >> dev >> root >> mountpoint;
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    std::string fstype;
    rest >> fstype;
    out.push_back({Unescape(mountpoint), fstype});
  }
  return out;
}

}  // namespace

std::optional<std::string> MountedTypeAt(const std::string& dir) {
  std::optional<std::string> type;
  for (const MountEntry& m : ReadMounts()) {
    if (m.mountpoint == dir) type = m.fstype;  // the last one listed is the top of the stack
  }
  return type;
}

std::vector<std::string> KvfsMountpoints() {
  std::vector<std::string> out;
  for (const MountEntry& m : ReadMounts()) {
    if (m.fstype == "fuse.kvfs") out.push_back(m.mountpoint);
  }
  return out;
}

namespace {

// What is mounted at a mount point, by its resolved path.
struct MountpointState {
  std::string dir;                  // absolute, resolved where it resolves
  std::optional<std::string> type;  // the filesystem mounted there, if any
  bool disconnected = false;        // a dead FUSE daemon's mount (ENOTCONN)
};

MountpointState InspectMountpoint(const std::string& dir_in) {
  MountpointState m;
  m.dir = AbsolutePath(dir_in);
  // mountinfo lists resolved paths: a path through a symbolic link must be compared resolved
  // (a stale mount cannot be resolved, ENOTCONN: its lexical path is what was mounted).
  if (char resolved[PATH_MAX]; ::realpath(m.dir.c_str(), resolved) != nullptr) m.dir = resolved;
  m.type = MountedTypeAt(m.dir);
  // stat may be answered from the kernel's attribute cache after the daemon died; statfs always
  // asks the daemon, so a dead one's mount says ENOTCONN there.
  struct stat st {};
  struct statfs fs_stat {};
  m.disconnected = (::stat(m.dir.c_str(), &st) != 0 && errno == ENOTCONN) ||
                   (m.type && ::statfs(m.dir.c_str(), &fs_stat) != 0 && errno == ENOTCONN);
  return m;
}

Status RefuseIfMounted(const MountpointState& m) {
  if (!m.type || m.disconnected) return Status::Ok();  // (a stale mount is detached)
  if (*m.type != "fuse.kvfs") return InvalidArgument(m.dir + " already has a " + *m.type + " filesystem mounted on it");
  // A mount that answers is a running kvfsd's (a killed one's says ENOTCONN): taking it over
  // would pull its agents from under its users.
  return InvalidArgument(m.dir + " is served by a running kvfsd: stop it first (fusermount3 -u " + m.dir +
                         "), or mount this one elsewhere");
}

}  // namespace

Status CheckMountpointFree(const std::string& dir) { return RefuseIfMounted(InspectMountpoint(dir)); }

Result<bool> PrepareMountpoint(const std::string& dir_in) {
  const MountpointState m = InspectMountpoint(dir_in);
  KVFS_RETURN_IF_ERROR(RefuseIfMounted(m));
  const std::string& dir = m.dir;
  if (m.disconnected) {
    spdlog::warn("{}: detaching a stale kvfs mount left by a kvfsd that was killed", dir);
    KVFS_RETURN_IF_ERROR(RunFusermountDetach(dir));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return IoError(dir + ": " + std::strerror(errno));
    if (::mkdir(dir.c_str(), 0755) != 0) return IoError("cannot create " + dir + ": " + std::strerror(errno));
    return true;
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(dir + " is not a directory");
  std::error_code ec;
  if (!std::filesystem::is_empty(dir, ec) && !ec)
    spdlog::warn("{} is not empty: what it holds is hidden while kvfs is mounted over it", dir);
  return false;
}

CreatedMountpoint::~CreatedMountpoint() {
  if (created_ && ::rmdir(dir_.c_str()) != 0) spdlog::warn("cannot remove the mount point {} made at start: {}", dir_, std::strerror(errno));
}

}  // namespace kvfs::daemon
