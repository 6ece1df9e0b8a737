// The backend seam: one forward pass over a batch of sequences, on the CPU or on a Vulkan
// device. The engine thread owns a backend; it is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/kv/sequence_kv.h"
#include "engine/model/model.h"

namespace kvfs {

// One sequence's part of a batch: new tokens appended at positions kv->n_tokens() onwards.
struct SequenceStep {
  SequenceKv* kv = nullptr;
  std::span<const TokenId> tokens;
  bool all_logits = false;  // logits for every new token, else only for the last
};

// Logits of a forward pass: rows of n_vocab floats, for each step in order either one row per
// new token (all_logits) or one row.
struct Logits {
  int64_t n_vocab = 0;
  std::vector<float> data;
  std::vector<int64_t> first_row;  // per step: index of its first row
  const float* row(int64_t r) const { return data.data() + r * n_vocab; }
};

struct VulkanTuning;

// What a backend with a CPU fallback has had to do (FallbackBackend); zeros for others.
struct BackendHealth {
  int64_t cpu_fallback_steps = 0;  // steps meant for the device that the CPU ran
  bool device_lost = false;        // the device is lost: every pass runs on the CPU until it is
                                   // made again
  int64_t device_losses = 0;       // times the device was lost
  int64_t device_remakes = 0;      // times it was made again
  int64_t remake_failures = 0;     // tries to make it again that failed
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Runs the model over every step's new tokens, writes their K/V into each step's kv, and
  // advances kv->n_tokens(). Fails without touching any kv when a step does not fit.
  virtual Status Forward(std::span<const SequenceStep> steps, Logits& out) = 0;
  // Whether one pass over these steps fits the backend's memory (a device's KV budget), judged
  // before their kv->Reserve; false means Forward would refuse it with kUnavailable, touching
  // nothing. FallbackBackend runs what does not fit on the CPU.
  virtual bool Fits(std::span<const SequenceStep> steps) const { return true; }
  // The device stopped working (a lost Vulkan device): every Forward of this backend fails.
  virtual bool Lost() const { return false; }
  virtual BackendHealth Health() const { return {}; }
  // Work due between passes (FallbackBackend: making a lost device again), in ms from now;
  // nullopt: none. The engine thread calls Maintain() while idle once it is due, so that the
  // next pass does not wait for it (a new device's weight upload). Maintain() does the work or
  // moves the due time on (else the engine would call it again at once).
  virtual std::optional<int64_t> MaintenanceDueInMs() const { return std::nullopt; }
  virtual void Maintain() {}
  // Whether the backend keeps copies of KV blocks (by PoolBlock::serial) that must be told
  // when the host blocks are freed.
  virtual bool KeepsBlockCopies() const { return false; }
  // The host blocks with these serials were freed (erased or evicted): zero and drop any copy
  // of them, before returning.
  virtual Status ForgetBlocks(std::span<const uint64_t> serials) { return Status::Ok(); }
  // Copies of blocks held now (tests, status).
  virtual int64_t BlockCopies() const { return 0; }
  // Whether passes read the model's matrices (token_embd, output, the layers' seven) from the
  // model's bytes. A device that holds its own copies does not: those bytes may be given back.
  virtual bool ReadsModelMatrices() const { return true; }
  // Whether the backend makes its kernels on first use (Vulkan compiles a pipeline for each
  // shader variant a pass needs): the first passes of each shape then take seconds, unless
  // WarmUpBackend (warm_up.h) ran them first.
  virtual bool CompilesOnFirstUse() const { return false; }
  // Whether a pass over `steps` would run on such kernels (FallbackBackend: on a device not
  // known lost, not on the CPU behind it): what a warm-up pass needs to be of use.
  virtual bool MakesKernelsFor(std::span<const SequenceStep> steps) const { return CompilesOnFirstUse() && Fits(steps); }
  // A warm-up's pass: Forward, but never on the CPU behind a device (FallbackBackend: the device's
  // error, kUnavailable where it cannot run the pass), which would make no kernel of the device's.
  virtual Status ForwardOnDevice(std::span<const SequenceStep> steps, Logits& out) { return Forward(steps, out); }
  // Kernels made so far (Vulkan pipelines): tests check that a warm-up left none to make.
  virtual int64_t KernelsMade() const { return 0; }
  // Where device time went since the last call, as a table (kvfs bench --profile); empty
  // unless the backend was made with profiling on.
  virtual std::string TakeProfileReport() { return {}; }
  // Vulkan: records later passes with `tuning` (the same values; kvfs tune compares settings
  // with it). A setting the device cannot run is refused and the current one kept.
  virtual Status SetVulkanTuning(const VulkanTuning& tuning);
};

namespace cpu { struct KernelTable; }

struct CpuOptions {
  int n_threads = 2;
  // Kernel table to use; nullptr = the best one this CPU supports (or KVFS_CPU=scalar|avx2|avx512).
  const cpu::KernelTable* kernels = nullptr;
  // Repack the weight types the table has packed kernels for (every quantized type on the x86
  // tables: the 32-value block formats and the K-quants) into its row-interleaved layout at
  // load: decode streams the weights at the memory's speed and batched decode steps get much
  // cheaper (see engine/backend/cpu/packed_weights.h). false: every matrix runs from the
  // mapped file. The model's bytes of what was packed are given back (GgufFile::GiveBack): a
  // backend made after this one calls GgufFile::Refill before reading the weights.
  bool pack_weights = true;
};
std::unique_ptr<Backend> MakeCpuBackend(const Model& model, const CpuOptions& options);

// A Vulkan device as `kvfs devices` lists it.
struct VulkanDeviceInfo {
  int index = 0;                   // what VulkanOptions::device takes
  std::string name;
  std::string type;                // "discrete", "integrated", "virtual", "cpu", "other"
  std::string api_version;         // e.g. "1.3.230"
  int64_t memory_bytes = 0;        // largest device-local heap
  int64_t max_binding_bytes = 0;   // maxStorageBufferRange: larger tensors are split
  int64_t shared_memory_bytes = 0; // maxComputeSharedMemorySize
  uint32_t subgroup_size = 0;
  bool subgroup_shuffle = false;   // compute shaders may shuffle within a subgroup (the shaders'
                                   // reduction trees then end in shuffles)
  bool portability = false;        // a portability driver (VK_KHR_portability_subset: MoltenVK,
                                   // Vulkan over Apple's Metal), whose subset the backend enables
  bool is_default = false;         // the device picked when none is named
};
// Every Vulkan device the loader reports. Unsupported when the build has no Vulkan backend;
// NotFound when there is no Vulkan driver or device.
Result<std::vector<VulkanDeviceInfo>> ListVulkanDevices();
// The device `device` names (-1: the default one) among `devices`; nullptr when none is.
const VulkanDeviceInfo* ChosenVulkanDevice(const std::vector<VulkanDeviceInfo>& devices, int device);
// The device that was `name` at `index`, listed again after a loss: the one named `name`, at
// `index` if that one still is; nullptr when none is (it is gone, and the default may now be
// another device).
const VulkanDeviceInfo* SameVulkanDevice(const std::vector<VulkanDeviceInfo>& devices, int index,
                                         const std::string& name);

// The matrix-vector shaders' shape (decode's matrix products), for sweeps on a GPU (kvfs bench
// --matvec-*); 0 keeps the default of each.
struct VulkanMatvecShape {
  static constexpr int64_t kDefaultGroup = 64;
  static constexpr int64_t kDefaultMinGroups = 1024;
  static constexpr int64_t kDefaultRows = 8;
  static constexpr int64_t kDefaultAhead = 1;
  // On a GPU (any device but a CPU's): a warp-sized workgroup with up to 2 rows a slot. On an
  // H200, llama3.1-8b Q4_0 decoded 1.06x as fast at depth 0 and 1.04x at 3500 than with 64 and 8
  // (kvfs bench A/B, 2026-11-29); kvfs tune found the same.
  static constexpr int64_t kGpuGroup = 32;
  static constexpr int64_t kGpuRows = 2;
  int64_t group = 0;       // invocations per workgroup (default 64, on a GPU 32), a power of two
  int64_t lanes = 0;       // invocations per row at most (default, or more than the group: the
                           // group), a power of two >= 4
  int64_t min_groups = 0;  // quantized rows per slot grow while this many workgroups remain (1024)
  int64_t rows = 0;        // quantized rows per slot at most (8, on a GPU 2), a power of two
  int64_t ahead = 0;       // quantized units an invocation loads before using any (1): bytes in
                           // flight, against registers; 1 to 8
  int64_t norm_group = 0;  // decode: the quantized matrices an RMSNorm feeds (q|k|v, gate|up,
                           // output) make it themselves, in workgroups of this many invocations
                           // (each repeats the norm, so larger than `group`); 0: off, the norm is
                           // a dispatch and a barrier of its own. A power of two from max(32,
                           // lanes) to the device's workgroup size
  bool operator==(const VulkanMatvecShape&) const = default;
};

// How the Vulkan backend records a pass, where the best choice depends on the device: every
// setting computes the same values (up to the order of float sums), so a tuner may change them
// between passes (Backend::SetVulkanTuning, kvfs tune) and keep the fastest.
struct VulkanTuning {
  static constexpr int64_t kDefaultAttentionSplit = 128;
  // On a GPU (any device but a CPU's): more, shorter splits keep its multiprocessors busy at
  // the depths where a decode step has few (token, KV head, split) workgroups; on an H200,
  // kvfs tune measured llama3.1-8b q4k decode at depth 1024 at 0.86x the time of 128's.
  static constexpr int64_t kGpuAttentionSplit = 32;
  int64_t attention_split = 0;     // decode attention's positions per workgroup (0: the
                                   // default, 128 on a CPU device, kGpuAttentionSplit on a GPU)
  bool fuse_softmax = true;        // decode attention makes its softmax weights inside the
                                   // weighted sum (off: softmax.comp as its own dispatch); also
                                   // off when VulkanOptions::fuse_ops is
  bool swiglu_in_matvec = true;    // decode: a stacked gate|up matrix's shader also quantizes
                                   // SwiGLU for the down matrix (off: quantize_act does, a
                                   // dispatch and a barrier more per layer); also off when
                                   // VulkanOptions::fuse_ops is
  bool subgroup_trees = true;      // the steps of reduction trees within a subgroup by shuffles
                                   // where the device has them (matrix-vector sums, RMSNorm,
                                   // activation quantization); off: all in shared memory
  int64_t prefetch_mib = 0;        // decode: MiB of the next weight matrices read ahead into the
                                   // device's cache beside the norms and beside kv_store and the
                                   // scores, each, while memory would idle (vk::Ops::Prefetch);
                                   // 0: off. Worth it only where the last-level cache holds that
                                   // much and the phase is long enough; kvfs tune measures it
  VulkanMatvecShape matvec;
  bool operator==(const VulkanTuning&) const = default;
};

struct VulkanOptions {
  int device = -1;                 // index into ListVulkanDevices(); -1: the default device
  int64_t kv_device_bytes = 0;     // device memory for KV blocks; 0: a quarter of the device's
  int64_t max_binding_bytes = 0;   // cap on one storage binding (0: the device's limit); tests
                                   // lower it to exercise tensors split across bindings
  bool profile = false;            // time every dispatch (Backend::TakeProfileReport)
  bool phase_clock = false;        // with profile: the short shaders' phases timed inside them
                                   // (vk/phase_clock.h; where the device has shader clocks)
  bool integer_dot = true;         // packed 8-bit dot products where the device has them; tests
                                   // turn them off to check the plain-integer shaders
  bool fuse_ops = true;            // one dispatch for ops that follow each other (norm or SwiGLU
                                   // and the quantization after it, K and V stores); tests turn
                                   // it off to compare with the separate ops
  bool split_weight_rows = true;   // Q4_0, Q8_0, Q6_K rows with 16-byte-aligned codes on the device
                                   // (vk::WeightLayout::kSplitRows); off: the GGUF rows as they are
  bool stack_matrices = true;      // q, k, v (and gate, up) as one matrix and one dispatch where
                                   // their types agree (off: a dispatch each)
  bool batch_attention = true;     // the attention steps of a pass's sequences recorded side by
                                   // side, sharing barriers (off: one sequence after another)
  bool query_tiles = true;         // an attention workgroup takes several queries (prefill's
                                   // tokens, a KV head's query heads) and reads each key and value
                                   // once for all; off: one query a workgroup (the same values)
  bool merge_sequences = true;     // batched: the sequences of a pass that share a KV layout share
                                   // each layer's kv_store (fused) and their attn_scores and
                                   // attn_output where these are specialized alike, and all
                                   // prompts one softmax (a table of the calls); off: one of each
                                   // per sequence, side by side (the same values), to measure it
  bool kv_rows_by_kv_store = true; // fused kv_store also writes the new K/V rows into the host's
                                   // write-back buffer; off: copied there at the end of each pass
                                   // (a copy per sequence, layer and plane), to measure the saving
  bool contract_floats = false;    // let the device fuse a float multiply and add into one
                                   // rounding (off: each rounds as on the CPU, whose bits the
                                   // pass then gives on any device; vk/spirv_no_contraction.h)
  bool batch_invariant = true;     // each step's rows on the matrix shader its own length picks
                                   // (step_order.h), so a sequence's logits are the same bits
                                   // whatever shares its pass; off: a pass of more than 8 rows
                                   // takes the tiled shaders for all (decode of more than 16
                                   // agents then reads the weights fewer times)
  VulkanTuning tuning;
  int64_t device_local_limit = 0;  // fault injection (tests): device-local memory beyond this many
                                   // bytes fails as a full device's (vk::Context); 0: none
};
// Uploads the weights and prepares the pipelines. Unsupported when the build has no Vulkan
// backend or the model has a weight type the shaders lack; NotFound without a device;
// Unavailable when the weights do not fit in the device's memory.
Result<std::unique_ptr<Backend>> MakeVulkanBackend(const Model& model, const VulkanOptions& options);

// Whether a Vulkan backend's error is a device out of memory (VK_ERROR_OUT_OF_DEVICE_MEMORY,
// which its errors name); a lost device is Unavailable too, but not this.
bool IsOutOfDeviceMemory(const Status& status);

// The backend a user asked for (kvfs --backend/--device, kvfsd, the engine).
struct BackendRequest {
  bool vulkan = false;
  int device = -1;  // -1: the default Vulkan device
  int64_t kv_device_bytes = 0;  // Vulkan: VulkanOptions::kv_device_bytes (0: a quarter of the device's)
  bool cpu_fallback = true;     // Vulkan: inside a FallbackBackend (passes the device cannot run go
                                // to the CPU); benchmarks turn it off, so their figures are the device's
  bool profile = false;  // Vulkan: time every dispatch (Backend::TakeProfileReport)
  bool phase_clock = false;  // Vulkan, with profile: time the short shaders' phases (VulkanOptions)
  bool fuse_ops = true;  // Vulkan: VulkanOptions::fuse_ops
  bool split_weight_rows = true;  // Vulkan: VulkanOptions::split_weight_rows
  bool batch_attention = true;    // Vulkan: VulkanOptions::batch_attention
  bool stack_matrices = true;     // Vulkan: VulkanOptions::stack_matrices
  bool query_tiles = true;        // Vulkan: VulkanOptions::query_tiles
  bool kv_rows_by_kv_store = true;  // Vulkan: VulkanOptions::kv_rows_by_kv_store
  bool merge_sequences = true;      // Vulkan: VulkanOptions::merge_sequences
  bool contract_floats = false;     // Vulkan: VulkanOptions::contract_floats
  bool batch_invariant = true;      // Vulkan: VulkanOptions::batch_invariant
  VulkanTuning tuning;            // Vulkan: VulkanOptions::tuning
  std::string tuning_file;        // Vulkan: a file of kvfs tune's; its tuning replaces `tuning`
                                  // when it was made for this device and model (else a warning)
  int64_t device_local_limit = 0;  // Vulkan: VulkanOptions::device_local_limit (tests)
  CpuOptions cpu;
};
struct ChosenBackend {
  std::unique_ptr<Backend> backend;
  std::string name;     // "cpu" or "vulkan: DEVICE NAME"
  std::string warning;  // set when Vulkan was asked for and the CPU serves instead, or a
                        // tuning file was not made for this device and model
  bool tuned = false;   // a tuning file's settings are in use
};
// A Vulkan backend comes inside a FallbackBackend (fallback_backend.h; request.cpu_fallback):
// passes the device cannot run go to the CPU. With cpu_fallback, a Vulkan request gives the CPU
// backend and a warning where there is no Vulkan driver or device (or a build without Vulkan) or
// the model does not fit in the device's memory; without it (benchmarks), those are errors. A
// device index that does not exist, or a model the shaders cannot run, is always an error.
Result<ChosenBackend> MakeRequestedBackend(const Model& model, const BackendRequest& request);

// Test hooks of the Vulkan backend (Unsupported for other backends and builds): the bytes of
// the device copy of host block `serial` (every layer's K then V plane of its slot); that
// slot's bytes after ForgetBlocks({serial}), which must be zeros; and a device loss injected at
// its `at_submission`-th queue submission from now.
Result<std::vector<uint8_t>> VulkanReadBlockCopy(Backend& backend, uint64_t serial);
Result<std::vector<uint8_t>> VulkanForgetAndReadSlot(Backend& backend, uint64_t serial);
Status VulkanLoseDevice(Backend& backend, int64_t at_submission);

}  // namespace kvfs
