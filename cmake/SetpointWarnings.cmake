# Warning flags live on an INTERFACE target that setpoint's own targets link
# PRIVATE, so they never leak into users' builds (no CMAKE_CXX_FLAGS edits).
# The installed libraries link it as $<BUILD_INTERFACE:setpoint_warnings>:
# a static library's private links are still named in its export, and this
# keeps the target (and -Werror) out of setpointTargets.cmake altogether.
# -Werror comes with SETPOINT_WERROR, on by default only when setpoint is the
# top-level project.
add_library(setpoint_warnings INTERFACE)
target_compile_options(setpoint_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Woverloaded-virtual -Wimplicit-fallthrough
  $<$<CXX_COMPILER_ID:Clang>:-Wthread-safety>
  # GCC 12 reports false "may be used uninitialized" for std::function members
  # of options structs built with designated initializers (at -O2 and above).
  # Clang's -Wuninitialized and the sanitizer presets still cover this.
  # Users who build with -Wall on GCC 12 see the same false reports from
  # setpoint's headers and can add the same flag (README.md says so).
  $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>
  $<$<BOOL:${SETPOINT_WERROR}>:-Werror>)
