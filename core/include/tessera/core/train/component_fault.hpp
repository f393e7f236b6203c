// A plugin's failure during training, named for the user: which component, in which event, at
// which step ("callback/sample_text (components.callbacks[3]) failed in on_step_end at step 40:
// ..."). The trainer runs every call into a component through in_component().
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "tessera/error.hpp"

namespace tessera::core {

class ComponentFault : public Error {
 public:
  ComponentFault(std::string component, std::string event, std::int64_t step, const std::string& what)
      : Error(component + " failed in " + event + " at step " + std::to_string(step) + ": " + what),
        component_(std::move(component)),
        event_(std::move(event)),
        step_(step) {}
  const std::string& component() const { return component_; }
  const std::string& event() const { return event_; }
  std::int64_t step() const { return step_; }

 private:
  std::string component_, event_;
  std::int64_t step_;
};

// Runs `call`; an exception from it (other than a ComponentFault already named) becomes a
// ComponentFault. LibTorch's errors lose their C++ backtrace: the message is for a user.
template <class Call>
decltype(auto) in_component(const std::string& component, const char* event, std::int64_t step, Call&& call) {
  try {
    return call();
  } catch (const ComponentFault&) {
    throw;
  } catch (const c10::Error& e) {
    throw ComponentFault(component, event, step, e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw ComponentFault(component, event, step, e.what());
  }
}

}  // namespace tessera::core
