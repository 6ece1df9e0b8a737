// The epilogue of the matrix shaders: y = [y_old +] (W x [+ bias]) for row r of the part
// (matrix row y_col0 + r) and token t. A matrix made of several concatenated ones (q|k|v,
// gate|up: one dispatch instead of three or two) sends its rows from seg1 on to y1 and from
// seg2 on to y2, each output with rows of its own width; the bias is indexed by matrix row.
// Needs the Params fields y_stride, y_col0, flags, seg1, seg2, y1_stride, y2_stride and the
// buffers y, y1, y2, bias.
void StoreOutput(uint t, uint r, float v) {
  const uint row = p.y_col0 + r;
  if ((p.flags & 2u) != 0u) v += bias[row];
  const bool add = (p.flags & 1u) != 0u;
  if (row >= p.seg2) {
    const uint at = t * p.y2_stride + row - p.seg2;
    if (add) v = y2[at] + v;
    y2[at] = v;
  } else if (row >= p.seg1) {
    const uint at = t * p.y1_stride + row - p.seg1;
    if (add) v = y1[at] + v;
    y1[at] = v;
  } else {
    const uint at = t * p.y_stride + row;
    if (add) v = y[at] + v;
    y[at] = v;
  }
}
