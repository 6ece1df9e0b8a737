// Chat template detection and rendering. Template texts are the real Jinja templates (or
// their distinguishing excerpts) of well-known models; expected prompts are written out.
#include "engine/model/chat_template.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/model/gguf.h"
#include "tests/gguf_builder.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

// A vocabulary without an encoder: enough for Find(), bos/eos/eot and token_text().
class FakeTokenizer : public Tokenizer {
 public:
  FakeTokenizer(std::vector<std::string> tokens, std::string_view bos, std::string_view eos,
                std::string_view eot = {}) {
    tokens_ = std::move(tokens);
    attrs_.assign(tokens_.size(), TokenAttr::kControl);
    BuildIndex();
    bos_ = Find(bos);
    eos_ = Find(eos);
    eot_ = eot.empty() ? kNoToken : Find(eot);
    eog_ = {eos_};
  }
  // From a GGUF's token list (the real vocabulary), with its BOS/EOS ids.
  explicit FakeTokenizer(const GgufFile& gguf) {
    const GgufArray* toks = gguf.GetArray("tokenizer.ggml.tokens");
    if (toks != nullptr) {
      for (uint64_t i = 0; i < toks->size(); ++i) tokens_.emplace_back(toks->string_at(i));
    }
    attrs_.assign(tokens_.size(), TokenAttr::kNormal);
    bos_ = static_cast<TokenId>(gguf.GetInt("tokenizer.ggml.bos_token_id").value_or(kNoToken));
    eos_ = static_cast<TokenId>(gguf.GetInt("tokenizer.ggml.eos_token_id").value_or(kNoToken));
    eog_ = {eos_};
    BuildIndex();
  }
  std::vector<TokenId> Encode(std::string_view, bool, SpecialParsing) const override { return {}; }
  std::string TokenToPiece(TokenId id, bool) const override { return std::string(token_text(id)); }
};

// The conversation every family renders below.
const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."},
    {"user", "Hi"},
    {"assistant", "Hello!"},
    {"user", "Bye"},
};

// --- Real templates (tokenizer_config.json chat_template, as stored in GGUF) ----------------

// Qwen2-7B-Instruct.
constexpr std::string_view kQwen2 =
    R"({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful assistant.<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})";

// meta-llama/Llama-2-7b-chat-hf.
constexpr std::string_view kLlama2Chat =
    R"({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})";

// meta-llama/Meta-Llama-3-8B-Instruct.
constexpr std::string_view kLlama3 =
    R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})";

// mistralai/Mistral-7B-Instruct-v0.1 (the v1 layout; we render v3 spacing, see the .cpp).
constexpr std::string_view kMistralV01 =
    R"({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})";

// mistralai/Mistral-7B-Instruct-v0.3, excerpt (system prompt and assistant turns).
constexpr std::string_view kMistralV03 =
    R"({%- if loop.last and system_message is defined %}{{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}{%- else %}{{- "[INST] " + message["content"] + "[/INST]" }}{%- endif %}{%- elif message["role"] == "assistant" %}{{- " " + message["content"]|trim + eos_token}})";

// mistralai/Mistral-Large-Instruct-2411 (v7), excerpt.
constexpr std::string_view kMistralV7 =
    R"({%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{%- elif message['role'] == 'user' %}{{- '[INST] ' + message['content'] + '[/INST]' }})";

// google/gemma-7b-it.
constexpr std::string_view kGemma =
    R"({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + message['content'] | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %})";

// microsoft/Phi-3.5-mini-instruct (system-aware; mentions eos_token, like zephyr).
constexpr std::string_view kPhi35 =
    R"({% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %})";

// HuggingFaceH4/zephyr-7b-beta.
constexpr std::string_view kZephyr =
    R"({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %})";

// stabilityai/stablelm-2-zephyr-1_6b, excerpt: EOS is <|endoftext|>.
constexpr std::string_view kStablelmZephyr =
    R"({% for message in messages %}{% if message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|endoftext|>' + '
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|endoftext|>' + '
'}}{% endif %}{% endfor %})";

// microsoft/phi-4, excerpt: <|im_start|> with <|im_sep|>, not chatml.
constexpr std::string_view kPhi4 =
    R"({{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>'}})";

TEST(ChatTemplateDetect, RecognisesRealTemplates) {
  EXPECT_EQ(DetectChatFamily(kQwen2), ChatFamily::kChatml);
  EXPECT_EQ(DetectChatFamily(kLlama2Chat), ChatFamily::kLlama2);
  EXPECT_EQ(DetectChatFamily(kLlama3), ChatFamily::kLlama3);
  EXPECT_EQ(DetectChatFamily(kMistralV01), ChatFamily::kMistral);
  EXPECT_EQ(DetectChatFamily(kMistralV03), ChatFamily::kMistral);
  EXPECT_EQ(DetectChatFamily(kMistralV7), ChatFamily::kMistral);
  EXPECT_EQ(DetectChatFamily(kGemma), ChatFamily::kGemma);
  EXPECT_EQ(DetectChatFamily(kPhi35), ChatFamily::kPhi3);  // not zephyr despite eos_token
  EXPECT_EQ(DetectChatFamily(kZephyr), ChatFamily::kZephyr);
  EXPECT_EQ(DetectChatFamily(kStablelmZephyr), ChatFamily::kZephyr);
}

TEST(ChatTemplateDetect, UnknownAndEmptyAreRaw) {
  EXPECT_EQ(DetectChatFamily(""), ChatFamily::kRaw);
  EXPECT_EQ(DetectChatFamily("{% for m in messages %}{{ m['content'] }}{% endfor %}"), ChatFamily::kRaw);
  EXPECT_EQ(DetectChatFamily(kPhi4), ChatFamily::kRaw);
  EXPECT_EQ(DetectChatFamily("<|user|> without any end marker"), ChatFamily::kRaw);
}

TEST(ChatTemplateDetect, AcceptsFamilyNames) {
  for (ChatFamily f : {ChatFamily::kRaw, ChatFamily::kChatml, ChatFamily::kLlama2, ChatFamily::kLlama3,
                       ChatFamily::kMistral, ChatFamily::kGemma, ChatFamily::kPhi3, ChatFamily::kZephyr}) {
    EXPECT_EQ(DetectChatFamily(ChatFamilyName(f)), f) << ChatFamilyName(f);
  }
  EXPECT_EQ(ChatFamilyName(ChatFamily::kLlama3), "llama3");
}

// --- Rendering ------------------------------------------------------------------------------

TEST(ChatTemplateFormat, Chatml) {
  FakeTokenizer tok({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, "", "<|im_end|>");
  ChatTemplate t(ChatFamily::kChatml, &tok);
  EXPECT_EQ(t.Format(kConversation, true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Without the generation prompt, and with content kept untrimmed as Qwen's template does.
  std::vector<ChatMessage> one = {{"user", " Hi\n"}};
  EXPECT_EQ(t.Format(one, false), "<|im_start|>user\n Hi\n<|im_end|>\n");
  // EOS is <|im_end|> here: listed once.
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{2}));
  EXPECT_EQ(t.StopStrings(), (std::vector<std::string>{"<|im_end|>"}));
}

TEST(ChatTemplateFormat, Llama3) {
  FakeTokenizer tok({"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eot_id|>"},
                    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>");
  ChatTemplate t(ChatFamily::kLlama3, &tok);
  // No <|begin_of_text|>: the tokenizer adds BOS.
  EXPECT_EQ(t.Format(kConversation, true),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  std::vector<ChatMessage> padded = {{"user", "  Hi \n"}};  // | trim
  EXPECT_EQ(t.Format(padded, false), "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{4, 1}));
  EXPECT_EQ(t.StopStrings(), (std::vector<std::string>{"<|eot_id|>"}));
}

TEST(ChatTemplateFormat, Llama2) {
  FakeTokenizer tok({"<unk>", "<s>", "</s>"}, "<s>", "</s>");
  ChatTemplate t(ChatFamily::kLlama2, &tok);
  // First BOS left to the tokenizer, the in-history one kept; no assistant header exists.
  EXPECT_EQ(t.Format(kConversation, true),
            "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
  // content.strip() applies to the whole first turn, <<SYS>> block included.
  std::vector<ChatMessage> no_system = {{"user", " Hi "}, {"assistant", " Yo "}};
  EXPECT_EQ(t.Format(no_system, false), "[INST] Hi [/INST] Yo </s>");
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{2}));
  EXPECT_EQ(t.StopStrings(), (std::vector<std::string>{"</s>"}));
}

TEST(ChatTemplateFormat, MistralV3Spacing) {
  FakeTokenizer tok({"<unk>", "<s>", "</s>", "[INST]", "[/INST]"}, "<s>", "</s>");
  ChatTemplate t(ChatFamily::kMistral, &tok);
  // The system prompt goes before the last user message, as in the v0.3 template.
  EXPECT_EQ(t.Format(kConversation, true), "[INST] Hi[/INST] Hello!</s>[INST] You are terse.\n\nBye[/INST]");
  std::vector<ChatMessage> single = {{"user", "Hi"}};
  EXPECT_EQ(t.Format(single, true), "[INST] Hi[/INST]");
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{2}));
}

TEST(ChatTemplateFormat, GemmaMergesSystemIntoFirstUser) {
  FakeTokenizer tok({"<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"}, "<bos>", "<eos>");
  ChatTemplate t(ChatFamily::kGemma, &tok);
  EXPECT_EQ(t.Format(kConversation, true),
            "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{4, 1}));
  EXPECT_EQ(t.StopStrings(), (std::vector<std::string>{"<end_of_turn>"}));
}

TEST(ChatTemplateFormat, Phi3) {
  FakeTokenizer tok({"<unk>", "<s>", "</s>", "<|endoftext|>", "<|end|>"}, "<s>", "<|endoftext|>");
  ChatTemplate t(ChatFamily::kPhi3, &tok);
  EXPECT_EQ(t.Format(kConversation, true),
            "<|system|>\nYou are terse.<|end|>\n"
            "<|user|>\nHi<|end|>\n"
            "<|assistant|>\nHello!<|end|>\n"
            "<|user|>\nBye<|end|>\n"
            "<|assistant|>\n");
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{4, 3}));
}

TEST(ChatTemplateFormat, ZephyrEndsTurnsWithEos) {
  FakeTokenizer tok({"<unk>", "<s>", "</s>"}, "<s>", "</s>");
  ChatTemplate t(ChatFamily::kZephyr, &tok);
  EXPECT_EQ(t.Format(kConversation, true),
            "<|system|>\nYou are terse.</s>\n"
            "<|user|>\nHi</s>\n"
            "<|assistant|>\nHello!</s>\n"
            "<|user|>\nBye</s>\n"
            "<|assistant|>\n");
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{2}));
  EXPECT_EQ(t.StopStrings(), (std::vector<std::string>{"</s>"}));

  // stablelm-zephyr: the vocab's EOS spelling is used.
  FakeTokenizer stablelm({"<|endoftext|>", "<|user|>", "<|assistant|>"}, "<|endoftext|>", "<|endoftext|>");
  ChatTemplate s(ChatFamily::kZephyr, &stablelm);
  std::vector<ChatMessage> one = {{"user", "Hi"}};
  EXPECT_EQ(s.Format(one, true), "<|user|>\nHi<|endoftext|>\n<|assistant|>\n");
  EXPECT_EQ(s.StopStrings(), (std::vector<std::string>{"<|endoftext|>"}));
}

TEST(ChatTemplateFormat, RawConcatenatesSystemFirst) {
  FakeTokenizer tok({"<s>", "</s>"}, "<s>", "</s>");
  ChatTemplate t(ChatFamily::kRaw, &tok);
  std::vector<ChatMessage> msgs = {{"user", "Once upon"}, {"system", "[story] "}, {"assistant", " a time"}};
  EXPECT_EQ(t.Format(msgs, true), "[story] Once upon a time");
  EXPECT_EQ(t.Format(kConversation, false), "You are terse.HiHello!Bye");
  EXPECT_TRUE(t.StopStrings().empty());
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{1}));
}

TEST(ChatTemplateFormat, WorksWithoutTokenizer) {
  ChatTemplate t(ChatFamily::kLlama2, nullptr);
  std::vector<ChatMessage> msgs = {{"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  EXPECT_EQ(t.Format(msgs, true), "[INST] a [/INST] b </s><s>[INST] c [/INST]");
  EXPECT_TRUE(t.EndOfTurnTokens().empty());
  EXPECT_EQ(t.StopStrings(), (std::vector<std::string>{"</s>"}));
}

// --- A real GGUF ----------------------------------------------------------------------------

TEST(ChatTemplateGguf, Phi3VocabTemplate) {
  const std::string path = testing::SharedDir() + "/models/vocab/ggml-vocab-phi-3.gguf";
  KVFS_REQUIRE_DATA(path);
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().message();
  std::optional<std::string_view> jinja = (*gguf)->GetString("tokenizer.chat_template");
  ASSERT_TRUE(jinja.has_value());
  EXPECT_EQ(DetectChatFamily(*jinja), ChatFamily::kPhi3);

  FakeTokenizer tok(**gguf);
  ASSERT_EQ(tok.n_vocab(), 32064);
  ChatTemplate t = ChatTemplate::FromGguf(**gguf, tok);
  EXPECT_EQ(t.family(), ChatFamily::kPhi3);
  // What this file's template renders ('<|user|>' + '\n' + content + '<|end|>' + '\n' +
  // '<|assistant|>' + '\n' per user turn, content + '<|end|>' + '\n' per assistant turn),
  // without its leading bos_token.
  std::vector<ChatMessage> msgs = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  EXPECT_EQ(t.Format(msgs, true), "<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n");
  // <|end|> = 32007 and EOS <|endoftext|> = 32000 in the Phi-3 vocab.
  EXPECT_EQ(t.EndOfTurnTokens(), (std::vector<TokenId>{32007, 32000}));
  EXPECT_EQ(t.StopStrings(), (std::vector<std::string>{"<|end|>"}));
}

TEST(ChatTemplateGguf, NoTemplateIsRaw) {
  const std::string path = testing::SharedDir() + "/models/vocab/ggml-vocab-llama-spm.gguf";
  KVFS_REQUIRE_DATA(path);
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().message();
  ASSERT_FALSE((*gguf)->GetString("tokenizer.chat_template").has_value());
  FakeTokenizer tok(**gguf);
  EXPECT_EQ(ChatTemplate::FromGguf(**gguf, tok).family(), ChatFamily::kRaw);
}

// A family's turn marker missing from the vocabulary (a template put on a model not trained
// with it) is reported; present, or a family without one, is not.
TEST(ChatTemplateGguf, AMissingTurnMarkerIsReported) {
  FakeTokenizer plain({"<s>", "</s>"}, "<s>", "</s>");
  FakeTokenizer chatml({"<s>", "</s>", "<|im_start|>", "<|im_end|>"}, "<s>", "</s>");
  EXPECT_EQ(ChatTemplate(ChatFamily::kChatml, &plain).MissingTurnMarker(), "<|im_end|>");
  EXPECT_EQ(ChatTemplate(ChatFamily::kLlama3, &plain).MissingTurnMarker(), "<|eot_id|>");
  EXPECT_EQ(ChatTemplate(ChatFamily::kChatml, &chatml).MissingTurnMarker(), "");
  EXPECT_EQ(ChatTemplate(ChatFamily::kLlama2, &plain).MissingTurnMarker(), "");  // ends turns with EOS
  EXPECT_EQ(ChatTemplate(ChatFamily::kRaw, &plain).MissingTurnMarker(), "");
}

// A template that is none of the families renders raw, and says so (the engine warns about it);
// a missing template, an empty one, one that names "raw", and a recognised one do not.
TEST(ChatTemplateGguf, AnUnrecognisedTemplateIsFlagged) {
  FakeTokenizer tok({"<s>", "</s>"}, "<s>", "</s>");
  auto flagged = [&](std::optional<std::string> tmpl) {
    testing::GgufBuilder b;
    b.Str("general.architecture", "llama");
    if (tmpl) b.Str("tokenizer.chat_template", *tmpl);
    const std::vector<uint8_t> bytes = b.Bytes();
    auto gguf = GgufFile::Parse(bytes);
    EXPECT_TRUE(gguf.ok()) << gguf.status().message();
    const ChatTemplate t = ChatTemplate::FromGguf(**gguf, tok);
    return std::make_pair(t.family(), t.unrecognised());
  };
  const std::string deepseek = "{% for m in messages %}<｜User｜>{{ m['content'] }}<｜Assistant｜>{% endfor %}";
  EXPECT_EQ(flagged(deepseek), std::make_pair(ChatFamily::kRaw, true));
  EXPECT_EQ(flagged(std::nullopt), std::make_pair(ChatFamily::kRaw, false));
  EXPECT_EQ(flagged(std::string(" \n")), std::make_pair(ChatFamily::kRaw, false));
  EXPECT_EQ(flagged(std::string("raw")), std::make_pair(ChatFamily::kRaw, false));
  EXPECT_EQ(flagged(std::string("{{ '<|im_start|>' + m['role'] }}")), std::make_pair(ChatFamily::kChatml, false));
}

}  // namespace
}  // namespace kvfs
