// Tests for setpoint/base/logging.h.
#include "setpoint/base/logging.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/ringbuffer_sink.h"

namespace setpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class LoggingTest : public ::testing::Test {
 protected:
  LoggingTest() {
    sink_->set_formatter(std::make_unique<spdlog::pattern_formatter>(
        "%l %s %v", spdlog::pattern_time_type::local, /*eol=*/""));
  }

  // Counts how often a log argument was evaluated.
  int Counted() { return ++evaluated_; }

  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_ =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  std::shared_ptr<spdlog::logger> logger_ =
      std::make_shared<spdlog::logger>("test", sink_);
  int evaluated_ = 0;
};

TEST_F(LoggingTest, LinesBelowTheLoggersLevelAreNotFormattedNorEvaluated) {
  logger_->set_level(spdlog::level::info);
  SETPOINT_LOG_DEBUG(logger_, "debug line n={}", Counted());
  SETPOINT_LOG_TRACE(logger_, "trace line n={}", Counted());
  EXPECT_THAT(sink_->last_formatted(), IsEmpty());
  EXPECT_EQ(evaluated_, 0);
}

TEST_F(LoggingTest, LinesAtTheLoggersLevelCarryLevelAndSourceFile) {
  logger_->set_level(spdlog::level::trace);
  SETPOINT_LOG_DEBUG(logger_, "debug line n={}", Counted());
  SETPOINT_LOG_TRACE(logger_, "trace line n={}", Counted());
  SETPOINT_LOG_DEBUG(logger_.get(), "through a plain pointer");
  EXPECT_THAT(sink_->last_formatted(),
              ElementsAre("debug logging_test.cc debug line n=1",
                          "trace logging_test.cc trace line n=2",
                          "debug logging_test.cc through a plain pointer"));
}

TEST_F(LoggingTest, DebugLinesShowAtDebugButTraceLinesDoNot) {
  logger_->set_level(spdlog::level::debug);
  SETPOINT_LOG_DEBUG(logger_, "shown");
  SETPOINT_LOG_TRACE(logger_, "hidden n={}", Counted());
  EXPECT_THAT(sink_->last_formatted(),
              ElementsAre("debug logging_test.cc shown"));
  EXPECT_EQ(evaluated_, 0);
}

TEST_F(LoggingTest, ALoggersBacktraceKeepsLinesBelowItsLevel) {
  logger_->set_level(spdlog::level::info);
  logger_->enable_backtrace(4);
  SETPOINT_LOG_DEBUG(logger_, "kept for later n={}", Counted());
  EXPECT_THAT(sink_->last_formatted(), IsEmpty());
  logger_->dump_backtrace();
  EXPECT_EQ(evaluated_, 1);
  EXPECT_THAT(sink_->last_formatted(),
              ::testing::Contains("debug logging_test.cc kept for later n=1"));
}

}  // namespace
}  // namespace setpoint
