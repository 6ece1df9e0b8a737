#!/usr/bin/env python3
"""Writes seeds for fuzz_safetensors (stdlib only): valid kv.safetensors files for the fuzz
target's geometry (2 layers, 2 KV heads of 4; f16 group 8, q8 and q4 groups of 4, rotation on for
q8/q4; q4k sub-blocks of 4 and K chunks of 2 tokens), one per KV type plus an empty cache, with
the data in a shuffled tensor order in one.
Usage: make_safetensors_seeds.py FUZZ_CORPUS_DIR  (writes DIR/safetensors/*)"""
import json, os, struct, sys

FP = '0123456789abcdef0123456789abcdef'
L, H, D = 2, 2, 4
TYPES = {'f16': (8, 'off', [('', 'F16', lambda n, ng, G: [n, H, D], 2)]),
         'q8': (4, 'on', [('.codes', 'I8', lambda n, ng, G: [n, ng, G], 1),
                          ('.scales', 'F16', lambda n, ng, G: [n, ng], 2)]),
         'q4': (4, 'on', [('.codes', 'U8', lambda n, ng, G: [n, ng, G // 2], 1),
                          ('.scales', 'F16', lambda n, ng, G: [n, ng], 2),
                          ('.mins', 'F16', lambda n, ng, G: [n, ng], 2)])}

C = 2  # q4k K chunk (safetensors.h lists q4k's tensors)
Q4K = [('k.codes', 'U8', lambda n: [n // C, H * D, C // 2], 1), ('k.scales', 'F16', lambda n: [n // C, H * D], 2),
       ('k.mins', 'F16', lambda n: [n // C, H * D], 2), ('k.staged', 'F16', lambda n: [n % C, H, D], 2),
       ('v.codes', 'U8', lambda n: [n, H * D // 4, 2], 1), ('v.scale_units', 'F16', lambda n: [n], 2),
       ('v.min_units', 'F16', lambda n: [n], 2), ('v.sub_fields', 'U8', lambda n: [n, 1, 5], 1)]

def seed(kv, n_cached, tokens, reverse=False):
    G, rot, fields = TYPES[kv] if kv != 'q4k' else (4, 'on', None)
    ng = H * D // G
    meta = {'format': 'kvfs-kv', 'format_version': '1', 'model_fingerprint': FP, 'kv_format': kv,
            'group_size': str(G), 'rotation': rot, 'n_layer': str(L), 'n_head_kv': str(H), 'head_dim': str(D),
            'n_cached': str(n_cached), 'token_ids': json.dumps(tokens),
            'conversation': json.dumps([{'role': 'user', 'text': 'Hi \u00e9'}, {'role': 'assistant', 'text': 'Yo'}])}
    names = []
    if kv == 'q4k':
        meta['k_chunk_tokens'] = str(C)
        for l in range(L):
            for suffix, dtype, shape, size in Q4K:
                s, n = shape(n_cached), size
                for x in s: n *= x
                names.append(('layers.%d.%s' % (l, suffix), dtype, s, n))
    for l in range(L if fields else 0):
        for p in 'kv':
            for suffix, dtype, shape, size in fields:
                s = shape(n_cached, ng, G)
                n = size
                for x in s: n *= x
                names.append(('layers.%d.%s%s' % (l, p, suffix), dtype, s, n))
    header, off, data = {'__metadata__': meta}, 0, b''
    for name, dtype, s, n in (reversed(names) if reverse else names):
        header[name] = {'dtype': dtype, 'shape': s, 'data_offsets': [off, off + n]}
        data += bytes((off + i * 13) % 251 for i in range(n))
        off += n
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    return struct.pack('<Q', len(text)) + text + data

def main(out):
    d = os.path.join(out, 'safetensors')
    os.makedirs(d, exist_ok=True)
    files = {'f16.safetensors': seed('f16', 3, [1, 2, 3, 4]),
             'q8.safetensors': seed('q8', 5, [5, 6, 7, 8, 9]),
             'q4.safetensors': seed('q4', 3, [1, 2, 2147483647]),
             'q4_reversed.safetensors': seed('q4', 2, [7, 8, 9], reverse=True),
             'q4k.safetensors': seed('q4k', 3, [1, 2, 3, 4]),
             'empty.safetensors': seed('q4', 0, [])}
    for name, blob in files.items():
        with open(os.path.join(d, name), 'wb') as f: f.write(blob)

if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'corpus'))
