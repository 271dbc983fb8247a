#include "fs/views.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <span>
#include <stdexcept>
#include <utility>

#include "cuda/npy.h"

namespace dsfs::fs {
namespace {

constexpr std::array<std::string_view, 3> kImageExtensions = {".jpg", ".jpeg", ".png"};
// Undecodable files remembered at most; a dataset with more fails each of the rest on every read.
constexpr size_t kMaxRememberedFailures = 100000;

bool ends_with_ignoring_case(std::string_view text, std::string_view suffix) {
  if (text.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), text.end() - static_cast<long>(suffix.size()),
                    [](char a, char b) {
                      const auto lower = [](char c) {
                        return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
                      };
                      return lower(a) == lower(b);
                    });
}

uint64_t nanoseconds_since(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
}

}  // namespace

bool is_image_name(std::string_view name) {
  return std::any_of(kImageExtensions.begin(), kImageExtensions.end(), [&](std::string_view ext) {
    // A bare ".jpg" is a hidden file with no stem, not an image name.
    return name.size() > ext.size() && ends_with_ignoring_case(name, ext);
  });
}

std::string view_file_name(std::string_view source_name) {
  std::string name(source_name);
  name += kViewSuffix;
  return name;
}

std::optional<std::string_view> view_source_name(std::string_view view_name) {
  if (!view_name.ends_with(kViewSuffix)) return std::nullopt;
  const std::string_view source = view_name.substr(0, view_name.size() - kViewSuffix.size());
  if (!is_image_name(source)) return std::nullopt;
  return source;
}

// ---- ViewRegistry -----------------------------------------------------------------------------

ViewRegistry::ViewRegistry(uint32_t max_slots) : max_slots_(std::min(max_slots, kMaxViewSlots)) {
  slots_.resize(max_slots_);
  std::lock_guard lock(mutex_);
  for (const auto& [name, text] : view::view_presets()) {
    if (size() == max_slots_) break;
    add_locked(name, view::parse_view_spec(text));
  }
  preset_count_ = size();
}

uint32_t ViewRegistry::add_locked(std::string name, view::ViewSpec spec) {
  const uint32_t index = size_.load(std::memory_order_relaxed);
  std::string canonical = spec.canonical();
  auto slot = std::make_unique<Slot>();
  slot->name = name;
  slot->header = view::npy_header(spec);
  slot->file_size = view::npy_file_size(spec);
  slot->spec = std::move(spec);
  const auto [it, added] = by_canonical_.try_emplace(std::move(canonical), index);
  slot->canonical = it->second;
  try {
    by_name_.emplace(std::move(name), index);
  } catch (...) {
    if (added) by_canonical_.erase(it);
    throw;
  }
  slots_[index] = std::move(slot);
  size_.store(index + 1, std::memory_order_release);  // publishes the slot to slot()
  return index;
}

ViewRegistry::Found ViewRegistry::find_or_add(std::string_view name) {
  {
    // Fast path without parsing: a name seen before.
    std::lock_guard lock(mutex_);
    if (const auto it = by_name_.find(std::string(name)); it != by_name_.end()) {
      return {.slot = it->second, .error = {}};
    }
  }
  view::ViewSpec spec;
  try {
    spec = view::parse_view_spec(name);
  } catch (const view::SpecError& e) {
    return {.slot = std::nullopt, .error = e.what()};
  }
  std::lock_guard lock(mutex_);
  if (const auto it = by_name_.find(std::string(name)); it != by_name_.end()) {
    return {.slot = it->second, .error = {}};  // another thread added it meanwhile
  }
  if (size() >= max_slots_) {
    std::string error = fmt::format(
        "view spec \"{}\": this mount already has {} view directories, its limit; use one of "
        "the spellings already entered, or remount",
        name, max_slots_);
    if (!full_logged_) {
      full_logged_ = true;
      spdlog::warn("{} (logged once)", error);
    }
    return {.slot = std::nullopt, .error = std::move(error)};
  }
  return {.slot = add_locked(std::string(name), std::move(spec)), .error = {}};
}

const ViewRegistry::Slot* ViewRegistry::slot(uint32_t index) const {
  if (index >= size()) return nullptr;
  return slots_[index].get();
}

// ---- ViewFiles --------------------------------------------------------------------------------

ViewFiles::ViewFiles(prefetch::FileReader& reader, uint64_t cache_bytes)
    : reader_(reader), cache_(cache_bytes) {}

ViewFiles::~ViewFiles() = default;

void ViewFiles::start(std::unique_ptr<view::ViewService> service) {
  if (service_) throw std::logic_error("ViewFiles::start called twice");
  service_ = std::move(service);
}

prefetch::ObjectBuffer ViewFiles::rendered(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                           uint32_t canonical_slot) {
  const ViewRegistry::Slot* slot = registry_.slot(canonical_slot);
  if (!slot) throw std::logic_error(fmt::format("view slot {} is not registered", canonical_slot));
  const prefetch::ObjectKey key{.dataset = dataset.index,
                                .chunk = canonical_slot,
                                .generation = dataset.generation(),
                                .object_id = entry};
  return cache_.get(key, [&] { return render(dataset, entry, *slot, key); });
}

prefetch::ObjectBuffer ViewFiles::render(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                         const ViewRegistry::Slot& slot,
                                         const prefetch::ObjectKey& key) {
  if (!service_) {
    throw std::logic_error("a view file was read before the view service was started");
  }
  // A file that failed is never cached, so every read of it comes here: answer from memory
  // rather than fetching and decoding it again. Rendered files never reach this lock.
  {
    std::lock_guard lock(failed_mutex_);
    if (const auto it = failed_.find(key); it != failed_.end()) throw ViewRenderError(it->second);
  }
  const auto started = std::chrono::steady_clock::now();
  const catalog::CatalogEntry& file = dataset.catalog->entry(entry);
  const std::vector<prefetch::Slice> slices = reader_.read(dataset, entry, 0, file.size);
  std::span<const std::byte> encoded;
  std::vector<std::byte> joined;  // only for a file stored in several chunks
  if (slices.size() == 1) {
    const prefetch::Slice& s = slices.front();
    encoded = std::as_bytes(std::span(s.buffer->bytes().data() + s.offset, s.length));
  } else if (slices.size() > 1) {
    joined.resize(file.size);
    size_t at = 0;
    for (const prefetch::Slice& s : slices) {
      std::memcpy(joined.data() + at, s.buffer->bytes().data() + s.offset, s.length);
      at += s.length;
    }
    joined.resize(at);
    encoded = joined;
  }
  fetch_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);

  std::string rendered;
  try {
    rendered = service_->render(slot.spec, encoded);
  } catch (const view::DecodeError& e) {
    render_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
    render_errors_.fetch_add(1, std::memory_order_relaxed);
    std::string reason =
        fmt::format("dataset '{}': {} cannot be decoded for .views/{}: {}", dataset.name(),
                    dataset.catalog->path(entry), slot.name, e.what());
    spdlog::warn("{} (EIO)", reason);
    std::lock_guard lock(failed_mutex_);
    if (failed_.size() < kMaxRememberedFailures) failed_.emplace(key, reason);
    throw ViewRenderError(std::move(reason));
  }
  render_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
  if (rendered.size() != slot.file_size) {
    throw std::logic_error(fmt::format("view render of {} gave {} bytes, its size is {}",
                                       dataset.catalog->path(entry), rendered.size(),
                                       slot.file_size));
  }
  return std::make_shared<const prefetch::ObjectData>(std::move(rendered));
}

ViewStats ViewFiles::stats() const {
  const auto load = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  ViewStats stats;
  if (service_) {
    stats.backend = std::string(service_->backend_name());
    stats.service = service_->stats();
    stats.cuda = view::cuda_backend_info(service_->backend());
  }
  stats.specs = registry_.size();
  stats.rendered = stats.service.rendered;
  stats.render_errors = load(render_errors_);
  stats.header_reads = load(header_reads_);
  stats.bytes_read = load(bytes_read_);
  stats.render_seconds = static_cast<double>(load(render_ns_)) / 1e9;
  stats.fetch_seconds = static_cast<double>(load(fetch_ns_)) / 1e9;
  stats.cache = cache_.stats();
  return stats;
}

}  // namespace dsfs::fs
