// An open file or directory of AgentStore (private to fs/).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/shred.h"
#include "fs/agent_store.h"
#include "fs/import_buffer.h"
#include "fs/utf8.h"

namespace kvfs::fs {

struct AgentStore::Handle {
  // What an open file held (an export, a prompt, system text) is zeroed when the last reference
  // to the handle goes, not left in freed memory.
  ~Handle() { ShredString(data); }

  enum class Kind {
    kDirectory,   // a snapshot of the entries
    kPrompt,      // write-only buffer; becomes a turn at close
    kResponse,    // streams the turn current at open
    kTranscript,  // rendered on every read (it grows)
    kAuditLog,    // read live from the log
    kSnapshot,    // read-only content rendered at open (status files, an export, ...)
    kEditable,    // system, config.json, a prefix file: a buffer applied at close
    kImport,      // kv.safetensors written: imported at close
  };

  Kind kind = Kind::kSnapshot;
  InodeId ino = 0;
  Node node;        // copy of the node at open (kind, agent, prefix name)
  uint32_t uid = 0; // who opened it (for the audit log)
  uint32_t opener_process = 0;  // the process that opened it (0: unknown); see AgentStore::Flush
  std::optional<uint64_t> export_to_audit;  // kv.safetensors: the export's bytes, audited at its first read

  std::mutex mu;      // guards the fields below (writes to one fd may come concurrently)
  std::string data;   // snapshot or write buffer
  std::unique_ptr<ImportBuffer> import;  // kImport: the bytes written (not `data`)
  // kImport: the last write refused for want of memory or disk; should the import then fail at
  // close, that is why (the file lacks those bytes), not what the incomplete file looks like.
  Status import_write_failure;
  uint64_t import_failed_at = 0;  // its offset
  bool dirty = false; // written since the last apply
  // Opened with O_TRUNC and not written since: the file is emptied at the last close (Release),
  // not at a flush, since a shell's `echo x > system` closes a duplicate of its descriptor
  // before it writes (the file would be emptied, then written: two edits, and a turn starting
  // in between would run without its system prompt).
  bool empty_at_last_close = false;
  std::string system_at_open;      // with empty_at_last_close: emptied only if still this text
  int flushes_without_writes = 0;  // `: > system` closes twice without writing: the second empties
  // What it holds was erased (`rm -r`; `rm kv.safetensors` for an export): its bytes are zeroed
  // and reads fail with ENOENT, so nothing erased stays readable through a descriptor.
  bool erased = false;
  // Bytes written here and not yet applied when the erasure came: the close fails (ENOENT), so
  // a writer learns that what it wrote is gone.
  bool writes_erased = false;
  // Editable text: the buffer holds only bytes written through this handle (it was empty at open,
  // or truncated to 0 since). Only then can a text that no further write makes valid be refused
  // at the write; an in-place edit (`r+`: write, then ftruncate) is judged whole at close.
  bool holds_only_writes = true;
  bool append = false;
  uint64_t prompt_end = 0;  // prompt: the offset the next write must start at (bytes accepted)
  // prompt: cut to 0 at this end (ftruncate), not written since: the next write may start at 0
  // (Python's seek(0); truncate()) or here (C's ftruncate leaves the offset where it was).
  std::optional<uint64_t> prompt_cut_at;
  Utf8Validator utf8;
  Status refused;     // prompt: the first error; this prompt never becomes a turn
  // system: the text before this handle's first applied edit, and what it applied: a write
  // refused after an edit was applied (too large, not UTF-8) puts the earlier text back, so
  // nothing of a refused file stays applied.
  struct AppliedEdit {
    std::string before, applied;
  };
  std::optional<AppliedEdit> applied_edit;
  // The undo's own handle: applied only while the system prompt is still this text (checked
  // under the agent's submit_mu, so another writer's edit in between stands).
  std::optional<std::string> only_if_system_is;
  std::shared_ptr<TurnStream> turn;                      // response
  std::shared_ptr<const std::vector<DirEntry>> entries;  // directory
};

}  // namespace kvfs::fs
