#pragma once
// A mount's live counters in the Prometheus text exposition format (version 0.0.4), served by
// `dsfs mount --metrics-listen` (fs/metrics_server.h). Rendered from the StatsSources snapshot
// that stats.json is rendered from, so the two never disagree.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fs/stats.h"
#include "prefetch/read_stats.h"

namespace dsfs::fs {

// The Content-Type of render_metrics' text.
inline constexpr std::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

// Every metric of the mount: dsfs_ prefix, base units (seconds, bytes), counters ending in
// _total, each family with # HELP and # TYPE. Figures a source keeps per dataset are labelled
// dataset="NAME"; the disk tier's appear only when the mount has one. Pure: reads the sources,
// which synchronize themselves (see StatsSources).
std::string render_metrics(const StatsSources& sources);

// A label value as the exposition format quotes it: backslash, double quote and newline
// escaped; bytes that are not UTF-8 (dataset names and endpoints are user-supplied) become
// U+FFFD, as stats.json does.
std::string escape_label_value(std::string_view value);

// The read-stall histogram's bucket bounds (le), in microseconds, ascending: 1, then 2^k and
// 3 * 2^(k-1) up to 2^26 (67 s). Each is a lower edge of a StallHistogram bucket, so the
// cumulative counts are exact (an observation counts under le when it is below it, to the
// nanosecond), at two buckets per power of two rather than all 321 of StallHistogram.
const std::vector<uint64_t>& stall_bucket_bounds_us();

// Appends `stall` as histogram family `name` (_bucket{le=...} cumulative and ending with +Inf,
// _sum in seconds, _count equal to the +Inf bucket), with its # HELP and # TYPE lines.
void append_stall_histogram(std::string& out, std::string_view name, std::string_view help,
                            const prefetch::StallHistogram& stall);

}  // namespace dsfs::fs
