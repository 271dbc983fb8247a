#include "tools/synth_command.h"

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <memory>

#include "tools/synth.h"

namespace dsfs::tools {

void register_synth_command(CLI::App& app, cli::GlobalOptions& global) {
  auto* sub = app.add_subcommand(
      "synth",
      "Write a synthetic ImageFolder tree DIR/class_XXXX/img_XXXXXX.JPEG of real JPEGs that\n"
      "resemble ImageNet (mean about 110 KB, around 500x375, varied aspect ratios, about 2%\n"
      "grayscale). The same seed gives byte-identical files whatever --jobs is. Needs no Redis.");
  // Shared so the callback, which runs after this function returns, still owns the options.
  auto options = std::make_shared<SynthOptions>();
  sub->add_option("DIR", options->dir, "Output directory (created if missing; must be empty)")
      ->required();
  sub->add_option("--classes,-c", options->classes, "Number of class folders")
      ->capture_default_str();
  sub->add_option("--per-class,-n", options->per_class, "Images per class")->capture_default_str();
  sub->add_option("--seed,-s", options->seed, "Seed; the same seed gives the same bytes")
      ->capture_default_str();
  sub->add_option("--jobs,-j", options->jobs, "Writer threads (0: one per CPU)")
      ->capture_default_str();
  sub->add_option("--quality,-q", options->quality, "JPEG quality, 1..100")->capture_default_str();
  sub->add_flag("--force", options->force, "Write into DIR even if it is not empty");
  cli::add_global_options(*sub, global);
  sub->callback([options, &global] {
    cli::apply_log_level(global);
    const SynthSummary summary = synthesize(*options);
    fmt::print("{}\n", format_synth_summary(*options, summary));
  });
}

}  // namespace dsfs::tools
