# Precompiled LibTorch headers for the in-tree build (option TESSERA_PCH).
#
# Parsing <ATen/ATen.h> and <torch/nn/module.h> is 7-10 s of every translation unit that reaches
# them, most of the ~20 s such a unit takes here; precompiled once, a unit loads them in well
# under a second. Two carrier targets hold the precompiled header, because GCC refuses one made
# with -fPIC in a unit compiled with -fPIE: tessera_pch_library for libraries and plugins,
# tessera_pch_executable for programs. Every other target reuses one of them (REUSE_FROM), which
# works because the whole build shares its other code-generation flags (optimisation, debug info,
# sanitizers); definitions may differ as long as LibTorch's headers don't read them.
#
# ccache caches the precompiled header itself and, with CCACHE_SLOPPINESS pch_defines and
# time_macros (set on the launcher in the top-level CMakeLists.txt), the units that use it.
# Plugins built out of tree through find_package(Tessera) never see these targets.
set(TESSERA_PCH_HEADERS <ATen/ATen.h> <torch/nn/module.h>)

# GCC only: the plugins compile with -fvisibility=hidden and the carriers without it, which GCC
# accepts and clang refuses ("default visibility ... differs in PCH file").
if(TESSERA_PCH AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  message(STATUS "TESSERA_PCH: off with ${CMAKE_CXX_COMPILER_ID} (the precompiled headers are made for GCC)")
  set(TESSERA_PCH OFF)
endif()

if(TESSERA_PCH)
  foreach(_kind library executable)
    add_library(tessera_pch_${_kind} OBJECT ${CMAKE_CURRENT_LIST_DIR}/pch/carrier.cpp)
    target_link_libraries(tessera_pch_${_kind} PRIVATE ${TORCH_LIBRARIES})
    target_precompile_headers(tessera_pch_${_kind} PRIVATE ${TESSERA_PCH_HEADERS})
  endforeach()
  # Programs are compiled as position-independent executables (CMAKE_POSITION_INDEPENDENT_CODE).
  set_target_properties(tessera_pch_executable PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(tessera_pch_executable PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
endif()

# tessera_use_pch(TARGET...): compile each target's units with the precompiled LibTorch headers.
# Only for targets that link LibTorch (their flags and definitions match the carriers').
function(tessera_use_pch)
  if(NOT TESSERA_PCH)
    return()
  endif()
  foreach(_target IN LISTS ARGN)
    get_target_property(_type ${_target} TYPE)
    if(_type STREQUAL "EXECUTABLE")
      target_precompile_headers(${_target} REUSE_FROM tessera_pch_executable)
    else()
      target_precompile_headers(${_target} REUSE_FROM tessera_pch_library)
    endif()
  endforeach()
endfunction()
