# tessera_add_plugin(NAME SOURCES ... [LIBRARIES ...]): builds one plugin as its own shared
# library, libtessera_<NAME>.so in ${TESSERA_PLUGIN_OUTPUT_DIR}, with hidden visibility so only
# the entry symbol is exported. The target is NAME.
set(TESSERA_PLUGIN_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/plugin.map CACHE INTERNAL "")

function(tessera_add_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBRARIES" ${ARGN})
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE tessera::sdk ${ARG_LIBRARIES})
  set_target_properties(${name} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "tessera_${name}"
    LIBRARY_OUTPUT_DIRECTORY ${TESSERA_PLUGIN_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  # Hidden visibility still leaves weak template instances exported; the version script
  # leaves exactly the entry symbol.
  target_link_options(${name} PRIVATE "-Wl,--version-script=${TESSERA_PLUGIN_VERSION_SCRIPT}")
  set_property(GLOBAL APPEND PROPERTY TESSERA_PLUGINS ${name})
endfunction()
