// `dsfs list`, `dsfs info NAME`, `dsfs rm NAME`.
#include "tools/admin_commands.h"

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "src/catalog/dataset.h"
#include "src/catalog/names.h"
#include "src/store/client.h"
#include "src/store/errors.h"
#include "src/store/log_text.h"
#include "tools/progress.h"
#include "tools/stop_signal.h"

namespace dsfs::tools {
namespace {

nlohmann::json info_to_json(const catalog::DatasetInfo& info) {
  return nlohmann::json{
      {"name", info.name},
      {"schema_version", info.schema_version},
      {"generation", info.generation},
      {"previous_generation", info.previous_generation},
      {"file_count", info.file_count},
      {"dir_count", info.dir_count},
      {"total_bytes", info.total_bytes},
      {"class_count", info.class_count},
      {"created_unix", info.created_unix},
      {"source", info.source},
      {"chunk_size", info.chunk_size},
      {"manifest_chunks", info.manifest_chunks},
      {"manifest_bytes", info.manifest_bytes},
      {"manifest_xxh64", fmt::format("{:016x}", info.manifest_xxh64)},
  };
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1000 && unit + 1 < std::size(kUnits)) {
    value /= 1000;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, kUnits[unit]);
}

void list_command(const cli::GlobalOptions& global, bool as_json) {
  cli::apply_log_level(global);
  const catalog::KeySchema keys(global.ns);
  const std::shared_ptr<store::Client> client = cli::make_client(global);
  // A damaged dataset is shown as such, with its reason; it never hides the others.
  std::vector<std::string> unpublished;
  const std::vector<catalog::DatasetStatus> statuses =
      catalog::list_dataset_status(*client, keys, &unpublished);
  // Keys of a first ingest that never published are invisible otherwise (an audit found 80 MB
  // of them left by a killed ingest, with nothing saying so).
  if (!unpublished.empty()) {
    std::string names;
    for (size_t i = 0; i < unpublished.size() && i < 10; ++i) {
      names += fmt::format("{}'{}'", i == 0 ? "" : ", ", store::log_text(unpublished[i], 128));
    }
    if (unpublished.size() > 10) names += fmt::format(" and {} more", unpublished.size() - 10);
    fmt::print(stderr,
               "not published: {} (an ingest of it is running, or one stopped before publishing "
               "and left what it wrote; `dsfs rm NAME` removes that, or ingest it again)\n",
               names);
  }
  if (as_json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& status : statuses) {
      list.push_back(status.info
                         ? info_to_json(*status.info)
                         : nlohmann::json{{"name", status.name}, {"damaged", status.damage}});
    }
    fmt::print("{}\n", list.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  if (statuses.empty()) {
    fmt::print(stderr, "no datasets in namespace '{}' on {}; add one with `dsfs ingest`\n",
               keys.ns(), client->describe());
    return;
  }
  size_t name_width = 4;
  for (const auto& status : statuses) name_width = std::max(name_width, status.name.size());
  fmt::print("{:<{}}  {:>12}  {:>10}  {:>10}\n", "NAME", name_width, "FILES", "SIZE", "GENERATION");
  size_t damaged = 0;
  for (const auto& status : statuses) {
    if (const auto& info = status.info) {
      fmt::print("{:<{}}  {:>12}  {:>10}  {:>10}\n", status.name, name_width,
                 format_count(info->file_count), format_bytes(info->total_bytes), info->generation);
    } else {
      ++damaged;
      fmt::print("{:<{}}  damaged: {}\n", status.name, name_width, status.damage);
    }
  }
  if (damaged > 0) {
    fmt::print(stderr, "{} damaged dataset(s): mounts skip them; `dsfs rm NAME` removes one\n",
               damaged);
  }
}

void info_command(const cli::GlobalOptions& global, const std::string& name, bool as_json) {
  cli::apply_log_level(global);
  catalog::validate_dataset_name(name);
  const catalog::KeySchema keys(global.ns);
  const std::shared_ptr<store::Client> client = cli::make_client(global);
  const catalog::DatasetInfo info = catalog::read_info(*client, keys, name);
  // On a cluster, how the objects spread over the primaries: each object key's slot, from the
  // catalogue, no SCAN.
  struct NodeShare {
    uint64_t objects = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, NodeShare> shares;
  if (client->is_cluster()) {
    const std::shared_ptr<const catalog::Catalog> catalog =
        catalog::load_catalog(*client, keys, info);
    for (uint32_t i = 0; i < catalog->entry_count(); ++i) {
      const catalog::CatalogEntry& entry = catalog->entry(i);
      if (entry.is_dir) continue;
      const uint64_t chunks = catalog->chunk_count(i);
      for (uint64_t k = 0; k < chunks; ++k) {
        NodeShare& share = shares[client->primary_address(
            keys.object_piece(name, info.generation, entry.object_id, k, chunks > 1))];
        share.objects += 1;
        share.bytes += chunks == 1      ? entry.size
                       : k + 1 < chunks ? catalog->chunk_size()
                                        : entry.size - (chunks - 1) * catalog->chunk_size();
      }
    }
  }
  if (as_json) {
    nlohmann::json json = info_to_json(info);
    if (!shares.empty()) {
      json["nodes"] = nlohmann::json::array();
      for (const auto& [address, share] : shares) {
        json["nodes"].push_back({{"address", address.empty() ? "unserved" : address},
                                 {"objects", share.objects},
                                 {"bytes", share.bytes}});
      }
    }
    fmt::print("{}\n", json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("name:                {}\n", info.name);
  fmt::print("files:               {}\n", format_count(info.file_count));
  fmt::print("directories:         {}\n", format_count(info.dir_count));
  fmt::print("size:                {} ({} bytes)\n", format_bytes(info.total_bytes),
             format_count(info.total_bytes));
  fmt::print("classes:             {}\n", format_count(info.class_count));
  fmt::print("generation:          {}\n", info.generation);
  fmt::print("previous generation: {}\n",
             info.previous_generation ? std::to_string(info.previous_generation) : "none");
  fmt::print("created:             {}\n", store::utc_time_text(info.created_unix));
  // The path as given at ingest: any bytes, shown escaped (a terminal control sequence in a
  // directory name would otherwise reach the terminal).
  fmt::print("source:              {}\n", store::log_text(info.source, 4096));
  fmt::print("chunk size:          {} bytes\n", format_count(info.chunk_size));
  fmt::print("manifest:            {} chunks, {} bytes, xxh64 {:016x}\n", info.manifest_chunks,
             format_count(info.manifest_bytes), info.manifest_xxh64);
  fmt::print("schema version:      {}\n", info.schema_version);
  if (!shares.empty()) {
    uint64_t objects = 0;
    uint64_t bytes = 0;
    for (const auto& [address, share] : shares) {
      objects += share.objects;
      bytes += share.bytes;
    }
    fmt::print("cluster primaries:   {}\n", shares.size());
    for (const auto& [address, share] : shares) {
      fmt::print(
          "  {:<21} {} objects ({:.1f}%), {} ({:.1f}%)\n",
          address.empty() ? "(slot unserved)" : address, format_count(share.objects),
          100.0 * static_cast<double>(share.objects) / static_cast<double>(objects),
          format_bytes(share.bytes),
          bytes == 0 ? 0.0 : 100.0 * static_cast<double>(share.bytes) / static_cast<double>(bytes));
    }
  }
}

void rm_command(const cli::GlobalOptions& global, const std::string& name,
                const std::string& progress_style, bool force) {
  cli::apply_log_level(global);
  catalog::validate_dataset_name(name);
  const catalog::KeySchema keys(global.ns);
  const std::shared_ptr<store::Client> client = cli::make_client(global);
  // A mounted dataset's reads would fail with EIO mid-training, and a dataset re-created under
  // the same name reuses its generation numbers, so the stale mount could even read the new
  // objects: refuse unless asked.
  std::vector<std::string> leases;
  if (!force) {
    try {
      leases = catalog::live_leases(*client, keys, name);
    } catch (const store::ReplyError& e) {
      // A user without TIME or ZRANGE is no damage, and --force would skip what protects the
      // mounts: said as it is.
      if (std::string_view(e.what()).find("NOPERM") != std::string_view::npos) throw;
      throw std::runtime_error(fmt::format(
          "cannot read the leases of dataset '{}' ({}); it is damaged: pass --force to remove "
          "it anyway",
          name, e.what()));
    }
  }
  if (!leases.empty()) {
    std::string holders;
    for (size_t i = 0; i < leases.size() && i < 3; ++i) {
      holders += fmt::format("{}{}", i ? ", " : "", leases[i]);
    }
    if (leases.size() > 3) holders += ", ...";
    throw std::runtime_error(fmt::format(
        "dataset '{}' is mounted: {} live lease(s) (GEN:HOST:PID:ID: {}); unmount it first "
        "(`dsfs umount MOUNTPOINT`; a mount that died keeps its lease until --lease-ttl "
        "passes), or pass --force to remove it anyway (the mount's reads then fail)",
        name, leases.size(), holders));
  }
  ProgressOptions progress_options;
  progress_options.unit = "keys";
  progress_options.show_bytes = false;
  progress_options.style = parse_progress_style(progress_style);
  Progress progress(fmt::format("rm {}", name), progress_options);
  uint64_t reported = 0;
  // SIGINT/SIGTERM stop rm after the batch under way: the dataset stays marked as being
  // removed (list, info and mount say so) until an rm runs to the end.
  StopSignalGuard signals;
  struct Interrupted {};
  uint64_t deleted = 0;
  try {
    deleted = catalog::remove_dataset(*client, keys, name, [&](uint64_t keys_deleted) {
      progress.add(keys_deleted - std::min(keys_deleted, reported), 0);
      reported = std::max(reported, keys_deleted);
      if (StopSignalGuard::stopped()) throw Interrupted{};
    });
  } catch (const Interrupted&) {
    progress.stop();
    fmt::print(stderr,
               "dsfs: rm {} interrupted after {} keys; the dataset is marked as being removed: "
               "run `dsfs rm {}` again to finish\n",
               name, format_count(reported), name);
    throw cli::ExitCode{128 + StopSignalGuard::signal_number()};
  }
  progress.stop();
  fmt::print("removed dataset '{}' ({} keys)\n", name, format_count(deleted));
}

}  // namespace

void register_admin_commands(CLI::App& app, cli::GlobalOptions& global) {
  {
    auto as_json = std::make_shared<bool>(false);
    CLI::App* sub = app.add_subcommand("list", "List published datasets: files, size, generation");
    sub->add_flag("--json", *as_json, "Print a JSON array of every dataset's info");
    cli::add_global_options(*sub, global);
    sub->callback([as_json, &global] { list_command(global, *as_json); });
  }
  {
    struct InfoState {
      std::string name;
      bool as_json = false;
    };
    auto state = std::make_shared<InfoState>();
    CLI::App* sub = app.add_subcommand("info",
                                       "Show a dataset's info: counts, sizes, classes, "
                                       "generation, source; on a Redis Cluster also how its "
                                       "objects and bytes spread over the primaries");
    sub->add_option("NAME", state->name, "Dataset name")->required();
    sub->add_flag("--json", state->as_json, "Print the info as a JSON object");
    cli::add_global_options(*sub, global);
    sub->callback([state, &global] { info_command(global, state->name, state->as_json); });
  }
  {
    struct RmState {
      std::string name;
      bool force = false;
      std::string progress = "auto";
    };
    auto state = std::make_shared<RmState>();
    CLI::App* sub = app.add_subcommand(
        "rm", "Remove a dataset: every generation's keys, in batches that never block Redis long");
    sub->add_option("NAME", state->name, "Dataset name")->required();
    sub->add_flag("--yes,-y")->description("Accepted for scripts; rm never asks");
    sub->add_flag("--force,-f", state->force,
                  "Remove the dataset even while a mount serves it (its reads then fail)");
    sub->add_option("--progress", state->progress, "auto, bar, lines or none")
        ->check(CLI::IsMember({"auto", "bar", "lines", "none"}))
        ->capture_default_str();
    cli::add_global_options(*sub, global);
    sub->callback(
        [state, &global] { rm_command(global, state->name, state->progress, state->force); });
  }
}

}  // namespace dsfs::tools
