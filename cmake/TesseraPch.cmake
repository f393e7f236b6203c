# Precompiled LibTorch headers for the in-tree build (option TESSERA_PCH).
#
# Parsing <ATen/ATen.h> and <torch/nn/module.h> is 7-10 s of every translation unit that reaches
# them, most of the ~20 s such a unit takes here; precompiled once, a unit loads them in well
# under a second. Carrier targets hold the precompiled header, because a compiler refuses one
# made with other code-generation flags: tessera_pch_library for libraries (-fPIC),
# tessera_pch_hidden (clang only) for libraries and plugins compiled with -fvisibility=hidden
# (clang refuses a header precompiled with another visibility; GCC accepts it, and they take the
# library carrier), tessera_pch_executable for programs (-fPIE). Every other target reuses one of them (REUSE_FROM), which works because the
# whole build shares its other code-generation flags (optimisation, debug info, sanitizers);
# definitions may differ as long as LibTorch's headers don't read them. The SDK, the engine and
# the host binary use them too, in every preset (the fuzz preset's clang included): a build from
# a clean clone with an empty compiler cache, as CI's, parses the headers once per carrier.
#
# ccache caches the precompiled header itself and, with CCACHE_SLOPPINESS pch_defines and
# time_macros (set on the launcher in the top-level CMakeLists.txt), the units that use it; clang
# writes no timestamp into it (-fno-pch-timestamp) so that ccache can.
# Plugins built out of tree through find_package(Tessera) never see these targets.
set(TESSERA_PCH_HEADERS <ATen/ATen.h> <torch/nn/module.h>)

# GCC accepts a header precompiled without hidden visibility in units compiled with it (clang
# refuses), so under GCC the plugins share the libraries' carrier: parsing the headers costs
# about 55 s a carrier in a cold build here. -fPIC against -fPIE it refuses too.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(_tessera_pch_kinds library executable)
else()
  set(_tessera_pch_kinds library hidden executable)
endif()
if(TESSERA_PCH)
  foreach(_kind IN LISTS _tessera_pch_kinds)
    add_library(tessera_pch_${_kind} OBJECT ${CMAKE_CURRENT_LIST_DIR}/pch/carrier.cpp)
    target_link_libraries(tessera_pch_${_kind} PRIVATE ${TORCH_LIBRARIES})
    target_precompile_headers(tessera_pch_${_kind} PRIVATE ${TESSERA_PCH_HEADERS})
    if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
      target_compile_options(tessera_pch_${_kind} PRIVATE -Xclang -fno-pch-timestamp)
    endif()
  endforeach()
  if(TARGET tessera_pch_hidden)
    set_target_properties(tessera_pch_hidden PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  endif()
  if(TARGET tessera_pch_executable)
    # Programs are compiled as position-independent executables (CMAKE_POSITION_INDEPENDENT_CODE).
    set_target_properties(tessera_pch_executable PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(tessera_pch_executable PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
  endif()
endif()

# The units that reach no LibTorch header (cmake/torch_free_units.py) skip the precompiled one:
# GCC spends about 2.5 s loading its 500 MB in every unit, for nothing when the unit never names
# a tensor (about 55 units: the config reader, the CLI, the tokenizer's BPE, the SDK's registry
# and schemas, ...). Scanned at each configure; a unit that starts including LibTorch later only
# compiles slower until the next configure.
if(TESSERA_PCH)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/torch_free_units.py ${PROJECT_SOURCE_DIR}
            ${PROJECT_SOURCE_DIR}/sdk/include ${PROJECT_SOURCE_DIR}/core/include
            ${PROJECT_SOURCE_DIR}/core/tooling/include
            ${PROJECT_SOURCE_DIR}/tests/support
    OUTPUT_VARIABLE _torch_free RESULT_VARIABLE _scan_failed)
  if(_scan_failed)
    message(FATAL_ERROR "cmake/torch_free_units.py failed (${_scan_failed})")
  endif()
  string(REPLACE "\n" ";" TESSERA_TORCH_FREE_UNITS "${_torch_free}")
endif()

# tessera_use_pch(TARGET...): compile each target's units with the precompiled LibTorch headers,
# but for those that reach no LibTorch header. Only for targets that link LibTorch (their flags
# and definitions match the carriers').
function(tessera_use_pch)
  if(NOT TESSERA_PCH)
    return()
  endif()
  foreach(_target IN LISTS ARGN)
    get_target_property(_type ${_target} TYPE)
    get_target_property(_visibility ${_target} CXX_VISIBILITY_PRESET)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # GCC skips a precompiled header it finds unusable in silence: say so instead.
      target_compile_options(${_target} PRIVATE -Winvalid-pch)
    endif()
    if(_type STREQUAL "EXECUTABLE")
      target_precompile_headers(${_target} REUSE_FROM tessera_pch_executable)
    elseif(_visibility STREQUAL "hidden" AND TARGET tessera_pch_hidden)
      target_precompile_headers(${_target} REUSE_FROM tessera_pch_hidden)
    else()
      target_precompile_headers(${_target} REUSE_FROM tessera_pch_library)
    endif()
    get_target_property(_sources ${_target} SOURCES)
    get_target_property(_source_dir ${_target} SOURCE_DIR)
    foreach(_source IN LISTS _sources)
      if(_source MATCHES "^\\$<")
        continue()
      endif()
      cmake_path(ABSOLUTE_PATH _source BASE_DIRECTORY ${_source_dir} NORMALIZE)
      if(_source IN_LIST TESSERA_TORCH_FREE_UNITS)
        set_source_files_properties(${_source} TARGET_DIRECTORY ${_target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
      endif()
    endforeach()
  endforeach()
endfunction()
