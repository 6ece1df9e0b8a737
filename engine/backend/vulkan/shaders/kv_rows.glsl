// Reading KV rows in their stored formats (engine/kv/kv_format.h) from a device plane held as
// 32-bit words (`kv_words`, declared by the includer): f16 values; q8 groups of (f16 d,
// G int8 codes), x = d*q; q4 groups of (f16 d, f16 m, G/2 bytes of nibbles), x = m + d*q.
// Needs the specialization constants KV_TYPE (1 f16, 2 q8, 3 q4) and KV_GROUP (G).
// Rows start at word boundaries on the device; groups inside a row need not.

const uint kKvF16 = 1u;
const uint kKvQ8 = 2u;
const uint kKvQ4 = 3u;
const uint kKvQ4K = 4u;  // rows are V rows (kv_store encodes them; keys are chunks)

uint KvU8(uint byte_offset) { return (kv_words[byte_offset >> 2] >> ((byte_offset & 3u) * 8u)) & 0xFFu; }

uint KvU16(uint byte_offset) {  // byte_offset even
  const uint w = kv_words[byte_offset >> 2];
  return (byte_offset & 2u) != 0u ? (w >> 16) : (w & 0xFFFFu);
}

// Bytes per group of the format.
uint KvGroupBytes() {
  return KV_TYPE == kKvF16 ? 2u * KV_GROUP : (KV_TYPE == kKvQ8 ? KV_GROUP + 2u : KV_GROUP / 2u + 4u);
}

// Value i of a q4k V row: M * mn + (D * sc) * q, sub-block j's 10-bit field at bit 10 (j % 4)
// of its quad's 5 field bytes.
float KvValueQ4k(uint row, uint i) {
  const uint j = i / KV_GROUP, r = i % KV_GROUP, k = j % 4u;
  const uint fields = row + 4u + (j / 4u) * (5u + 2u * KV_GROUP);
  const uint at = fields + (10u * k) / 8u;
  const uint field = ((KvU8(at) | (KvU8(at + 1u) << 8)) >> ((10u * k) % 8u)) & 0x3FFu;
  precise float d = F16BitsToF32(KvU16(row)) * float(field & 31u);
  precise float m = F16BitsToF32(KvU16(row + 2u)) * float(int(field >> 5) - 15);
  const uint byte_value = KvU8(fields + 5u + k * (KV_GROUP / 2u) + r / 2u);
  precise float v = m + d * float((r & 1u) != 0u ? (byte_value >> 4) : (byte_value & 15u));
  return v;
}

// Value i of the row that starts at byte `row`, decoded as KvDequantize does.
float KvValue(uint row, uint i) {
  if (KV_TYPE == kKvQ4K) return KvValueQ4k(row, i);
  if (KV_TYPE == kKvF16) return F16BitsToF32(KvU16(row + 2u * i));
  const uint group = row + (i / KV_GROUP) * KvGroupBytes();
  const uint j = i % KV_GROUP;
  const float d = F16BitsToF32(KvU16(group));
  if (KV_TYPE == kKvQ8) return d * float(bitfieldExtract(int(KvU8(group + 2u + j)), 0, 8));
  const uint byte_value = KvU8(group + 4u + j / 2u);
  const uint q = (j & 1u) != 0u ? (byte_value >> 4) : (byte_value & 15u);
  precise float v = F16BitsToF32(KvU16(group + 2u)) + d * float(q);
  return v;
}
