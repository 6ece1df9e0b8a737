#!/usr/bin/env python3
"""Writes small GGUF seeds for the fuzzer (stdlib only): a complete tiny llama model with an
SPM vocab and a tiny qwen2-style one with a BPE vocab. Usage: make_seeds.py OUTDIR"""
import struct, sys, os

def s(x): b = x.encode(); return struct.pack('<Q', len(b)) + b
def kv_str(k, v): return s(k) + struct.pack('<I', 8) + s(v)
def kv_u32(k, v): return s(k) + struct.pack('<II', 4, v)
def kv_f32(k, v): return s(k) + struct.pack('<If', 6, v)
def kv_arr_str(k, vs): return s(k) + struct.pack('<IIQ', 9, 8, len(vs)) + b''.join(s(v) for v in vs)
def kv_arr_f32(k, vs): return s(k) + struct.pack('<IIQ', 9, 6, len(vs)) + b''.join(struct.pack('<f', v) for v in vs)
def kv_arr_i32(k, vs): return s(k) + struct.pack('<IIQ', 9, 5, len(vs)) + b''.join(struct.pack('<i', v) for v in vs)

def gguf(kvs, tensors):
    head = struct.pack('<IIQQ', 0x46554747, 3, len(tensors), len(kvs)) + b''.join(kvs)
    off, infos, datas = 0, b'', []
    for name, dims, data in tensors:
        infos += s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims)
        infos += struct.pack('<IQ', 0, off)
        pad = (-len(data)) % 32
        datas.append(data + b'\0' * pad)
        off += len(data) + pad
    out = head + infos
    out += b'\0' * ((-len(out)) % 32)
    return out + b''.join(datas)

def f32(n, scale=0.1):
    return b''.join(struct.pack('<f', scale * (((i * 37) % 17) - 8) / 8) for i in range(n))

def model(arch, tok_kvs, n_vocab):
    E, F, H, HKV, L = 8, 16, 2, 1, 1
    kvs = [kv_str('general.architecture', arch), kv_u32(arch + '.embedding_length', E),
           kv_u32(arch + '.block_count', L), kv_u32(arch + '.attention.head_count', H),
           kv_u32(arch + '.attention.head_count_kv', HKV), kv_u32(arch + '.feed_forward_length', F),
           kv_u32(arch + '.context_length', 64), kv_f32(arch + '.attention.layer_norm_rms_epsilon', 1e-5)] + tok_kvs
    hd = E // H
    t = [('token_embd.weight', [E, n_vocab], f32(E * n_vocab)), ('output_norm.weight', [E], f32(E, 1.0))]
    for i in range(L):
        p = 'blk.%d.' % i
        t += [(p + 'attn_norm.weight', [E], f32(E, 1.0)), (p + 'attn_q.weight', [E, E], f32(E * E)),
              (p + 'attn_k.weight', [E, HKV * hd], f32(E * HKV * hd)), (p + 'attn_v.weight', [E, HKV * hd], f32(E * HKV * hd)),
              (p + 'attn_output.weight', [E, E], f32(E * E)), (p + 'ffn_norm.weight', [E], f32(E, 1.0)),
              (p + 'ffn_gate.weight', [E, F], f32(E * F)), (p + 'ffn_up.weight', [E, F], f32(E * F)),
              (p + 'ffn_down.weight', [F, E], f32(F * E))]
        if arch == 'qwen2':
            t += [(p + 'attn_q.bias', [E], f32(E)), (p + 'attn_k.bias', [HKV * hd], f32(HKV * hd)), (p + 'attn_v.bias', [HKV * hd], f32(HKV * hd))]
    return gguf(kvs, t)

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
spm_tokens = ['<unk>', '<s>', '</s>', '<0x41>', '\u2581', 'a', 'b', '\u2581a', 'ab', '\u2581ab']
spm = [kv_str('tokenizer.ggml.model', 'llama'), kv_arr_str('tokenizer.ggml.tokens', spm_tokens),
       kv_arr_f32('tokenizer.ggml.scores', [0, 0, 0, 0, -1, -2, -3, -1.5, -1.2, -0.5]),
       kv_arr_i32('tokenizer.ggml.token_type', [2, 3, 3, 6, 1, 1, 1, 1, 1, 1]),
       kv_u32('tokenizer.ggml.bos_token_id', 1), kv_u32('tokenizer.ggml.eos_token_id', 2)]
open(os.path.join(out, 'tiny-llama-spm.gguf'), 'wb').write(model('llama', spm, len(spm_tokens)))
bpe_tokens = ['a', 'b', 'c', '\u0120', 'ab', '\u0120a', '<|endoftext|>']
bpe = [kv_str('tokenizer.ggml.model', 'gpt2'), kv_str('tokenizer.ggml.pre', 'gpt-2'),
       kv_arr_str('tokenizer.ggml.tokens', bpe_tokens), kv_arr_i32('tokenizer.ggml.token_type', [1, 1, 1, 1, 1, 1, 3]),
       kv_arr_str('tokenizer.ggml.merges', ['a b', '\u0120 a']),
       kv_u32('tokenizer.ggml.bos_token_id', 6), kv_u32('tokenizer.ggml.eos_token_id', 6)]
open(os.path.join(out, 'tiny-qwen2-bpe.gguf'), 'wb').write(model('qwen2', bpe, len(bpe_tokens)))
