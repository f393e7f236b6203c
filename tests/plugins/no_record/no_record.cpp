// A shared library in the plugin naming scheme without a build record: built without
// TESSERA_PLUGIN, or against an SDK older than the record (ABI 3 and before).
extern "C" __attribute__((visibility("default"))) int not_a_plugin() { return 1; }
