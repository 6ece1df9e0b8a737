// Float weight types (F32, F16, BF16): element access and the activation rounding of the
// CPU's dot products (it rounds activations to the weight's type first). Needs WEIGHT_TYPE
// and weight_bytes.glsl.

// Element e of the row starting at byte `row`.
float WeightValue(uint row, uint e) {
  if (WEIGHT_TYPE == kTypeF32) return uintBitsToFloat(weight_words[(row >> 2) + e]);
  if (WEIGHT_TYPE == kTypeF16) return WeightF16(row + 2u * e);
  return uintBitsToFloat(WeightU16(row + 2u * e) << 16);  // BF16
}

// An activation as the CPU's dot product with this weight type sees it.
float ActivationValue(float x) {
  if (WEIGHT_TYPE == kTypeF16) return RoundF16(x);
  if (WEIGHT_TYPE == kTypeBF16) return RoundBf16(x);
  return x;
}
