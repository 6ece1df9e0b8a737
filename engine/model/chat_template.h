// Chat templates: the family is recognised from tokenizer.chat_template (a Jinja string we do
// not execute) and each family's format is written out in code.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/model/tokenizer.h"

namespace kvfs {

enum class ChatFamily { kRaw, kChatml, kLlama2, kLlama3, kMistral, kGemma, kPhi3, kZephyr };
std::string_view ChatFamilyName(ChatFamily family);
// Recognises the family from a template's text; kRaw when nothing matches or it is empty.
ChatFamily DetectChatFamily(std::string_view jinja_template);

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // From the model's metadata (kRaw when there is no template).
  static ChatTemplate FromGguf(const GgufFile& gguf, const Tokenizer& tokenizer);
  ChatTemplate(ChatFamily family, const Tokenizer* tokenizer);

  ChatFamily family() const { return family_; }
  // The model has a chat template that no family here matches: prompts go in as raw text,
  // which the model was not trained on (the engine warns; .model.json says so).
  bool unrecognised() const { return unrecognised_; }
  // The prompt text for these messages; with add_generation_prompt the assistant header for
  // the next reply is appended. Raw mode concatenates contents (system first) unchanged.
  // The text contains the family's special tokens as text. `content`, when given, receives the
  // spans of the text that are the messages' contents (sorted; adjacent ones merged): encode it
  // with SpecialParsing(*content), so that the markup's control tokens are parsed and the
  // contents' spellings of them stay text.
  // The leading BOS is not part of it (Encode's add_special adds it); see chat_template.cpp
  // for each family's exact layout and the Mistral spacing variant chosen.
  std::string Format(std::span<const ChatMessage> messages, bool add_generation_prompt,
                     std::vector<TextSpan>* content = nullptr) const;
  // The vocabulary's tokens that spell this family's markup (turn markers, BOS, EOS), for
  // SpecialParsing's markers: those typed user-defined would otherwise be cut out of contents.
  std::vector<TokenId> MarkupTokens() const;
  // Tokens that end an assistant turn for this family (e.g. <|im_end|>, <|eot_id|>), plus EOS.
  std::vector<TokenId> EndOfTurnTokens() const;
  // Textual end-of-turn markers, for models whose vocab lacks them as single tokens.
  std::vector<std::string> StopStrings() const;
  // The family's end-of-turn marker when the vocabulary has no token for it (a template put on
  // a model not trained with it: its markup is then plain text), else empty.
  std::string_view MissingTurnMarker() const;

 private:
  ChatFamily family_;
  const Tokenizer* tokenizer_;
  bool unrecognised_ = false;
};

}  // namespace kvfs
