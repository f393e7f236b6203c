// Numbers as people read them in a log line: printf-style values, counts with a k/M/G suffix
// (12.3k tokens/s) and durations (6m10s). Shared by the console sinks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace tessera::human {

// One value through a printf pattern, e.g. format("%.4f", loss).
inline std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

// 950, 12.3k, 4.56M, 1.20G.
inline std::string count(double value) {
  if (value >= 1e9) return format("%.2fG", value / 1e9);
  if (value >= 1e6) return format("%.2fM", value / 1e6);
  if (value >= 1e3) return format("%.1fk", value / 1e3);
  return format("%.0f", value);
}

// 25s, 6m10s, 2h05m.
inline std::string duration(double seconds) {
  const auto total = static_cast<long long>(seconds + 0.5);
  char text[64];
  if (total < 60) {
    std::snprintf(text, sizeof text, "%llds", total);
  } else if (total < 3600) {
    std::snprintf(text, sizeof text, "%lldm%02llds", total / 60, total % 60);
  } else {
    std::snprintf(text, sizeof text, "%lldh%02lldm", total / 3600, total / 60 % 60);
  }
  return text;
}

}  // namespace tessera::human
