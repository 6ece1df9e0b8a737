// Byte access into a weight matrix stored as 32-bit words (`weight_words`, declared by the
// includer) exactly as the GGUF file stores its rows. Every ggml block size is even and rows
// start at even offsets, so 16-bit fields sit at even byte offsets; 32-bit reads at an offset
// that is 2 mod 4 combine two words (the buffer is padded to a whole word at its end).

uint WeightU8(uint byte_offset) {
  return (weight_words[byte_offset >> 2] >> ((byte_offset & 3u) * 8u)) & 0xFFu;
}

uint WeightU16(uint byte_offset) {  // byte_offset even
  const uint w = weight_words[byte_offset >> 2];
  return (byte_offset & 2u) != 0u ? (w >> 16) : (w & 0xFFFFu);
}

uint WeightU32(uint byte_offset) {  // byte_offset even
  const uint i = byte_offset >> 2;
  if ((byte_offset & 2u) == 0u) return weight_words[i];
  return (weight_words[i] >> 16) | (weight_words[i + 1u] << 16);
}

float WeightF16(uint byte_offset) { return F16BitsToF32(WeightU16(byte_offset)); }

// ggml type ids (engine/model/ggml_types.h) for WEIGHT_TYPE.
const uint kTypeF32 = 0u;
const uint kTypeF16 = 1u;
const uint kTypeQ4_0 = 2u;
const uint kTypeQ4_1 = 3u;
const uint kTypeQ5_0 = 6u;
const uint kTypeQ5_1 = 7u;
const uint kTypeQ8_0 = 8u;
const uint kTypeQ4_K = 12u;
const uint kTypeQ5_K = 13u;
const uint kTypeQ6_K = 14u;
const uint kTypeBF16 = 30u;
