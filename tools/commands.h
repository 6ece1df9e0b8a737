// Subcommands of the kvfs CLI. Each returns the process exit status: 0 ok, 1 runtime failure,
// 2 bad usage or bad input (one clear line on stderr).
#pragma once

namespace kvfs::cli {

int Inspect(int argc, char** argv);
int Run(int argc, char** argv);
int Bench(int argc, char** argv);
int BenchResume(int argc, char** argv);  // kvfs bench resume
int BenchAgents(int argc, char** argv);  // kvfs bench agents
int BenchBatched(int argc, char** argv); // kvfs bench batched
int BenchDispatch(int argc, char** argv); // kvfs bench dispatch
int Perplexity(int argc, char** argv);
int ShowStatus(int argc, char** argv);  // kvfs status
int BenchFs(int argc, char** argv);     // kvfs bench fs
int Devices(int argc, char** argv);      // kvfs devices
int Tune(int argc, char** argv);         // kvfs tune
int Shaders(int argc, char** argv);      // kvfs shaders

}  // namespace kvfs::cli
