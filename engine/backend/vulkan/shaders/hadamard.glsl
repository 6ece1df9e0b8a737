// In-place orthonormal fast Walsh-Hadamard transform of vectors held in shared memory
// (`hvec`, declared by the includer), bit for bit the CPU's HadamardTransform (kv_format.cpp):
// the same butterflies in the same order, then one multiply by `scale` (1/sqrt(n), computed on
// the host as the CPU does). Every invocation of the workgroup must call it (it has barriers).

// Transforms n_vec vectors of n values (n a power of two) stored back to back from hvec[0].
void HadamardShared(uint n_vec, uint n, float scale, uint tid, uint n_threads) {
  const uint pairs = n_vec * (n / 2u);
  for (uint len = 1u; len < n; len <<= 1) {
    for (uint i = tid; i < pairs; i += n_threads) {
      const uint v = i / (n / 2u), k = i % (n / 2u);
      const uint j = v * n + (k / len) * 2u * len + (k % len);
      const float a = hvec[j], b = hvec[j + len];
      hvec[j] = a + b;
      hvec[j + len] = a - b;
    }
    barrier();
  }
  for (uint i = tid; i < n_vec * n; i += n_threads) hvec[i] *= scale;
  barrier();
}
