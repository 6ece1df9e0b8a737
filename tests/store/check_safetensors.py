#!/usr/bin/env python3
"""Independent reader for kvfs' kv.safetensors exports (standard library only: struct + json).
It shares no code with the C++ writer: the safetensors container rules and the kvfs tensor
naming (engine/store/safetensors.h) are re-implemented here from their descriptions.

  check_safetensors.py FILE [--pattern] [--expect NAME I,J,... VALUE]...

Checks: the 8-byte header length fits the file; the header is a UTF-8 JSON object without
duplicate keys; every tensor has a known dtype, a shape of non-negative ints and data_offsets
whose size is prod(shape) * dtype size; sorted by offset the tensors tile the data buffer
exactly; __metadata__ maps strings to strings and holds every kvfs key (version 2: the
payload_xxh3_64 checksum too, as 16 lowercase hex digits); the tensor set and shapes
are the ones the metadata implies. Prints a summary.
--pattern: every element equals the closed-form pattern of tests/store/make_safetensors_sample.cpp.
--expect: the element at that index (offset computed here from shape and data_offsets) equals
VALUE (a float for F16, an int for I8/U8).
Exit status 0 when everything holds, 1 otherwise (with the reason on stderr).
"""
import json, struct, sys

DTYPE_SIZE = {'F16': 2, 'BF16': 2, 'F32': 4, 'F64': 8, 'I8': 1, 'U8': 1, 'I16': 2, 'U16': 2,
              'I32': 4, 'U32': 4, 'I64': 8, 'U64': 8, 'BOOL': 1}
STRUCT_CODE = {'F16': 'e', 'I8': 'b', 'U8': 'B'}
META_KEYS = ['format', 'format_version', 'model_fingerprint', 'kv_format', 'group_size', 'rotation',
             'n_layer', 'n_head_kv', 'head_dim', 'n_cached', 'token_ids', 'conversation']


class Bad(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Bad(msg)


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    need(len(keys) == len(set(keys)), 'duplicate key in the header')
    return dict(pairs)


def prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


def expected_tensors(meta):
    """name -> (dtype, shape), from the kvfs naming rules and the metadata alone."""
    L, H, D = int(meta['n_layer']), int(meta['n_head_kv']), int(meta['head_dim'])
    G, n = int(meta['group_size']), int(meta['n_cached'])
    need((H * D) % G == 0, 'group_size does not divide the row')
    ng = H * D // G
    fields = {'f16': [('', 'F16', [n, H, D])],
              'q8': [('.codes', 'I8', [n, ng, G]), ('.scales', 'F16', [n, ng])],
              'q4': [('.codes', 'U8', [n, ng, G // 2]), ('.scales', 'F16', [n, ng]), ('.mins', 'F16', [n, ng])]}
    out = {}
    if meta['kv_format'] == 'q4k':
        # Keys per channel over chunks of C tokens (nc complete chunks; the ns newest tokens'
        # keys staged in f16), values in rows of sub-blocks of G with per-quad packed fields.
        need('k_chunk_tokens' in meta, 'q4k without k_chunk_tokens')
        C = int(meta['k_chunk_tokens'])
        need(C > 0 and C % 2 == 0 and D % G == 0, 'q4k chunk %d / sub-block %d' % (C, G))
        nv, nc, ns = H * D, n // C, n % C
        nsub = nv // G
        for l in range(L):
            for suffix, dtype, shape in [('k.codes', 'U8', [nc, nv, C // 2]), ('k.scales', 'F16', [nc, nv]),
                                         ('k.mins', 'F16', [nc, nv]), ('k.staged', 'F16', [ns, H, D]),
                                         ('v.codes', 'U8', [n, nsub, G // 2]), ('v.scale_units', 'F16', [n]),
                                         ('v.min_units', 'F16', [n]), ('v.sub_fields', 'U8', [n, (nsub + 3) // 4, 5])]:
                out['layers.%d.%s' % (l, suffix)] = (dtype, shape)
        return out
    need(meta['kv_format'] in fields, 'unknown kv_format %r' % meta['kv_format'])
    for l in range(L):
        for p in 'kv':
            for suffix, dtype, shape in fields[meta['kv_format']]:
                out['layers.%d.%s%s' % (l, p, suffix)] = (dtype, shape)
    return out


def parse(blob):
    need(len(blob) >= 8, 'file shorter than the 8-byte header length')
    (n,) = struct.unpack('<Q', blob[:8])
    need(n <= len(blob) - 8, 'header length %d larger than the file' % n)
    need((8 + n) % 8 == 0, 'data buffer not 8-byte aligned (header length %d)' % n)
    header = json.loads(blob[8:8 + n].decode('utf-8'), object_pairs_hook=no_duplicates)
    need(isinstance(header, dict), 'header is not a JSON object')
    data_start, data_len = 8 + n, len(blob) - 8 - n
    meta = header.pop('__metadata__', None)
    need(isinstance(meta, dict), '__metadata__ missing or not an object')
    for k, v in meta.items():
        need(isinstance(k, str) and isinstance(v, str), 'metadata %r is not a string' % k)
    for k in META_KEYS:
        need(k in meta, 'metadata key %r missing' % k)
    need(meta['format'] == 'kvfs-kv' and meta['format_version'] in ('1', '2'), 'not kvfs-kv version 1 or 2')
    # Version 2 requires the data's checksum (XXH3-64, which the standard library cannot compute:
    # its form is checked here, its value by the C++ tests against libxxhash).
    if meta['format_version'] == '2' or 'payload_xxh3_64' in meta:
        h = meta.get('payload_xxh3_64', '')
        need(len(h) == 16 and all(c in '0123456789abcdef' for c in h), 'payload_xxh3_64 %r' % h)
    need(meta['rotation'] in ('on', 'off'), 'rotation %r' % meta['rotation'])
    fp = meta['model_fingerprint']
    need(len(fp) == 32 and all(c in '0123456789abcdef' for c in fp), 'fingerprint %r' % fp)
    tokens = json.loads(meta['token_ids'])
    need(isinstance(tokens, list) and all(isinstance(t, int) and 0 <= t < 2**31 for t in tokens), 'token_ids')
    need(int(meta['n_cached']) <= len(tokens), 'n_cached > number of token ids')
    conv = json.loads(meta['conversation'])
    need(isinstance(conv, list) and all(isinstance(t, dict) and set(t) == {'role', 'text'} for t in conv), 'conversation')

    tensors = {}
    for name, t in header.items():
        need(isinstance(t, dict) and set(t) == {'dtype', 'shape', 'data_offsets'}, '%s: fields' % name)
        dtype, shape, offs = t['dtype'], t['shape'], t['data_offsets']
        need(dtype in DTYPE_SIZE, '%s: unknown dtype %r' % (name, dtype))
        need(isinstance(shape, list) and all(isinstance(x, int) and x >= 0 for x in shape), '%s: shape' % name)
        need(isinstance(offs, list) and len(offs) == 2 and all(isinstance(x, int) for x in offs), '%s: offsets' % name)
        begin, end = offs
        need(0 <= begin <= end <= data_len, '%s: data_offsets %r out of range' % (name, offs))
        need(end - begin == prod(shape) * DTYPE_SIZE[dtype],
             '%s: %d bytes for shape %r of %s' % (name, end - begin, shape, dtype))
        tensors[name] = (dtype, shape, begin, end)
    cursor = 0
    for name, (_, _, begin, end) in sorted(tensors.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        need(begin == cursor, '%s: starts at %d, expected %d (gap or overlap)' % (name, begin, cursor))
        cursor = end
    need(cursor == data_len, 'tensors cover %d of %d data bytes' % (cursor, data_len))

    want = expected_tensors(meta)
    need(set(want) == set(tensors), 'tensor set differs: extra %s, missing %s' %
         (sorted(set(tensors) - set(want))[:3], sorted(set(want) - set(tensors))[:3]))
    for name, (dtype, shape) in want.items():
        need(tensors[name][:2] == (dtype, shape), '%s: %s %r != expected %s %r' % ((name,) + tensors[name][:2] + (dtype, shape)))
    return meta, tensors, data_start, tokens, conv


def element(blob, data_start, tensor, index):
    dtype, shape, begin, _ = tensor
    need(len(index) == len(shape) and all(0 <= i < s for i, s in zip(index, shape)), 'index %r outside %r' % (index, shape))
    flat = 0
    for i, s in zip(index, shape):
        flat = flat * s + i
    size = DTYPE_SIZE[dtype]
    off = data_start + begin + flat * size
    return struct.unpack('<' + STRUCT_CODE[dtype], blob[off:off + size])[0]


def check_pattern(blob, data_start, tensors):
    """The closed form of make_safetensors_sample.cpp, element by element."""
    count = 0
    for name, (dtype, shape, begin, end) in tensors.items():
        parts = name.split('.')
        l, p = int(parts[1]), 'kv'.index(parts[2])
        per_token = prod(shape[1:])
        size = DTYPE_SIZE[dtype]
        for t in range(shape[0]):
            for e in range(per_token):
                off = data_start + begin + (t * per_token + e) * size
                if dtype == 'F16':
                    (got,) = struct.unpack('<e', blob[off:off + 2])
                    want = (4 * l + 2 * p + e % 4) + t / 16
                    if name.endswith('.mins'):
                        want = -want
                else:
                    got, want = blob[off], (31 * l + 17 * p + 7 * t + 3 * e) % 256
                need(got == want, '%s[token %d, element %d] = %r, pattern says %r' % (name, t, e, got, want))
                count += 1
    return count


def main(argv):
    if not argv or argv[0].startswith('-'):
        print(__doc__, file=sys.stderr)
        return 2
    path, pattern, expects, i = argv[0], False, [], 1
    while i < len(argv):
        if argv[i] == '--pattern':
            pattern, i = True, i + 1
        elif argv[i] == '--expect' and i + 3 < len(argv):
            expects.append((argv[i + 1], [int(x) for x in argv[i + 2].split(',')], argv[i + 3]))
            i += 4
        else:
            print('bad argument %r' % argv[i], file=sys.stderr)
            return 2
    with open(path, 'rb') as f:
        blob = f.read()
    try:
        meta, tensors, data_start, tokens, conv = parse(blob)
        print('%s: %d bytes, header %d bytes, %d tensors, kv_format %s group %s rotation %s, '
              'n_layer %s n_head_kv %s head_dim %s, %s of %d tokens cached, %d turns' %
              (path, len(blob), data_start - 8, len(tensors), meta['kv_format'], meta['group_size'], meta['rotation'],
               meta['n_layer'], meta['n_head_kv'], meta['head_dim'], meta['n_cached'], len(tokens), len(conv)))
        if pattern:
            print('  pattern holds for all %d elements' % check_pattern(blob, data_start, tensors))
        for name, index, value in expects:
            need(name in tensors, 'no tensor %s' % name)
            got = element(blob, data_start, tensors[name], index)
            want = float(value) if tensors[name][0] == 'F16' else int(value)
            need(got == want, '%s%r = %r, expected %r' % (name, index, got, want))
            print('  %s%r = %r as expected' % (name, index, got))
    except (Bad, ValueError, KeyError, UnicodeDecodeError, struct.error) as e:
        print('%s: INVALID: %s' % (path, e), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
