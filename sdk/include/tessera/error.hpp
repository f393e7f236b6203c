// Error types that cross the plugin boundary. ConfigError is a user mistake (exit code 2);
// Error is a failure at run time (exit code 1).
#pragma once

#include <stdexcept>
#include <string>

#include "tessera/export.hpp"

namespace tessera {

class TESSERA_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~Error() override;
};

// Thrown by a factory or plugin when a config value is wrong. The host adds the file, line,
// column and config path of the component being built, so the message says only what is wrong.
class TESSERA_API ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message, std::string field = {});
  ~ConfigError() override;
  // The config field the message is about (relative to the component's config), or empty.
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

}  // namespace tessera
