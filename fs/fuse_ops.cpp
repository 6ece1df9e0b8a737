// The FUSE operations: each decodes its request, makes one AgentStore call and replies; a
// Status becomes an errno only through ErrnoFromStatus. No exception leaves a callback.
#include "fs/fuse_ops.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <exception>
#include <new>
#include <string>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>

#include <spdlog/spdlog.h>

#include "engine/core/shred.h"
#include "fs/errno_map.h"

namespace kvfs::fs {

namespace {

constexpr double kEntryTimeout = 1.0;  // names are stable: only mkdir/rmdir/create/unlink change them

FuseServer::State& StateOf(fuse_req_t req) { return *static_cast<FuseServer::State*>(fuse_req_userdata(req)); }
AgentStore& StoreOf(fuse_req_t req) { return StateOf(req).store; }

Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return Caller{ctx->uid, ctx->gid, static_cast<uint32_t>(ctx->pid)};
}

// The process (thread group) of a request's thread: FUSE gives the thread's id. 0 when it is
// unknown (the thread is gone, another pid namespace): then the caller counts as the opener.
uint32_t ProcessOf(fuse_req_t req) {
  const pid_t tid = fuse_req_ctx(req)->pid;
  if (tid <= 0) return 0;
  std::ifstream status("/proc/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Tgid:", 0) == 0) return static_cast<uint32_t>(std::strtoul(line.c_str() + 5, nullptr, 10));
  }
  return 0;
}

void ReplyError(fuse_req_t req, const Status& status, const char* op, bool logged_already = false) {
  int err = ErrnoFromStatus(status);
  // Expected refusals (ENOENT of lookups, EACCES, ...) are routine: debug level only.
  if (err == EIO && !logged_already) {
    spdlog::warn("{}: {}", op, status.message());
  } else {
    spdlog::debug("{}: {} ({})", op, status.message(), ErrnoName(err));
  }
  fuse_reply_err(req, err);
}

struct stat StatOf(const Attr& a) {
  struct stat st {};
  st.st_ino = a.ino;
  st.st_mode = (a.type == FileType::kDirectory ? S_IFDIR : S_IFREG) | a.mode;
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_size = static_cast<off_t>(a.size);
  st.st_blksize = 4096;
  st.st_blocks = static_cast<blkcnt_t>((a.size + 511) / 512);
  timespec t{static_cast<time_t>(a.mtime_ms / 1000), static_cast<long>((a.mtime_ms % 1000) * 1000000)};
  st.st_mtim = st.st_ctim = st.st_atim = t;
  return st;
}

fuse_entry_param EntryOf(const Attr& a) {
  fuse_entry_param e{};
  e.ino = a.ino;
  e.generation = 1;  // inode numbers are never reused within a mount
  e.attr = StatOf(a);
  e.attr_timeout = a.attr_timeout_s;
  e.entry_timeout = kEntryTimeout;
  return e;
}

OpenFlags DecodeOpenFlags(int flags) {
  OpenFlags f;
  int mode = flags & O_ACCMODE;
  f.read = mode == O_RDONLY || mode == O_RDWR;
  f.write = mode == O_WRONLY || mode == O_RDWR;
  f.truncate = (flags & O_TRUNC) != 0;
  f.append = (flags & O_APPEND) != 0;
  return f;
}

void OnInit(void* userdata, fuse_conn_info* conn) {
  // O_TRUNC arrives with open (so `echo x > prompt` is one open), and readdirplus always
  // (ls -l of many agents is one pass).
  if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
  conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Result<Attr> attr = StoreOf(req).Lookup(parent, name);
  if (!attr.ok()) return ReplyError(req, attr.status(), "lookup");
  fuse_entry_param e = EntryOf(*attr);
  fuse_reply_entry(req, &e);
}

void OnForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  StoreOf(req).Forget(ino, nlookup);
  fuse_reply_none(req);
}

void OnForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  AgentStore& store = StoreOf(req);
  for (size_t i = 0; i < count; ++i) store.Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  std::optional<HandleId> open_file;
  if (fi != nullptr) open_file = fi->fh;  // fstat of an open file
  Result<Attr> attr = StoreOf(req).GetAttr(ino, open_file);
  if (!attr.ok()) return ReplyError(req, attr.status(), "getattr");
  struct stat st = StatOf(*attr);
  fuse_reply_attr(req, &st, attr->attr_timeout_s);
}

void OnSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  AgentStore& store = StoreOf(req);
  if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
    // Fixed, but setting what they already are succeeds (tar -x, cp -p and rsync -a do).
    Status unchanged = store.CheckModeAndOwner(ino, (to_set & FUSE_SET_ATTR_MODE) ? std::optional<uint32_t>(attr->st_mode & 07777) : std::nullopt,
                                               (to_set & FUSE_SET_ATTR_UID) ? std::optional<uint32_t>(attr->st_uid) : std::nullopt,
                                               (to_set & FUSE_SET_ATTR_GID) ? std::optional<uint32_t>(attr->st_gid) : std::nullopt,
                                               CallerOf(req));
    if (!unchanged.ok()) return ReplyError(req, unchanged, "setattr");
  }
  Result<Attr> result = Status(StatusCode::kInternal, "unset");
  if (to_set & FUSE_SET_ATTR_SIZE) {
    std::optional<HandleId> handle;
    if (fi != nullptr) handle = fi->fh;
    result = store.Truncate(ino, static_cast<uint64_t>(attr->st_size), handle, CallerOf(req));
  } else {
    result = store.GetAttr(ino);  // times: accepted and ignored (touch works)
  }
  if (!result.ok()) return ReplyError(req, result.status(), "setattr");
  struct stat st = StatOf(*result);
  fuse_reply_attr(req, &st, result->attr_timeout_s);
}

void OnMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t) {
  Result<Attr> attr = StoreOf(req).MakeAgent(parent, name, CallerOf(req));
  if (!attr.ok()) return ReplyError(req, attr.status(), "mkdir");
  fuse_entry_param e = EntryOf(*attr);
  fuse_reply_entry(req, &e);
}

void OnRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Status s = StoreOf(req).RemoveAgent(parent, name, CallerOf(req));
  if (!s.ok()) return ReplyError(req, s, "rmdir");
  fuse_reply_err(req, 0);
}

void OnUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Status s = StoreOf(req).Unlink(parent, name, CallerOf(req));
  if (!s.ok()) return ReplyError(req, s, "unlink");
  fuse_reply_err(req, 0);
}

void OnRename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned int) {
  ReplyError(req, NotPermitted("kvfs names cannot be renamed"), "rename");
}

void OnMknod(fuse_req_t req, fuse_ino_t, const char* name, mode_t, dev_t) {
  ReplyError(req, NotPermitted(std::string("cannot create ") + name), "mknod");
}

void OnSymlink(fuse_req_t req, const char*, fuse_ino_t, const char* name) {
  ReplyError(req, NotPermitted(std::string("cannot create ") + name + ": kvfs has no symbolic links"), "symlink");
}

void OnLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char* name) {
  ReplyError(req, NotPermitted(std::string("cannot create ") + name + ": kvfs has no hard links"), "link");
}

void OnStatfs(fuse_req_t req, fuse_ino_t) {
  Result<struct statvfs> st = StoreOf(req).StatFs();
  if (!st.ok()) return ReplyError(req, st.status(), "statfs");
  fuse_reply_statfs(req, &*st);
}

void FillOpenInfo(fuse_file_info* fi, HandleId handle) {
  fi->fh = handle;
  fi->direct_io = 1;   // contents are generated or stream: never the page cache
  fi->keep_cache = 0;
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Caller caller = CallerOf(req);
  if (StoreOf(req).OpeningProcessMatters(static_cast<InodeId>(ino))) caller.process = ProcessOf(req);
  Result<HandleId> handle = StoreOf(req).Open(ino, DecodeOpenFlags(fi->flags), caller);
  if (!handle.ok()) return ReplyError(req, handle.status(), "open");
  FillOpenInfo(fi, *handle);
  if (fuse_reply_open(req, fi) != 0) StoreOf(req).Release(*handle);  // the opener was interrupted
}

void OnCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t, fuse_file_info* fi) {
  Caller caller = CallerOf(req);
  caller.process = ProcessOf(req);  // a new prefix file is applied at its opener's close (Flush)
  auto created = StoreOf(req).Create(parent, name, DecodeOpenFlags(fi->flags), caller);
  if (!created.ok()) return ReplyError(req, created.status(), "create");
  FillOpenInfo(fi, created->second);
  fuse_entry_param e = EntryOf(created->first);
  if (fuse_reply_create(req, &e, fi) != 0) {
    StoreOf(req).Discard(created->second);  // the opener was interrupted: it wrote nothing
    StoreOf(req).Forget(created->first.ino, 1);
  }
}

void OnInterrupt(fuse_req_t req, void* data) {
  FuseServer::State& state = StateOf(req);
  uint64_t id = reinterpret_cast<uintptr_t>(data);
  std::shared_ptr<Interrupt> interrupt;
  {
    std::lock_guard lock(state.interrupts_mu);
    auto it = state.interrupts.find(id);
    if (it != state.interrupts.end()) interrupt = it->second;
  }
  if (interrupt != nullptr) interrupt->Trigger();
}

void OnRead(fuse_req_t req, fuse_ino_t, size_t size, off_t offset, fuse_file_info* fi) {
  FuseServer::State& state = StateOf(req);
  auto interrupt = std::make_shared<Interrupt>();
  uint64_t id = 0;
  {
    std::lock_guard lock(state.interrupts_mu);
    id = state.next_interrupt++;
    state.interrupts[id] = interrupt;
  }
  // Called at once if the kernel already interrupted this request.
  fuse_req_interrupt_func(req, OnInterrupt, reinterpret_cast<void*>(static_cast<uintptr_t>(id)));
  // A read of `response` that must wait is answered later, from the thread that makes it ready:
  // this request thread goes back to the loop (libfuse replies from any thread).
  state.store.ReadAsync(fi->fh, static_cast<uint64_t>(offset), size, interrupt,
                        [req, &state, id](Result<std::string> data) {
                          {
                            std::lock_guard lock(state.interrupts_mu);
                            state.interrupts.erase(id);
                          }
                          // (a failed turn was logged when it failed, not at each read)
                          if (!data.ok()) return ReplyError(req, data.status(), "read", /*logged_already=*/true);
                          fuse_reply_buf(req, data->data(), data->size());
                        });
}

void OnWrite(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  // The data sits in this worker's request buffer (libfuse's, malloc'd and reused, never freed
  // through the zeroing heap) until a later request overwrites it; a short one would not. Those
  // bytes may be an agent's text, which an erasure must leave nowhere (DESIGN: freed memory is
  // zeroed), so they go once the store has its own copy (or refused them, or threw). The buffer
  // is libfuse's writable heap memory; only the parameter is const.
  struct ZeroOnExit {
    char* data;
    size_t size;
    ~ZeroOnExit() { explicit_bzero(data, size); }
  } zero_on_exit{const_cast<char*>(buf), size};
  Result<size_t> written = StoreOf(req).Write(fi->fh, static_cast<uint64_t>(offset), std::string_view(buf, size));
  if (!written.ok()) return ReplyError(req, written.status(), "write");
  fuse_reply_write(req, *written);
}

// close(2) gets flush's error (the kernel ignores release's), so prompts and edits apply here.
void OnFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  AgentStore& store = StoreOf(req);
  Status s = store.Flush(fi->fh, store.ClosingProcessMatters(static_cast<HandleId>(fi->fh)) ? ProcessOf(req) : 0);
  if (!s.ok()) return ReplyError(req, s, "flush");
  fuse_reply_err(req, 0);
}

void OnRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  StoreOf(req).Release(fi->fh);
  fuse_reply_err(req, 0);
}

void OnFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) { fuse_reply_err(req, 0); }

void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Result<HandleId> handle = StoreOf(req).OpenDir(ino, CallerOf(req));
  if (!handle.ok()) return ReplyError(req, handle.status(), "opendir");
  fi->fh = *handle;
  if (fuse_reply_open(req, fi) != 0) StoreOf(req).ReleaseDir(*handle);
}

void ReadDirectory(fuse_req_t req, size_t size, off_t offset, fuse_file_info* fi, bool plus) {
  AgentStore& store = StoreOf(req);
  auto entries = store.DirEntries(fi->fh);
  if (entries == nullptr) return ReplyError(req, InvalidArgument("bad directory handle"), "readdir");
  std::string buf(size, '\0');
  size_t used = 0;
  for (size_t i = static_cast<size_t>(offset); i < entries->size(); ++i) {
    const DirEntry& entry = (*entries)[i];
    size_t need = 0;
    off_t next = static_cast<off_t>(i + 1);
    if (plus) {
      fuse_entry_param e = EntryOf(entry.attr);
      // Measure first: the kernel holds a reference for every readdirplus entry sent (but "."
      // and ".."), so it is counted only for an entry that fits and whose node still exists.
      need = fuse_add_direntry_plus(req, nullptr, 0, entry.name.c_str(), &e, next);
      if (need > size - used) break;
      bool dot = entry.name == "." || entry.name == "..";
      if (!dot && !store.CountLookup(entry.attr.ino)) continue;  // erased since the listing
      fuse_add_direntry_plus(req, buf.data() + used, size - used, entry.name.c_str(), &e, next);
    } else {
      struct stat st = StatOf(entry.attr);
      need = fuse_add_direntry(req, buf.data() + used, size - used, entry.name.c_str(), &st, next);
      if (need > size - used) break;
    }
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void OnReaddir(fuse_req_t req, fuse_ino_t, size_t size, off_t offset, fuse_file_info* fi) {
  ReadDirectory(req, size, offset, fi, false);
}

void OnReaddirplus(fuse_req_t req, fuse_ino_t, size_t size, off_t offset, fuse_file_info* fi) {
  ReadDirectory(req, size, offset, fi, true);
}

void OnReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  StoreOf(req).ReleaseDir(fi->fh);
  fuse_reply_err(req, 0);
}

void OnGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  auto value = StoreOf(req).GetXattr(ino, name);
  if (!value.ok()) return ReplyError(req, value.status(), "getxattr");
  if (!value->has_value()) return (void)fuse_reply_err(req, ENODATA);
  const std::string& v = **value;
  if (size == 0) return (void)fuse_reply_xattr(req, v.size());
  if (size < v.size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, v.data(), v.size());
}

void OnListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto names = StoreOf(req).ListXattr(ino);
  if (!names.ok()) return ReplyError(req, names.status(), "listxattr");
  std::string list;
  for (const std::string& n : *names) list += n + '\0';
  if (size == 0) return (void)fuse_reply_xattr(req, list.size());
  if (size < list.size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, list.data(), list.size());
}

void OnSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char*, size_t, int) {
  ReplyError(req, StoreOf(req).SetXattr(ino, name), "setxattr");
}

void OnRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  ReplyError(req, StoreOf(req).SetXattr(ino, name), "removexattr");
}

// No exception leaves a callback: one that escapes an op (std::bad_alloc from a buffer a caller
// asked to grow, say) fails that request with an errno instead of terminating the daemon and
// every mount user with it. Every op replies as its last step, so none has replied yet (OnRead
// may also have parked its reply: ReadAsync takes the park back before it lets an exception out).
template <auto Op>
struct Guarded;
template <typename... Args, void (*Op)(fuse_req_t, Args...)>
struct Guarded<Op> {
  static void Run(fuse_req_t req, Args... args) {
    try {
      Op(req, args...);
    } catch (const std::bad_alloc&) {
      ReplyError(req, Status(StatusCode::kResourceExhausted, "out of memory"), "request");
    } catch (const std::exception& e) {
      ReplyError(req, Internal(std::string("unexpected exception: ") + e.what()), "request");
    }
    ScrubStack();  // the request's text (a write's, a rendered transcript's) left below this frame
  }
};

fuse_lowlevel_ops MakeOperations() {
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = Guarded<OnLookup>::Run;
  ops.forget = OnForget;
  ops.forget_multi = OnForgetMulti;
  ops.getattr = Guarded<OnGetattr>::Run;
  ops.setattr = Guarded<OnSetattr>::Run;
  ops.mkdir = Guarded<OnMkdir>::Run;
  ops.rmdir = Guarded<OnRmdir>::Run;
  ops.unlink = Guarded<OnUnlink>::Run;
  ops.rename = Guarded<OnRename>::Run;
  ops.mknod = Guarded<OnMknod>::Run;
  ops.symlink = Guarded<OnSymlink>::Run;
  ops.link = Guarded<OnLink>::Run;
  ops.open = Guarded<OnOpen>::Run;
  ops.create = Guarded<OnCreate>::Run;
  ops.read = Guarded<OnRead>::Run;
  ops.write = Guarded<OnWrite>::Run;
  ops.flush = Guarded<OnFlush>::Run;
  ops.release = Guarded<OnRelease>::Run;
  ops.fsync = Guarded<OnFsync>::Run;
  ops.opendir = Guarded<OnOpendir>::Run;
  ops.readdir = Guarded<OnReaddir>::Run;
  ops.readdirplus = Guarded<OnReaddirplus>::Run;
  ops.releasedir = Guarded<OnReleasedir>::Run;
  ops.getxattr = Guarded<OnGetxattr>::Run;
  ops.listxattr = Guarded<OnListxattr>::Run;
  ops.setxattr = Guarded<OnSetxattr>::Run;
  ops.removexattr = Guarded<OnRemovexattr>::Run;
  ops.statfs = Guarded<OnStatfs>::Run;
  return ops;
}

}  // namespace

const fuse_lowlevel_ops& KvfsOperations() {
  static const fuse_lowlevel_ops ops = MakeOperations();
  return ops;
}

}  // namespace kvfs::fs
