# Passed to horovod's CMake as CMAKE_TOOLCHAIN_FILE (CMake reads that environment variable).
# Horovod 0.28.1 hard-codes C++14, which torch >= 2.1 headers refuse. Instead of patching horovod,
# we change what "C++14" means to the compiler: see cxx_standard_override.cmake.
set(CMAKE_USER_MAKE_RULES_OVERRIDE_CXX "${CMAKE_CURRENT_LIST_DIR}/cxx_standard_override.cmake")
