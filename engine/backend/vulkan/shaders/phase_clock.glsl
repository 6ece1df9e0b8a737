// Phase clocks (kvfs bench --phases): the NAME_clock variants of the decode path's short
// shaders (shaders.cmake: KVFS_VK_CLOCK_SHADERS), compiled with KVFS_PHASE_CLOCK, mark where
// each workgroup is in time. MarkPhase(k) has the workgroup's invocation 0 write the device's
// realtime clock and its multiprocessor's cycle counter for mark k into the dispatch's region
// of the clock buffer (set 1, bound by the Recorder at a dynamic offset per dispatch):
// workgroup w's mark k at [w * kPhaseMarks + k], workgroups past the region unrecorded; a mark
// not reached stays 0. After a barrier the whole workgroup has reached the mark; elsewhere it
// is invocation 0's progress. The marks' names are the host's (phase_clock.cpp, kMarkNames):
// keep them in step. Without KVFS_PHASE_CLOCK, MarkPhase does nothing. The shader declares
// the extensions first (#extension must come before any other token):
//   GL_EXT_shader_realtime_clock and GL_ARB_shader_clock.
const uint kPhaseMarks = 16;  // vk::PhaseClock::kMarks
#if defined(KVFS_PHASE_CLOCK)
layout(set = 1, binding = 0) buffer PhaseMarks { uvec4 phase_marks[]; };  // (realtime lo, hi; cycles lo, hi)

// (No early return: the subgroup shuffles after some marks need the invocations together again.)
void MarkPhase(uint k) {
  const uint wg = gl_WorkGroupID.x + gl_NumWorkGroups.x * (gl_WorkGroupID.y + gl_NumWorkGroups.y * gl_WorkGroupID.z);
  const uint at = wg * kPhaseMarks + k;
  if (gl_LocalInvocationIndex == 0u && at < uint(phase_marks.length())) {
    phase_marks[at] = uvec4(clockRealtime2x32EXT(), clock2x32ARB());
  }
}
#else
void MarkPhase(uint k) {}
#endif
