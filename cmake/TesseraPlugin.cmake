# tessera_add_plugin(NAME SOURCES ...): builds one plugin as its own shared library in
# ${TESSERA_PLUGIN_OUTPUT_DIR}, with hidden visibility so only the entry symbol is exported.
function(tessera_add_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBRARIES" ${ARGN})
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE tessera::sdk ${ARG_LIBRARIES})
  set_target_properties(${name} PROPERTIES
    PREFIX "libtessera_"
    LIBRARY_OUTPUT_DIRECTORY ${TESSERA_PLUGIN_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(TESSERA_USE_PCH AND TARGET tessera_pch)
    target_precompile_headers(${name} REUSE_FROM tessera_pch)
  endif()
  set_property(GLOBAL APPEND PROPERTY TESSERA_PLUGINS ${name})
endfunction()
