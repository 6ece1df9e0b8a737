#include "engine/model/gguf.h"
#include "tests/test_support.h"
TEST(Gguf, OpensStories) {
  std::string path = kvfs::testing::SharedDir() + "/models/stories260K.gguf";
  KVFS_REQUIRE_DATA(path);
  auto f = kvfs::GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
}
