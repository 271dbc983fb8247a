#include "fs/cache_command.h"

#include <fmt/core.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "prefetch/disk_tier.h"
#include "src/store/log_text.h"

namespace dsfs::fs {
namespace {

void show(const std::filesystem::path& dir, bool as_json) {
  const prefetch::DiskTierContents contents = prefetch::inspect_disk_tier(dir);
  if (as_json) {
    nlohmann::json generations = nlohmann::json::array();
    for (const auto& g : contents.generations) {
      generations.push_back({{"dataset", g.dataset},
                             {"generation", g.generation},
                             {"objects", g.objects},
                             {"bytes", g.bytes}});
    }
    const nlohmann::json out = {
        {"dir", dir.string()},
        {"objects", contents.objects},
        {"bytes", contents.bytes},
        {"unfinished_writes", contents.temp_files},
        {"in_use_by_pid",
         contents.held_by.empty() ? nlohmann::json(nullptr) : nlohmann::json(contents.held_by)},
        {"generations", generations}};
    // Dataset names are a user's bytes: invalid UTF-8 is replaced, not a crash.
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("disk cache {}: {} objects, {}; {}\n", store::log_text(dir.string()), contents.objects,
             store::mib_text(contents.bytes),
             contents.held_by.empty() ? std::string("no mount uses it")
                                      : fmt::format("in use by a dsfs mount (pid {})",
                                                    store::log_text(contents.held_by)));
  if (!contents.generations.empty()) {
    fmt::print("  {:<32} {:>12} {:>10} {:>14}\n", "dataset", "generation", "objects", "size");
    for (const auto& g : contents.generations) {
      fmt::print("  {:<32} {:>12} {:>10} {:>14}\n", store::log_text(g.dataset, 64), g.generation,
                 g.objects, store::mib_text(g.bytes));
    }
  }
  if (contents.temp_files > 0) {
    fmt::print("  {} unfinished writes ({})\n", contents.temp_files,
               contents.held_by.empty() ? "a killed mount's; the next mount removes them"
                                        : "being written");
  }
}

}  // namespace

void register_cache_command(CLI::App& app) {
  CLI::App* cache = app.add_subcommand(
      "cache", "Show or clear a disk cache (the DIR of `dsfs mount --disk-cache DIR`)");
  cache->require_subcommand(1);
  {
    struct ShowArgs {
      std::string dir;
      bool as_json = false;
    };
    auto args = std::make_shared<ShowArgs>();
    CLI::App* sub = cache->add_subcommand(
        "show",
        "What DIR holds: objects and bytes per dataset and generation, and whether a mount uses "
        "it (works while one does; reads names and one header per dataset, changes nothing)");
    sub->add_option("DIR", args->dir, "The disk cache directory")->required();
    sub->add_flag("--json", args->as_json, "Print a JSON object");
    sub->callback([args] { show(args->dir, args->as_json); });
  }
  {
    auto dir = std::make_shared<std::string>();
    CLI::App* sub = cache->add_subcommand(
        "clear",
        "Remove every object of DIR; refused while a mount uses it (unmount it first). Files "
        "that are not the cache's are left alone");
    sub->add_option("DIR", *dir, "The disk cache directory")->required();
    sub->callback([dir] {
      const uint64_t removed = prefetch::clear_disk_tier(*dir);
      fmt::print("cleared the disk cache {}: {} objects removed\n", store::log_text(*dir), removed);
    });
  }
}

}  // namespace dsfs::fs
