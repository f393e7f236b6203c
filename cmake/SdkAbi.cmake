# The mechanical SDK ABI check: the public SDK headers (sdk/include/tessera/**.hpp) may only change
# together with TESSERA_SDK_ABI_VERSION. sdk/abi_versions.txt records, for each ABI version, a
# SHA-256 of the headers with comments removed and runs of white space folded to one space (so
# documentation edits and re-indentation need no bump; `int* x` -> `int *x` does), and without
# the release version (TESSERA_VERSION_STRING). Run as a script:
#
#   cmake -P cmake/SdkAbi.cmake                 check (the build runs this; fails on a mismatch)
#   cmake -DMODE=record -P cmake/SdkAbi.cmake   record the headers for a new (bumped) version
#
# -DSDK_DIR=DIR points at another sdk/ folder (include/tessera/*.hpp and abi_versions.txt); the
# test of this check uses a copy. -DSTAMP=FILE is touched after a successful check.
cmake_minimum_required(VERSION 3.25)

if(NOT DEFINED SDK_DIR)
  get_filename_component(SDK_DIR "${CMAKE_CURRENT_LIST_DIR}/../sdk" ABSOLUTE)
endif()
if(NOT DEFINED MODE)
  set(MODE check)
endif()
set(_record_file "${SDK_DIR}/abi_versions.txt")
set(_fix "bump TESSERA_SDK_ABI_VERSION in sdk/include/tessera/version.hpp, then run: cmake -DMODE=record -P cmake/SdkAbi.cmake")

# The version the headers claim.
file(STRINGS "${SDK_DIR}/include/tessera/version.hpp" _line REGEX "^#define TESSERA_SDK_ABI_VERSION [0-9]+")
if(NOT _line)
  message(FATAL_ERROR "SDK ABI check: ${SDK_DIR}/include/tessera/version.hpp does not define TESSERA_SDK_ABI_VERSION")
endif()
string(REGEX REPLACE ".*TESSERA_SDK_ABI_VERSION ([0-9]+).*" "\\1" _version "${_line}")

# The hash of what the headers declare: file names and their text without comments and spacing.
# Subfolders too (tessera/parallel/...): every public header.
file(GLOB_RECURSE _headers RELATIVE "${SDK_DIR}/include/tessera" "${SDK_DIR}/include/tessera/*.hpp")
list(SORT _headers)
set(_all "")
foreach(_header IN LISTS _headers)
  file(READ "${SDK_DIR}/include/tessera/${_header}" _text)
  # Block comments, then line comments. Regular expressions do not know C++: a "//" inside a
  # string literal cuts the rest of its line from the hash, and a "/*" inside a line comment
  # would start a block; the SDK headers have neither (keep it so).
  string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" " " _text "${_text}")
  string(REGEX REPLACE "//[^\n]*" "" _text "${_text}")
  # A release changes the version string, not the ABI.
  string(REGEX REPLACE "#define TESSERA_VERSION_STRING \"[^\"]*\"" "" _text "${_text}")
  string(REGEX REPLACE "[ \t\r\n]+" " " _text "${_text}")
  string(STRIP "${_text}" _text)
  string(APPEND _all "${_header}\n${_text}\n")
endforeach()
string(SHA256 _hash "${_all}")

# Recorded versions: "VERSION SHA256" lines; '#' starts a comment.
set(_recorded "")
if(EXISTS "${_record_file}")
  file(STRINGS "${_record_file}" _lines REGEX "^[0-9]+ [0-9a-f]+$")
  foreach(_entry IN LISTS _lines)
    string(REPLACE " " ";" _pair "${_entry}")
    list(GET _pair 0 _v)
    list(GET _pair 1 _h)
    if(_v STREQUAL _version)
      set(_recorded "${_h}")
    endif()
  endforeach()
endif()

if(MODE STREQUAL "record")
  if(_recorded STREQUAL _hash)
    message(STATUS "SDK ABI ${_version} is already recorded with these headers")
  elseif(_recorded)
    message(FATAL_ERROR "SDK ABI check: version ${_version} was recorded with other headers (${_recorded}); "
                        "a released version's headers cannot be re-recorded: ${_fix}")
  else()
    file(APPEND "${_record_file}" "${_version} ${_hash}\n")
    message(STATUS "SDK ABI ${_version} recorded: ${_hash}")
  endif()
elseif(MODE STREQUAL "check")
  if(NOT _recorded)
    message(FATAL_ERROR "SDK ABI check: TESSERA_SDK_ABI_VERSION ${_version} has no recorded header hash in "
                        "${_record_file}; record it with: cmake -DMODE=record -P cmake/SdkAbi.cmake")
  endif()
  if(NOT _recorded STREQUAL _hash)
    message(FATAL_ERROR "SDK ABI check: the public SDK headers changed (hash ${_hash}) but TESSERA_SDK_ABI_VERSION "
                        "is still ${_version} (recorded with ${_recorded}): ${_fix}")
  endif()
  if(DEFINED STAMP)
    file(TOUCH "${STAMP}")
  endif()
else()
  message(FATAL_ERROR "SDK ABI check: MODE must be check or record, got ${MODE}")
endif()
