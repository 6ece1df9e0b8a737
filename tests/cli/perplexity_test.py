#!/usr/bin/env python3
"""End-to-end tests of `kvfs perplexity` (stdlib only), run by ctest:
   perplexity_test.py KVFS_BINARY [SHARED_DIR]
The shared data directory is $KVFS_TEST_DATA, else SHARED_DIR, else ../shared next to the repo.
Missing data: skip (exit 0 with a message), except under CI=true where it fails.

What it holds:
- f16 perplexity of stories260K on tinystories_sample.txt at -c 256 equals the reference's
  llama-perplexity figure (peers.md: 6.898 +- 0.77) within 0.5%. Why 0.5% is tight but fair: the
  figure is given to 4 digits (0.007%), kvfs reproduces the reference's f16 numerics (logits
  within ~0.01, see cli_test.py), and the result is then 6.8981; but a different summation order
  in attention (the reference's own f16 and f16 flash-attention paths) moves a perplexity by
  ~0.1%, so anything above 0.5% means a different method (windowing, BOS, scoring range), not
  rounding. The uncertainty, printed to 2 digits, must agree to its rounding (1.5%).
- --kl-divergence with --kv f16 compares f16 with itself: KL 0, same top-1 100%, equal PPLs.
- q8 loses less than q4: mean KL(q8) < mean KL(q4).
- q4k (keys per channel) loses far less than q4 on this model: mean KL(q4k) < KL(q4) / 10.
- bad input exits 2 with one line on stderr and nothing on stdout.
The wiki file (256 KB, ~185k tokens, minutes per run) is measured in docs/performance.md, not here.
"""
import json, os, subprocess, sys, tempfile

kvfs = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
shared = os.environ.get('KVFS_TEST_DATA') or (sys.argv[2] if len(sys.argv) > 2 else '') or \
    os.path.join(here, '..', '..', '..', 'shared')
model = os.path.join(shared, 'models', 'stories260K.gguf')
text = os.path.join(shared, 'corpus', 'tinystories_sample.txt')
if not (os.path.exists(model) and os.path.exists(text)):
    if os.environ.get('CI') == 'true':
        print('CI=true but shared data is missing at', shared); sys.exit(1)
    print('SKIP: shared test data not found at', shared, '(set KVFS_TEST_DATA)'); sys.exit(0)

REF_PPL, REF_UNC = 6.898, 0.77  # peers.md, llama-perplexity -c 256, f16 KV

failures = []
def check(name, cond, detail=''):
    print(('ok   ' if cond else 'FAIL ') + name + ('' if cond else ': ' + detail))
    if not cond: failures.append(name)

def run(args):
    return subprocess.run([kvfs, 'perplexity'] + args, capture_output=True, text=True, timeout=300)

def figures(args):
    r = run(['-m', model, '-f', text, '-c', '256', '-t', '2', '--json'] + args)
    if r.returncode != 0:
        return None, f'rc={r.returncode} stderr={r.stderr!r}'
    return json.loads(r.stdout), ''

# 1. f16 perplexity against the reference figure; windowing facts.
j, err = figures(['--kv', 'f16'])
check('f16 runs', j is not None, err)
if j:
    rel = abs(j['ppl']['value'] - REF_PPL) / REF_PPL
    check('f16 PPL matches the reference within 0.5%', rel < 0.005, f"ppl={j['ppl']['value']} rel={rel:.5f}")
    urel = abs(j['ppl']['uncertainty'] - REF_UNC) / REF_UNC
    check('f16 PPL uncertainty matches the reference', urel < 0.015, f"unc={j['ppl']['uncertainty']}")
    # Non-overlapping windows of 256; positions 128..254 of each are scored.
    check('windows and scored count', j['windows'] == j['tokens'] // 256 and j['scored'] == j['windows'] * 127,
          f"tokens={j['tokens']} windows={j['windows']} scored={j['scored']}")

# 2. f16 against itself: nothing differs.
j, err = figures(['--kv', 'f16', '--kl-divergence', '--chunks', '2'])
check('f16 --kl-divergence runs', j is not None, err)
if j:
    check('f16 vs f16: KL ~ 0', abs(j['kl_divergence']['mean']) < 1e-9 and j['kl_divergence']['max'] < 1e-9,
          str(j['kl_divergence']))
    check('f16 vs f16: same top-1 100%', j['same_top1_pct']['value'] == 100.0, str(j['same_top1_pct']))
    check('f16 vs f16: equal PPL', abs(j['ppl']['value'] - j['f16_ppl']['value']) < 1e-9 and j['scored'] == 2 * 127,
          f"{j['ppl']} {j['f16_ppl']}")

# 3. The 8-bit cache is closer to f16 than the 4-bit one.
q8, err8 = figures(['--kv', 'q8', '--kl-divergence', '--chunks', '2'])
q4, err4 = figures(['--kv', 'q4', '--kl-divergence', '--chunks', '2'])
check('q8 and q4 --kl-divergence run', q8 is not None and q4 is not None, err8 + err4)
if q8 and q4:
    k8, k4 = q8['kl_divergence']['mean'], q4['kl_divergence']['mean']
    check('KL(q8) < KL(q4), both > 0', 0 < k8 < k4, f'q8={k8} q4={k4}')
    check('base f16 PPL identical across runs', q8['f16_ppl'] == q4['f16_ppl'], f"{q8['f16_ppl']} {q4['f16_ppl']}")
    check('same top-1 of q8 in (50, 100]', 50 < q8['same_top1_pct']['value'] <= 100, str(q8['same_top1_pct']))

# 3b. Keys per channel fix stories260K's 4-bit keys (docs/performance.md: KL 0.006 against q4's 0.64).
q4k, err4k = figures(['--kv', 'q4k', '--kl-divergence', '--chunks', '2'])
check('q4k --kl-divergence runs', q4k is not None, err4k)
if q4k and q4:
    check('q4k reported with its chunk', q4k['kv'] == 'q4k' and q4k['chunk'] == 64, f"{q4k['kv']} {q4k.get('chunk')}")
    k4k, k4 = q4k['kl_divergence']['mean'], q4['kl_divergence']['mean']
    check('KL(q4k) < KL(q4) / 10, > 0', 0 < k4k < k4 / 10, f'q4k={k4k} q4={k4}')

# 4. Text output.
r = run(['-m', model, '-f', text, '-c', '256', '--chunks', '1'])
check('text output', r.returncode == 0 and 'PPL = ' in r.stdout and r.stderr == '', f'rc={r.returncode} {r.stdout!r} {r.stderr!r}')

# 5. Bad input: exit 2, exactly one line on stderr, nothing on stdout.
def bad(name, args, expect):
    r = run(args)
    lines = r.stderr.strip().splitlines()
    check(name, r.returncode == 2 and len(lines) == 1 and expect in r.stderr and r.stdout == '',
          f'rc={r.returncode} stdout={r.stdout!r} stderr={r.stderr!r}')

with tempfile.TemporaryDirectory() as tmp:
    short = os.path.join(tmp, 'short.txt'); open(short, 'w').write('Once upon a time there was a cat.\n')
    empty = os.path.join(tmp, 'empty.txt'); open(empty, 'w').close()
    bad('missing text file', ['-m', model, '-f', os.path.join(tmp, 'nope.txt')], 'nope.txt')
    bad('missing model', ['-m', os.path.join(tmp, 'nope.gguf'), '-f', text], 'nope.gguf')
    bad('text shorter than one window', ['-m', model, '-f', short, '-c', '256'], 'fewer than one window')
    bad('empty text', ['-m', model, '-f', empty, '-c', '16'], 'fewer than one window')
    bad('window larger than the text', ['-m', model, '-f', text, '-c', '4096'], 'fewer than one window')
    bad('missing -f', ['-m', model], 'missing -f')
    bad('missing -m', ['-f', text], 'missing -m')
    bad('bad kv type', ['-m', model, '-f', text, '--kv', 'q3'], 'q3')
    bad('bad rotate value', ['-m', model, '-f', text, '--kv', 'q4', '--kv-rotate', 'maybe'], 'maybe')
    bad('context too small', ['-m', model, '-f', text, '-c', '2'], '-c')
    bad('bad chunks', ['-m', model, '-f', text, '--chunks', '0'], '--chunks')
    bad('unknown option', ['-m', model, '-f', text, '--frobnicate'], 'frobnicate')
    bad('option without value', ['-m', model, '-f'], '-f')

print(f'{len(failures)} failure(s)' if failures else 'all passed')
sys.exit(1 if failures else 0)
