#include "sluice/rate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

Rate MustParse(std::string_view text) {
  absl::StatusOr<Rate> rate = ParseRate(text);
  EXPECT_TRUE(rate.ok()) << text << ": " << rate.status();
  return rate.ok() ? *rate : Rate{};
}

std::string ErrorOf(std::string_view text) {
  absl::StatusOr<Rate> rate = ParseRate(text);
  EXPECT_FALSE(rate.ok()) << text << " parsed";
  return std::string(rate.status().message());
}

TEST(ParseRate, AcceptsTheDocumentedSpellings) {
  EXPECT_EQ(MustParse("100/s"), (Rate{100, Duration::Seconds(1)}));
  EXPECT_EQ(MustParse("40/min"), (Rate{40, Duration::Minutes(1)}));
  EXPECT_EQ(MustParse("5000/h"), (Rate{5000, Duration::Hours(1)}));
  EXPECT_EQ(MustParse("1/day"), (Rate{1, Duration::Days(1)}));
  EXPECT_EQ(MustParse("10/5s"), (Rate{10, Duration::Seconds(5)}));
  EXPECT_EQ(MustParse("3/250ms"), (Rate{3, Duration::Millis(250)}));
  EXPECT_EQ(MustParse("7/1.5s"), (Rate{7, Duration::Millis(1500)}));
  EXPECT_EQ(MustParse("2/hour"), (Rate{2, Duration::Hours(1)}));
  EXPECT_EQ(MustParse("9/100us"), (Rate{9, Duration::Micros(100)}));
}

TEST(ParseRate, ErrorsSayWhatIsWrong) {
  EXPECT_THAT(ErrorOf("100"), HasSubstr("expected LIMIT/PERIOD"));
  EXPECT_THAT(ErrorOf("/s"), HasSubstr("missing limit"));
  EXPECT_THAT(ErrorOf("10/"), HasSubstr("missing period"));
  EXPECT_THAT(ErrorOf("1.5/s"), HasSubstr("not a whole number"));
  EXPECT_THAT(ErrorOf("ten/s"), HasSubstr("not a whole number"));
  EXPECT_THAT(ErrorOf("10/fortnight"), HasSubstr("unknown unit \"fortnight\""));
  EXPECT_THAT(ErrorOf("0/s"), HasSubstr("at least 1"));
  EXPECT_THAT(ErrorOf("-5/s"), HasSubstr("must be positive"));
  EXPECT_THAT(ErrorOf("10/0s"), HasSubstr("period must be positive"));
  EXPECT_THAT(ErrorOf("1/400d"), HasSubstr("longer than the maximum"));
  EXPECT_THAT(ErrorOf("99999999999999999999/s"), HasSubstr("too large"));
  EXPECT_THAT(ErrorOf("1/0.5us"), HasSubstr("whole number of microseconds"));
}

TEST(FormatRate, RoundTrips) {
  for (std::string_view text : {"100/s", "40/min", "5000/h", "1/day", "10/5s", "3/250ms"}) {
    EXPECT_EQ(FormatRate(MustParse(text)), text);
  }
}

}  // namespace
}  // namespace sluice
