// A shader's call parameters (`p`) and workgroup id (`group_id`) for main() to use: those of the
// dispatch (JOBS 0: the push constants' Params, gl_WorkGroupID), or of one of several calls
// merged into one dispatch (JOBS 1; Ops::AttentionBatch). Merged, each call keeps the grid it
// would have alone, but its workgroups along dimension kJobsFlatDim and z are numbered one after
// another along kJobsFlatDim (call after call; z is 1): a workgroup finds its call in `jobs` by
// its number, then its (dimension, z) within that call. The other dimension is shared.
// Before including: struct Params, the constants JOBS, kJobsBinding and kJobsFlatDim (0 or 1).

layout(push_constant) uniform Push {
  Params params;  // JOBS 0: the call's; JOBS 1: unused
  uint job0;      // JOBS 1: this dispatch's first entry of `jobs`
  uint n_jobs;    // JOBS 1: its calls
} push;

struct Job {
  uint first_group;  // the call's first workgroup along kJobsFlatDim
  uint groups;       // its workgroups along kJobsFlatDim (those along z follow)
  Params params;
};
layout(binding = kJobsBinding) readonly buffer Jobs { Job jobs[]; };

Params p;
uvec3 group_id;

void LoadCall() {
  if (JOBS == 0u) {
    p = push.params;
    group_id = gl_WorkGroupID;
    return;
  }
  const uint g = kJobsFlatDim == 0u ? gl_WorkGroupID.x : gl_WorkGroupID.y;
  // The last call whose first workgroup is at most g (the calls ascend).
  uint lo = push.job0, hi = push.job0 + push.n_jobs - 1u;
  while (lo < hi) {
    const uint mid = (lo + hi + 1u) / 2u;
    if (jobs[mid].first_group <= g) {
      lo = mid;
    } else {
      hi = mid - 1u;
    }
  }
  p = jobs[lo].params;
  const uint local = g - jobs[lo].first_group, n = jobs[lo].groups;
  group_id = kJobsFlatDim == 0u ? uvec3(local % n, gl_WorkGroupID.y, local / n)
                                : uvec3(gl_WorkGroupID.x, local % n, local / n);
}
