"""fs integration test of kvfsd on the Vulkan backend (imported by fs_integration_test.py, which
runs it): the same turns through the mount as on the CPU."""
import json, os, signal, subprocess, time

from fs_harness import (CI, FAKE, KVFS_CLI, Failure, Skip, check, say, sh, shquote, small_replies, test, user_turns,
                        wait_idle)


@test
def vulkan_daemon_serves_as_the_cpu(t):
    """Issue 7: kvfsd --backend vulkan (lavapipe in CI) serves agents through the mount as the CPU
    backend does. Four agents written at once (one batch), then a restart that resumes them from
    the store onto the device (their turns extend the cache: nothing re-read), then KV memory
    for about two agents, taking turns (caches evicted to the store and reloaded), then a device
    KV budget too small for any block, so every step runs on the CPU behind the device: the
    replies must be the CPU daemon's byte for byte (greedy: the Vulkan backend computes what the
    CPU's does, its logits within NMSE 1e-10 of the CPU tables' on stories260K, as the engine's
    Vulkan tests also require). Then rm -r erases an agent, and kill -9 in the middle of a reply
    loses no committed turn."""
    if FAKE:
        raise Skip('the fake engine has no backend (kvfsd runs this)')
    if KVFS_CLI is None:
        if CI:
            raise Failure('CI=true: no kvfs CLI given (argument 4) to list Vulkan devices')
        raise Skip('no kvfs CLI given to list Vulkan devices')
    r = subprocess.run([KVFS_CLI, 'devices'], capture_output=True, text=True, timeout=120)
    if 'built without the Vulkan backend' in r.stderr:
        raise Skip('kvfsd is built without the Vulkan backend (KVFS_VULKAN=OFF)')
    if r.returncode != 0:
        if CI:
            raise Failure('CI=true: no Vulkan device (lavapipe: mesa-vulkan-drivers): ' + r.stderr.strip())
        raise Skip('no Vulkan device: ' + r.stderr.strip())
    prompts = {'amy': 'Once upon a time, there was a little girl named Lily.', 'ben': 'Tom had a big red ball.',
               'cat': 'The cat sat on the mat and looked at the bird.', 'dan': 'One day, a dog went to the park.'}

    def all_at_once(m, text_of):
        out = os.path.join(t.dir, 'out')
        os.makedirs(out, exist_ok=True)
        script = ' '.join('(echo %s > %s/%s/prompt && cat %s/%s/response > %s/%s) &'
                          % (shquote(text_of(a)), m, a, m, a, out, a) for a in prompts)
        sh(script + ' wait', check_rc=0, timeout=300)
        replies = {a: open(os.path.join(out, a), errors='replace').read() for a in prompts}
        for a in prompts:
            wait_idle(m, a)
            status = json.loads(sh('cat %s/%s/status.json' % (m, a), check_rc=0).stdout)
            check(status['last_error'] == '' and status['last_turn']['generated_tokens'] > 0,
                  '%s replied: %s' % (a, status))
        return replies

    def serve(backend):
        """The script on one backend: replies per phase, and what the phases showed."""
        # Blocks of 64 tokens (q4k's chunk): each agent's cache spans several, which move between the device,
        # host memory and the store.
        vulkan = ['--block-tokens', '64'] + (['--backend', 'vulkan'] if backend == 'vulkan' else [])
        d = t.daemon(name=backend, extra=vulkan)
        m = d.mnt
        sh('mkdir ' + ' '.join('%s/%s' % (m, a) for a in prompts), check_rc=0)
        for a in prompts:
            small_replies(m, a, 24)
        replies = [all_at_once(m, lambda a: prompts[a])]
        replies.append(all_at_once(m, lambda a: 'And then what did %s do?' % a))
        if backend == 'vulkan':
            check('vulkan:' in open(d.log).read(), 'kvfsd runs on the Vulkan device:\n' + open(d.log).read())
        check(d.stop() == 0, 'kvfsd exits 0 on SIGTERM')
        d.start()  # the caches come back from the store
        replies.append(all_at_once(m, lambda a: 'Where did %s go next?' % a))
        for a in prompts:
            last = json.loads(sh('cat %s/%s/status.json' % (m, a), check_rc=0).stdout)['last_turn']
            check(last['match'] == 'extend' and last['reused_tokens'] > 0,
                  '%s resumed its cache after the restart: %s' % (a, last))
        check(d.stop() == 0, 'kvfsd exits 0 on SIGTERM')
        # KV memory for about two agents of four, which take turns one by one: each turn's cache
        # comes back from the store (on the device: its blocks are uploaded again) and sends
        # another's out. (Written at once, their blocks would all be in use together: EAGAIN.)
        d.extra = vulkan + ['--kv-budget', '160K']
        d.start()
        for question in ('Who did %s meet?', 'What did %s find?'):
            replies.append({a: say(m, a, question % a) for a in prompts})
        status = json.loads(sh('cat %s/.status.json' % m, check_rc=0).stdout)
        check(status['evictions'] > 0 and status['reload_bytes'] > 0 and status['cpu_fallback_steps'] == 0,
              'caches were evicted and reloaded: %s' % status)
        check(d.stop() == 0, 'kvfsd exits 0 on SIGTERM')
        d.extra = vulkan + (['--kv-device-budget', '1'] if backend == 'vulkan' else [])
        d.start()
        replies.append(all_at_once(m, lambda a: 'What did %s say?' % a))
        if backend == 'vulkan':
            status = json.loads(sh('cat %s/.status.json' % m, check_rc=0).stdout)
            check(status['cpu_fallback_steps'] > 0 and 'step(s) on the CPU' in open(d.log).read(),
                  'with no device budget, the steps run on the CPU behind it: %s' % status)
        def blocks_on_disk():
            return sum(len(files) for _, _, files in os.walk(os.path.join(d.store, 'blocks')))

        before = blocks_on_disk()
        sh('rm -r %s/dan' % m, check_rc=0)
        check(sh('ls %s' % m, check_rc=0).stdout.split() == ['amy', 'ben', 'cat'], 'dan is erased')
        # rm -r unlinks the files first (the cache goes: erase_cache), then the directory (erase).
        audit = [json.loads(l) for l in sh('cat %s/.audit.log' % m, check_rc=0).stdout.splitlines()]
        dan = [e for e in audit if e['agent'] == 'dan']
        freed = sum(e.get('blocks_freed', 0) for e in dan)
        check(dan[-1]['action'] == 'erase' and freed >= 2 and blocks_on_disk() == before - freed,
              'the audit log has the erasure and its blocks left the store (%d of %d): %s'
              % (freed, before, dan))
        d.stop()
        return d, replies

    _, cpu = serve('cpu')
    d, gpu = serve('vulkan')
    for phase, (want, got) in enumerate(zip(cpu, gpu)):
        for a in prompts:
            check(got[a] == want[a], 'phase %d, %s: the Vulkan daemon replies as the CPU one:\n%r\n%r'
                  % (phase, a, got[a], want[a]))
    # kill -9 while the device generates: the agent is at its last committed turn or the new one.
    d.extra = ['--block-tokens', '64', '--backend', 'vulkan']
    d.start()
    m = d.mnt
    small_replies(m, 'amy', 200)
    before = sh('cat %s/amy/transcript' % m, check_rc=0).stdout
    sh('echo "Tell me a long story." > %s/amy/prompt' % m, check_rc=0)
    deadline = time.time() + 30
    while time.time() < deadline:  # until the reply streams into the transcript (tail -f's view)
        now = sh('cat %s/amy/transcript' % m, check_rc=0).stdout
        if len(now) > len(before) + 60:
            break
        if json.loads(sh('cat %s/amy/status.json' % m, check_rc=0).stdout)['queued_turns'] == 0:
            break  # a short reply ended already: kill -9 after the turn
        time.sleep(0.01)
    d.stop(signal.SIGKILL)
    d.start()
    after = sh('cat %s/amy/transcript' % m, check_rc=0).stdout
    print('     killed %s' % ('before the turn committed' if after == before else 'after the turn committed'), flush=True)
    check(after == before or (after.startswith(before) and '[user]\nTell me a long story.\n' in after),
          'after kill -9, the previous turn or the new one:\n%r\n%r' % (before, after))
    small_replies(m, 'amy', 8)
    say(m, 'amy', 'One more.')
    check(user_turns(m, 'amy') == before.count('[user]\n') + (1 if after == before else 2), 'and it goes on')
