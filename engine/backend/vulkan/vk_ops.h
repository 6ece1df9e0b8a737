// The operations of the forward pass, each recorded as one or more dispatches of a shader in
// shaders/: they choose the pipeline (specialization constants), fill the push constants and
// the grid. They record no barriers: the caller orders dependent operations (Recorder::Barrier).
// Buffers hold row-major f32 activations unless said otherwise.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/vulkan/vk_commands.h"
#include "engine/backend/vulkan/vk_context.h"
#include "engine/backend/vulkan/vk_pipelines.h"
#include "engine/core/status.h"
#include "engine/kv/kv_format.h"
#include "engine/model/ggml_types.h"
#include "engine/model/hparams.h"

namespace kvfs::vk {

// How a weight matrix's rows are laid out on the device (the shaders' WEIGHT_LAYOUT).
enum class WeightLayout : uint32_t {
  kGguf = 0,       // as the GGUF file stores them: blocks back to back
  // Q4_0 and Q8_0: each row's n_in / 32 f16 scales, zero padding to a multiple of 16 bytes,
  // then each block's 16 or 32 code bytes. Every block's codes start at a multiple of 16
  // bytes, so a shader reads them with 128-bit loads instead of 16-bit pieces of 18- or
  // 34-byte blocks. Q6_K: the super-blocks' d, the units' scales, then each unit's high bits
  // (8 bytes) and low nibbles (16 bytes), not 16 words of a 210-byte block (weight_layout.h).
  kSplitRows = 1,
};

// A weight matrix on the device (n_out rows of row_bytes in `layout`), split into parts of
// whole rows when it is larger than one storage binding may be.
struct DeviceMatrixPart {
  Buffer buffer;       // rows [row0, row0 + n_rows) of the matrix, back to back
  int64_t row0 = 0;
  int64_t n_rows = 0;
};
struct DeviceMatrix {
  GgmlType type = GgmlType::kF32;
  WeightLayout layout = WeightLayout::kGguf;
  int64_t n_in = 0;       // values per row
  int64_t n_out = 0;      // rows
  int64_t row_bytes = 0;  // bytes per row on the device (in `layout`)
  std::vector<DeviceMatrixPart> parts;
  // Matrices of the same type and input stacked into one (q|k|v, gate|up), multiplied by one
  // dispatch: the first rows of the second and third (at most two entries); empty: one matrix.
  // Ops::MatMul writes each one's rows to an output of its own.
  std::vector<int64_t> segment_rows;
};

// How activations are prepared for a weight type's dot product: quantized to 8-bit units like
// the CPU's (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the k-quants), or read as
// f32 (float weights).
enum class ActKind : uint32_t { kQ8_0 = 0, kQ8_1 = 1, kQ8_K = 2, kFloat = 3 };
ActKind ActKindFor(GgmlType weight_type);
// Whether the shaders can multiply by (and look up rows of) a matrix of this type.
bool SupportedWeightType(GgmlType t);

// Quantized activations: codes [rows][n / 4] words (4 signed bytes each) and aux
// [rows][n / 32] vec4 (scale, Q8_1 sum term, code sums of the two halves of each 32 values).
struct QuantizedActs {
  const Buffer* codes = nullptr;
  const Buffer* aux = nullptr;
};

// Where the attention output shaders also write their rows quantized (for an o matrix of
// activation kind `kind`, as QuantizeActs would): Ops::QuantizesAttentionOutput says when.
struct OutputCodes {
  ActKind kind = ActKind::kFloat;
  QuantizedActs acts;
};

// One sequence's KV on the device for one layer: the K and V planes of its layout's arena,
// indexed through a block table (block index -> device slot) starting at table0.
struct KvView {
  const Buffer* k_plane = nullptr;  // [slots * block_tokens][row_stride bytes]; q4k: [slots][k_slot_bytes]
  const Buffer* v_plane = nullptr;  // [slots * block_tokens][row_stride bytes]
  const Buffer* block_table = nullptr;  // uint32 slots
  uint32_t table0 = 0;
  KvFormat format;
  int64_t block_tokens = 0;
  int64_t row_stride = 0;  // bytes between device rows (row bytes rounded up to a word)
  // q4k (keys in chunks of format.chunk tokens): the bytes of one slot's K plane
  // (block_tokens / chunk chunks), and the pass's f16 key rows of this layer ([rows][row
  // values] halfs; row key_row0 holds position key_pos0), which hold the keys of every position
  // from the sequence's first incomplete chunk on.
  int64_t k_slot_bytes = 0;
  const Buffer* keys = nullptr;
  int64_t key_row0 = 0;
  int64_t key_pos0 = 0;
};

// Query/head geometry shared by the attention ops.
struct AttentionShape {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
};

// Where one call's rows start in the attention scratch (AttentionBatch shares it): floats of
// scores and of partials, (max, sum) entries of stats.
struct ScratchOffsets {
  int64_t score0 = 0;
  int64_t partial0 = 0;
  int64_t stats0 = 0;
  int64_t counter0 = 0;  // words of the split counters
};

// The matrix-vector shaders' shape (VulkanMatvecShape with the defaults filled in).
struct MatvecShape {
  uint32_t group = VulkanMatvecShape::kDefaultGroup;  // invocations per workgroup
  uint32_t max_lanes = VulkanMatvecShape::kDefaultGroup;  // invocations per row (slot) at most; short rows take fewer
  int64_t min_groups = VulkanMatvecShape::kDefaultMinGroups;  // matvec_quant's rows per slot grow
                                                              // while this many workgroups remain
  uint32_t max_rows = VulkanMatvecShape::kDefaultRows;  // matvec_quant's rows per slot at most
  uint32_t ahead = VulkanMatvecShape::kDefaultAhead;    // matvec_quant's units a lane's round loads
  uint32_t norm_group = 0;  // workgroups of matvec_quant making its RMSNorm input itself; 0: none do
};

// The shape a VulkanTuning asks for (ResolvedTuning's: no 0s left); lanes above the group mean
// the group.
MatvecShape MatvecShapeFor(const VulkanTuning& resolved);

class Ops {
 public:
  static Result<std::unique_ptr<Ops>> Create(Context& ctx, PipelineCache& pipelines);
  // Ops that only plan (PlanMatMul, FusesSwiGlu: kvfs shaders) and make no buffer, for devices
  // that have no memory to give (RADV's null device). Recording any op with them is an error.
  static Result<std::unique_ptr<Ops>> CreateForPlanning(Context& ctx, PipelineCache& pipelines);

  // x[t] = row tokens[t] of `table` (int32 ids, n_tokens of them), dequantized.
  Status Embed(Recorder& rec, const DeviceMatrix& table, const Buffer& tokens, int64_t n_tokens, const Buffer& x);
  // y[i] = RMSNorm(x[row i, or row_ids[i] when given]) * w over n values, for n_rows rows.
  Status RmsNorm(Recorder& rec, const Buffer& x, int64_t x_stride, const Buffer& w, int64_t n, float eps,
                 const Buffer& y, int64_t y_stride, int64_t n_rows, const Buffer* row_ids);
  // Quantizes n_rows rows of n values of x for weights of activation kind `kind` (not kFloat).
  Status QuantizeActs(Recorder& rec, ActKind kind, const Buffer& x, int64_t x_stride, int64_t n, int64_t n_rows,
                      const QuantizedActs& out);
  // Fused ops, one dispatch each: RmsNorm (without gather) into y, or SwiGlu of n_rows rows of
  // n values (gate and up rows n apart) into y, and those rows quantized as QuantizeActs does.
  // The values are those of the separate ops, bit for bit.
  Status NormQuantizeActs(Recorder& rec, ActKind kind, const Buffer& x, int64_t x_stride, const Buffer& w, int64_t n,
                          float eps, const Buffer& y, int64_t y_stride, int64_t n_rows, const QuantizedActs& out);
  Status SwiGluQuantizeActs(Recorder& rec, ActKind kind, const Buffer& gate, const Buffer& up, int64_t n,
                            int64_t n_rows, const Buffer& y, const QuantizedActs& out);

  // Words of the counters (all 0 between uses) the backend gives split attention and the
  // SwiGLU epilogue: 16384, e.g. 512 sequences of 4 tokens with 8 head groups in one round.
  static constexpr int64_t kCounterWords = 16384;

  // The most activation rows the matrix-vector shaders take; more go to the tiled shaders.
  static constexpr int64_t kMatvecMaxTokens = 8;

  // SwiGLU of a stacked gate|up matrix's outputs (y = gate, y1 = up), quantized for the down
  // matrix by the matrix-vector shader itself: the workgroup that completes a block's gate and
  // up rows writes the block's codes, as SwiGluQuantizeActs would (FusesSwiGlu says when).
  struct SwiGluCodes {
    ActKind kind = ActKind::kFloat;     // the down matrix's
    QuantizedActs acts;                 // [n_tokens][n_ff / 4] codes, [n_tokens][n_ff / 32] aux
    const Buffer* counters = nullptr;   // uint32 words, all 0; left 0
    int64_t counter_words = 0;
  };

  // The RMSNorm a quantized matrix's input is, made by the matrix-vector shader itself from x:
  // RMSNorm(x[t]) * weight quantized for the matrix, as NormQuantizeActs would (FusesNorm says
  // when). Then neither the norm's dispatch nor its barrier: decode is a chain of short ones.
  struct NormInput {
    const Buffer* x = nullptr;       // [row0 + n_tokens][x_stride] f32 rows, token t's at row0 + t
    int64_t x_stride = 0;
    const Buffer* weight = nullptr;  // [w.n_in] f32
    float eps = 0;
    int64_t row0 = 0;
  };

  struct MatMulArgs {
    const Buffer* x = nullptr;  // f32 input rows (read by float weights)
    int64_t x_stride = 0;
    QuantizedActs acts;         // x quantized for w's ActKind (read by quantized weights)
    int64_t n_tokens = 0;
    const Buffer* y = nullptr;  // [n_tokens][w.n_out]; stacked matrices: [n_tokens][rows of the first]
    const Buffer* y1 = nullptr;  // stacked matrices: [n_tokens][rows of the second]
    const Buffer* y2 = nullptr;  // three stacked: [n_tokens][rows of the third]
    const Buffer* bias = nullptr;  // [w.n_out] or null
    bool accumulate = false;    // y += W x instead of y = W x
    const SwiGluCodes* swiglu = nullptr;  // with it, also SwiGLU(y, y1) quantized (FusesSwiGlu)
    const NormInput* norm = nullptr;      // with it, the input is that norm of x (acts unused; FusesNorm)
    // Rows [0, matvec_tokens) go to the matrix-vector shader and the rest to the tiled one,
    // whatever their numbers; -1: all to one, the matrix-vector shader for at most
    // kMatvecMaxTokens rows. The two add a row's products in different orders, so a backend that
    // keeps each step's rows on the shader its own length picks gives every sequence the same
    // bits whatever else shares its pass. A split (0 < matvec_tokens < n_tokens) takes neither
    // swiglu nor norm.
    int64_t matvec_tokens = -1;
  };
  // y[t][r] = W.row(r) . x[t] (+ bias[r]) (+ old y[t][r]) for every part of W (the rows of
  // stacked matrices going to y, y1, y2; bias indexed by the stacked row).
  Status MatMul(Recorder& rec, const DeviceMatrix& w, const MatMulArgs& a);
  // The pipeline MatMul runs for a part of `part_rows` rows of w and n_tokens activation rows
  // (with SwiGLU's codes when `swiglu`), and the outputs each workgroup computes: rows by
  // tokens. kvfs shaders reports the compiler's statistics of these.
  struct MatMulPlan {
    const Pipeline* pipeline = nullptr;
    uint32_t rows_per_group = 0;
    uint32_t tokens_per_group = 0;
  };
  // `matvec`: the matrix-vector shader (in groups of rows) or the tiled one; by default, the
  // matrix-vector shader for at most kMatvecMaxTokens rows.
  Result<MatMulPlan> PlanMatMul(const DeviceMatrix& w, int64_t part_rows, int64_t n_tokens,
                                const SwiGluCodes* swiglu = nullptr, bool norm = false,
                                std::optional<bool> matvec = std::nullopt);
  // Whether MatMul can hand on SwiGLU codes of `kind` for n_tokens rows: w is gate|up stacked
  // (two halves of a quantized type, each a whole number of kind's blocks), the rows go to the
  // matrix-vector shader, whose workgroups have room for the quantizer (at least 32
  // invocations, its shared memory), and the blocks' counters fit in counter_words.
  bool FusesSwiGlu(const DeviceMatrix& w, int64_t n_tokens, ActKind kind, int64_t counter_words) const;
  // Whether MatMul can make its input's RMSNorm itself (MatMulArgs::norm) for n_tokens rows, with
  // SwiGLU's codes too when `swiglu`: the shape has a norm_group, w's activations are Q8_0 or
  // Q8_1, the rows go to the matrix-vector shader, and each part's shared memory (the codes of
  // its workgroup's tokens among it) fits the device.
  bool FusesNorm(const DeviceMatrix& w, int64_t n_tokens, const SwiGluCodes* swiglu = nullptr) const;
  // The pipeline of an RMSNorm whose output feeds a matrix taking activations of `kind`, as a
  // fused pass records it: NormQuantizeActs (quantize_act) for quantized kinds, RmsNorm for
  // float ones (kvfs shaders).
  Result<const Pipeline*> PlanNorm(ActKind kind);

  // Rotates the first n_rot dimensions of every head (head_dim apart) of n_tokens rows in place
  // with the (cos, sin) table [n_tokens][n_rot / 2].
  Status Rope(Recorder& rec, const Buffer& x, int64_t x_stride, int64_t n_heads, int64_t head_dim, int64_t n_rot,
              RopeStyle style, const Buffer& cos_sin, int64_t n_tokens);
  // out = silu(gate) * up over n values.
  Status SwiGlu(Recorder& rec, const Buffer& gate, const Buffer& up, const Buffer& out, int64_t n);

  // Reads bytes [offset, offset + bytes) of `data` (offset and bytes multiples of 16) so that
  // they sit in the device's cache for a later dispatch that streams them (prefetch.comp),
  // XORing every word read into sink's first word (atomically: read-aheads beside each other
  // share the sink with no barrier between). Recorded beside a short dispatch with no barrier
  // between, it uses memory that would otherwise idle.
  Status PrefetchBytes(Recorder& rec, const Buffer& data, int64_t offset, int64_t bytes, const Buffer& sink);
  // The same for up to `bytes` of matrix m from byte `offset` of its rows (over its parts, in
  // row order); returns how many bytes that covered (less at the matrix's end).
  Result<int64_t> Prefetch(Recorder& rec, const DeviceMatrix& m, int64_t offset, int64_t bytes, const Buffer& sink);
  // The most workgroups a prefetch dispatch takes (few, so that they run beside the short
  // dispatch rather than queue in front of it), their size, and the loads in flight in each
  // of their invocations: 128 x 256 x 8 x 16 bytes = 4 MiB in flight, what a GPU's memory
  // needs over a latency of about a microsecond.
  static constexpr uint32_t kPrefetchGroups = 128;
  static constexpr uint32_t kPrefetchGroupSize = 256;
  static constexpr uint32_t kPrefetchLoads = 8;

  // Where KvStoreBoth also writes the rows it stores, for the host: in `buffer` (host-visible,
  // the write-back's), the row of position p >= pos0[i] at byte bytes0[i] + (p - pos0[i]) times
  // the row's bytes (kv.row_stride; q4k's staged keys: 2 per value); entry 0 is K (q4k: the
  // staged keys), 1 is V. Negative bytes0: that plane is not mirrored. Offsets are multiples of 4.
  struct KvMirror {
    const Buffer* buffer = nullptr;
    std::array<int64_t, 2> bytes0{-1, -1};
    std::array<int64_t, 2> pos0{0, 0};
    int64_t layer_bytes = 0;  // the next layer's rows lie this much further (KvStoreBatch)
  };
  // Encodes rows src[src_row0 ..] (n_tokens rows of n_head_kv * head_dim values) into `plane`
  // at positions pos0 .. pos0 + n_tokens - 1 of the sequence (q4k: V rows only; its keys go
  // through KStage and KChunks).
  Status KvStore(Recorder& rec, const KvView& kv, const Buffer& plane, const AttentionShape& shape,
                 const Buffer& src, int64_t src_stride, int64_t src_row0, int64_t n_tokens, int64_t pos0);
  // The RoPE of Rope() (table rows = src rows), for ops that rotate their input first.
  struct RopeTable {
    const Buffer* cos_sin = nullptr;
    int64_t n_rot = 0;
    RopeStyle style = RopeStyle::kNormal;
  };
  // KvStore of K rows k_src[src_row0 ..], rotated by k_rope first when given, and of V rows
  // v_src[src_row0 ..], in one dispatch. q4k: the keys are staged as KStage stages them (after
  // k_rope), for KChunks.
  Status KvStoreBoth(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& k_src,
                     const Buffer& v_src, int64_t src_stride, int64_t src_row0, int64_t n_tokens, int64_t pos0,
                     const RopeTable* k_rope, const KvMirror* mirror = nullptr);
  // One row of KvStoreBatch, as kv_store.comp's KvStoreEntry: entries are written by the host
  // into a host-visible buffer before the pass is submitted.
  static constexpr uint32_t kNotMirrored = 0xFFFFFFFFu;
  struct KvStoreEntry {
    uint32_t src_row = 0;  // its row of the K and V sources (and of the RoPE table)
    uint32_t pos = 0;      // its position in its sequence
    uint32_t table0 = 0;   // its sequence's first block table entry (KvView::table0)
    uint32_t key_row = 0;  // q4k: its row of the pass's key rows
    std::array<uint32_t, 2> mirror_word{kNotMirrored, kNotMirrored};  // layer 0's K (q4k: staged keys) and V row
    uint32_t mirror_layer_words = 0;  // in the mirror, words from a layer's row to the next layer's
  };
  // The entry of source row src_row, position pos of the sequence kv views, its rows also
  // written where `mirror` (layer 0's, or null) says, as KvStoreBoth's mirror would.
  // Internal when the mirror's rows do not start at whole words.
  static Result<KvStoreEntry> KvStoreEntryFor(const KvView& kv, const AttentionShape& shape, int64_t src_row,
                                              int64_t pos, const KvMirror* mirror);
  // KvStoreBoth in one dispatch for rows of several sequences that share kv's planes (one KV
  // arena): entries[entry0 .. entry0 + n_entries) (KvStoreEntry each) say where each row comes
  // from and goes, for layer `layer` (kv's planes and keys); with `mirror`, the rows whose
  // entries say so also go there. The same bytes as KvStoreBoth for each sequence.
  Status KvStoreBatch(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& k_src,
                      const Buffer& v_src, int64_t src_stride, const Buffer& entries, int64_t entry0,
                      int64_t n_entries, int64_t layer, const RopeTable* k_rope, const Buffer* mirror);
  // q4k keys: rows src[src_row0 ..] as f16 into kv.keys at positions pos0 .. (no rotation).
  Status KStage(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& src, int64_t src_stride,
                int64_t src_row0, int64_t n_tokens, int64_t pos0);
  // q4k keys: encodes chunks chunk0 .. chunk0 + n_chunks - 1 (complete, their keys in kv.keys)
  // into the K plane (the bytes of KvQuantizeKChunk).
  Status KChunks(Recorder& rec, const KvView& kv, const AttentionShape& shape, int64_t chunk0, int64_t n_chunks);
  // Attention of n_tokens consecutive query tokens of one sequence (positions pos0 ..), with
  // q rows q[q_row0 ..]: scores, causal softmax, weighted V sum into out[out_row0 ..].
  // `scores` holds [n_tokens][n_head][pos0 + n_tokens] floats; `partials` (partial_floats
  // floats) takes the partial sums when a few tokens' positions are split over workgroups.
  // With `stats` (stats_floats floats), decode fuses the softmax into the weighted sum when
  // FusesSoftmax says it can: one dispatch fewer, and no pass over the whole context by one
  // workgroup per head.
  Status Attention(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                   int64_t q_row0, int64_t n_tokens, int64_t pos0, const Buffer& scores, const Buffer& partials,
                   int64_t partial_floats, const Buffer& out, int64_t out_stride, int64_t out_row0,
                   const Buffer* stats = nullptr, int64_t stats_floats = 0);

  // A call of attn_scores, softmax or attn_output as it would be recorded alone. AttentionBatch
  // merges the calls of a step that share a pipeline (so the same specialization: split or not,
  // fused softmax, query tiles), buffers and the grid dimension not numbered across calls
  // (scores, softmax: heads; output: head groups) into one dispatch, their parameters in a table
  // of the pass (jobs.glsl, vk_attention_calls.cpp).
  static constexpr size_t kMaxCallWords = 24;
  struct AttnCall {
    const ShaderInterface* shader = nullptr;
    std::array<uint32_t, 12> spec{};  // the last one used is JOBS (0)
    size_t n_spec = 0;
    std::array<const Buffer*, Recorder::kMaxBuffers> buffers{};  // the last one used: the jobs table (unused_)
    size_t n_buffers = 0;
    std::array<uint32_t, kMaxCallWords> params{};  // the shader's Params, word by word
    size_t n_params = 0;
    std::array<uint32_t, 3> grid{};
    uint32_t flat_dim = 0;  // jobs.glsl's kJobsFlatDim: the grid dimension the calls share is the other one
  };
  // One sequence's query tokens in AttentionBatch: as Attention's arguments.
  struct AttentionJob {
    KvView kv;
    int64_t q_row0 = 0;    // q row of its first token
    int64_t n_tokens = 0;
    int64_t pos0 = 0;      // position of its first token
    int64_t out_row0 = 0;  // out row of its first token
  };
  // The scratch the jobs share, sizes in floats; no stats: no fused softmax.
  struct AttentionScratch {
    const Buffer* scores = nullptr;
    int64_t score_floats = 0;
    const Buffer* partials = nullptr;
    int64_t partial_floats = 0;
    const Buffer* stats = nullptr;
    int64_t stats_floats = 0;
    // Counters (uint32 words, all 0 to begin with; the shaders leave them 0): with them the split
    // workgroup that finishes last adds the splits up itself, without attn_reduce.
    const Buffer* counters = nullptr;
    int64_t counter_words = 0;
  };
  // Attention of several sequences' tokens (q and out rows of one pass): each step (scores,
  // softmax, weighted sum, split sums unless counted in one pass) is recorded for every job whose scratch fits beside the
  // others', with one barrier between steps instead of three per sequence, so the device runs
  // the sequences side by side (batched decode of many agents). The scores (and the weighted
  // sums) of jobs that share a pipeline and KV plane are one dispatch (set_merge_jobs): their
  // parameters go to a table of the pass (Recorder::PassTable). Jobs that do not fit wait for
  // the next round. Every job gets the splits and fusing Attention alone would give it, so its
  // output is the same bit for bit. ResourceExhausted when one job's scores exceed the buffer.
  // Records no barrier after the last step. With `codes`, the output rows are also quantized
  // (QuantizesAttentionOutput must hold): the o matrix needs no QuantizeActs of its own. With
  // `q_rope` (rows = q's rows), the scores rotate the queries by RoPE as Rope() would (q itself
  // stays as it is): no rope dispatch for them.
  //
  // With `new_keys` (and q_rope; every job ScoresReadNewKeys), the scores take the keys of each
  // job's own tokens from new_keys' rows (q's rows) and rotate them by q_rope, as kv_store stores
  // them, instead of reading them from the cache: a decode step may record kv_store and the
  // scores with no barrier between (the weighted sums, after a barrier, read V from the cache).
  struct NewKeys {
    const Buffer* k = nullptr;  // K rows as the q|k|v matrix leaves them, before RoPE
    int64_t k_stride = 0;       // floats between rows
  };
  static constexpr int64_t kNewKeyTokens = 4;
  // f16 keys (not rotated) or q4k's staged keys in a chunk the job does not complete, and at
  // most kNewKeyTokens tokens.
  static bool ScoresReadNewKeys(const KvFormat& format, int64_t n_tokens, int64_t pos0);
  Status AttentionBatch(Recorder& rec, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                        const Buffer& out, int64_t out_stride, std::span<const AttentionJob> jobs,
                        const AttentionScratch& scratch, const OutputCodes* codes = nullptr,
                        const RopeTable* q_rope = nullptr, const NewKeys* new_keys = nullptr);
  // Whether the attention output shaders can quantize their rows for `kind`: each workgroup
  // writes whole blocks (its heads hold a whole number of them) and the quantizer's shared
  // memory fits the device.
  bool QuantizesAttentionOutput(const AttentionShape& shape, ActKind kind) const;

  // The attention scratch the backend makes, in bytes, each within one binding.
  struct ScratchBytes {
    int64_t scores = 0;
    int64_t partials = 0;
    int64_t stats = 0;
  };
  static ScratchBytes BackendScratch(int64_t max_binding_bytes, int64_t device_memory_bytes);
  // The pipelines a fused pass records for one sequence's attention step of n_tokens query
  // tokens at positions pos0 .. (kvfs shaders), planned as the backend and AttentionBatch plan
  // them, with the backend's scratch and its choices (RoPE of the keys in kv_store and of the
  // queries in the scores; the new keys made by the scores where they can; the output quantized
  // for an o matrix of activation kind o_kind where it can); a step whose scores exceed the
  // scratch as its first job of the tokens that fit, as the backend splits it. Records nothing;
  // kv's buffers may be absent.
  struct StepPipelines {
    const Pipeline* kv_store = nullptr;       // with a row table, as the backend stores
    std::array<const Pipeline*, 2> scores{};  // alone; merged with other sequences' calls
    std::array<const Pipeline*, 2> softmax{};  // where the softmax is not fused into the weighted sum
    std::array<const Pipeline*, 2> output{};
    const Pipeline* reduce = nullptr;         // where attn_reduce adds the splits' sums
  };
  Result<StepPipelines> PlanAttentionStep(const KvView& kv, const AttentionShape& shape, int64_t n_tokens, int64_t pos0,
                                          int64_t max_binding_bytes, RopeStyle rope_style, int64_t n_rot,
                                          ActKind o_kind);

  // The steps of Attention, for tests. With `stats`, AttnScores also writes each workgroup's
  // softmax share (its max and sum: [n_tokens][n_head][ceil(n_ctx / ScoreGroupPositions)]
  // float pairs) and AttnOutput takes raw scores and makes the weights itself from them.
  Status AttnScores(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                    int64_t q_row0, int64_t n_tokens, int64_t pos0, const Buffer& scores,
                    const Buffer* stats = nullptr, const ScratchOffsets& at = {}, const RopeTable* q_rope = nullptr,
                    const NewKeys* new_keys = nullptr);
  Status Softmax(Recorder& rec, const Buffer& scores, int64_t n_head, int64_t n_tokens, int64_t pos0,
                 int64_t score_stride, float scale, bool round_f16, int64_t score0 = 0);
  // With n_splits > 1, writes partial sums into `partials` instead of out and needs AttnReduce,
  // unless given `counters` (AttentionScratch): then the last split of each row adds them up.
  Status AttnOutput(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& scores,
                    int64_t n_tokens, int64_t pos0, const Buffer& out, int64_t out_stride, int64_t out_row0,
                    int64_t n_splits, const Buffer* partials, const Buffer* stats = nullptr,
                    const ScratchOffsets& at = {}, const OutputCodes* codes = nullptr,
                    const Buffer* counters = nullptr);
  // Counter words AttnOutput uses in one pass (n_splits > 1, with counters).
  static int64_t SplitCounters(const AttentionShape& shape, int64_t n_tokens);
  Status AttnReduce(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& partials,
                    int64_t n_tokens, int64_t n_splits, const Buffer& out, int64_t out_stride, int64_t out_row0,
                    int64_t partial0 = 0, const OutputCodes* codes = nullptr);
  // Workgroups per (token, head) that Attention's weighted sum uses: several for decode.
  int64_t AttentionSplits(const AttentionShape& shape, int64_t n_tokens, int64_t pos0, int64_t partial_floats) const;
  // Positions per attn_scores workgroup (so per stats entry) for the format.
  static int64_t ScoreGroupPositions(const KvFormat& format);
  // false: one query (token, head) per attention workgroup, as before query tiles (the same
  // values; for A/B timing and the tests' comparison).
  void set_query_tiles(bool on) { query_tiles_ = on; }
  // Whether Attention fuses the softmax for this call: decode (a few tokens), splits short
  // enough for their weights to sit in shared memory, and room for the stats.
  bool FusesSoftmax(const KvView& kv, const AttentionShape& shape, int64_t n_tokens, int64_t pos0, int64_t n_splits,
                    int64_t stats_floats) const;
  // false: always run softmax.comp as its own dispatch (for A/B timing).
  void set_fuse_softmax(bool on) { fuse_softmax_ = on; }
  // false: AttentionBatch records each job's attn_scores and attn_output dispatches side by side
  // instead of merging the jobs that share a pipeline and KV plane into one dispatch (the same
  // values; for A/B timing and the tests' comparison).
  void set_merge_jobs(bool on) { merge_jobs_ = on; }
  // false: reduction trees entirely in shared memory, not their steps within a subgroup by
  // shuffles (the *_sg shader variants, subgroup_tree.glsl; the same values), for A/B timing.
  void set_subgroup_trees(bool on) { subgroup_trees_ = on; }
  bool subgroup_trees() const { return subgroup_trees_ && ctx_.subgroup_shuffle(); }
  // InvalidArgument for shapes the shaders or the device cannot take (powers of two, lanes >= 4
  // and <= group, group within the device's workgroup size, partial sums within its shared
  // memory).
  Status set_matvec_shape(const MatvecShape& shape);
  const MatvecShape& matvec_shape() const { return matvec_; }

  // Whether attention and KV encoding fit this device for the geometry (shared memory,
  // workgroup size), with the reason when they do not.
  Status CheckAttentionShape(const AttentionShape& shape) const;

  // Positions per workgroup when a few tokens' attention is split over positions (decode). The
  // invocations of attn_output walk their share of a split one position after another, so long
  // splits leave a large GPU latency-bound on a few workgroups: at 512, an H100 spent ~140 us a
  // layer on 3500 positions that take ~1 us to stream. Splits hold whole 32-position tiles.
  static constexpr int64_t kDefaultAttentionSplit = VulkanTuning::kDefaultAttentionSplit;
  int64_t attention_split_positions() const { return split_positions_; }
  // Rounded up to whole 32-position tiles, as the splits are.
  void set_attention_split_positions(int64_t n) { split_positions_ = (std::max<int64_t>(n, 1) + 31) / 32 * 32; }

 private:
  Ops(Context& ctx, PipelineCache& pipelines) : ctx_(ctx), pipelines_(pipelines) {}
  // Rows [t_begin, t_end) of a's through one part of w, on the matrix-vector or the tiled shader.
  Status MatMulPart(Recorder& rec, const DeviceMatrix& w, const DeviceMatrixPart& part, const MatMulArgs& a,
                    int64_t t_begin, int64_t t_end, bool matvec);
  // matvec_quant's workgroup for a part of w of part_rows rows (with the norm, or not):
  // invocations, invocations a slot (row), rows a slot.
  struct QuantShape {
    uint32_t group, lanes, rows;
  };
  QuantShape MatvecQuantShape(const DeviceMatrix& w, int64_t part_rows, bool norm) const;
  struct KvStoreRows {
    const Buffer* src;
    const Buffer* plane;
  };
  // A KvStoreBatch dispatch's rows: entries [entry0, entry0 + n) of `entries`, for `layer`.
  struct KvStoreTable {
    const Buffer* entries;
    int64_t entry0;
    int64_t layer;
  };
  // kv_store of one or two (rows, plane) pairs; the first is rotated by `rope` when given; with
  // `mirror` (two pairs: K, V), the rows also go where it says. With `table`, n_tokens rows
  // as its entries say (src_row0, pos0 unused; mirror: its buffer).
  Status KvStoreRowsOf(Recorder& rec, const KvView& kv, const AttentionShape& shape, std::span<const KvStoreRows> rows,
                       int64_t src_stride, int64_t src_row0, int64_t n_tokens, int64_t pos0, const RopeTable* rope,
                       const KvMirror* mirror, const KvStoreTable* table = nullptr);
  Result<AttnCall> PlanScores(const KvView& kv, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                              int64_t q_row0, int64_t n_tokens, int64_t pos0, const Buffer& scores,
                              const Buffer* stats, const ScratchOffsets& at, const RopeTable* q_rope,
                              const NewKeys* new_keys);
  Result<AttnCall> PlanOutput(const KvView& kv, const AttentionShape& shape, const Buffer& scores, int64_t n_tokens,
                              int64_t pos0, const Buffer& out, int64_t out_stride, int64_t out_row0,
                              int64_t n_splits, const Buffer* partials, const Buffer* stats, const ScratchOffsets& at,
                              const OutputCodes* codes, const Buffer* counters);
  // Records a call alone (vk_attention_calls.cpp).
  Status RecordCall(Recorder& rec, const AttnCall& call);
  // Records `call` with its pipeline alone or merged (JOBS), pushing job0 and groups0 after its
  // Params (jobs.glsl).
  Status DispatchCall(Recorder& rec, const AttnCall& call, bool merged, uint32_t job0, uint32_t groups0);
  // Records calls that need no barrier between them, merged where they can be (merge_jobs_):
  // the calls of each group of mergeable ones in dispatches within the device's grid limit.
  Status RecordCalls(Recorder& rec, std::span<const AttnCall> calls);
  // Records mergeable calls as one dispatch with their table (or alone when the pass's table
  // space is used up).
  Status RecordMerged(Recorder& rec, std::span<const AttnCall* const> calls);
  // The queries an attn_scores workgroup scores (each of its keys loaded once for all): tokens
  // by query heads of one KV head. At most 16, fewer where the device's shared memory asks; one
  // query with query tiles off.
  struct ScoreTile {
    int64_t tokens = 1;
    int64_t heads = 1;
  };
  ScoreTile ScoreQueries(const KvFormat& format, const AttentionShape& shape, int64_t n_tokens, bool stats) const;
  // quantize_act.comp's SOURCE: what the quantized rows are.
  enum class QuantizeSource : uint32_t { kRows = 0, kSwiGlu = 1, kRmsNorm = 2 };
  // The pipelines RmsNorm and Quantize record (and PlanNorm reports).
  Result<const Pipeline*> RmsNormPipeline();
  Result<const Pipeline*> QuantizePipeline(ActKind kind, QuantizeSource source);
  Status Quantize(Recorder& rec, ActKind kind, QuantizeSource source, const Buffer& x, int64_t x_stride,
                  const Buffer* x2, int64_t n, float eps, const Buffer* y, int64_t y_stride, int64_t n_rows,
                  const QuantizedActs& out);

  Context& ctx_;
  PipelineCache& pipelines_;
  Buffer unused_;  // bound where a shader's optional input is absent
  int64_t split_positions_ = kDefaultAttentionSplit;
  bool fuse_softmax_ = true;
  bool subgroup_trees_ = true;
  bool query_tiles_ = true;
  MatvecShape matvec_;
  // An AttentionBatch job as recorded: its splits and fusing (decided against the whole
  // scratch, as alone) and where its rows lie in the scratch; round_ holds a round's jobs.
  struct PlannedJob {
    const AttentionJob* job;
    int64_t n_splits;
    bool fused;
    bool one_pass;  // split, its sums added by the last split (no attn_reduce)
    ScratchOffsets at;
    ScratchOffsets takes;  // the scratch it takes: floats of scores and partials, stats entries, counter words
    // Its splits' sums are added (and its output written and quantized) by attn_reduce.
    bool reduces() const { return n_splits > 1 && !one_pass; }
  };
  // A job's splits and fusing against the whole scratch (as alone), its rows at `at`;
  // ResourceExhausted when its scores alone exceed the scratch.
  Result<PlannedJob> PlanJob(const AttentionJob& j, const AttentionShape& shape, const AttentionScratch& scratch,
                             const ScratchOffsets& at) const;
  // Its attn_scores and attn_output calls (AttentionBatch's arguments).
  Result<AttnCall> ScoresCall(const PlannedJob& p, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                              const AttentionScratch& scratch, const RopeTable* q_rope, const NewKeys* new_keys);
  Result<AttnCall> OutputCall(const PlannedJob& p, const AttentionShape& shape, const Buffer& out, int64_t out_stride,
                              const AttentionScratch& scratch, const OutputCodes* codes);
  AttnCall PlanSoftmax(const Buffer& scores, int64_t n_head, int64_t n_tokens, int64_t pos0, int64_t score_stride,
                       float scale, bool round_f16, int64_t score0) const;
  AttnCall SoftmaxCall(const PlannedJob& p, const AttentionShape& shape, const AttentionScratch& scratch) const;
  Result<const Pipeline*> ReducePipeline(const KvView& kv, const AttentionShape& shape, const OutputCodes* codes);
  uint32_t KvStoreGroup(const KvFormat& f) const;  // kv_store's invocations a workgroup
  Result<const Pipeline*> KvStorePipeline(const KvView& kv, const AttentionShape& shape, const RopeTable* rope,
                                          bool table);
  // A call's pipeline alone or merged (JOBS).
  Result<const Pipeline*> CallPipeline(const AttnCall& call, bool merged);
  std::vector<PlannedJob> round_;
  bool merge_jobs_ = true;
  // RecordCalls' scratch, kept between calls (no allocation per layer): the calls of a step,
  // each call's group, each group's first call, a merged dispatch's table.
  std::vector<AttnCall> calls_;
  std::vector<size_t> call_group_, group_first_;
  std::vector<const AttnCall*> merged_calls_;
  std::vector<uint32_t> job_table_;
  bool warned_table_full_ = false;
};

}  // namespace kvfs::vk
