# Loaded by CMake right after it sets the compiler's default flags, so these win: whenever a target asks
# for CMAKE_CXX_STANDARD 14 (horovod does, twice), the compiler gets the standard that the installed torch
# headers require instead. HYDRA_DIST_CXX_STD (17 or 20) comes from scripts/setup.d/10-horovod.sh.
set(_std "$ENV{HYDRA_DIST_CXX_STD}")
if(NOT _std)
  set(_std 17)
endif()
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++${_std}")
set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++${_std}")
