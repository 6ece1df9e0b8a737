// A shader's call parameters (`p`) and workgroup id (`group_id`) for main() to use: those of the
// dispatch (JOBS 0: the push constants' Params, gl_WorkGroupID), or of one of several calls
// merged into one dispatch (JOBS 1; Ops::AttentionBatch). Merged, each call keeps the grid it
// would have alone, but its workgroups along dimension kJobsFlatDim and z are numbered one after
// another along kJobsFlatDim (call after call; z is 1): a workgroup reads its call's index from
// the table's per-workgroup list (one load, not a search: on a GPU every workgroup waits for
// these loads before it starts), then the call's Params and its (dimension, z) within the call.
// The other dimension is shared.
// Before including: struct Params, the constants JOBS, kJobsBinding and kJobsFlatDim (0 or 1).

layout(push_constant) uniform Push {
  Params params;  // JOBS 0: the call's; JOBS 1: unused
  uint job0;      // JOBS 1: this dispatch's first entry of `jobs`
  uint groups0;   // JOBS 1: where its per-workgroup list starts in the table, in words
} push;

struct Job {
  uint first_group;  // the call's first workgroup along kJobsFlatDim
  uint groups;       // its workgroups along kJobsFlatDim (those along z follow)
  Params params;
};
layout(binding = kJobsBinding) readonly buffer Jobs { Job jobs[]; };
// The same table as words: per workgroup of the dispatch (along kJobsFlatDim), its call's index
// from job0.
layout(binding = kJobsBinding) readonly buffer JobWords { uint job_words[]; };

Params p;
uvec3 group_id;

void LoadCall() {
  if (JOBS == 0u) {
    p = push.params;
    group_id = gl_WorkGroupID;
    return;
  }
  const uint g = kJobsFlatDim == 0u ? gl_WorkGroupID.x : gl_WorkGroupID.y;
  const uint call = push.job0 + job_words[push.groups0 + g];
  p = jobs[call].params;
  const uint local = g - jobs[call].first_group, n = jobs[call].groups;
  group_id = kJobsFlatDim == 0u ? uvec3(local % n, gl_WorkGroupID.y, local / n)
                                : uvec3(gl_WorkGroupID.x, local % n, local / n);
}
