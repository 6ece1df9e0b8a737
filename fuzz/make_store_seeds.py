#!/usr/bin/env python3
"""Writes seeds for fuzz_manifest and fuzz_block (stdlib only; the zstd CLI, if present, adds a
compressed block). Block checksums are left zero: the fuzz target recomputes them. Manifest seeds
are version 1 (no checksum, which the stdlib cannot compute), so mutations reach every field;
manifest/with_tail_v2.json, the same manifest in version 2 as kvfs writes it (XXH3-64 checksum
last), is kept in the corpus as is, and so is manifest/story_v2.prefix (a prefix record in
version 2). manifest/story.prefix is a prefix record in version 1. manifest/tuning.json is a
tuning file as kvfs tune writes it (lavapipe), also kept as is.
Usage: make_store_seeds.py FUZZ_CORPUS_DIR  (writes DIR/manifest/* and DIR/block/*)"""
import json, os, shutil, struct, subprocess, sys

def manifest(name, n_tokens, blocks, tail):
    return {"format": "kvfs-manifest", "version": 1, "name": name,
            "model_fingerprint": "0123456789abcdef0123456789abcdef", "kv_format": "q4",
            "block_size": 4, "tokens": list(range(1, n_tokens + 1)),
            "conversation": [{"role": "system", "text": "Be brief."},
                             {"role": "user", "text": "Hi \u00e9\u20ac \"q\"\n"}],
            "blocks": blocks, "tail": tail,
            "config": {"temperature": 0.7, "stop": ["\n\n"], "max_tokens": 64},
            "created_ms": 1700000000000, "updated_ms": 1700000001000, "turn": 3}

def header(magic, kv_format, flags, n_tokens, stored, raw, hash16):
    h = struct.pack('<IHHIIIIQQ', magic, 1, 72, kv_format, flags, n_tokens, 0, stored, raw) + hash16
    return h + b'\0' * 16  # payload and header checksums: fixed up by the fuzz target

def main(out):
    m, b = os.path.join(out, 'manifest'), os.path.join(out, 'block')
    os.makedirs(m, exist_ok=True); os.makedirs(b, exist_ok=True)
    h1, h2 = '00112233445566778899aabbccddeeff', 'ffeeddccbbaa99887766554433221100'
    seeds = {'with_tail.json': manifest('alice', 10, [h1, h2], {"file": "tail.3.kvt", "n_tokens": 2}),
             'no_tail.json': manifest('bob_2', 8, [h1, h2], None),
             'empty.json': manifest('c', 0, [], None)}
    seeds['story.prefix'] = {"format": "kvfs-prefix", "version": 1, "name": "story.txt", "owner_uid": 1000,
                             "text": "Once upon a time \u00e9\n", "kv_format": "q4", "block_size": 16,
                             "model_fingerprint": "0123456789abcdef0123456789abcdef", "blocks": [h1, h2]}
    for name, obj in seeds.items():
        with open(os.path.join(m, name), 'w') as f: json.dump(obj, f)
    payload = bytes((i * 37 + 11) % 256 for i in range(300))
    blk = 0x4B42564B; tail = 0x4C54564B
    with open(os.path.join(b, 'raw.kvb'), 'wb') as f:
        f.write(header(blk, 7, 0, 4, len(payload), len(payload), bytes.fromhex(h1)) + payload)
    with open(os.path.join(b, 'tail.kvt'), 'wb') as f:
        f.write(header(tail, 7, 0, 2, 100, 100, b'\0' * 16) + payload[:100])
    if shutil.which('zstd'):
        raw = bytes(i % 7 for i in range(4096))
        comp = subprocess.run(['zstd', '-q', '-c', '-3'], input=raw, capture_output=True, check=True).stdout
        with open(os.path.join(b, 'zstd.kvb'), 'wb') as f:
            f.write(header(blk, 7, 1, 4, len(comp), len(raw), bytes.fromhex(h2)) + comp)

if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'corpus'))
