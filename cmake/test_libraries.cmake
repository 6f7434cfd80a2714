# GoogleTest and Google Benchmark: the tests need the first, the benchmark the second, and nothing
# else in the course needs either. The course runner, the stages and the Python package build
# without them, so that a learner's first command never waits on a test library.
#
# FLASH_TESTS says what to do about them:
#   OFF  (default, the README's first command): leave both out, and with them what only the tests
#        run (the exercises, the Python package's library, the variant programs: CMakeLists.txt),
#        so that the first build compiles the runner and the stages and nothing else.
#   ON   (the README's test command): the system's library where there is one, else the release
#        pinned below, downloaded once at configure time. Offline, configure stops and names what
#        to install.
#   AUTO: the tests and the benchmark where the system has the library, never downloaded; left out,
#        said in one configure message, where it does not.
# Sets FLASH_HAVE_GTEST and FLASH_HAVE_BENCHMARK for the top-level CMakeLists.txt.
#
# The pins: releases whose archives' SHA-256 are fixed, so a fetch is as reproducible as a package.
# Both build with CMake alone; once a build directory has them, nothing is downloaded again.
set(FLASH_GTEST_VERSION 1.14.0)
set(FLASH_GTEST_URL https://github.com/google/googletest/archive/refs/tags/v${FLASH_GTEST_VERSION}.tar.gz)
set(FLASH_GTEST_SHA256 8ad598c73ad796e0d8280b082cebd82a630d73e73cd3c70057938a6501bba5d7)
set(FLASH_BENCHMARK_VERSION 1.8.3)
set(FLASH_BENCHMARK_URL https://github.com/google/benchmark/archive/refs/tags/v${FLASH_BENCHMARK_VERSION}.tar.gz)
set(FLASH_BENCHMARK_SHA256 6bc180a57d23d4d9515519f92b0c83d61b05b5bab188961f36ac7b06b0d9e9ce)

set(FLASH_TESTS OFF CACHE STRING "Tests and benchmark: OFF, ON (fetch GoogleTest / Google Benchmark when missing), AUTO (where the system has them)")
set_property(CACHE FLASH_TESTS PROPERTY STRINGS OFF ON AUTO)
string(TOUPPER "${FLASH_TESTS}" flash_tests_mode)
if(NOT flash_tests_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "FLASH_TESTS=${FLASH_TESTS}: must be AUTO, ON or OFF")
endif()

# What to install where, per library, for the message when neither the system nor a fetch has it:
# the package names of Debian/Ubuntu, Fedora, Homebrew and conda-forge, in that order.
set(flash_packages_gtest libgtest-dev gtest-devel googletest gtest)
set(flash_packages_benchmark libbenchmark-dev google-benchmark-devel google-benchmark benchmark)

set(FLASH_HAVE_GTEST OFF)
set(FLASH_HAVE_BENCHMARK OFF)
if(flash_tests_mode STREQUAL "OFF")
  message(STATUS "flash-stages: the tests, the benchmark and the exercises left out; the runner and the "
                 "stages do not need them. The README's test command (-DFLASH_TESTS=ON) builds them.")
  return()
endif()

# The system's first: a CMake package (Debian's, vcpkg's, conda's) of either library. A failed search
# is not cached as final, so installing a library and configuring again finds it.
find_package(GTest CONFIG QUIET)
find_package(benchmark CONFIG QUIET)
set(FLASH_HAVE_GTEST ${GTest_FOUND})
set(FLASH_HAVE_BENCHMARK ${benchmark_FOUND})

if(flash_tests_mode STREQUAL "AUTO")
  set(left_out "")
  if(NOT FLASH_HAVE_GTEST)
    list(APPEND left_out "the tests (GoogleTest not found)")
  endif()
  if(NOT FLASH_HAVE_BENCHMARK)
    list(APPEND left_out "the benchmark (Google Benchmark not found)")
  endif()
  if(left_out)
    list(JOIN left_out " and " left_out)
    message(STATUS "flash-stages: ${left_out} left out; the runner and the stages do not need them. "
                   "The README's test command (-DFLASH_TESTS=ON) fetches what is missing.")
  endif()
  return()
endif()

# FLASH_TESTS=ON: fetch what the system lacks. FetchContent would stop configure with its own build
# log on a failed download; downloading the archive here first lets an offline machine get a
# message that says what to install instead. The download is checked against its SHA-256 after it
# succeeds, not by file(DOWNLOAD EXPECTED_HASH), which reports a failed download as a hash mismatch
# error of its own before that message.
include(FetchContent)

# flash_fetch(<name> <url> <sha256> <result-var>): makes <name>'s CMake targets available from the
# pinned archive; sets <result-var> to ON, or to OFF with the reason in <result-var>_WHY.
function(flash_fetch name url sha256 result)
  string(TOUPPER ${name} upper)
  set(archive ${FETCHCONTENT_BASE_DIR}/${name}.tar.gz)
  if(FETCHCONTENT_SOURCE_DIR_${upper})
    # The user pointed FetchContent at a copy of the sources: nothing to download.
    message(STATUS "flash-stages: ${name} from FETCHCONTENT_SOURCE_DIR_${upper}=${FETCHCONTENT_SOURCE_DIR_${upper}}")
  elseif(EXISTS ${FETCHCONTENT_BASE_DIR}/${name}-src/CMakeLists.txt)
    # Fetched by an earlier configure of this build directory.
  elseif(FETCHCONTENT_FULLY_DISCONNECTED)
    set(${result}_WHY "not downloaded: FETCHCONTENT_FULLY_DISCONNECTED is ON" PARENT_SCOPE)
    set(${result} OFF PARENT_SCOPE)
    return()
  elseif(flash_download_failed)
    # Offline, a second try would only wait for its own timeout before the same message.
    set(${result}_WHY "not downloaded: the download before it failed" PARENT_SCOPE)
    set(${result} OFF PARENT_SCOPE)
    return()
  else()
    message(STATUS "flash-stages: downloading ${name} from ${url}")
    file(DOWNLOAD ${url} ${archive} INACTIVITY_TIMEOUT 30 STATUS status)
    list(GET status 0 code)
    if(code EQUAL 0)
      file(SHA256 ${archive} actual)
      if(NOT actual STREQUAL sha256)
        set(code -1)
        set(why "its SHA-256 is ${actual}, not the pinned ${sha256}")
      endif()
    else()
      list(GET status 1 why)
    endif()
    if(NOT code EQUAL 0)
      file(REMOVE ${archive})
      set(flash_download_failed ON PARENT_SCOPE)
      set(${result}_WHY "download of ${url} failed: ${why}" PARENT_SCOPE)
      set(${result} OFF PARENT_SCOPE)
      return()
    endif()
  endif()
  # The archive is local now: FetchContent only unpacks it.
  FetchContent_Declare(${name} URL ${archive} URL_HASH SHA256=${sha256} DOWNLOAD_EXTRACT_TIMESTAMP ON)
  FetchContent_MakeAvailable(${name})
  set(${result} ON PARENT_SCOPE)
endfunction()

set(missing_names "")
set(missing_packages "")
set(fetch_error "")
if(NOT FLASH_HAVE_GTEST)
  # Only the library: no GoogleMock, nothing installed with our build.
  set(BUILD_GMOCK OFF CACHE BOOL "")
  set(INSTALL_GTEST OFF CACHE BOOL "")
  flash_fetch(googletest ${FLASH_GTEST_URL} ${FLASH_GTEST_SHA256} FLASH_HAVE_GTEST)
  if(FLASH_HAVE_GTEST)
    message(STATUS "flash-stages: GoogleTest built from its sources (none on this system)")
  else()
    list(APPEND missing_names "GoogleTest")
    list(APPEND missing_packages gtest)
    set(fetch_error "${FLASH_HAVE_GTEST_WHY}")  # the first failure: the others follow from it
  endif()
endif()
if(NOT FLASH_HAVE_BENCHMARK)
  # The library only: its own tests would want GoogleTest, and -Werror would tie it to one compiler.
  set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "")
  set(BENCHMARK_ENABLE_INSTALL OFF CACHE BOOL "")
  set(BENCHMARK_ENABLE_WERROR OFF CACHE BOOL "")
  set(BENCHMARK_INSTALL_DOCS OFF CACHE BOOL "")
  flash_fetch(benchmark ${FLASH_BENCHMARK_URL} ${FLASH_BENCHMARK_SHA256} FLASH_HAVE_BENCHMARK)
  if(FLASH_HAVE_BENCHMARK)
    message(STATUS "flash-stages: Google Benchmark built from its sources (none on this system)")
  else()
    list(APPEND missing_names "Google Benchmark")
    list(APPEND missing_packages benchmark)
    if(NOT fetch_error)
      set(fetch_error "${FLASH_HAVE_BENCHMARK_WHY}")
    endif()
  endif()
endif()
if(missing_names)
  # One line per package manager, naming only what is missing.
  set(install "")
  set(commands "apt-get install" "dnf install" "brew install" "conda install -c conda-forge")
  set(systems "Debian, Ubuntu" "Fedora" "macOS" "conda")
  foreach(index RANGE 3)
    list(GET commands ${index} line)
    foreach(lib IN LISTS missing_packages)
      list(GET flash_packages_${lib} ${index} name)
      string(APPEND line " ${name}")
    endforeach()
    list(GET systems ${index} system)
    string(APPEND install "    ${system}: ${line}\n")
  endforeach()
  list(JOIN missing_names " and " missing_names)
  message(FATAL_ERROR
          "flash-stages: the tests need ${missing_names}, which this system does not have and which "
          "could not be fetched (${fetch_error}).\n"
          "Install them with one of\n${install}"
          "and configure again. Or build the course without tests: leave out -DFLASH_TESTS=ON\n"
          "    cmake -S . -B build -DFLASH_TESTS=OFF")
endif()
