// `dsfs ingest`: options, signal handling and the summary around tools::run_ingest.
#include "tools/ingest_command.h"

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <csignal>
#include <memory>

#include "src/catalog/keys.h"
#include "tools/ingest.h"
#include "tools/proxy.h"
#include "tools/stop_signal.h"

namespace dsfs::tools {
namespace {

struct IngestCommandState {
  IngestOptions options;
  std::string source;
  std::string labels = "auto";
  std::string metadata;
  std::string checksum = "xxh64";
  std::string progress = "auto";
  bool no_follow_symlinks = false;
  std::string symlinks = "all";
  std::string url_timeout = "1800s";
  std::string url_stall_timeout = "30s";
};

std::chrono::milliseconds parse_ms(std::string_view option, const std::string& text) {
  try {
    const auto value = std::chrono::duration_cast<std::chrono::milliseconds>(parse_duration(text));
    if (value.count() <= 0) throw std::invalid_argument("zero");
    return value;
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument(
        fmt::format("{} must be a positive duration such as 30s or 600s, not '{}'", option, text));
  }
}

}  // namespace

void register_ingest_command(CLI::App& app, cli::GlobalOptions& global) {
  auto state = std::make_shared<IngestCommandState>();
  CLI::App* sub = app.add_subcommand(
      "ingest",
      "Store a dataset in Redis and publish it atomically. SRC is a directory (ImageFolder\n"
      "layout gives labels), a tar archive (.tar, .tar.gz, ... anything libarchive reads), or a\n"
      "text file of http(s) URLs, one per line, optionally followed by the path to store it as.\n"
      "Re-ingesting a name replaces it atomically; a failed or interrupted ingest publishes\n"
      "nothing.");
  sub->add_option("SRC", state->source, "Directory, archive, or file listing URLs")->required();
  sub->add_option("--dataset,-d", state->options.dataset,
                  "Dataset name: 1-128 of A-Z a-z 0-9 . _ -")
      ->required();
  sub->add_option("--labels", state->labels,
                  "auto: classes are SRC's first-level directories, sorted (as torchvision's "
                  "ImageFolder); none: no labels")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  sub->add_option("--symlinks", state->symlinks,
                  "Symlinks in a directory SRC. all: followed, as torchvision's ImageFolder "
                  "does, with a warning for each that leads outside SRC; inside: a link "
                  "leading outside SRC fails the ingest (nothing outside SRC is ever read); "
                  "none: every link is skipped with a warning")
      ->check(CLI::IsMember({"all", "inside", "none"}))
      ->capture_default_str();
  sub->add_flag("--no-follow-symlinks", state->no_follow_symlinks,
                "Same as --symlinks none: skip symlinks to files and directories alike");
  sub->add_option("--url-timeout", state->url_timeout,
                  "URL lists: each file, all its retries together, must arrive within this")
      ->capture_default_str();
  sub->add_option("--url-min-rate", state->options.url_min_bytes_per_second,
                  "URL lists: a transfer averaging less than this per second over "
                  "--url-stall-timeout is abandoned and retried")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("1KiB");
  sub->add_option("--url-stall-timeout", state->url_stall_timeout,
                  "URL lists: the window --url-min-rate is averaged over")
      ->capture_default_str();
  sub->add_option("--metadata", state->metadata,
                  "JSONL file: one object per line with a \"path\" member; its other members "
                  "become that file's metadata");
  sub->add_option("--jobs,-j", state->options.jobs,
                  "Writer threads (each with a Redis connection per node), reader threads and "
                  "concurrent downloads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--chunk-size", state->options.chunk_size,
                  "Files larger than this are stored in chunks of this size")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("4MiB");
  sub->add_option("--checksum", state->checksum, "Checksum stored per file: xxh64 or none")
      ->check(CLI::IsMember({"xxh64", "none"}))
      ->capture_default_str();
  sub->add_option("--keep-generations", state->options.keep_generations,
                  "Previous generations kept for readers still using them")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  sub->add_option("--max-in-flight", state->options.max_bytes_in_flight,
                  "Bound on file bytes read but not yet stored (a chunk is counted before it is "
                  "read; one chunk larger than the bound goes alone)")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("256MiB");
  sub->add_option("--progress", state->progress,
                  "auto: a bar on a terminal, a line every 5 s otherwise; bar; lines; none")
      ->check(CLI::IsMember({"auto", "bar", "lines", "none"}))
      ->capture_default_str();
  cli::add_global_options(*sub, global);

  sub->callback([state, &global] {
    cli::apply_log_level(global);
    // Each reading thread's chunk buffer came from its own malloc arena and stayed there once
    // freed: RSS grew to about threads x chunk size whatever --max-in-flight said (measured,
    // -j 16, 8 MiB chunks, a 2 MiB bound: 245 MB; 57 MB with this, and no slower). Buffers of
    // 1 MiB and more are mapped and given back when freed.
    cli::tune_malloc(/*arenas=*/2, /*mmap_threshold=*/1 << 20);
    IngestOptions options = state->options;
    options.source = state->source;
    options.labels = parse_label_mode(state->labels);
    if (!state->metadata.empty()) options.metadata_file = state->metadata;
    options.symlinks =
        state->no_follow_symlinks ? SymlinkPolicy::kNone : parse_symlink_policy(state->symlinks);
    options.url_file_deadline = parse_ms("--url-timeout", state->url_timeout);
    options.url_stall_timeout = parse_ms("--url-stall-timeout", state->url_stall_timeout);
    options.checksum =
        state->checksum == "none" ? catalog::ChecksumKind::kNone : catalog::ChecksumKind::kXxh64;
    options.progress = parse_progress_style(state->progress);
    // Fail on a bad name or option before starting any server.
    validate_ingest_options(options);

    const catalog::KeySchema keys(global.ns);
    const std::shared_ptr<store::Client> client = cli::make_client(global);
    StopSignalGuard signals;
    options.stop = &StopSignalGuard::stopped();
    try {
      const IngestResult result = run_ingest(*client, keys, options);
      fmt::print("{}\n", format_ingest_summary(options.dataset, result));
    } catch (const IngestInterrupted& e) {
      fmt::print(stderr, "dsfs: {}\n", e.what());
      const int signal_number = StopSignalGuard::signal_number();
      throw cli::ExitCode{128 + (signal_number != 0 ? signal_number : SIGINT)};
    }
  });
}

}  // namespace dsfs::tools
