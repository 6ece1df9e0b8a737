// The median of a few measurements (benchmarks, kvfs tune's comparisons).
#pragma once

#include <algorithm>
#include <vector>

namespace kvfs {

// The median of v (0 when empty); the mean of the middle two for an even count.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace kvfs
