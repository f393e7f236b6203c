# Finds every third-party dependency once, for the SDK, the host, the plugins and the tests.
#
# LibTorch comes from the torch wheel (its CMake package under torch/share/cmake). The wheel is
# CUDA-enabled; with no GPU to probe, the architecture list must be given explicitly. CUDA is
# never initialised at run time unless a config asks for a cuda device.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for LibTorch (H100/H200)")
endif()
# Without a hint, use the project's own virtual environment (tools/setup.sh creates it).
if(NOT Torch_DIR AND NOT "${CMAKE_PREFIX_PATH}" MATCHES "torch")
  foreach(_python ${PROJECT_SOURCE_DIR}/.venv/bin/python3 python3)
    execute_process(COMMAND ${_python} -c "import torch; print(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _torch_found ERROR_QUIET)
    if(_torch_found EQUAL 0 AND EXISTS "${_torch_prefix}")
      list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
      # TorchConfig finds libc10 and libtorch with find_library, which searches the system before
      # the wheel: with Debian's libtorch-dev installed (LibTorch 1.13, setup.sh's fallback) a fresh
      # configure linked /usr/lib's libc10.so beside the wheel's, two c10 runtimes in one process
      # (LeakSanitizer's report of both one's statics). The wheel's own, named up front, are the ones.
      get_filename_component(_torch_lib "${_torch_prefix}/../../lib" ABSOLUTE)
      if(EXISTS "${_torch_lib}/libc10.so" AND EXISTS "${_torch_lib}/libtorch.so")
        set(c10_LIBRARY "${_torch_lib}/libc10.so" CACHE FILEPATH "libc10 of the torch wheel")
        set(TORCH_LIBRARY "${_torch_lib}/libtorch.so" CACHE FILEPATH "libtorch of the torch wheel")
      endif()
      break()
    endif()
  endforeach()
endif()
find_package(Torch REQUIRED)
# TorchConfig appends its own flags (e.g. -D_GLIBCXX_USE_CXX11_ABI) to CMAKE_CXX_FLAGS; keep them.
set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} ${TORCH_CXX_FLAGS}")
set(TESSERA_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR "${TORCH_LIBRARIES}" MATCHES "torch_cuda")
  set(TESSERA_TORCH_HAS_CUDA ON)
endif()
message(STATUS "Tessera: LibTorch ${Torch_VERSION}, CUDA-enabled: ${TESSERA_TORCH_HAS_CUDA}")

find_package(Boost 1.74 REQUIRED COMPONENTS program_options filesystem)
find_package(yaml-cpp REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(Threads REQUIRED)
# The tokenizers' libraries (Debian: libpcre2-dev, libsentencepiece-dev), through pkg-config.
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
