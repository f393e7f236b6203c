#include "tessera/components/adapter.hpp"

#include "tessera/error.hpp"

namespace tessera {

Adapter::~Adapter() = default;

PeftExport Adapter::peft_export(const Model&, const StateDict&, const std::string&) const {
  throw Error("this adapter has no PEFT format; use checkpoint.export_format: tessera or hf");
}

void Adapter::merge(StateDict&) const {
  throw Error("this adapter cannot be merged into the base weights; use checkpoint.export_format: tessera");
}

}  // namespace tessera
