// The one unit of the precompiled-header carriers (cmake/TesseraPch.cmake). It compiles the
// precompiled LibTorch headers; the targets that reuse them hold the code.
