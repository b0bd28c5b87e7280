// Issue 32 (WEAK, durability and leftovers): a 20 MB pickle drove the unpickler to 3.3 GB before it was
// refused. The unpickler now counts the memory of the values it builds (lib/io/pickle/unpickler.h:
// 64 MiB + 48 x the pickle's size) and refuses past it, naming the file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

#include "core/error.h"
#include "io/pickle/unpickler.h"

namespace pickle_memory_test {

namespace {
// Exit status and peak resident memory (kB) of `f` run in a child process.
int in_child(const std::function<int()>& f, long* max_rss_kb) {
  const pid_t pid = fork();
  if (pid == 0) _exit(f());
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  *max_rss_kb = ru.ru_maxrss;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
}  // namespace

// 20 MB of pickle: a list, then 10 million (EMPTY_DICT, APPEND) pairs. Before: no refusal at all, the
// list of ten million dicts built (about 3 GB); now refused once the values built pass the budget.
TEST(PickleMemory, DictFloodIsRefusedWithinTheBudget) {
  std::string pkl = "\x80\x02]";
  for (int i = 0; i < 10'000'000; ++i) pkl += "}a";
  pkl += '.';
  long rss = 0;
  const int rc = in_child(
      [&] {
        try {
          ucpkit::pickle::unpickle({reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size()}, "flood/data.pkl");
        } catch (const ucpkit::Error& e) {
          const std::string what = e.what();
          return what.rfind("flood/data.pkl: pickle: the values it builds take more than", 0) == 0 ? 0 : 4;
        }
        return 3;  // accepted
      },
      &rss);
  EXPECT_EQ(rc, 0) << "3: accepted, 4: another error";
  EXPECT_LT(rss, 1400L * 1024) << "peak kB";  // budget 64 MiB + 48 x 20 MB = 1,024 MB of values, plus the input
}

// The same shape at a size real pickles have (a list of 100,000 dicts, 200 kB) is read.
TEST(PickleMemory, OrdinarySizesAreRead) {
  std::string pkl = "\x80\x02]";
  for (int i = 0; i < 100'000; ++i) pkl += "}a";
  pkl += '.';
  const auto v = ucpkit::pickle::unpickle({reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size()}, "ok.pkl");
  EXPECT_EQ(v->items.size(), 100'000u);
}

}  // namespace pickle_memory_test
