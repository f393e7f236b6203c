// Step metrics that are still on their way from the device. The trainer never waits for the
// GPU to report a step's loss: it starts a non-blocking copy of the values into pinned host
// memory, marks the copy with an event, and goes on with the next step. A MetricValue is read on
// first use: a callback that needs the value every step waits for the copy (a host
// synchronisation, the callback's choice); a sink that reads it a step later finds it arrived
// (ready()) and waits for nothing. On a CPU the copy is done at once: the code path is the same.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <ostream>

#include "tessera/export.hpp"

namespace tessera {

// A few doubles copied from the device without waiting.
class TESSERA_API AsyncValues {
 public:
  // Starts copying `values` (1-D, any device, any floating dtype) to the host as float64.
  static std::shared_ptr<const AsyncValues> copy_of(const at::Tensor& values);
  ~AsyncValues();
  // Whether the copy has landed (never waits).
  bool ready() const;
  // Value i, waiting for the copy if it has not landed.
  double at(std::size_t i) const;

 private:
  struct Impl;
  explicit AsyncValues(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class TESSERA_API MetricValue {
 public:
  MetricValue() = default;
  MetricValue(double value) : value_(value) {}  // NOLINT: implicit, a value known on the host
  MetricValue(std::shared_ptr<const AsyncValues> source, std::size_t index)
      : source_(std::move(source)), index_(index) {}

  // The value; waits for its copy when it has not landed yet.
  double value() const { return source_ ? source_->at(index_) : value_; }
  operator double() const { return value(); }  // NOLINT: reads like the double it stands for
  // Whether value() would return without waiting.
  bool ready() const { return !source_ || source_->ready(); }

 private:
  std::shared_ptr<const AsyncValues> source_;
  std::size_t index_ = 0;
  double value_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const MetricValue& v) { return os << v.value(); }

}  // namespace tessera
