// What `tessera new-plugin KIND NAME` writes for one kind (plugin_scaffold.cpp): the headers, the
// class body and the config of a small but working component. The config is a struct
// (@CLASS@Config): `members` are its fields with their defaults, `fields` the lines of its
// declare() (tessera/config/config_fields.hpp). @CLASS@, @NAME@ and @KIND@ are filled in.
#pragma once

namespace tessera::tooling {

struct KindTemplate {
  const char* includes;
  const char* interface;
  const char* body;
  const char* members;
  const char* fields;
  const char* test_node;  // the component's node in the test run spec
  // The registered factory: from the config (and the run, for a component that splits over
  // its mesh) to the component.
  const char* factory = "[](const @CLASS@Config& config) { return std::make_shared<@CLASS@>(config); }";
  // The config's bases (" : tessera::nn::DecoderFields"), whose fields it declares too.
  const char* config_bases = "";
  // Extra generated tests (CMake lines) and files (name, text) beside the plugin.
  const char* extra_tests = "";
  const char* extra_file_name = nullptr;
  const char* extra_file = nullptr;
};

// A kit model (tessera/nn/): trains under tensor, context and pipeline parallelism and fsdp, and
// its generated tests show it (model_template.cpp).
KindTemplate model_template();

}  // namespace tessera::tooling
