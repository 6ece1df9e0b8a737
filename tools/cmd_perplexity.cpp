// kvfs perplexity: the quality of a KV format, measured like the reference's llama-perplexity so
// that figures compare. The text is tokenized whole (BOS first when the model adds one), cut into
// non-overlapping windows of CTX tokens (the first token of each replaced by BOS when the model
// adds one), and each window is run from an empty cache. Only the second half of a window is
// scored, positions CTX/2 .. CTX-2 each predicting the next token of the window, so every
// scored token has at least CTX/2 tokens of context. --kl-divergence runs each window over an
// f16 KV cache too, in the same forward pass (one batch of two sequences, so the weights are read
// once), and compares the two distributions position by position.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/backend/backend.h"
#include "engine/core/read_file.h"
#include "engine/runtime/logit_stats.h"
#include "engine/store/manifest.h"
#include "tools/args.h"
#include "tools/backend_choice.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

constexpr const char* kPerplexityUsage =
    "usage: kvfs perplexity -m MODEL -f TEXT [options]\n"
    "  -m MODEL            GGUF model file\n"
    "  -f TEXT             the text to score (read whole; one trailing newline dropped)\n"
    "  -c CTX              window size in tokens (default 512); the second half of each is scored\n"
    "  -t THREADS          CPU threads (default: all cores)\n"
    "  --kv f16|q8|q4|q4k  KV cache format (default f16); q4k: keys 4-bit per channel over\n"
    "                      chunks of 64 tokens, values 4-bit in sub-blocks of 16\n"
    "  --kv-rotate on|off  Walsh-Hadamard rotation of quantized KV (default on where head_dim is a power of two)\n"
    "  --kl-divergence     also run every window over an f16 KV cache and compare: mean KL(p_f16 || p_kv),\n"
    "                      same top-1 token rate, both perplexities and their ratio\n"
    "  --chunks N          score at most the first N windows (default: all)\n"
    "  --json              print the figures as one JSON object\n"
    "  --verbose           running perplexity per window and timings on stderr\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvfs perplexity: %s\n", message.c_str());
  return 2;
}

nlohmann::json ToJson(const Estimate& e) { return {{"value", e.value}, {"uncertainty", e.uncertainty}}; }

using Clock = std::chrono::steady_clock;

}  // namespace

int Perplexity(int argc, char** argv) {
  Args args(argc, argv, {"-m", "-f", "-c", "-t", "--kv", "--kv-rotate", "--chunks", "--backend", "--device", "--tuning"},
            {"--kl-divergence", "--json", "--verbose", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kPerplexityUsage, stdout);
    std::fputs(kBackendUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(args.error() + " (see kvfs perplexity --help)");
  if (!args.has("-m")) return Fail("missing -m MODEL");
  if (!args.has("-f")) return Fail("missing -f TEXT");
  // CTX >= 4 leaves at least one scored position (CTX - 1 - CTX/2 of them per window).
  const int64_t n_ctx = args.get_int("-c", 512, 4, 1 << 20);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int n_threads = static_cast<int>(args.get_int("-t", hw, 1, 1024));
  const int64_t max_chunks = args.get_int("--chunks", -1, 1, int64_t{1} << 40);
  const bool kl = args.has("--kl-divergence"), json = args.has("--json"), verbose = args.has("--verbose");
  const BackendChoice backend_choice = ReadBackendChoice(args, n_threads);
  if (!args.error().empty()) return Fail(args.error());

  const std::string text_path = *args.get("-f");
  std::string text;
  {
    Result<std::string> read = ReadWholeFile(text_path);
    if (!read.ok()) return Fail("text file: " + read.status().message());
    text = std::move(*read);
  }
  // As kvfs run and the mount: text is UTF-8 (the tokenizers' pre-splitting assumes it).
  if (!store::ValidUtf8(text)) return Fail("text file: " + text_path + " is not valid UTF-8");
  // The reference's -f drops one trailing newline; do the same so the token streams agree.
  if (!text.empty() && text.back() == '\n') text.pop_back();

  spdlog::set_level(verbose ? spdlog::level::info : spdlog::level::warn);
  auto model_or = Model::Load(*args.get("-m"));
  if (!model_or.ok()) return Fail(model_or.status().message());
  const Model& model = **model_or;
  const HParams& hp = model.hparams();
  const Tokenizer& tok = model.tokenizer();

  auto format = MakeKvFormat(args.get("--kv").value_or("f16"), args.get("--kv-rotate").value_or(""),
                             hp.n_head_kv, hp.head_dim);
  if (!format.ok()) return Fail(format.status().message());
  auto base_format = MakeKvFormat("f16", "", hp.n_head_kv, hp.head_dim);
  if (!base_format.ok()) return Fail(base_format.status().message());

  // BOS by hand rather than add_special: an EOS appended by the tokenizer would be scored as text.
  std::vector<TokenId> tokens;
  if (tok.add_bos()) tokens.push_back(tok.bos());
  {
    std::vector<TokenId> body = tok.Encode(text, /*add_special=*/false, /*parse_special=*/false);
    tokens.insert(tokens.end(), body.begin(), body.end());
  }
  const int64_t n_windows_max = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (n_windows_max < 1) {
    return Fail(fmt::format("{} tokenizes to {} tokens, fewer than one window of -c {}", text_path, tokens.size(), n_ctx));
  }
  const int64_t n_windows = max_chunks > 0 ? std::min(max_chunks, n_windows_max) : n_windows_max;
  const int64_t first = n_ctx / 2;

  const auto t0 = Clock::now();
  std::string backend_used;
  auto backend_or = MakeChosenBackend(model, backend_choice, "perplexity", &backend_used);
  if (!backend_or.ok()) return Fail(backend_or.status().message());
  std::unique_ptr<Backend> backend = std::move(*backend_or);
  SequenceKv kv(KvLayoutFor(hp, *format), n_ctx);
  SequenceKv kv_base(KvLayoutFor(hp, *base_format), n_ctx);
  std::vector<TokenId> window(static_cast<size_t>(n_ctx));
  Logits logits;
  NllAccumulator nll;
  KlAccumulator cmp;
  const int64_t n_vocab = hp.n_vocab;

  for (int64_t w = 0; w < n_windows; ++w) {
    const TokenId* src = tokens.data() + w * n_ctx;
    std::copy(src, src + n_ctx, window.begin());
    if (tok.add_bos()) window[0] = tok.bos();
    kv.Truncate(0);
    kv_base.Truncate(0);
    // Slot 0 is the tested format; slot 1 the f16 base when comparing.
    const SequenceStep steps[2] = {{&kv, window, true}, {&kv_base, window, true}};
    Status st = backend->Forward(std::span<const SequenceStep>(steps, kl ? 2 : 1), logits);
    if (!st.ok()) {
      std::fprintf(stderr, "kvfs perplexity: window %lld: %s\n", static_cast<long long>(w), st.message().c_str());
      return 1;
    }
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const TokenId target = src[j + 1];
      const float* row = logits.row(logits.first_row[0] + j);
      if (kl) {
        cmp.Add(logits.row(logits.first_row[1] + j), row, n_vocab, target);
      } else {
        nll.Add(row, n_vocab, target);
      }
    }
    if (verbose) {
      const Estimate p = kl ? cmp.TestPerplexity() : nll.Perplexity();
      std::fprintf(stderr, "[%lld]%.4f%s", static_cast<long long>(w + 1), p.value, w + 1 == n_windows ? "\n" : ",");
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t scored = kl ? cmp.count() : nll.count();
  const Estimate ppl = kl ? cmp.TestPerplexity() : nll.Perplexity();
  const std::string kv_name = format->Name();

  if (json) {
    nlohmann::json j = {{"model", model.path()}, {"text", text_path}, {"kv", kv_name},
                        {"group", format->group}, {"chunk", format->chunk}, {"rotate", format->rotate}, {"ctx", n_ctx},
                        {"tokens", tokens.size()}, {"windows", n_windows}, {"scored", scored},
                        {"ppl", ToJson(ppl)}, {"seconds", seconds}, {"threads", n_threads},
                        {"backend", backend_used}};
    if (kl) {
      const Estimate ratio = cmp.LogPerplexityRatio();
      j["f16_ppl"] = ToJson(cmp.BasePerplexity());
      j["ln_ppl_ratio"] = ToJson(ratio);
      j["ppl_change_pct"] = {{"value", 100.0 * std::expm1(ratio.value)},
                             {"uncertainty", 100.0 * std::exp(ratio.value) * ratio.uncertainty}};
      j["kl_divergence"] = {{"mean", cmp.MeanKl().value}, {"uncertainty", cmp.MeanKl().uncertainty}, {"max", cmp.MaxKl()}};
      const Estimate top = cmp.SameTop1();
      j["same_top1_pct"] = {{"value", 100.0 * top.value}, {"uncertainty", 100.0 * top.uncertainty}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  fmt::print("model {}  text {}  kv {}  ctx {}  {} windows  {} scored of {} tokens  {:.1f} s  backend {}\n",
             model.path(), text_path, kv_name, n_ctx, n_windows, scored, tokens.size(), seconds, backend_used);
  if (!kl) {
    fmt::print("PPL = {:.4f} +/- {:.5f}\n", ppl.value, ppl.uncertainty);
    return 0;
  }
  const Estimate base = cmp.BasePerplexity(), ratio = cmp.LogPerplexityRatio(), kld = cmp.MeanKl(), top = cmp.SameTop1();
  fmt::print("PPL({}) = {:.4f} +/- {:.5f}\n", kv_name, ppl.value, ppl.uncertainty);
  fmt::print("PPL(f16) = {:.4f} +/- {:.5f}\n", base.value, base.uncertainty);
  fmt::print("ln(PPL({})/PPL(f16)) = {:.6f} +/- {:.6f}  ({:+.3f}%)\n", kv_name, ratio.value, ratio.uncertainty,
             100.0 * std::expm1(ratio.value));
  fmt::print("Mean KLD = {:.6f} +/- {:.6f}  (max {:.6f})\n", kld.value, kld.uncertainty, cmp.MaxKl());
  fmt::print("Same top-1 = {:.3f} +/- {:.3f} %\n", 100.0 * top.value, 100.0 * top.uncertainty);
  return 0;
}

}  // namespace kvfs::cli
