// jemalloc's options for the tools, read by jemalloc as it starts (compiled in only when the tools link jemalloc:
// apps/CMakeLists.txt); MALLOC_CONF in the environment still overrides them.
// oversize_threshold:0: allocations of 8 MiB and more stay in the arenas of the rest, whose freed memory is kept a
// while and used again, instead of jemalloc's arena for them that gives freed memory back at once (a 100,000-tensor
// DCP rewrite's `.metadata` parse, pickle and plan: each phase faulted its pages in afresh, the most expensive thing
// this VM kind does; 0.475 -> 0.435 s median, the same peak RSS). Transparent huge pages for all arenas
// (thp:always) were slower here (0.585 s): docs/notes/whole-checkpoints.md, twenty-sixth session.
extern "C" {
extern const char* malloc_conf;
const char* malloc_conf = "oversize_threshold:0";
}
