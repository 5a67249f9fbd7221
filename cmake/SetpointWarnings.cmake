# Warning flags live on an INTERFACE target that setpoint's own targets link
# PRIVATE, so they never leak into users' builds (no CMAKE_CXX_FLAGS edits).
add_library(setpoint_warnings INTERFACE)
target_compile_options(setpoint_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Woverloaded-virtual -Wimplicit-fallthrough
  $<$<CXX_COMPILER_ID:Clang>:-Wthread-safety>
  # GCC 12 reports false "may be used uninitialized" for std::function members
  # of options structs built with designated initializers (at -O2 and above).
  # Clang's -Wuninitialized and the sanitizer presets still cover this.
  $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>
  $<$<BOOL:${SETPOINT_WERROR}>:-Werror>)
