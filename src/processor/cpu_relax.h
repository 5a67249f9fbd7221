// CpuRelax: the processor's hint to the CPU inside a spin-wait loop, shared
// by the runner and the updater pool. Private to the library.
//
// Thread safety: any thread.
#ifndef SETPOINT_SRC_PROCESSOR_CPU_RELAX_H_
#define SETPOINT_SRC_PROCESSOR_CPU_RELAX_H_

namespace setpoint::internal {

// One pause of a spin-wait: `pause` on x86, `yield` on ARM, nothing
// elsewhere.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace setpoint::internal

#endif  // SETPOINT_SRC_PROCESSOR_CPU_RELAX_H_
