#include "replay/log_reader.h"

#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice::replay {
namespace {

std::string TempPath(const std::string& name) { return testing::TempDir() + "/" + name; }

void WritePlain(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void WriteGzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  gzclose(f);
}

std::vector<std::string> ReadAll(LineReader& in, std::vector<bool>* too_long = nullptr) {
  std::vector<std::string> lines;
  std::string_view line;
  while (in.Next(line)) {
    lines.emplace_back(line);
    if (too_long != nullptr) too_long->push_back(in.too_long());
  }
  return lines;
}

TEST(ReplayLineReader, ReadsPlainAndGzipAlike) {
  std::string text;
  for (int i = 0; i < 100'000; ++i) text += "line " + std::to_string(i) + "\n";  // > one buffer
  text += "last, without a newline";
  for (bool gzip : {false, true}) {
    const std::string path = TempPath(gzip ? "log.gz" : "log.txt");
    if (gzip) {
      WriteGzip(path, text);
    } else {
      WritePlain(path, text);
    }
    absl::StatusOr<std::unique_ptr<LineReader>> in = LineReader::Open(path);
    ASSERT_TRUE(in.ok()) << in.status();
    const std::vector<std::string> lines = ReadAll(**in);
    ASSERT_EQ(lines.size(), 100'001u) << (gzip ? "gzip" : "plain");
    EXPECT_EQ(lines[0], "line 0");
    EXPECT_EQ(lines[99'999], "line 99999");
    EXPECT_EQ(lines.back(), "last, without a newline");
    EXPECT_TRUE((*in)->status().ok());
    EXPECT_EQ((*in)->line_number(), 100'001);
    EXPECT_GT((*in)->size(), 0);
    EXPECT_EQ((*in)->position(), (*in)->size());
    std::remove(path.c_str());
  }
}

TEST(ReplayLineReader, SkipsRunawayLinesWithoutHoldingThem) {
  const std::string path = TempPath("long.txt");
  WritePlain(path, "a\n" + std::string(kMaxLineBytes + 1, 'x') + "\nb\n" +
                       std::string(3 << 20, 'y') + "\nc\n");
  absl::StatusOr<std::unique_ptr<LineReader>> in = LineReader::Open(path);
  ASSERT_TRUE(in.ok());
  std::vector<bool> too_long;
  const std::vector<std::string> lines = ReadAll(**in, &too_long);
  EXPECT_THAT(lines, testing::ElementsAre("a", "", "b", "", "c"));
  EXPECT_THAT(too_long, testing::ElementsAre(false, true, false, true, false));
  std::remove(path.c_str());
}

TEST(ReplayLineReader, ADamagedGzipEndsWithAnError) {
  std::string text;
  for (int i = 0; i < 50'000; ++i) text += "request " + std::to_string(i * 7919) + "\n";
  const std::string path = TempPath("cut.gz");
  WriteGzip(path, text);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  WritePlain(path, bytes.substr(0, bytes.size() / 2));  // cut in the middle
  absl::StatusOr<std::unique_ptr<LineReader>> in = LineReader::Open(path);
  ASSERT_TRUE(in.ok());
  const std::vector<std::string> lines = ReadAll(**in);
  EXPECT_GT(lines.size(), 0u);
  EXPECT_LT(lines.size(), 50'001u);
  EXPECT_TRUE(absl::IsDataLoss((*in)->status())) << (*in)->status();
  std::remove(path.c_str());
}

TEST(ReplayLineReader, MissingFileIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(LineReader::Open(TempPath("no-such.log")).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(LineReader::Open(testing::TempDir()).status()));
}

}  // namespace
}  // namespace sluice::replay
