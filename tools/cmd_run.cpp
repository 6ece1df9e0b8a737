// kvfs run: load a model, encode a prompt (through the chat template unless --raw), generate.
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/backend/backend.h"
#include "engine/core/read_file.h"
#include "engine/runtime/generate.h"
#include "engine/store/manifest.h"
#include "tools/args.h"
#include "tools/backend_choice.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

constexpr const char* kRunUsage =
    "usage: kvfs run -m MODEL (-p TEXT | -f FILE) [options]\n"
    "  -m MODEL            GGUF model file\n"
    "  -p TEXT | -f FILE   the prompt, inline or from a file (its one trailing newline dropped)\n"
    "  -n N                tokens to generate (default 128)\n"
    "  -c CTX              context size in tokens (default: the model's, at most 4096)\n"
    "  -t THREADS          CPU threads (default: all cores)\n"
    "  --temp T            temperature; 0 = greedy (default 0.8)\n"
    "  --seed S            sampling seed (default: random)\n"
    "  --top-k K --top-p P --min-p P --repeat-penalty R   sampling filters (40, 0.95, 0.05, 1.0)\n"
    "  --system TEXT       system prompt (chat mode; a model without a chat template reads it\n"
    "                      before the prompt, as kvfsd's agents do)\n"
    "  --kv f16|q8|q4|q4k  KV cache format (default f16); q4k: keys 4-bit per channel over\n"
    "                      chunks of 64 tokens, values 4-bit in sub-blocks of 16\n"
    "  --kv-rotate on|off  Walsh-Hadamard rotation of quantized KV (default on where head_dim is a power of two)\n"
    "  --raw               no chat template: the prompt is the model's input text as is\n"
    "  --ignore-eos        keep generating past end-of-generation tokens\n"
    "  --token-ids         print the prompt's token ids, then the generated ids (two lines)\n"
    "  --logits-out FILE   write the logits of every prompt position (float32 LE, n_tokens x n_vocab)\n"
    "  --verbose           timings and model summary on stderr\n";

std::string RunUsage() { return std::string(kRunUsage) + kBackendUsage; }

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvfs run: %s\n", message.c_str());
  return 2;
}

std::string JoinIds(const std::vector<TokenId>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace

int Run(int argc, char** argv) {
  Args args(argc, argv,
            {"-m", "-p", "-f", "-n", "-c", "-t", "--temp", "--seed", "--top-k", "--top-p", "--min-p",
             "--repeat-penalty", "--system", "--logits-out", "--kv", "--kv-rotate", "--backend", "--device", "--tuning"},
            {"--raw", "--ignore-eos", "--token-ids", "--verbose", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(RunUsage().c_str(), stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(args.error() + " (see kvfs run --help)");
  if (!args.has("-m")) return Fail("missing -m MODEL");
  if (args.has("-p") == args.has("-f")) return Fail("give exactly one of -p TEXT or -f FILE");

  const int n_predict = static_cast<int>(args.get_int("-n", 128, 0, 1 << 20));
  const int64_t ctx_arg = args.get_int("-c", 0, 0, 1 << 24);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int n_threads = static_cast<int>(args.get_int("-t", hw, 1, 1024));
  GenerateOptions gen;
  gen.max_tokens = n_predict;
  gen.sampling.temperature = static_cast<float>(args.get_double("--temp", 0.8, 0.0, 100.0));
  gen.sampling.top_k = static_cast<int>(args.get_int("--top-k", 40, 0, 1 << 30));
  gen.sampling.top_p = static_cast<float>(args.get_double("--top-p", 0.95, 0.0, 1.0));
  gen.sampling.min_p = static_cast<float>(args.get_double("--min-p", 0.05, 0.0, 1.0));
  gen.sampling.repeat_penalty = static_cast<float>(args.get_double("--repeat-penalty", 1.0, 0.01, 100.0));
  gen.sampling.seed = args.get_u64("--seed", std::random_device{}());
  gen.stop_at_eog = !args.has("--ignore-eos");
  const BackendChoice backend_choice = ReadBackendChoice(args, n_threads);
  if (!args.error().empty()) return Fail(args.error());

  std::string prompt;
  if (auto p = args.get("-p")) {
    prompt = *p;
  } else {
    Result<std::string> text = ReadWholeFile(*args.get("-f"));
    if (!text.ok()) return Fail("prompt file: " + text.status().message());
    prompt = std::move(*text);
    // A text file's last newline is not part of the prompt (as for the mount's prompt files
    // and kvfs perplexity -f).
    if (!prompt.empty() && prompt.back() == '\n') prompt.pop_back();
  }
  if (args.has("--raw") && args.has("--system")) return Fail("--system has no place with --raw (the prompt is the input as is)");
  // As the mount's prompt and system files: text is UTF-8 (the replies and the templates are).
  if (!store::ValidUtf8(prompt)) return Fail("the prompt is not valid UTF-8");
  if (auto sys = args.get("--system"); sys && !store::ValidUtf8(*sys)) return Fail("--system is not valid UTF-8");

  spdlog::set_level(args.has("--verbose") ? spdlog::level::info : spdlog::level::warn);
  auto model_or = Model::Load(*args.get("-m"));
  if (!model_or.ok()) return Fail(model_or.status().message());
  const Model& model = **model_or;
  const HParams& hp = model.hparams();
  const int64_t n_ctx = ctx_arg > 0 ? ctx_arg : std::min<int64_t>(hp.n_ctx_train, 4096);

  // Chat mode wraps the prompt as a user turn; raw mode feeds the text as is.
  const ChatTemplate& chat = model.chat_template();
  // A model without a template still takes a system prompt: its text goes first, as kvfsd does.
  const bool use_chat = !args.has("--raw") && (chat.family() != ChatFamily::kRaw || args.has("--system"));
  std::vector<TokenId> tokens;
  if (use_chat) {
    std::vector<ChatMessage> messages;
    if (auto sys = args.get("--system")) messages.push_back({"system", *sys});
    messages.push_back({"user", prompt});
    std::vector<TextSpan> content;  // the messages' "</s>" stays text, as kvfsd encodes it
    const std::string text = chat.Format(messages, true, &content);
    const std::vector<TokenId> markers = chat.MarkupTokens();
    tokens = model.tokenizer().Encode(text, true, SpecialParsing(content, markers));
    gen.stop_strings = chat.StopStrings();
  } else {
    tokens = model.tokenizer().Encode(prompt, true, false);
  }
  if (tokens.empty()) return Fail("the prompt encodes to no tokens");
  if (static_cast<int64_t>(tokens.size()) > n_ctx) {
    return Fail(fmt::format("the prompt has {} tokens, more than the context size {} (use -c)", tokens.size(), n_ctx));
  }

  auto kv_format = MakeKvFormat(args.get("--kv").value_or("f16"), args.get("--kv-rotate").value_or(""),
                                hp.n_head_kv, hp.head_dim);
  if (!kv_format.ok()) return Fail(kv_format.status().message());
  SequenceKv kv(KvLayoutFor(hp, *kv_format), n_ctx);
  std::string backend_used;
  auto backend_or = MakeChosenBackend(model, backend_choice, "run", &backend_used);
  if (!backend_or.ok()) return Fail(backend_or.status().message());
  std::unique_ptr<Backend> backend = std::move(*backend_or);
  if (std::string_view marker = chat.MissingTurnMarker(); !marker.empty() && !args.has("--raw")) {
    std::fprintf(stderr, "kvfs run: warning: the chat template is %s, but the vocabulary has no %.*s token: its "
                 "markup reaches the model as plain text\n",
                 std::string(ChatFamilyName(chat.family())).c_str(), static_cast<int>(marker.size()), marker.data());
  }
  if (args.has("--verbose")) {
    std::fprintf(stderr, "model: %s | %lld layers, width %lld, %lld heads (%lld KV), vocab %lld, trained context %lld | "
                 "%.1f MiB of weights | chat template %s | context %lld, KV %s\n",
                 model.name().c_str(), static_cast<long long>(hp.n_layer), static_cast<long long>(hp.n_embd),
                 static_cast<long long>(hp.n_head), static_cast<long long>(hp.n_head_kv),
                 static_cast<long long>(hp.n_vocab), static_cast<long long>(hp.n_ctx_train),
                 model.weights().total_bytes / 1048576.0, std::string(ChatFamilyName(chat.family())).c_str(),
                 static_cast<long long>(n_ctx), args.get("--kv").value_or("f16").c_str());
    std::fprintf(stderr, "backend: %s\n", backend_used.c_str());
  }
  gen.prompt_all_logits = args.has("--logits-out");
  const bool ids_only = args.has("--token-ids");

  // The logits file is opened first: a path that cannot be written fails before any output.
  std::ofstream logits_out;
  if (auto path = args.get("--logits-out")) {
    if (SameFile(*path, *args.get("-m"))) return Fail("--logits-out " + *path + " is the model file");
    if (auto prompt_file = args.get("-f"); prompt_file && SameFile(*path, *prompt_file)) {
      return Fail("--logits-out " + *path + " is the prompt file (-f)");
    }
    logits_out.open(*path, std::ios::binary | std::ios::trunc);
    if (!logits_out) return Fail(fmt::format("cannot write --logits-out {}", *path));
  }
  auto result = Generate(*backend, model, kv, tokens, gen, [&](std::string_view text) {
    if (ids_only) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  if (!result.ok()) {
    std::fprintf(stderr, "kvfs run: %s\n", result.status().message().c_str());
    return result.status().code() == StatusCode::kOutOfRange ? 2 : 1;
  }
  if (ids_only) {
    std::printf("%s\n%s\n", JoinIds(tokens).c_str(), JoinIds(result->generated).c_str());
  } else {
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);  // before anything on stderr: the --verbose line starts on a line of its own
  if (auto path = args.get("--logits-out")) {
    logits_out.write(reinterpret_cast<const char*>(result->prompt_logits.data()),
                     static_cast<std::streamsize>(result->prompt_logits.size() * sizeof(float)));
    logits_out.close();
    if (!logits_out) {
      std::fprintf(stderr, "kvfs run: cannot write %s\n", path->c_str());
      return 1;
    }
  }
  if (args.has("--verbose")) {
    const double pp = tokens.size() / std::max(1e-9, result->prefill_seconds);
    const double tg = result->generated.size() / std::max(1e-9, result->decode_seconds);
    std::fprintf(stderr, "prompt %zu tokens %.1f t/s | generated %zu tokens %.1f t/s | stop: %s\n",
                 tokens.size(), pp, result->generated.size(), tg,
                 std::string(StopReasonName(result->reason)).c_str());
  }
  return 0;
}

}  // namespace kvfs::cli
