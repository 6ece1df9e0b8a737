// Chat templates. We do not run Jinja: the family is recognised from distinctive markers in
// tokenizer.chat_template (the facts about which marker means which family follow llama.cpp's
// llm_chat_detect_template), and each family's rendering is written out below so that it
// produces the same text the model's own template would for system/user/assistant messages.
//
// BOS: templates usually start with {{ bos_token }}. Format() leaves that first BOS out
// because the tokenizer adds it with Encode(add_special=true); emitting it as text too would
// give a doubled BOS. A BOS that a template places *inside* the history (llama2 between
// turns) is kept as text and becomes the control token through parse_special=true.
#include "engine/model/chat_template.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvfs {
namespace {

constexpr std::array<std::pair<ChatFamily, std::string_view>, 8> kFamilyNames = {{
    {ChatFamily::kRaw, "raw"},
    {ChatFamily::kChatml, "chatml"},
    {ChatFamily::kLlama2, "llama2"},
    {ChatFamily::kLlama3, "llama3"},
    {ChatFamily::kMistral, "mistral"},
    {ChatFamily::kGemma, "gemma"},
    {ChatFamily::kPhi3, "phi3"},
    {ChatFamily::kZephyr, "zephyr"},
}};

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// Jinja's |trim and Python's str.strip() with no argument strip ASCII whitespace (for the
// text models are given, the Unicode spaces Python also strips do not occur at the ends).
bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// Joins the contents of all system messages: templates take one system prompt, and when a
// caller passes several we keep all of them rather than silently dropping some.
std::string JoinedSystem(std::span<const ChatMessage> messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (!out.empty()) out += "\n\n";
    out += m.content;
  }
  return out;
}

void AppendAll(std::string& out, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts) out.append(p);
}

}  // namespace

std::string_view ChatFamilyName(ChatFamily family) {
  for (const auto& [f, name] : kFamilyNames) {
    if (f == family) return name;
  }
  return "unknown";
}

ChatFamily DetectChatFamily(std::string_view tmpl) {
  if (tmpl.empty()) return ChatFamily::kRaw;
  // A bare family name is accepted too (as llama.cpp does), so a user can force a family.
  for (const auto& [f, name] : kFamilyNames) {
    if (tmpl == name) return f;
  }
  // Order matters: later checks use markers that earlier families may also contain.
  if (Contains(tmpl, "<|im_start|>")) {
    // Phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) reuse <|im_start|> with a different
    // layout; rendering them as chatml would produce a prompt they were not trained on.
    if (Contains(tmpl, "<|im_sep|>") || Contains(tmpl, "<end_of_utterance>")) return ChatFamily::kRaw;
    return ChatFamily::kChatml;
  }
  if (Contains(tmpl, "[INST]")) {
    // Llama 2 chat wraps the system prompt in <<SYS>>; Mistral's templates never do.
    return Contains(tmpl, "<<SYS>>") ? ChatFamily::kLlama2 : ChatFamily::kMistral;
  }
  if (Contains(tmpl, "<|start_header_id|>")) return ChatFamily::kLlama3;
  if (Contains(tmpl, "<start_of_turn>")) return ChatFamily::kGemma;
  if (Contains(tmpl, "<|user|>")) {
    // Both phi3 and zephyr use <|user|>/<|assistant|>. Phi-3 ends turns with <|end|>; newer
    // Phi-3 templates also mention eos_token (after the last turn), so phi3 is checked first.
    if (Contains(tmpl, "<|end|>")) return ChatFamily::kPhi3;
    // Zephyr ends every turn with EOS: spelled eos_token (HuggingFaceH4/zephyr), </s>, or
    // <|endoftext|> (stablelm-zephyr, whose EOS that is).
    if (Contains(tmpl, "eos_token") || Contains(tmpl, "</s>") || Contains(tmpl, "<|endoftext|>")) {
      return ChatFamily::kZephyr;
    }
  }
  return ChatFamily::kRaw;
}

ChatTemplate ChatTemplate::FromGguf(const GgufFile& gguf, const Tokenizer& tokenizer) {
  std::optional<std::string_view> tmpl = gguf.GetString("tokenizer.chat_template");
  ChatTemplate out(tmpl ? DetectChatFamily(*tmpl) : ChatFamily::kRaw, &tokenizer);
  out.unrecognised_ = tmpl && !Trim(*tmpl).empty() && out.family_ == ChatFamily::kRaw && *tmpl != "raw";
  return out;
}

ChatTemplate::ChatTemplate(ChatFamily family, const Tokenizer* tokenizer)
    : family_(family), tokenizer_(tokenizer) {}

namespace {

// Token texts the templates spell as {{ bos_token }} / {{ eos_token }}. Without a tokenizer
// (or without the token) we fall back to the SentencePiece spellings these families use.
std::string_view SpecialText(const Tokenizer* tok, TokenId id, std::string_view fallback) {
  if (tok == nullptr || id == kNoToken || id >= tok->n_vocab()) return fallback;
  return tok->token_text(id);
}

// The rendered text, and the spans of it that are messages' contents (TextSpan: encoded with
// their control-token spellings left as text).
struct Rendering {
  std::string text;
  std::vector<TextSpan> content;
  void Markup(std::string_view s) { text.append(s); }
  void Content(std::string_view s) {
    if (s.empty()) return;
    if (!content.empty() && content.back().end == text.size()) content.back().end += s.size();  // (adjacent)
    else content.push_back({text.size(), text.size() + s.size()});
    text.append(s);
  }
};

void FormatChatml(std::span<const ChatMessage> msgs, bool gen, Rendering& out) {
  // Qwen/Hermes/Yi chatml templates: content untrimmed, newline after <|im_end|>.
  for (const ChatMessage& m : msgs) {
    out.Markup("<|im_start|>");
    out.Markup(m.role);
    out.Markup("\n");
    out.Content(m.content);
    out.Markup("<|im_end|>\n");
  }
  if (gen) out.Markup("<|im_start|>assistant\n");
}

void FormatLlama3(std::span<const ChatMessage> msgs, bool gen, Rendering& out) {
  // Meta-Llama-3-*-Instruct: message['content'] | trim, no newline after <|eot_id|>.
  for (const ChatMessage& m : msgs) {
    out.Markup("<|start_header_id|>");
    out.Markup(m.role);
    out.Markup("<|end_header_id|>\n\n");
    out.Content(Trim(m.content));
    out.Markup("<|eot_id|>");
  }
  if (gen) out.Markup("<|start_header_id|>assistant<|end_header_id|>\n\n");
}

void FormatPhi3(std::span<const ChatMessage> msgs, bool gen, Rendering& out) {
  // The system-aware Phi-3/3.5 template (empty system messages are skipped, as there). The
  // first Phi-3-mini template dropped system messages and put <|assistant|>\n after every user
  // turn; for user/assistant conversations both render the same text. The eos_token that
  // template appends when not asked for a generation prompt is left out: a prompt ending in
  // EOS is never useful to generate from.
  for (const ChatMessage& m : msgs) {
    if (m.role == "system" && m.content.empty()) continue;
    out.Markup("<|");
    out.Markup(m.role);
    out.Markup("|>\n");
    out.Content(m.content);
    out.Markup("<|end|>\n");
  }
  if (gen) out.Markup("<|assistant|>\n");
}

void FormatZephyr(std::span<const ChatMessage> msgs, bool gen, std::string_view eos, Rendering& out) {
  // HuggingFaceH4/zephyr: '<|role|>\n' + content + eos_token, each followed by the newline
  // that the template's layout leaves after the expression.
  for (const ChatMessage& m : msgs) {
    out.Markup("<|");
    out.Markup(m.role);
    out.Markup("|>\n");
    out.Content(m.content);
    out.Markup(eos);
    out.Markup("\n");
  }
  if (gen) out.Markup("<|assistant|>\n");
}

void FormatGemma(std::span<const ChatMessage> msgs, bool gen, Rendering& out) {
  // Gemma has no system role: its system text goes in front of the next user message,
  // separated by a blank line (llama.cpp, and Gemma 3's own template, do the same). Contents
  // are trimmed as in the template; the assistant is called "model".
  std::string pending_system;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      const bool user_follows = std::any_of(msgs.begin() + static_cast<ptrdiff_t>(i) + 1, msgs.end(),
                                            [](const ChatMessage& n) { return n.role == "user"; });
      if (user_follows) {
        if (!pending_system.empty()) pending_system += "\n\n";
        pending_system.append(Trim(m.content));
      } else {
        // Nothing to attach it to: keep the text as a user turn rather than lose it.
        out.Markup("<start_of_turn>user\n");
        out.Content(Trim(m.content));
        out.Markup("<end_of_turn>\n");
      }
      continue;
    }
    const std::string_view role = m.role == "assistant" ? std::string_view("model") : m.role;
    out.Markup("<start_of_turn>");
    out.Markup(role);
    out.Markup("\n");
    if (role == "user" && !pending_system.empty()) {
      out.Content(pending_system);
      out.Content("\n\n");
      pending_system.clear();
    }
    out.Content(Trim(m.content));
    out.Markup("<end_of_turn>\n");
  }
  if (gen) out.Markup("<start_of_turn>model\n");
}

void FormatLlama2(std::span<const ChatMessage> msgs, std::string_view bos, std::string_view eos, Rendering& out) {
  // Meta's Llama-2-chat template: bos + '[INST] ' + content.strip() + ' [/INST]' per user
  // turn, where the first user turn's content is prefixed with the <<SYS>> block before the
  // strip; assistant turns are ' ' + content.strip() + ' ' + eos. There is no assistant
  // header, so add_generation_prompt has nothing to add. As in the template, a system prompt
  // with no user message to attach to is dropped. (The <<SYS>> markers are no vocabulary
  // entries: inside the content span they are text either way.)
  std::string system = JoinedSystem(msgs);
  bool first_user = true;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") continue;
    if (m.role == "user") {
      std::string content;
      if (first_user && !system.empty()) AppendAll(content, {"<<SYS>>\n", system, "\n<</SYS>>\n\n"});
      content += m.content;
      if (!first_user) out.Markup(bos);
      out.Markup("[INST] ");
      out.Content(Trim(content));
      out.Markup(" [/INST]");
      first_user = false;
    } else {
      out.Markup(" ");
      out.Content(Trim(m.content));
      out.Markup(" ");
      out.Markup(eos);
    }
  }
}

void FormatMistral(std::span<const ChatMessage> msgs, std::string_view eos, Rendering& out) {
  // Mistral's tokenizer versions differ in spacing: v1 (Mistral-7B v0.1/v0.2, Mixtral-8x7B)
  // renders " [INST] user [/INST] answer</s>", v2/v3 (Mistral-7B v0.3, Mixtral-8x22B,
  // Mistral-Large-2, Codestral) "[INST] user[/INST] answer</s>", v7 adds [SYSTEM_PROMPT].
  // We render v3, the one shared by the most models: with control tokens parsed it gives the
  // same tokens as mistral-common. As in the v3 template, the system prompt goes in front of
  // the last user message (not the first, so it does not make a stable prefix across turns)
  // and assistant text is trimmed (without a user message the system prompt is dropped, as
  // there). The model answers right after [/INST]: no generation prompt.
  std::string system = JoinedSystem(msgs);
  size_t last_user = msgs.size();
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (msgs[i].role == "user") last_user = i;
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") continue;
    if (m.role == "user") {
      out.Markup("[INST] ");
      if (i == last_user && !system.empty()) {
        out.Content(system);
        out.Content("\n\n");
      }
      out.Content(m.content);
      out.Markup("[/INST]");
    } else {
      out.Markup(" ");
      out.Content(Trim(m.content));
      out.Markup(eos);
    }
  }
}

void FormatRaw(std::span<const ChatMessage> msgs, Rendering& out) {
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") out.Content(m.content);
  }
  for (const ChatMessage& m : msgs) {
    if (m.role != "system") out.Content(m.content);
  }
}

}  // namespace

std::string ChatTemplate::Format(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                 std::vector<TextSpan>* content) const {
  const std::string_view bos = SpecialText(tokenizer_, tokenizer_ ? tokenizer_->bos() : kNoToken, "<s>");
  const std::string_view eos = SpecialText(tokenizer_, tokenizer_ ? tokenizer_->eos() : kNoToken, "</s>");
  Rendering out;
  switch (family_) {
    case ChatFamily::kRaw: FormatRaw(messages, out); break;
    case ChatFamily::kChatml: FormatChatml(messages, add_generation_prompt, out); break;
    case ChatFamily::kLlama2: FormatLlama2(messages, bos, eos, out); break;
    case ChatFamily::kLlama3: FormatLlama3(messages, add_generation_prompt, out); break;
    case ChatFamily::kMistral: FormatMistral(messages, eos, out); break;
    case ChatFamily::kGemma: FormatGemma(messages, add_generation_prompt, out); break;
    case ChatFamily::kPhi3: FormatPhi3(messages, add_generation_prompt, out); break;
    case ChatFamily::kZephyr: FormatZephyr(messages, add_generation_prompt, eos, out); break;
  }
  if (content != nullptr) *content = std::move(out.content);
  return std::move(out.text);
}

namespace {

// The vocabulary entry that closes an assistant turn, when the family has its own (families
// that end turns with EOS have none beyond it).
std::string_view TurnEndMarker(ChatFamily family) {
  switch (family) {
    case ChatFamily::kChatml: return "<|im_end|>";
    case ChatFamily::kLlama3: return "<|eot_id|>";
    case ChatFamily::kGemma: return "<end_of_turn>";
    case ChatFamily::kPhi3: return "<|end|>";
    default: return {};
  }
}

bool EndsTurnWithEos(ChatFamily family) {
  return family == ChatFamily::kLlama2 || family == ChatFamily::kMistral || family == ChatFamily::kZephyr;
}

}  // namespace

std::vector<TokenId> ChatTemplate::MarkupTokens() const {
  std::vector<TokenId> ids;
  if (tokenizer_ == nullptr) return ids;
  std::vector<std::string_view> markers;
  switch (family_) {
    case ChatFamily::kRaw: break;
    case ChatFamily::kChatml: markers = {"<|im_start|>", "<|im_end|>"}; break;
    case ChatFamily::kLlama3: markers = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}; break;
    case ChatFamily::kGemma: markers = {"<start_of_turn>", "<end_of_turn>"}; break;
    case ChatFamily::kPhi3: markers = {"<|system|>", "<|user|>", "<|assistant|>", "<|end|>"}; break;
    case ChatFamily::kZephyr: markers = {"<|system|>", "<|user|>", "<|assistant|>"}; break;
    case ChatFamily::kLlama2:
    case ChatFamily::kMistral: markers = {"[INST]", "[/INST]"}; break;
  }
  for (std::string_view m : markers)
    if (TokenId id = tokenizer_->Find(m); id != kNoToken) ids.push_back(id);
  for (TokenId id : {tokenizer_->bos(), tokenizer_->eos()})
    if (id != kNoToken && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

std::vector<TokenId> ChatTemplate::EndOfTurnTokens() const {
  std::vector<TokenId> ids;
  if (tokenizer_ == nullptr) return ids;
  auto add = [&ids](TokenId id) {
    if (id != kNoToken && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  if (std::string_view marker = TurnEndMarker(family_); !marker.empty()) add(tokenizer_->Find(marker));
  // The vocab's own end-of-turn token too: it is what the model was trained to emit, even
  // when the template spells the turn end differently.
  add(tokenizer_->eot());
  add(tokenizer_->eos());
  return ids;
}

std::string_view ChatTemplate::MissingTurnMarker() const {
  const std::string_view marker = TurnEndMarker(family_);
  return !marker.empty() && tokenizer_ != nullptr && tokenizer_->Find(marker) == kNoToken ? marker : std::string_view();
}

std::vector<std::string> ChatTemplate::StopStrings() const {
  if (std::string_view marker = TurnEndMarker(family_); !marker.empty()) return {std::string(marker)};
  if (EndsTurnWithEos(family_)) {
    return {std::string(SpecialText(tokenizer_, tokenizer_ ? tokenizer_->eos() : kNoToken, "</s>"))};
  }
  return {};  // raw text has no turn structure
}

}  // namespace kvfs
