// formats/deepspeed/storage_tags: a GPU run's files name "cuda:N" storages (tests/formats/fixtures.py
// gpt_tp2pp2dp2_gpu, torch.save of tensors on a device); tag_storages_cpu re-tags each storage once,
// however often it is referenced, and the file written back is the same but for those tags.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/storage_tags.h"
#include "io/torch/torch_file.h"

namespace deepspeed_storage_tags_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;

namespace {

// Every storage reachable from `v` (tensors in dicts, lists, tuples, objects' state).
void storages(const pickle::ValuePtr& v, std::set<const Storage*>& out) {
  if (!v) return;
  if (v->kind == pickle::Kind::Tensor && v->tensor && v->tensor->storage()) out.insert(v->tensor->storage().get());
  for (const auto& [k, x] : v->entries) storages(x, out);
  for (const auto& x : v->items) storages(x, out);
  storages(v->dict_state, out);
  if (v->kind == pickle::Kind::Object && v->object) {
    storages(v->object->args, out);
    storages(v->object->state, out);
  }
}

}  // namespace

TEST(StorageTags, GpuFilesRetaggedOncePerStorage) {
  size_t files = 0;
  for (const char* part : {"optim_states.pt", "model_states.pt"})
    for (const auto& path : fx::files_with("gpt_tp2pp2dp2_gpu", part)) {
      SCOPED_TRACE(path);
      const TorchFile f = load_torch_file(path);
      std::set<const Storage*> all;
      storages(f.root, all);
      size_t on_gpu = 0;
      for (const auto* s : all) on_gpu += s->location.rfind("cuda:", 0) == 0;
      const std::string before = fx::saved(f.root, "before.pt");
      EXPECT_EQ(ds::tag_storages_cpu(f.root), on_gpu);
      for (const auto* s : all) EXPECT_EQ(s->location, "cpu");
      EXPECT_EQ(ds::tag_storages_cpu(f.root), 0u);  // nothing left to re-tag
      // Written back and read again: as many storages, every one "cpu" now.
      const std::string after = fx::saved(f.root, "after.pt");
      if (on_gpu) EXPECT_NE(after, before);
      const std::string back_path = fx::scratch_path("after_read.pt");
      save_torch_file(back_path, f.root);
      const TorchFile back = load_torch_file(back_path);
      std::set<const Storage*> reread;
      storages(back.root, reread);
      EXPECT_EQ(reread.size(), all.size());
      for (const auto* s : reread) EXPECT_EQ(s->location, "cpu");
      files += on_gpu > 0;
    }
  EXPECT_GT(files, 0u);  // fixtures.py: device_tags=True
}

}  // namespace deepspeed_storage_tags_test
