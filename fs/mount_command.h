#pragma once
#include "src/cli/common.h"

namespace dsfs::fs {
// `dsfs mount MOUNTPOINT [--dataset NAME ...] [-f] [-o opts] ...` and `dsfs umount MOUNTPOINT`.
void register_mount_commands(CLI::App& app, cli::GlobalOptions& global);

// glibc backs its malloc heap with transparent huge pages only when told so at startup
// (GLIBC_TUNABLES=glibc.malloc.hugetlb=1), and the kernel's THP in madvise mode (the common
// default) gives a heap none otherwise. The mount daemon's object buffers are that heap, so
// `dsfs mount` runs itself once more with the tunable set: call first thing in main() with the
// untouched argv when argv[1] is "mount". It returns without exec when THP is not in madvise
// mode, when the user set glibc.malloc.hugetlb already, or when exec fails. In the run after the
// exec it puts the user's GLIBC_TUNABLES back, so the processes the daemon starts inherit the
// environment the user gave.
void exec_with_huge_page_heap(char** argv);
}  // namespace dsfs::fs
