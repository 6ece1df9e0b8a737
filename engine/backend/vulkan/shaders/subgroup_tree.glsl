// Trees of partial results over a workgroup's invocations, partly by subgroup shuffles.
//
// The shaders add partial sums as a tree in shared memory: step s combines invocation i + s
// into i, for s = width / 2 ... 1, so invocation 0 ends with the result, and every step is a
// workgroup barrier. Compiled with KVFS_SUBGROUP (the *_sg variants, for devices with subgroup
// shuffles in compute shaders), the steps with s below the subgroup size are shuffles instead:
// i ^ s is i + s for the invocations that matter, so invocation 0 gets the same sum bit for
// bit, without barriers. (Max and integer sums do not depend on the order at all.)
//
// That needs each aligned run of subgroup-size invocations to be one subgroup: invocations are
// numbered subgroup by subgroup (TreeTid), which holds when every subgroup is full (checked
// here: then the numbering is a permutation of the workgroup). Otherwise every step goes
// through shared memory. Needs the spec constant WG, the workgroup size.

// The subgroup size the trees may use (1: none).
uint TreeSubgroupSize() {
#if defined(KVFS_SUBGROUP)
  return gl_NumSubgroups * gl_SubgroupSize == WG ? gl_SubgroupSize : 1u;
#else
  return 1u;
#endif
}

// The invocation's number within the workgroup, in subgroup order when the trees use them.
uint TreeTid(uint subgroup_size) {
#if defined(KVFS_SUBGROUP)
  if (subgroup_size > 1u) return gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
#endif
  return gl_LocalInvocationID.x;
}

// The tree's steps s = width / 2 ... 1 of a sum by shuffles (width: a power of two, at most
// the subgroup size; every invocation of the subgroup must call it).
float SubgroupTreeSteps(float v, uint width) {
#if defined(KVFS_SUBGROUP)
  for (uint s = width / 2u; s > 0u; s >>= 1) v += subgroupShuffleXor(v, s);
#endif
  return v;
}
