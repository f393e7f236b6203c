// A shared library in the plugin naming scheme that forgot TESSERA_PLUGIN(...).
extern "C" __attribute__((visibility("default"))) int not_the_entry() { return 1; }
