#include "roll/common/logging.h"

#include <vector>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace roll {

absl::Status InitLogging(std::string_view tag, std::string_view level, const std::string& file) {
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level '", Sv(level), "' is not one of trace, debug, info, warn, error"));
  }
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (!file.empty()) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file));
    } catch (const spdlog::spdlog_ex& e) {
      return absl::InvalidArgumentError(absl::StrCat("log file '", file, "': ", e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>(std::string(tag), sinks.begin(), sinks.end());
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e [%n] %l: %v");
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

void LogInfo(std::string_view message) { spdlog::info("{}", message); }
void LogWarning(std::string_view message) { spdlog::warn("{}", message); }
void LogError(std::string_view message) { spdlog::error("{}", message); }

}  // namespace roll
