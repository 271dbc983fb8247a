// `dsfs bench PATH`: options, progress, signals and output around tools::run_dataset_bench.
#include "tools/bench_command.h"

#include <fmt/core.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "tools/dataset_bench.h"
#include "tools/progress.h"
#include "tools/stop_signal.h"

namespace dsfs::tools {
namespace {

struct BenchCommandState {
  BenchOptions options;
  std::string root;
  std::string pattern = "seq";
  uint64_t epochs = 0;  // 0: not given
  double duration_s = 0;
  std::string json_file;
  CLI::Option* duration_option = nullptr;
};

// Units for durations: a bare number is seconds.
CLI::AsNumberWithUnit duration_units() {
  return CLI::AsNumberWithUnit(
      std::map<std::string, double>{{"ms", 0.001}, {"s", 1.0}, {"m", 60.0}, {"min", 60.0}});
}

[[noreturn]] void fail_setup(const std::string& message) {
  fmt::print(stderr, "dsfs: error: {}\n", message);
  throw cli::ExitCode{2};
}

void run_bench_command(BenchCommandState& state) {
  BenchOptions options = state.options;
  options.root = state.root;
  std::unique_ptr<std::ofstream> json_out;
  try {
    options.pattern = parse_bench_pattern(state.pattern);
    if (state.epochs > 0) options.epochs = state.epochs;
    if (state.duration_option->count() > 0) {
      if (state.duration_s <= 0) throw std::invalid_argument("--duration must be positive");
      options.duration = std::chrono::nanoseconds(static_cast<int64_t>(state.duration_s * 1e9));
    }
    validate_bench_options(options);
    // Opened first, so a bad --json path fails before a long run rather than after it.
    if (!state.json_file.empty() && state.json_file != "-") {
      json_out = std::make_unique<std::ofstream>(state.json_file);
      if (!*json_out) {
        throw std::invalid_argument(
            fmt::format("cannot write --json {}: {}", state.json_file, std::strerror(errno)));
      }
    }
  } catch (const std::invalid_argument& e) {
    fail_setup(e.what());
  }

  // Started once the listing is built, so its rate counts reading only. The engine reads
  // options.progress only after after_listing returns.
  std::unique_ptr<Progress> progress;
  if (::isatty(STDERR_FILENO)) {
    options.after_listing = [&options, &progress](const std::vector<BenchFile>& files) {
      progress = std::make_unique<Progress>("bench", ProgressOptions{.style = ProgressStyle::kBar});
      if (!options.duration) {
        const uint64_t epochs = options.epochs.value_or(1);
        uint64_t bytes = 0;
        for (const BenchFile& file : files) bytes += file.size;
        progress->set_totals(files.size() * epochs, bytes * epochs);
      }
      options.progress = progress.get();
    };
  }
  StopSignalGuard signals;
  options.stop = &StopSignalGuard::stopped();

  BenchResult result;
  try {
    result = run_dataset_bench(options);
  } catch (const BenchSetupError& e) {
    if (progress) progress->stop();
    fail_setup(e.what());
  }
  if (progress) progress->stop();

  // With --json -, stdout carries the JSON alone and the summary goes to stderr.
  const bool json_on_stdout = state.json_file == "-";
  const std::string summary = format_bench_summary(options, result);
  fmt::print(json_on_stdout ? stderr : stdout, "{}", summary);
  if (!state.json_file.empty()) {
    const std::string json = bench_result_json(options, result)
                                 .dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                             "\n";
    if (json_on_stdout) {
      fmt::print("{}", json);
      std::fflush(stdout);
    } else {
      *json_out << json;
      json_out->close();
      if (!*json_out) {
        throw std::runtime_error(fmt::format("could not write --json {}", state.json_file));
      }
    }
  }
  if (StopSignalGuard::stopped()) throw cli::ExitCode{128 + StopSignalGuard::signal_number()};
  if (result.totals.errors > 0) throw cli::ExitCode{1};
}

}  // namespace

void register_bench_command(CLI::App& app, cli::GlobalOptions& global) {
  auto state = std::make_shared<BenchCommandState>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Read every file under PATH (any directory: tmpfs, ext4, a dsfs mount) the way a data\n"
      "loader does, fio style: each file is opened, read to the end in --bs chunks and closed,\n"
      "by --jobs threads taking the next file of the epoch's order. Files are listed first\n"
      "(sorted bytewise by path, as `find PATH -type f | LC_ALL=C sort`), then timed. Prints\n"
      "files/s, MB/s (10^6 bytes) and per-file latency (open to close) percentiles, per epoch\n"
      "and in total. Exits 1 if any file could not be read (after reading the rest), 2 if\n"
      "there is nothing to read, 130 on Ctrl-C (after printing what was read).");
  sub->add_option("PATH", state->root, "Directory whose files to read (recursively)")->required();
  sub->add_option("--pattern", state->pattern,
                  "seq: directory order every epoch; shuffle: one seeded permutation reused "
                  "every epoch; epochs: a new permutation each epoch (epoch E uses seed+E), as a "
                  "shuffling sampler")
      ->check(CLI::IsMember({"seq", "shuffle", "epochs"}))
      ->capture_default_str();
  sub->add_option("--epochs", state->epochs,
                  "Passes over the files (default: 1, or as many as fit in --duration)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000'000}));
  sub->add_option("--jobs,-j", state->options.jobs, "Reader threads")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  sub->add_option("--files", state->options.max_files,
                  "Read only the first N files in directory order, before any shuffling "
                  "(0: all)")
      ->capture_default_str();
  sub->add_option("--bs", state->options.block_size, "Size of each read(2), e.g. 4k, 128KiB, 1M")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->default_str("1MiB");
  state->duration_option =
      sub->add_option("--duration", state->duration_s,
                      "Stop after this long (e.g. 30s, 500ms, 2m); the epoch under way is "
                      "reported as cut short. Without --epochs, epochs repeat until then "
                      "(default: no limit)")
          ->transform(duration_units());
  sub->add_option("--seed", state->options.seed, "Seed of the shuffled orders")
      ->capture_default_str();
  sub->add_option("--json", state->json_file,
                  "Also write everything as JSON to FILE ('-': stdout, and the summary goes to "
                  "stderr): config, totals, per-epoch figures, latency percentiles, errors and a "
                  "per-second timeline");
  sub->add_flag("--drop-caches", state->options.drop_caches,
                "Drop the page cache (sync, then 3 > /proc/sys/vm/drop_caches; needs root) "
                "before every epoch, so each epoch reads cold and later epochs measure the "
                "filesystem rather than the page cache; the time spent dropping is not counted "
                "(nor in --duration)");
  sub->add_flag("--plan", state->options.plan,
                "Before each epoch, write its whole order (paths relative to the mount, one "
                "per line) to the dsfs mount's .dsfs/plan, replacing the plan, so the prefetch "
                "engine fetches exactly what comes next; the mount is the nearest directory "
                "at or above PATH holding .dsfs/stats.json (an error if none). The write "
                "counts in the epoch's time, as a loader's sampler pays for it");
  cli::add_log_level_option(*sub, global);
  sub->callback([state, &global] {
    cli::apply_log_level(global);
    run_bench_command(*state);
  });
}

}  // namespace dsfs::tools
