# Apache Arrow and Parquet C++ for `tessera prepare-data`'s Parquet files and Hugging Face
# `datasets` folders, taken as LibTorch is from the torch wheel: the pyarrow wheel in the
# project's .venv (tools/setup.sh installs it) carries libarrow, libparquet and their headers.
# Optional: without it (TESSERA_ARROW=OFF, or no pyarrow) Tessera builds and works, and
# prepare-data says in one line what is missing when given such an input.
#
# Defines TESSERA_HAS_ARROW, and with it the imported targets tessera_arrow::arrow and
# tessera_arrow::parquet. Arrow's headers need C++20 (std::span, <bit>): only the units that
# include them (core/src/data/arrow_documents.cpp) are compiled so; their interface is C++17.
option(TESSERA_ARROW "Read Parquet and Arrow IPC inputs with the pyarrow wheel's Arrow C++" ON)
set(TESSERA_HAS_ARROW OFF)
if(TESSERA_ARROW)
  set(_arrow_python "${PROJECT_SOURCE_DIR}/.venv/bin/python3")
  if(NOT EXISTS "${_arrow_python}")
    set(_arrow_python python3)
  endif()
  execute_process(
    COMMAND ${_arrow_python} -c "import os, pyarrow; print(os.path.dirname(pyarrow.__file__)); print(pyarrow.__version__)"
    OUTPUT_VARIABLE _arrow_out OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _arrow_rc ERROR_QUIET)
  if(_arrow_rc EQUAL 0)
    string(REPLACE "\n" ";" _arrow_out "${_arrow_out}")
    list(GET _arrow_out 0 TESSERA_ARROW_DIR)
    list(GET _arrow_out 1 TESSERA_ARROW_VERSION)
    # The wheel names its libraries by ABI (libarrow.so.2600) and ships no unversioned link.
    file(GLOB _arrow_lib "${TESSERA_ARROW_DIR}/libarrow.so.[0-9]*")
    file(GLOB _parquet_lib "${TESSERA_ARROW_DIR}/libparquet.so.[0-9]*")
    if(_arrow_lib AND _parquet_lib AND EXISTS "${TESSERA_ARROW_DIR}/include/parquet/arrow/reader.h")
      list(GET _arrow_lib 0 _arrow_lib)
      list(GET _parquet_lib 0 _parquet_lib)
      foreach(_lib arrow parquet)
        add_library(tessera_arrow::${_lib} SHARED IMPORTED)
        get_filename_component(_soname "${_${_lib}_lib}" NAME)
        set_target_properties(tessera_arrow::${_lib} PROPERTIES
          IMPORTED_LOCATION "${_${_lib}_lib}" IMPORTED_SONAME "${_soname}"
          INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_ARROW_DIR}/include")
      endforeach()
      set_property(TARGET tessera_arrow::parquet PROPERTY INTERFACE_LINK_LIBRARIES tessera_arrow::arrow)
      set(TESSERA_HAS_ARROW ON)
    endif()
  endif()
endif()
if(TESSERA_HAS_ARROW)
  message(STATUS "Tessera: Apache Arrow ${TESSERA_ARROW_VERSION} from ${TESSERA_ARROW_DIR} (Parquet and Arrow inputs)")
else()
  message(STATUS "Tessera: no Apache Arrow (pyarrow in .venv): prepare-data reads text and JSON lines only")
endif()
