#pragma once
// Contents of the generated files under MOUNT/.meta/NAME/. Each is a pure function of one
// dataset generation, so it is rendered once and served for the life of the mount.
#include <string>
#include <string_view>

#include "prefetch/dataset_snapshot.h"

namespace dsfs::fs {

// Counts, bytes, classes count, generation, creation time, source, namespace, chunk size.
std::string render_info_json(const prefetch::DatasetSnapshot& dataset, std::string_view ns);
// Class names one per line, by label index.
std::string render_classes_txt(const catalog::Catalog& catalog);
// "path,label" then one row per file in catalogue order; the label is empty when there is none.
std::string render_labels_csv(const catalog::Catalog& catalog);
// One JSON object per file that has metadata: {"path": ..., then the metadata's members}.
std::string render_metadata_jsonl(const catalog::Catalog& catalog);

// A CSV field per RFC 4180: quoted (with doubled quotes) only when it needs to be.
std::string csv_field(std::string_view text);

}  // namespace dsfs::fs
