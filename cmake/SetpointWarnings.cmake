# Warning flags live on an INTERFACE target that setpoint's own targets link
# PRIVATE, so they never leak into users' builds (no CMAKE_CXX_FLAGS edits).
add_library(setpoint_warnings INTERFACE)
target_compile_options(setpoint_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Woverloaded-virtual -Wimplicit-fallthrough
  $<$<CXX_COMPILER_ID:Clang>:-Wthread-safety>
  $<$<BOOL:${SETPOINT_WERROR}>:-Werror>)
