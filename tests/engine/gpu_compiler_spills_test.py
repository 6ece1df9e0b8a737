#!/usr/bin/env python3
"""At the GPU defaults, no pipeline that a pass records spills registers in a GPU's compiler.

  gpu_compiler_spills_test.py KVFS_CLI SHARED_DIR WORK_DIR

CI has no GPU, but Mesa's AMD driver (RADV) compiles for one without it: with RADV_FORCE_FAMILY
it makes a null device whose compiler reports each pipeline's registers and spills
(VK_KHR_pipeline_executable_properties), which `kvfs shaders --json` prints without running
anything. A spilled register lives in device memory, so each use waits a memory latency: in
decode's chains of short dispatches that costs more than any setting gains. So the test holds
every pipeline of a prompt and a decode step (the matrices of every type a model mix uses,
attention, alone and merged, for every KV format, and the norms) and the matrices of a decode
step of 32 agents (the matrix-vector shaders' wide groups) to zero spilled vector and scalar registers.
Raising matvec_quant's units ahead to 8, for one, spills 56 registers there.

The models are llama3.1-8b (head_dim 128, 4 query heads a KV head; Q4_0 and the q4_k_m mix) and
tinyllama-1.1b (head_dim 64, 8 a KV head) from ../shared's synth_gguf.py, one layer each and
stories260K's 512-token vocabulary, so that they are small (25-140 MB) and the shapes real.

No RADV or no shared data: skipped (exit 77, which ctest reports as skipped), but a failure
under CI=true."""
import json, os, subprocess, sys

KVFS, SHARED, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
CI = os.environ.get('CI') == 'true'
ICD = '/usr/share/vulkan/icd.d/radeon_icd.x86_64.json'
FAMILY = 'gfx1100'  # RDNA3
MODELS = [('llama3.1-8b', ['--type', 'Q4_0']), ('llama3.1-8b', ['--mix', 'q4_k_m']),
          ('tinyllama-1.1b', ['--type', 'Q4_0'])]
KV_FORMATS = ['f16', 'q8', 'q4', 'q4k']
SPILLS = ('Spilled VGPRs', 'Spilled SGPRs')


def skip(why):
    if CI:
        print('FAIL (CI=true, so this may not skip): ' + why)
        sys.exit(1)
    print('SKIP: ' + why)
    sys.exit(77)


def model(preset, kind):
    path = os.path.join(WORK, '%s-%s-1layer.gguf' % (preset, kind[1]))
    if not os.path.exists(path):  # the generator is deterministic: same arguments, same bytes
        os.makedirs(WORK, exist_ok=True)
        subprocess.run([sys.executable, os.path.join(SHARED, 'tools', 'synth_gguf.py'), '--preset', preset] + kind +
                       ['--n-layer', '1', '--vocab', os.path.join(SHARED, 'models', 'stories260K.gguf'),
                        '-o', path + '.part', '-q'], check=True, stdout=subprocess.DEVNULL)
        os.rename(path + '.part', path)
    return path


def main():
    if not os.path.exists(ICD):
        skip('no RADV (%s; Debian package mesa-vulkan-drivers)' % ICD)
    if not os.path.exists(os.path.join(SHARED, 'tools', 'synth_gguf.py')):
        skip('no shared test data at %s (set KVFS_TEST_DATA)' % SHARED)
    env = dict(os.environ, RADV_FORCE_FAMILY=FAMILY, VK_ICD_FILENAMES=ICD, VK_DRIVER_FILES=ICD, RADV_DEBUG='nocache')
    failures, checked = [], 0
    for preset, kind in MODELS:
        path = model(preset, kind)
        run = subprocess.run([KVFS, 'shaders', '-m', path, '-t', '1,512', '--kv', ','.join(KV_FORMATS), '--stat',
                              ','.join(SPILLS), '--json'], env=env, capture_output=True, text=True, timeout=600)
        # And a decode step of 32 agents (batch-invariant: the matrix-vector shaders' wide groups).
        busy = subprocess.run([KVFS, 'shaders', '-m', path, '-t', '32', '--short-steps', '--kv', 'none', '--stat',
                               ','.join(SPILLS), '--json'], env=env, capture_output=True, text=True, timeout=600)
        if run.returncode != 0 or busy.returncode != 0:
            failures.append('%s: kvfs shaders exited %d, %d: %s' % (path, run.returncode, busy.returncode,
                                                                    (run.stderr + busy.stderr)[-2000:]))
            continue
        report = json.loads(run.stdout)
        wide = [m for m in json.loads(busy.stdout)['shaders'] if m['short_steps'] and m['tokens_per_group'] > 4]
        if not wide:
            failures.append('%s: no matrix-vector pipeline of more than 4 rows for 32 short steps' % path)
        report['shaders'] += wide
        # The null device answered, not lavapipe (whose compiler reports no spills at all).
        if 'RADV' not in report['device'] or not report['statistics']:
            failures.append('%s: device %r, statistics %r' % (path, report['device'], report['statistics']))
            continue
        # What the report must cover, so that the test cannot pass on an empty or partial plan.
        steps = {(a['kv'], a['step'], a['tokens']) for a in report['attention']}
        for kv in KV_FORMATS:
            for step in ('kv_store', 'scores', 'output'):
                for tokens in (1, 512):
                    if (kv, step, tokens) not in steps:
                        failures.append('%s: no %s %s pipeline for %d tokens' % (path, kv, step, tokens))
        if {n['norm'] for n in report.get('norms', [])} != {'attention', 'feed-forward', 'output'}:
            failures.append('%s: norm pipelines %s' % (path, [n['norm'] for n in report.get('norms', [])]))
        if {m['tokens'] for m in report['shaders']} != {1, 512, 32}:
            failures.append('%s: matrix pipelines for tokens %s' % (path, sorted({m['tokens'] for m in report['shaders']})))
        for entry in report['shaders'] + report['attention'] + report.get('norms', []):
            what = '%s %s %s' % (entry['shader'], entry['constants'],
                                 entry.get('matrices') or entry.get('norm') or '%s %s' % (entry.get('kv'), entry.get('step')))
            for stat in SPILLS:
                value = entry['statistics'].get(stat)
                if value is None:
                    failures.append('%s: %s: the compiler reported no "%s"' % (path, what, stat))
                elif value != 0:
                    failures.append('%s: %s, tokens %s: %s %g' % (path, what, entry.get('tokens', '-'), stat, value))
            checked += 1
    print('%d pipelines checked on %s (%s)' % (checked, FAMILY, ', '.join('%s %s' % (p, k[1]) for p, k in MODELS)))
    for f in failures:
        print('FAIL: ' + f)
    sys.exit(1 if failures or checked == 0 else 0)


main()
