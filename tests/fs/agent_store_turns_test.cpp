// AgentStore: turns as their files show them: response reads (blocking, parked without a
// thread, interrupted, bound to a turn), prompts closed by another process, the transcript as
// turns stream, failed turns, shutdown.
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "tests/fs/store_test_util.h"

namespace kvfs::fs {
namespace {

using testing::FakeEngine;

// `{ cat context; echo question; } > prompt`: the child (cat) closes its copy of the descriptor
// before the shell writes the question. Only the opener's close (or the last one) submits, so
// the prompt is one turn; a child's close still reports a refusal already made.
TEST_F(StoreTest, AChildsCloseDoesNotCutThePromptInTwo) {
  Mkdir("alice");
  Caller shell = kRoot;
  shell.process = 100;
  const InodeId prompt = *File("alice", "prompt");
  HandleId h = *store_->Open(prompt, WriteTruncFlags(), shell);
  ASSERT_EQ(*store_->Write(h, 0, "Context. "), 9u);
  ASSERT_TRUE(store_->Flush(h, 200).ok());  // cat exits
  EXPECT_EQ(engine_->Conversation("alice")->size(), 0u);
  ASSERT_EQ(*store_->Write(h, 9, "Question?\n"), 10u);
  ASSERT_TRUE(store_->Flush(h, 100).ok());  // the shell closes
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "response"), FakeEngine::ReplyFor(1, "Context. Question?"));
  EXPECT_EQ(engine_->Conversation("alice")->size(), 2u);
  // The opener closes first, then the child writes the rest: the last close (release) submits.
  h = *store_->Open(prompt, WriteTruncFlags(), shell);
  ASSERT_TRUE(store_->Flush(h, 100).ok());
  ASSERT_EQ(*store_->Write(h, 0, "Late."), 5u);
  ASSERT_TRUE(store_->Flush(h, 200).ok());
  EXPECT_EQ(engine_->Conversation("alice")->size(), 2u);
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "response"), FakeEngine::ReplyFor(2, "Late."));
  // A refused prompt: every close says so.
  h = *store_->Open(prompt, WriteTruncFlags(), shell);
  EXPECT_FALSE(store_->Write(h, 0, "\xff").ok());
  EXPECT_EQ(store_->Flush(h, 200).code(), StatusCode::kIllegalSequence);
  EXPECT_EQ(store_->Flush(h, 100).code(), StatusCode::kIllegalSequence);
  store_->Release(h);
}

// Python's f.seek(0); f.truncate(); f.write(...) on an open prompt: the cut to 0 starts the
// prompt again, at 0 (or at the old end, where C's ftruncate leaves the offset: the edits test);
// the turn is what was written after the cut, and a write elsewhere is refused.
TEST_F(StoreTest, APromptCutToZeroIsWrittenAgainFromZero) {
  Mkdir("alice");
  const InodeId prompt = *File("alice", "prompt");
  HandleId h = *store_->Open(prompt, OpenFlags{false, true, false, false}, kRoot);
  ASSERT_EQ(*store_->Write(h, 0, "draft"), 5u);
  ASSERT_TRUE(store_->Truncate(prompt, 0, h, kRoot).ok());
  ASSERT_EQ(*store_->Write(h, 0, "final text"), 10u);
  ASSERT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "response"), FakeEngine::ReplyFor(1, "final text"));
  h = *store_->Open(prompt, OpenFlags{false, true, false, false}, kRoot);
  ASSERT_EQ(*store_->Write(h, 0, "0123456789"), 10u);
  ASSERT_TRUE(store_->Truncate(prompt, 0, h, kRoot).ok());
  EXPECT_EQ(store_->Write(h, 4, "XYZ").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Flush(h).code(), StatusCode::kInvalidArgument);
  store_->Release(h);
  EXPECT_EQ(engine_->Conversation("alice")->size(), 2u);
  // C's way, then Python's f.truncate() at the writer's offset: a cut to where it is.
  h = *store_->Open(prompt, OpenFlags{false, true, false, false}, kRoot);
  ASSERT_EQ(*store_->Write(h, 0, "draft"), 5u);
  ASSERT_TRUE(store_->Truncate(prompt, 0, h, kRoot).ok());
  ASSERT_EQ(*store_->Write(h, 5, "abc"), 3u);
  ASSERT_TRUE(store_->Truncate(prompt, 8, h, kRoot).ok());
  ASSERT_TRUE(store_->Flush(h).ok());
  store_->Release(h);
  EXPECT_EQ(*Cat("alice", "response"), FakeEngine::ReplyFor(2, "abc"));
}

TEST_F(StoreTest, ResponseReadBlocksUntilTextAndCanBeInterrupted) {
  Mkdir("alice");
  engine_->HoldTurns(true);
  ASSERT_TRUE(Echo("alice", "prompt", "wait").ok());
  Interrupt interrupt;
  std::atomic<bool> finished{false};
  Result<std::string> result = Status(StatusCode::kInternal, "not run");
  std::thread reader([&] {
    result = Cat("alice", "response", kRoot, &interrupt);
    finished = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(finished.load());  // blocked: no text yet
  // ls, status and another agent are not blocked meanwhile.
  EXPECT_TRUE(store_->OpenDir(kRootInode, kRoot).ok());
  EXPECT_TRUE(Cat("alice", "status.json").ok());
  Mkdir("bob");
  auto t0 = std::chrono::steady_clock::now();
  interrupt.Trigger();
  reader.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  EXPECT_EQ(result.status().code(), StatusCode::kCancelled);
  engine_->HoldTurns(false);
  EXPECT_EQ(*Cat("alice", "response"), FakeEngine::ReplyFor(1, "wait"));
}

// ReadAsync parks a read of `response` that must wait, holding no thread: hundreds wait at once,
// each answered once, by the turn's text, an interrupt, an erasure or the shutdown.
TEST_F(StoreTest, ParkedResponseReadsAreAnsweredOnceByWhatEndsTheirWait) {
  Mkdir("alice");
  Mkdir("bob");
  engine_->HoldTurns(true);
  ASSERT_TRUE(Echo("alice", "prompt", "wait").ok());
  ASSERT_TRUE(Echo("bob", "prompt", "wait too").ok());
  std::mutex mu;
  std::map<int, std::vector<Result<std::string>>> answers;  // by reader
  auto reply_to = [&](int reader) {
    return [&, reader](Result<std::string> r) {
      std::lock_guard lock(mu);
      answers[reader].push_back(std::move(r));
    };
  };
  auto answered = [&](int reader) {
    std::lock_guard lock(mu);
    return answers[reader].size();
  };
  auto open = [&](const std::string& agent) {
    auto ino = File(agent, "response");
    EXPECT_TRUE(ino.ok());
    auto h = store_->Open(*ino, ReadFlags(), kRoot);
    EXPECT_TRUE(h.ok());
    return *h;
  };
  constexpr int kReaders = 300;
  std::vector<HandleId> handles;
  for (int i = 0; i < kReaders; ++i) {
    handles.push_back(open("alice"));
    store_->ReadAsync(handles.back(), 0, 4096, std::make_shared<Interrupt>(), reply_to(i));
  }
  for (int i = 0; i < kReaders; ++i) EXPECT_EQ(answered(i), 0u) << i;
  // The caller's thread came back: other requests go on.
  EXPECT_TRUE(Cat("alice", "status.json").ok());
  // An interrupt answers its read at once (EINTR), and only it; one that came before the read
  // answers it at the read.
  auto interrupt = std::make_shared<Interrupt>();
  const HandleId interrupted = open("alice");
  store_->ReadAsync(interrupted, 0, 4096, interrupt, reply_to(-1));
  EXPECT_EQ(answered(-1), 0u);
  interrupt->Trigger();
  ASSERT_EQ(answered(-1), 1u);
  EXPECT_EQ(answers[-1][0].status().code(), StatusCode::kCancelled);
  store_->ReadAsync(interrupted, 0, 4096, interrupt, reply_to(-2));
  ASSERT_EQ(answered(-2), 1u);
  EXPECT_EQ(answers[-2][0].status().code(), StatusCode::kCancelled);
  store_->Release(interrupted);
  // The turn's text answers every parked read of alice, once each, with the reply's start.
  engine_->HoldTurns(false);
  const std::string reply = *Cat("alice", "response");
  ASSERT_EQ(reply, FakeEngine::ReplyFor(1, "wait"));
  for (int i = 0; i < kReaders; ++i) {
    ASSERT_EQ(answered(i), 1u) << i;
    ASSERT_TRUE(answers[i][0].ok()) << answers[i][0].status().message();
    EXPECT_FALSE(answers[i][0]->empty());
    EXPECT_TRUE(reply.starts_with(*answers[i][0])) << *answers[i][0];
    // At the end of the reply a read is answered at once: EOF.
    store_->ReadAsync(handles[i], reply.size(), 4096, nullptr, reply_to(i));
    ASSERT_EQ(answered(i), 2u);
    EXPECT_EQ(answers[i][1].value(), "");
    store_->Release(handles[i]);
  }
  interrupt->Trigger();  // again, after its read was answered: nothing more
  EXPECT_EQ(answered(-1), 1u);
  // Bob's first turn ends before turns are held again (it may not have started yet: held
  // then, it would never end, and the read would wait for ever).
  ASSERT_TRUE(*Cat("bob", "response") == FakeEngine::ReplyFor(1, "wait too"));
  engine_->HoldTurns(true);
  ASSERT_TRUE(Echo("bob", "prompt", "held").ok());
  // A reader of bob's held turn is answered by bob's erasure, which cancels the turn first:
  // ENOENT all the same (the agent is gone, not a turn failed).
  const HandleId bobs_held = open("bob");
  store_->ReadAsync(bobs_held, 0, 4096, nullptr, reply_to(-4));
  EXPECT_EQ(answered(-4), 0u);
  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "bob", kRoot).ok());
  ASSERT_EQ(answered(-4), 1u);
  EXPECT_EQ(answers[-4][0].status().code(), StatusCode::kNotFound);
  store_->Release(bobs_held);
  // A read parked at shutdown is answered once the readers are released (EIO).
  ASSERT_TRUE(Echo("alice", "prompt", "last").ok());
  const HandleId last = open("alice");
  store_->ReadAsync(last, 0, 4096, nullptr, reply_to(-5));
  EXPECT_EQ(answered(-5), 0u);
  store_->BeginShutdown();
  EXPECT_EQ(answered(-5), 0u);
  store_->WakeAllReaders();
  ASSERT_EQ(answered(-5), 1u);
  EXPECT_EQ(answers[-5][0].status().code(), StatusCode::kIoError);
  store_->Release(last);
  engine_->HoldTurns(false);
}

TEST_F(StoreTest, ResponseBindsToTheTurnCurrentAtOpen) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "one").ok());
  InodeId ino = *File("alice", "response");
  HandleId first = *store_->Open(ino, ReadFlags(), kRoot);
  ASSERT_TRUE(Echo("alice", "prompt", "two").ok());
  std::string got;
  while (true) {
    auto chunk = store_->Read(first, got.size(), 3, nullptr);
    ASSERT_TRUE(chunk.ok());
    if (chunk->empty()) break;
    got += *chunk;
  }
  store_->Release(first);
  EXPECT_EQ(got, FakeEngine::ReplyFor(1, "one"));
  EXPECT_EQ(*Cat("alice", "response"), FakeEngine::ReplyFor(2, "two"));
}

TEST_F(StoreTest, FailedTurnGivesEioAndTheReasonInStatusJson) {
  testing::FakeEngineOptions options;
  options.n_ctx = 64;
  Start(options);
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", std::string(100, 'x')).ok());  // accepted, then fails in the engine
  EXPECT_EQ(Cat("alice", "response").status().code(), StatusCode::kIoError);
  auto status = nlohmann::json::parse(*Cat("alice", "status.json"));
  EXPECT_EQ(status["state"], "error");
  EXPECT_NE(status["last_error"].get<std::string>().find("context"), std::string::npos) << status.dump();
  EXPECT_EQ(*Cat("alice", "transcript"), "");
  engine_->FailNextTurn(Status(StatusCode::kNoSpace, "store: no space left on device"));
  ASSERT_TRUE(Echo("alice", "prompt", "hi").ok());
  EXPECT_EQ(Cat("alice", "response").status().code(), StatusCode::kIoError);
  status = nlohmann::json::parse(*Cat("alice", "status.json"));
  EXPECT_EQ(status["last_error_code"], "ENOSPC");
}

TEST_F(StoreTest, TranscriptOnlyGrowsWhileTurnsStream) {
  Mkdir("alice");
  engine_->SetPieceDelay(std::chrono::milliseconds(2));
  ASSERT_TRUE(Echo("alice", "prompt", "a long enough prompt to stream in many pieces").ok());
  std::string previous;
  for (int i = 0; i < 20; ++i) {
    std::string now = *Cat("alice", "transcript");
    EXPECT_EQ(now.substr(0, previous.size()), previous);
    EXPECT_GE(store_->GetAttr(*File("alice", "transcript"))->size, now.size());  // tail -f sees it grow
    previous = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  ASSERT_TRUE(Cat("alice", "response").ok());
  std::string final_text = *Cat("alice", "transcript");
  EXPECT_EQ(final_text.substr(0, previous.size()), previous);
  EXPECT_EQ(store_->GetAttr(*File("alice", "transcript"))->size, final_text.size());
}

// Reads copy only the window asked for, out of pieces (the committed conversation, then the turn
// still streaming): every window at every offset must equal that slice of the whole file.
TEST_F(StoreTest, TranscriptReadsAtAnyOffsetMatchTheWholeFile) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "prompt", "first turn").ok());
  ASSERT_TRUE(Cat("alice", "response").ok());
  engine_->HoldAfterFirstPiece(true);
  ASSERT_TRUE(Echo("alice", "prompt", "second turn, held after its first piece").ok());
  const std::string committed = "[user]\nfirst turn\n\n[assistant]\n" + FakeEngine::ReplyFor(1, "first turn") + "\n\n";
  const std::string second = "second turn, held after its first piece";
  const std::string expected = committed + "[user]\n" + second + "\n\n[assistant]\n" + FakeEngine::ReplyFor(2, second).substr(0, 4);
  std::string whole;
  for (int i = 0; i < 2000 && whole != expected; ++i) {
    whole = *Cat("alice", "transcript");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(whole, expected);
  InodeId ino = *File("alice", "transcript");
  EXPECT_EQ(store_->GetAttr(ino)->size, whole.size());
  HandleId h = *store_->Open(ino, ReadFlags(), kRoot);
  for (size_t window : {size_t{1}, size_t{3}, size_t{17}, size_t{4096}}) {
    for (size_t offset = 0; offset <= whole.size() + 2; ++offset) {
      Result<std::string> got = store_->Read(h, offset, window, nullptr);
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_EQ(*got, offset < whole.size() ? whole.substr(offset, window) : "") << offset << " " << window;
    }
  }
  EXPECT_EQ(*store_->Read(h, UINT64_MAX - 1, 4096, nullptr), "");
  store_->Release(h);
  engine_->HoldAfterFirstPiece(false);
  ASSERT_TRUE(Cat("alice", "response").ok());
  EXPECT_EQ(*Cat("alice", "transcript"),
            committed + "[user]\n" + second + "\n\n[assistant]\n" + FakeEngine::ReplyFor(2, second) + "\n\n");
}

// The engine's conversation holds a finished turn before the turn is done here (its commit is
// still being written). A transcript rendered in that window (a system change made the one
// before stale) must show the turn once, and keep it once after the turn is done.
TEST_F(StoreTest, TranscriptRenderedWhileATurnFinishesShowsItOnce) {
  Mkdir("alice");
  ASSERT_TRUE(Echo("alice", "system", "Be brief.\n").ok());  // (echo's newline: not shown)
  engine_->HoldBeforeDone(true);
  ASSERT_TRUE(Echo("alice", "prompt", "hi").ok());
  for (int i = 0; i < 2000 && engine_->Conversation("alice")->size() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(engine_->Conversation("alice")->size(), 3u);  // the system entry and the turn's two
  const std::string once = "[system]\nBe brief.\n\n[user]\nhi\n\n[assistant]\n" + FakeEngine::ReplyFor(1, "hi") + "\n\n";
  EXPECT_EQ(store_->GetAttr(*File("alice", "transcript"))->size, once.size());  // ls -l renders it
  EXPECT_EQ(*Cat("alice", "transcript"), once);
  engine_->HoldBeforeDone(false);
  ASSERT_TRUE(Cat("alice", "response").ok());
  EXPECT_EQ(*Cat("alice", "transcript"), once);
}

// The daemon's sequence: BeginShutdown refuses new turns but answers no reader yet; the engine's
// Shutdown finishes the running turn (its reader gets the whole reply, not EIO: it committed)
// and cancels the queued one (EIO); WakeAllReaders then ends any read still waiting.
TEST_F(StoreTest, ShutdownEndsEachWaitingReadAsItsTurnEnded) {
  Mkdir("alice");
  engine_->HoldAfterFirstPiece(true);
  ASSERT_TRUE(Echo("alice", "prompt", "never").ok());  // runs, then waits after its first piece
  Result<std::string> finished = Status(StatusCode::kInternal, "not run");
  std::thread reader([&] { finished = Cat("alice", "response"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_TRUE(Echo("alice", "prompt", "queued").ok());  // behind it; `response` now binds to it
  Result<std::string> cancelled = Status(StatusCode::kInternal, "not run");
  std::thread second_reader([&] { cancelled = Cat("alice", "response"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  store_->BeginShutdown();
  EXPECT_EQ(Echo("alice", "prompt", "more").code(), StatusCode::kIoError);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(finished.status().code(), StatusCode::kInternal) << "answered before the engine stopped";
  EXPECT_EQ(cancelled.status().code(), StatusCode::kInternal) << "answered before the engine stopped";
  engine_->Shutdown();
  reader.join();
  second_reader.join();
  engine_->HoldAfterFirstPiece(false);
  ASSERT_TRUE(finished.ok()) << finished.status().message();
  EXPECT_EQ(*finished, FakeEngine::ReplyFor(1, "never"));
  EXPECT_EQ(cancelled.status().code(), StatusCode::kIoError);
  store_->WakeAllReaders();
}

TEST_F(StoreTest, TurnsMayFinishAfterTheStoreIsGone) {
  Mkdir("alice");
  engine_->HoldTurns(true);
  ASSERT_TRUE(Echo("alice", "prompt", "late").ok());
  store_.reset();              // the callbacks hold the agent and the metrics, not the store
  engine_->HoldTurns(false);   // the turn runs and finishes now
  engine_->Shutdown();
}

// The value of a sample line of .metrics ("NAME VALUE"), or -1.
double MetricValue(const std::string& metrics, const std::string& name) {
  const std::string line = name + " ";
  for (size_t at = metrics.find(line); at != std::string::npos; at = metrics.find(line, at + 1)) {
    if (at == 0 || metrics[at - 1] == '\n') return std::stod(metrics.substr(at + line.size()));
  }
  return -1;
}

// Every turn submitted through the mount ends completed, failed or cancelled (dropped from the
// queue unstarted, here by rm -r), or is in flight, in .metrics, .status.json and .status alike;
// and an agent whose turn runs is counted by the state its status.json shows.
TEST_F(StoreTest, TurnCountsAddUpWhenAnErasureCancelsQueuedTurns) {
  Mkdir("alice");
  engine_->HoldAfterFirstPiece(true);
  for (const char* prompt : {"one", "two", "three"}) ASSERT_TRUE(Echo("alice", "prompt", prompt).ok());
  for (int i = 0; i < 1000 && engine_->GetAgent("alice")->state != AgentState::kGenerating; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const InodeId status_json = store_->Lookup(kRootInode, ".status.json")->ino;
  const InodeId metrics_file = store_->Lookup(kRootInode, ".metrics")->ino;
  nlohmann::json status = nlohmann::json::parse(*CatInode(status_json));
  EXPECT_EQ(nlohmann::json::parse(*Cat("alice", "status.json"))["state"], "generating");
  EXPECT_EQ(status["agents"]["generating"], 1);
  EXPECT_EQ(status["agents"]["hot"], 0);
  EXPECT_EQ(status["turns_in_flight"], 3);
  std::string metrics = *CatInode(metrics_file);
  EXPECT_EQ(MetricValue(metrics, "kvfs_agents{state=\"generating\"}"), 1);
  EXPECT_EQ(MetricValue(metrics, "kvfs_agents{state=\"hot\"}"), 0);
  EXPECT_EQ(MetricValue(metrics, "kvfs_turns_in_flight"), 3);

  ASSERT_TRUE(store_->RemoveAgent(kRootInode, "alice", kRoot).ok());
  metrics = *CatInode(metrics_file);
  const double submitted = MetricValue(metrics, "kvfs_fs_turns_submitted_total");
  const double ok = MetricValue(metrics, "kvfs_turns_total{result=\"ok\"}");
  const double failed = MetricValue(metrics, "kvfs_turns_total{result=\"failed\"}");
  const double cancelled = MetricValue(metrics, "kvfs_turns_total{result=\"cancelled\"}");
  EXPECT_EQ(submitted, 3);
  EXPECT_EQ(failed, 1);     // the running turn
  EXPECT_EQ(cancelled, 2);  // the queued ones
  EXPECT_EQ(MetricValue(metrics, "kvfs_turns_in_flight"), 0);
  EXPECT_EQ(submitted, ok + failed + cancelled);
  status = nlohmann::json::parse(*CatInode(status_json));
  EXPECT_EQ(status["turns_cancelled"], 2);
  EXPECT_EQ(status["turns_in_flight"], 0);
  const std::string text = *CatInode(store_->Lookup(kRootInode, ".status")->ino);
  EXPECT_NE(text.find("0 completed, 1 failed, 2 cancelled, 0 queued or running"), std::string::npos) << text;
  engine_->HoldAfterFirstPiece(false);
}

}  // namespace
}  // namespace kvfs::fs
