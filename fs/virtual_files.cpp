#include "fs/virtual_files.h"

#include <fmt/chrono.h>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <ctime>
#include <nlohmann/json.hpp>

#include "src/store/log_text.h"

namespace dsfs::fs {

std::string render_info_json(const prefetch::DatasetSnapshot& dataset, std::string_view ns) {
  const catalog::DatasetInfo& info = dataset.info;
  const catalog::Catalog& catalog = *dataset.catalog;
  const std::time_t created = static_cast<std::time_t>(info.created_unix);
  nlohmann::ordered_json json = {
      {"name", info.name},
      {"namespace", std::string(ns)},
      {"generation", info.generation},
      {"schema_version", info.schema_version},
      {"files", catalog.file_count()},
      {"directories", catalog.directory_count()},
      {"bytes", catalog.total_bytes()},
      {"classes", catalog.classes().size()},
      {"created_unix", info.created_unix},
      {"created", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(created))},
      {"source", info.source},
      {"chunk_size", catalog.chunk_size()},
      {"checksum", catalog.checksum_kind() == catalog::ChecksumKind::kXxh64    ? "xxh64"
                   : catalog.checksum_kind() == catalog::ChecksumKind::kCrc32c ? "crc32c"
                                                                               : "none"},
      {"manifest_bytes", info.manifest_bytes},
  };
  return json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string render_classes_txt(const catalog::Catalog& catalog) {
  std::string out;
  for (const std::string& name : catalog.classes()) {
    out += name;
    out += '\n';
  }
  return out;
}

std::string csv_field(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

std::string render_labels_csv(const catalog::Catalog& catalog) {
  std::string out = "path,label\n";
  for (uint32_t i = 0; i < catalog.entry_count(); ++i) {
    const catalog::CatalogEntry& entry = catalog.entry(i);
    if (entry.is_dir) continue;
    out += csv_field(catalog.path(i));
    out += ',';
    if (entry.label != catalog::kNoLabel) out += std::to_string(entry.label);
    out += '\n';
  }
  return out;
}

std::string render_metadata_jsonl(const catalog::Catalog& catalog) {
  std::string out;
  for (uint32_t i = 0; i < catalog.entry_count(); ++i) {
    const std::string_view metadata = catalog.metadata(i);
    if (catalog.entry(i).is_dir || metadata.empty()) continue;
    nlohmann::ordered_json line = {{"path", catalog.path(i)}};
    // Ingest refuses deeper metadata; a manifest written otherwise is served, not printed by a
    // recursion that would overflow this thread's stack.
    const bool too_deep = catalog::json_nesting_depth(metadata) > catalog::kMaxMetadataDepth;
    const auto parsed = too_deep ? nlohmann::ordered_json()
                                 : nlohmann::ordered_json::parse(metadata, nullptr,
                                                                 /*allow_exceptions=*/false);
    if (parsed.is_object()) {
      for (const auto& [key, value] : parsed.items()) {
        if (key != "path") line[key] = value;
      }
    } else {
      // Ingest stores objects only; anything else is kept verbatim rather than dropped.
      spdlog::warn("metadata of {} is {}; served as a string", store::log_text(catalog.path(i)),
                   too_deep
                       ? fmt::format("nested more than {} levels deep", catalog::kMaxMetadataDepth)
                       : std::string("not a JSON object"));
      line["metadata"] = std::string(metadata);
    }
    out += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  return out;
}

}  // namespace dsfs::fs
