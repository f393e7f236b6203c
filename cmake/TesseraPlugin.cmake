# tessera_add_plugin(NAME SOURCES ... [LIBRARIES ...])
#
# Builds one plugin: a shared library libtessera_<NAME>.so (target NAME) in
# TESSERA_PLUGIN_OUTPUT_DIR (default: <build>/plugins), compiled against the Tessera SDK with
# hidden visibility and a version script, so the entry symbol `tessera_plugin_entry` is its
# only export. `cmake --install` puts it in <prefix>/lib/tessera/plugins, where the installed
# `tessera` finds it. Used in-tree and, through find_package(Tessera), by plugins out of tree.
set(TESSERA_PLUGIN_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/plugin.map CACHE INTERNAL "")
if(NOT DEFINED TESSERA_PLUGIN_OUTPUT_DIR)
  set(TESSERA_PLUGIN_OUTPUT_DIR ${CMAKE_BINARY_DIR}/plugins)
endif()
set(TESSERA_PLUGIN_INSTALL_DIR lib/tessera/plugins CACHE STRING "Where plugins are installed")

function(tessera_add_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "tessera_add_plugin(${name}): no SOURCES given")
  endif()
  if(TARGET Tessera::sdk)
    set(sdk Tessera::sdk)
  else()
    set(sdk tessera::sdk)
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${sdk} ${ARG_LIBRARIES})
  set_target_properties(${name} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "tessera_${name}"
    LIBRARY_OUTPUT_DIRECTORY ${TESSERA_PLUGIN_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN/../..;${TORCH_INSTALL_PREFIX}/lib")
  # Hidden visibility still leaves weak template instances exported; the version script
  # leaves exactly the entry symbol.
  target_link_options(${name} PRIVATE "-Wl,--version-script=${TESSERA_PLUGIN_VERSION_SCRIPT}")
  set_property(TARGET ${name} APPEND PROPERTY LINK_DEPENDS ${TESSERA_PLUGIN_VERSION_SCRIPT})
  install(TARGETS ${name} LIBRARY DESTINATION ${TESSERA_PLUGIN_INSTALL_DIR})
  set_property(GLOBAL APPEND PROPERTY TESSERA_PLUGINS ${name})
  # In-tree only: the precompiled LibTorch headers of cmake/TesseraPch.cmake.
  if(COMMAND tessera_use_pch)
    tessera_use_pch(${name})
  endif()
endfunction()
