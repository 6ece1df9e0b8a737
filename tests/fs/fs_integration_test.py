#!/usr/bin/env python3
"""Integration tests of kvfsd on a real FUSE mount, driven only with real tools (ls, mkdir, echo,
cat, tail -f, cp, rm, stat, getfattr, find, jq, setpriv). Python 3 standard library only.

  fs_integration_test.py DAEMON MODEL OTHER_MODEL [KVFS_CLI]

DAEMON is kvfsd (the real engine) or kvfsd_fake (tests/fs/fake_engine.h); MODEL is the model to
serve and OTHER_MODEL one with another fingerprint (its caches must be refused). Every test
mounts in a fresh temporary directory and unmounts (fusermount3 -u -z) even when it fails.
Missing shared data, no FUSE or not root: skip (exit 0 with a message), except under CI=true.
A test that does not apply here (the fake engine has no forward pass; kvfsd built without
Vulkan) prints SKIP with the reason and is not counted as passed."""
import errno, json, os, signal, subprocess, sys, time

from fs_harness import (CI, DAEMON, FAKE, KVFS_CLI, MODEL, OTHER_MODEL, Failure, Skip, check, fails_with,
                        jq, run_tests, say, sh, shquote, small_replies, test, user_turns, wait_idle)


@test
def basic_turn_and_files(t):
    d = t.daemon()
    m = d.mnt
    sh('mkdir %s/alice' % m, check_rc=0)
    ls = sh('ls -l %s/alice' % m, check_rc=0).stdout
    for f in ('prompt', 'response', 'transcript', 'system', 'config.json', 'status.json', 'kv.safetensors'):
        check(f in ls, 'ls -l lists ' + f + ':\n' + ls)
    check(sh('stat -c %%a %s/alice' % m, check_rc=0).stdout.strip() == '700', 'agents are 0700')
    small_replies(m, 'alice')
    before = time.time()
    reply = say(m, 'alice', 'Once upon a time')
    check(len(reply) > 0 or not FAKE, 'a reply')
    transcript = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    check('Once upon a time' in transcript, 'transcript holds the prompt: ' + transcript)
    check(reply in transcript, 'transcript holds the reply')
    check(user_turns(m, 'alice') == 1, 'one turn')
    check(int(jq(m + '/alice/status.json', '.turns')) >= 1, 'status.json counts it')
    # A command inside a redirected group closes its copy of the descriptor before the group
    # is done: still one turn, with all of the group's text.
    sh('{ printf "Lily had a dog. "; /bin/true; printf "The dog ran."; } > %s/alice/prompt' % m, check_rc=0)
    wait_idle(m, 'alice', turns=2)
    transcript = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    check(user_turns(m, 'alice') == 2 and 'Lily had a dog. The dog ran.' in transcript,
          'a group\'s output is one prompt: %r' % transcript)
    check(jq(m + '/alice/status.json', '.state') in ('hot', 'warm', 'cold'), 'status.json state')
    xattr = sh('getfattr -d %s/alice' % m, check_rc=0).stdout
    for name in ('user.kvfs.state', 'user.kvfs.tokens', 'user.kvfs.bytes'):
        check(name in xattr, 'getfattr shows ' + name + ': ' + xattr)
    tokens = sh('getfattr --only-values -n user.kvfs.tokens %s/alice' % m, check_rc=0).stdout
    check(int(tokens) > 0, 'tokens > 0')
    # cp -p and cp -a set the mode the file already has and try ACLs and xattrs, which kvfs files
    # do not support (EOPNOTSUPP): the copy succeeds.
    src = os.path.join(t.dir, 'system.txt')
    with open(src, 'w') as f:
        f.write('Be kind.')
    os.chmod(src, 0o600)
    for flags in ('-p', '-a'):
        sh('cp %s %s %s/alice/system' % (flags, src, m), check_rc=0)
        check(sh('cat %s/alice/system' % m, check_rc=0).stdout == 'Be kind.', 'cp %s into system' % flags)
    sh(': > %s/alice/system' % m, check_rc=0)
    mtime = int(sh('stat -c %%Y %s/alice' % m, check_rc=0).stdout)
    check(abs(mtime - before) < 30, 'mtime of the agent is its last turn')
    found = sh('find %s -name status.json' % m, check_rc=0).stdout.split()
    check(found == [m + '/alice/status.json'], 'find: %s' % found)
    check('hit rate' in sh('cat %s/.status' % m, check_rc=0).stdout, '.status')
    check(jq(m + '/.status.json', '.agents | keys | join(",")') == 'cold,error,generating,hot,queued,warm', '.status.json agents')
    check('kvfs_turns_total' in sh('cat %s/.metrics' % m, check_rc=0).stdout, '.metrics')
    check(len(jq(m + '/.model.json', '.fingerprint')) > 0, '.model.json fingerprint')
    # df of the mount: the store's file system (where the agents' caches go), not zeros.
    mounted, store = os.statvfs(m), os.statvfs(d.store)
    check(mounted.f_blocks == store.f_blocks > 0 and mounted.f_frsize == store.f_frsize,
          'statfs of the mount is the store\'s: %s against %s' % (mounted, store))
    check(mounted.f_namemax == 64, 'names of up to 64 bytes: %s' % (mounted,))
    df = sh('df -P %s' % m, check_rc=0).stdout.splitlines()[-1].split()
    check(int(df[1]) > 0, 'df shows the size: %s' % df)
    if KVFS_CLI:
        out = sh('%s status --mount %s' % (KVFS_CLI, m), check_rc=0).stdout
        check('hit rate' in out, 'kvfs status: ' + out)
        out = sh('%s status --mount %s --json | jq .agents.hot' % (KVFS_CLI, m), check_rc=0).stdout
        check(out.strip().isdigit(), 'kvfs status --json')


@test
def bad_input_is_refused(t):
    d = t.daemon(extra=['-c', '256'])
    m = d.mnt
    for name in ('.x', 'a' * 65, "'a b'"):
        fails_with('mkdir %s/%s' % (m, name), 'Invalid argument')
    sh('mkdir %s/alice' % m, check_rc=0)
    small_replies(m, 'alice')
    fails_with('touch %s/alice/notes' % m, 'Operation not permitted')
    for f in ('response', 'transcript', 'status.json'):
        fails_with('echo x > %s/alice/%s' % (m, f), 'Permission denied')
    fails_with("printf 'bad \\xff byte' > %s/alice/prompt" % m, 'Invalid or incomplete multibyte')
    # Bad bytes that only close can see: a shell redirection ignores close errors, tee reports them.
    fails_with("printf 'cut \\xe2\\x82' | tee %s/alice/prompt" % m, 'Invalid or incomplete multibyte')
    sh("printf 'cut \\xe2\\x82' > %s/alice/prompt" % m, check_rc=0)  # the shell hides it ...
    refused = json.loads(sh('cat %s/alice/status.json' % m, check_rc=0).stdout)['last_refused_write']
    check(refused and refused['file'] == 'prompt' and refused['code'] == 'EILSEQ' and 'UTF-8' in refused['error'],
          '... status.json shows it: %s' % refused)
    # A refused import whose header is not UTF-8: the error quotes the bytes, status.json stays readable.
    sh("printf '\\003\\0\\0\\0\\0\\0\\0\\0\\042\\377\\042' > %s/bad.safetensors" % t.dir, check_rc=0)
    fails_with('cp %s/bad.safetensors %s/alice/kv.safetensors' % (t.dir, m), 'Invalid argument')
    refused = json.loads(sh('cat %s/alice/status.json' % m, check_rc=0).stdout)['last_refused_write']
    check(refused and refused['file'] == 'kv.safetensors' and refused['code'] == 'EINVAL',
          'status.json shows a refused import whose message holds bytes that are not UTF-8: %s' % refused)
    fails_with('head -c 1048577 /dev/zero | tr "\\0" a > %s/alice/prompt' % m, 'File too large')
    sh(': > %s/alice/prompt' % m, check_rc=0)  # empty: no turn
    check(user_turns(m, 'alice') == 0, 'no turn from refused or empty prompts')
    # A prompt longer than the context (256 tokens): the turn fails, the reason is in status.json.
    sh("printf 'word %%.0s' $(seq 2000) > %s/alice/prompt" % m, check_rc=0)
    fails_with('cat %s/alice/response' % m, 'Input/output error')
    status = json.loads(sh('cat %s/alice/status.json' % m, check_rc=0).stdout)
    check(status['state'] == 'error' and status['last_error'], 'status.json reports the failure: %s' % status)
    check(user_turns(m, 'alice') == 0, 'the failed turn is not committed')
    # Config: bad JSON or values fail at close with EINVAL and change nothing.
    before = sh('cat %s/alice/config.json' % m, check_rc=0).stdout
    fails_with("echo '{bad' > %s/alice/config.json" % m, 'Invalid argument')  # at write
    fails_with("""echo '{"temperature": -2}' > %s/alice/config.json""" % m, 'Invalid argument')
    fails_with("""echo '{"unknown": 1}' > %s/alice/config.json""" % m, 'Invalid argument')
    fails_with("""printf '{"top_k": ' | tee %s/alice/config.json""" % m, 'Invalid argument')  # at close
    check(sh('cat %s/alice/config.json' % m, check_rc=0).stdout == before, 'config unchanged')
    # The agent still works.
    say(m, 'alice', 'hello')
    check(user_turns(m, 'alice') == 1, 'a good turn after the bad ones')


@test
def import_export_and_erase_cache(t):
    d = t.daemon()
    m = d.mnt
    sh('mkdir %s/alice %s/bob' % (m, m), check_rc=0)
    small_replies(m, 'alice')
    say(m, 'alice', 'The cat sat on the mat')
    export = os.path.join(t.dir, 'alice.safetensors')
    r = sh('cp %s/alice/kv.safetensors %s' % (m, export))
    if r.returncode != 0 and 'Operation not supported' in r.stderr and not FAKE:
        # The engine reports export/import as not available yet (EOPNOTSUPP): test the rest.
        # The engine implements them, so under CI this is a failure, not a skip.
        if CI:
            raise Failure('kv.safetensors export reported EOPNOTSUPP: ' + r.stderr.strip())
        print('  (the engine does not support kv.safetensors export/import yet: that part is skipped)')
        sh('rm %s/alice/kv.safetensors' % m, check_rc=0)
        check('The cat sat' in sh('cat %s/alice/transcript' % m, check_rc=0).stdout, 'transcript stays')
        say(m, 'alice', 'And then')
        check(user_turns(m, 'alice') == 2, 'a turn after erasing the cache')
        check('erase_cache' in sh('cat %s/.audit.log' % m, check_rc=0).stdout, 'audit logs erase_cache')
        return
    check(r.returncode == 0, 'cp of the export: ' + r.stderr)
    check(os.path.getsize(export) > 0, 'export is not empty')
    with open(export, 'rb') as f:
        data = f.read()
    # Opened for reading and writing (no O_TRUNC) it is the export; a byte changed in place (the
    # payload's last, which only the checksum covers; the fake's first) is refused at close, and
    # alice keeps her cache.
    with open('%s/alice/kv.safetensors' % m, 'r+b') as f:
        check(f.read() == data, 'an O_RDWR open of kv.safetensors reads the export')
    try:
        with open('%s/alice/kv.safetensors' % m, 'r+b') as f:
            at = 0 if FAKE else len(data) - 1
            f.seek(at)
            f.write(bytes([data[at] ^ 1]))
        raise Failure('a damaged kv.safetensors was imported')
    except OSError as e:
        check(e.errno == errno.EINVAL, 'a damaged kv.safetensors fails with EINVAL: %s' % e)
    with open('%s/alice/kv.safetensors' % m, 'rb') as f:
        check(f.read() == data, 'a refused in-place change leaves the cache as it was')
    garbage = os.path.join(t.dir, 'garbage')
    with open(garbage, 'wb') as f:
        f.write(os.urandom(4096))
    truncated = os.path.join(t.dir, 'truncated')
    with open(truncated, 'wb') as f:
        f.write(data[: len(data) * 2 // 3])
    bads = [garbage, truncated]
    if not FAKE:
        # The export with its checksum deleted from the header and a data byte damaged: the
        # checksum is required, so deleting it does not get damaged data in.
        n = int.from_bytes(data[:8], 'little')
        header = json.loads(data[8:8 + n])
        check(header['__metadata__']['format_version'] == '2', 'exports are of format_version 2')
        del header['__metadata__']['payload_xxh3_64']
        text = json.dumps(header).encode()
        text += b' ' * ((8 - len(text) % 8) % 8)
        unchecked = os.path.join(t.dir, 'unchecked')
        with open(unchecked, 'wb') as f:
            f.write(len(text).to_bytes(8, 'little') + text + data[8 + n:-1] + bytes([data[-1] ^ 1]))
        bads.append(unchecked)
    for bad in bads:
        fails_with('cp %s %s/bob/kv.safetensors' % (bad, m), 'Invalid argument')
    check(sh('cat %s/bob/transcript' % m, check_rc=0).stdout == '', 'a refused import changes nothing')
    sh('cp %s %s/bob/kv.safetensors' % (export, m), check_rc=0)
    a = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    b = sh('cat %s/bob/transcript' % m, check_rc=0).stdout
    check(a == b and 'The cat sat' in b, 'import carries the conversation:\n%r\n%r' % (a, b))
    if not FAKE:
        # A clone continues alice's cache: its next turn reuses every imported token (the file
        # carries the text behind them).
        sh('cp %s/alice/config.json %s/bob/config.json' % (m, m), check_rc=0)
        tokens = json.loads(sh('cat %s/bob/status.json' % m, check_rc=0).stdout)['tokens']
        say(m, 'bob', 'And then')
        last = json.loads(sh('cat %s/bob/status.json' % m, check_rc=0).stdout)['last_turn']
        check(tokens > 0 and last['match'] == 'extend' and last['reused_tokens'] == tokens,
              'the clone extends the imported cache: %s (%d tokens imported)' % (last, tokens))
    # rm kv.safetensors: the cache goes, the transcript stays; the next turn rebuilds.
    sh('rm %s/alice/kv.safetensors' % m, check_rc=0)
    check('The cat sat' in sh('cat %s/alice/transcript' % m, check_rc=0).stdout, 'transcript stays')
    say(m, 'alice', 'And then')
    check(user_turns(m, 'alice') == 2, 'a turn after erasing the cache')
    audit = sh('cat %s/.audit.log' % m, check_rc=0).stdout
    actions = [json.loads(l)['action'] for l in audit.splitlines()]
    for a_ in ('export', 'import', 'erase_cache', 'config'):
        check(a_ in actions, 'audit log has %s: %s' % (a_, actions))
    check('cat sat' not in audit, 'the audit log never holds text')
    d.stop()
    # A cache of another model is refused.
    other = t.daemon(model=OTHER_MODEL, name='other')
    sh('mkdir %s/carol' % other.mnt, check_rc=0)
    fails_with('cp %s %s/carol/kv.safetensors' % (export, other.mnt), 'Invalid argument')


@test
def tar_backs_up_an_agent(t):
    """tar archives as many bytes as stat gives a file: kv.safetensors, generated at open, and
    response after a restart report their size, so an archive of an agent holds them as cat reads
    them, and its kv.safetensors clones the agent. A restart, which leaves the caches cold (an
    open reloads them), does not change the sizes; status.json, a live view, is archived empty
    (size 0, like /proc) without a warning."""
    d = t.daemon()
    m = d.mnt
    sh('mkdir %s/alice %s/bob' % (m, m), check_rc=0)
    small_replies(m, 'alice')
    sh('echo "Be brief." > %s/alice/system' % m, check_rc=0)
    say(m, 'alice', 'The cat sat on the mat')
    files = ['response', 'transcript', 'system', 'config.json', 'kv.safetensors']
    for restarted in (False, True):
        if restarted:
            d.stop()
            d.start()
        out = os.path.join(t.dir, 'x%d' % restarted)
        os.makedirs(out)
        # prompt is write-only: tar could not read it. Exit 0: no file changed size under it.
        sh('tar -cf %s/a.tar --exclude=alice/prompt -C %s alice && tar -xf %s/a.tar -C %s' % (out, m, out, out),
           check_rc=0)
        for f in files:
            archived = open(os.path.join(out, 'alice', f), 'rb').read()
            r = subprocess.run(['cat', '%s/alice/%s' % (m, f)], capture_output=True, timeout=60)
            check(r.returncode == 0, 'cat alice/%s' % f)
            check(len(archived) > 0 and archived == r.stdout,
                  'tar archived alice/%s as cat reads it (%d and %d bytes)' % (f, len(archived), len(r.stdout)))
    # A clone from the archive, as from the live agent (README): system, settings, then the cache.
    sh('cp %s/alice/system %s/alice/config.json %s/bob/' % (out, out, m), check_rc=0)
    sh('cp %s/alice/kv.safetensors %s/bob/kv.safetensors' % (out, m), check_rc=0)
    a = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    b = sh('cat %s/bob/transcript' % m, check_rc=0).stdout
    check(a == b and 'The cat sat' in b, 'the archived cache imports with its conversation:\n%r\n%r' % (a, b))
    # Restored in place after an erasure, as the README says. A plain tar -x over an agent ends
    # too, with errors (its unlink-and-create loop over the agent's files used to run forever).
    sh('rm -r %s/alice' % m, check_rc=0)
    sh('tar -xf %s/a.tar -C %s --overwrite --exclude=alice/response --exclude=alice/transcript '
       '--exclude=alice/status.json' % (out, m), check_rc=0)
    restored = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    check(restored == a, 'alice restored from the archive:\n%r\n%r' % (restored, a))
    # A plain tar -x over a live agent unlinks each file and creates it again: system,
    # config.json and kv.safetensors are restored that way (absent after the unlink, created
    # again); the views (response, transcript, status.json) stay and end tar's tries with errors.
    sh('echo "Be verbose." > %s/alice/system' % m, check_rc=0)
    r = sh('tar -xf %s/a.tar -C %s' % (out, m), timeout=60)
    check(r.returncode == 2 and 'alice/status.json' in r.stderr and 'alice/kv.safetensors' not in r.stderr
          and 'alice/config.json' not in r.stderr and 'alice/system' not in r.stderr,
          'tar -x over a live agent ends, failing only on the views: %r' % (r,))
    check(sh('cat %s/alice/system' % m, check_rc=0).stdout == 'Be brief.\n', 'tar -x restored system')
    check(sh('cat %s/alice/transcript' % m, check_rc=0).stdout == a, 'and the cache, the same conversation')
    check(json.loads(sh('cat %s/alice/status.json' % m, check_rc=0).stdout)['tokens'] > 0, 'a cache, not erased')
    # Tools that replace a file by unlink and create: cp --remove-destination, and mv from
    # another filesystem (the archive's directory), after the cache was erased too.
    sh('cp --remove-destination %s/alice/kv.safetensors %s/alice/kv.safetensors' % (out, m), check_rc=0)
    check(json.loads(sh('cat %s/alice/status.json' % m, check_rc=0).stdout)['tokens'] > 0, 'cp --remove-destination imports')
    sh('rm %s/alice/kv.safetensors' % m, check_rc=0)
    check(not os.path.exists('%s/alice/kv.safetensors' % m), 'kv.safetensors is absent after rm')
    check(FAKE or json.loads(sh('cat %s/alice/status.json' % m, check_rc=0).stdout)['tokens'] == 0,
          'rm erased the cache')  # (the fake engine's tokens count its conversation)
    sh('mv %s/alice/kv.safetensors %s/alice/kv.safetensors' % (out, m), check_rc=0)
    check(json.loads(sh('cat %s/alice/status.json' % m, check_rc=0).stdout)['tokens'] > 0, 'mv from another filesystem imports')
    check(sh('cat %s/alice/transcript' % m, check_rc=0).stdout == a, 'the same conversation')


@test
def system_prompt_and_prefixes(t):
    d = t.daemon()
    m = d.mnt
    sh('mkdir %s/alice' % m, check_rc=0)
    small_replies(m, 'alice')
    say(m, 'alice', 'Hello')
    sh("echo 'You tell short stories.' > %s/alice/system" % m, check_rc=0)
    check(sh('cat %s/alice/system' % m, check_rc=0).stdout.strip() == 'You tell short stories.', 'system reads back')
    transcript = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    # (the file keeps echo's newline; the transcript, like the model, leaves it out)
    check(transcript.startswith('[system]\nYou tell short stories.\n\n[user]\nHello\n'),
          'the transcript shows the system prompt, then the conversation kept: %r' % transcript[:80])
    say(m, 'alice', 'Again')
    check(user_turns(m, 'alice') == 2, 'turns continue after a system change')
    sh("echo 'Once upon a time there was a little' > %s/.prefixes/story" % m, check_rc=0)
    check('little' in sh('cat %s/.prefixes/story' % m, check_rc=0).stdout, 'prefix reads back')
    check('story' in sh('ls %s/.prefixes' % m, check_rc=0).stdout, 'prefix listed')
    sh('rm %s/.prefixes/story' % m, check_rc=0)
    check(sh('ls %s/.prefixes' % m, check_rc=0).stdout.strip() == '', 'prefix removed')
    check('prefix_remove' in sh('cat %s/.audit.log' % m, check_rc=0).stdout, 'audit logs the prefix removal')


@test
def prefixes_survive_restart(t):
    # 16-token blocks, so a short prefix fills whole blocks (only full blocks are shared).
    d = t.daemon(extra=['--block-tokens', '16'])
    m = d.mnt
    text = ('Once upon a time, there was a little girl named Lily. She liked to play outside '
            'with her dog in the big green park.')
    sh('printf %%s %s > %s/.prefixes/story.txt' % (shquote(text), m), check_rc=0, user=65534)
    sh('printf %%s %s > %s/.prefixes/gone' % (shquote('The sun was hot and the sky was blue all day long.'), m),
       check_rc=0)
    sh('rm %s/.prefixes/gone' % m, check_rc=0)
    rc = d.stop()
    check(rc == 0, 'kvfsd exits 0 on SIGTERM (got %s)' % rc)
    d.start()
    check(sh('ls %s/.prefixes' % m, check_rc=0).stdout.split() == ['story.txt'],
          'the prefix is listed after a restart, the removed one is not: %r' % sh('ls %s/.prefixes' % m).stdout)
    check(sh('cat %s/.prefixes/story.txt' % m, check_rc=0).stdout == text, 'the prefix text survives a restart')
    check(sh('stat -c %%u %s/.prefixes/story.txt' % m, check_rc=0).stdout.strip() == '65534',
          'the prefix keeps its owner')
    if not FAKE:
        log = open(d.log).read()
        restored = [l for l in log.splitlines() if 'prefix story.txt restored' in l]
        check(restored and ' 0 prefilled' in restored[-1] and ' 0 loaded' not in restored[-1],
              'its blocks were loaded from the store, not prefilled: %r' % restored)
        # An agent of another uid whose context starts with it reuses its blocks.
        sh('mkdir %s/reader' % m, check_rc=0)
        small_replies(m, 'reader', 8)
        say(m, 'reader', text + ' One day, Lily found a ball.')
        reused = int(jq('%s/reader/status.json' % m, '.last_turn.reused_tokens'))
        check(reused >= 16, 'the agent reused the prefix blocks: %d tokens' % reused)
    sh('rm %s/.prefixes/story.txt' % m, check_rc=0, user=65534)
    d.stop()
    d.start()
    check(sh('ls %s/.prefixes' % m, check_rc=0).stdout.strip() == '', 'a removed prefix stays removed after a restart')
    if not FAKE:
        check(not os.listdir(os.path.join(d.store, 'prefixes')), 'its record is gone from the store')
        # A damaged record (one letter of its text changed) is listed, owned by root; reading it
        # fails with EIO; rm erases it, and writing the name again makes a new prefix.
        sh('printf %%s %s > %s/.prefixes/damaged' % (shquote(text), m), check_rc=0)
        d.stop()
        record = os.path.join(d.store, 'prefixes', 'damaged.prefix')
        data = open(record, 'rb').read()
        at = data.index(b'"text":"') + 8
        open(record, 'wb').write(data[:at] + (b'y' if data[at:at + 1] == b'x' else b'x') + data[at + 1:])
        d.start()
        check(sh('ls %s/.prefixes' % m, check_rc=0).stdout.split() == ['damaged'], 'a damaged prefix is still listed')
        check(sh('stat -c %%u:%%s %s/.prefixes/damaged' % m, check_rc=0).stdout.strip() == '0:0',
              'owned by root (its owner is unknown), size 0')
        fails_with('cat %s/.prefixes/damaged' % m, 'Input/output error')
        check('prefix damaged is unreadable' in open(d.log).read(), 'the log says why')
        sh('rm %s/.prefixes/damaged' % m, check_rc=0)
        check(not os.listdir(os.path.join(d.store, 'prefixes')), 'rm erased the damaged record')
        sh('printf %%s %s > %s/.prefixes/damaged' % (shquote(text), m), check_rc=0)
        check(sh('cat %s/.prefixes/damaged' % m, check_rc=0).stdout == text, 'and the name can be written anew')


@test
def batched_turns_are_faster_than_serial(t):
    """Issue 6: agents whose prompts are written at once are decoded together (one forward pass
    per step), so 4 turns at once finish faster than the same 4 one after another, and each reply
    is the one it gets alone (greedy). Timing on a busy 2-core machine is noisy (other processes
    only ever add time, and a 2-thread engine sharing its cores can take several times longer
    for a while), so 7 serial and 7 concurrent rounds are paired and the median ratio is
    compared. On OTHER_MODEL (tiny-llama-F16: random weights, 2 layers, a 32000 x 256 f16 output
    matrix that every decode step reads, as a real model's weights are), which batching shares:
    the median ratio measured 0.44-0.60 in 12 runs beside a busy loop on one core. On
    stories260K a step's work is mostly per sequence (attention), the ratio was 0.77 on a quiet
    machine and 0.39-0.95 beside that loop (one failure in 12). The tiny-llama replies also hold
    byte tokens that form no UTF-8; their turns' commits once failed on them (see
    EngineTest.InvalidUtf8FromByteTokensIsCommittedAndResumed)."""
    if FAKE:
        raise Skip('the fake engine has no forward pass to batch')
    d = t.daemon(model=OTHER_MODEL)
    m = d.mnt
    prompts = ['Once upon a time, there was a little girl named Lily.', 'Tom had a big red ball.',
               'The cat sat on the mat and looked at the bird.', 'One day, a dog went to the park.']
    made = []

    def fresh_agents():
        names = ['a%d' % (len(made) + i) for i in range(len(prompts))]
        made.extend(names)
        sh('mkdir ' + ' '.join('%s/%s' % (m, a) for a in names), check_rc=0)
        for a in names:
            sh("""echo '{"max_tokens": 128, "temperature": 0}' > %s/%s/config.json""" % (m, a), check_rc=0)
        return names

    def max_batch():
        for line in sh('cat %s/.metrics' % m, check_rc=0).stdout.splitlines():
            if line.startswith('kvfs_batch_size{quantile="1"}') or line.startswith('kvfs_batch_size{quantile="1.0"}'):
                return float(line.split()[-1])
        raise Failure('no kvfs_batch_size max in .metrics')

    say(m, fresh_agents()[0], 'A warm-up turn.')  # threads up, model pages mapped: not timed
    out = os.path.join(t.dir, 'out')
    os.makedirs(out)
    alone, generated = None, []

    def run_serial():
        nonlocal alone, generated
        names = fresh_agents()
        t0 = time.time()
        replies = [say(m, a, p) for a, p in zip(names, prompts)]
        took = time.time() - t0
        if alone is None:
            alone = replies
            generated = [int(jq('%s/%s/status.json' % (m, a), '.last_turn.generated_tokens')) for a in names]
            check(sum(generated) >= 400, 'replies long enough for decoding to matter: %s tokens' % generated)
            check(max_batch() == 1, 'one agent at a time decodes alone (batch 1)')
        check(replies == alone, 'the same turns give the same replies')
        return took

    def run_concurrent():
        names = fresh_agents()
        script = ' '.join('(echo %s > %s/%s/prompt && cat %s/%s/response > %s/%s) &'
                          % (shquote(p), m, a, m, a, out, a) for a, p in zip(names, prompts))
        t0 = time.time()
        sh(script + ' wait', check_rc=0, timeout=300)
        took = time.time() - t0
        batched = max_batch()
        check(batched > 1, '.metrics shows batches of more than one sequence: %g' % batched)
        for a, want in zip(names, alone):
            got = open(os.path.join(out, a), errors='replace').read()
            check(got == want, '%s replies as it does alone:\n%r\n%r' % (a, got, want))
        return took

    # Paired rounds (serial then concurrent, then the other way round), compared pair by pair:
    # the two halves of a pair run back to back, so they mostly see the same machine.
    serial, concurrent = [], []
    for round in range(7):
        if round % 2 == 0:
            serial.append(run_serial())
            concurrent.append(run_concurrent())
        else:
            concurrent.append(run_concurrent())
            serial.append(run_serial())
    ratios = sorted(c / s for s, c in zip(serial, concurrent))
    print('     serial %s s, concurrent %s s, concurrent/serial median %.2f, %d tokens per round'
          % (' '.join('%.2f' % x for x in serial), ' '.join('%.2f' % x for x in concurrent), ratios[len(ratios) // 2],
             sum(generated)), flush=True)
    # Faster, with a margin for noise: quiet machines measure 0.7-0.8 on this tiny model.
    check(ratios[len(ratios) // 2] < 0.95, 'concurrent is not faster than 0.95 x serial (median ratio %.2f: %s)'
          % (ratios[len(ratios) // 2], ' '.join('%.2f' % r for r in ratios)))


@test
def privacy_between_uids(t):
    d = t.daemon()
    m = d.mnt
    sh('mkdir %s/alice' % m, check_rc=0)
    small_replies(m, 'alice')
    say(m, 'alice', 'my secret')
    fails_with('ls %s/alice' % m, 'Permission denied', user=65534)
    fails_with('cat %s/alice/transcript' % m, 'Permission denied', user=65534)
    fails_with('echo hi > %s/alice/prompt' % m, 'Permission denied', user=65534)
    check(sh('rm -rf %s/alice' % m, user=65534).returncode != 0, 'another uid cannot erase alice')  # sticky root
    check(user_turns(m, 'alice') == 1, 'alice intact')
    # nobody's own agent works and is nobody's.
    sh('mkdir %s/nobodys' % m, check_rc=0, user=65534)
    check(sh('stat -c %%u %s/nobodys' % m, check_rc=0).stdout.strip() == '65534', 'owned by its creator')
    sh("""echo '{"max_tokens": 8}' > %s/nobodys/config.json""" % m, check_rc=0, user=65534)
    sh('echo hello > %s/nobodys/prompt' % m, check_rc=0, user=65534)
    sh('cat %s/nobodys/response' % m, check_rc=0, user=65534)
    check('alice' in sh('ls %s' % m, check_rc=0, user=65534).stdout, 'names are listed, contents are not')
    sh('rm -r %s/nobodys' % m, check_rc=0, user=65534)
    # A file open for writing when its agent is erased never changes the agent that takes the name
    # next, another user's here: its close fails with ENOENT.
    sh('mkdir %s/reused' % m, check_rc=0, user=65534)
    stale = subprocess.Popen(
        ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', sys.executable, '-c',
         'import os, sys\n'
         'fd = os.open(sys.argv[1] + "/config.json", os.O_WRONLY | os.O_TRUNC)\n'
         'print("open", flush=True); sys.stdin.readline()\n'
         'os.write(fd, b\'{"max_tokens": 3, "stop": ["PWNED"]}\')\n'
         'try:\n  os.close(fd); print("closed")\n'
         'except OSError as e:\n  print("errno", e.errno)\n', '%s/reused' % m],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    check(stale.stdout.readline().strip() == 'open', 'the stale writer opened config.json')
    sh('rm -r %s/reused' % m, check_rc=0, user=65534)
    sh('mkdir %s/reused' % m, check_rc=0)
    before = sh('cat %s/reused/config.json' % m, check_rc=0).stdout
    out, _ = stale.communicate('go\n', timeout=60)
    check(out.strip() == 'errno %d' % errno.ENOENT, 'the stale close fails with ENOENT: %r' % out)
    check(sh('cat %s/reused/config.json' % m, check_rc=0).stdout == before, "root's new agent is unchanged")
    fails_with('ln -s x %s/reused/link' % m, 'Operation not permitted')


@test
def streaming_tail_and_interrupt(t):
    d = t.daemon(env={'KVFS_FAKE_DELAY_MS': '20'})
    m = d.mnt
    sh('mkdir %s/alice %s/bob' % (m, m), check_rc=0)
    small_replies(m, 'alice', 64)
    tail = subprocess.Popen(['tail', '-f', '-s', '0.1', m + '/alice/transcript'], stdout=subprocess.PIPE)
    try:
        sh('echo "A story about a dog" > %s/alice/prompt' % m, check_rc=0)
        # While alice generates: ls, .status, another agent's files and turns are not blocked.
        t0 = time.time()
        sh('ls -l %s && cat %s/.status >/dev/null && cat %s/bob/status.json >/dev/null' % (m, m, m), check_rc=0)
        sh("""echo '{"max_tokens": 8}' > %s/bob/config.json && echo hi > %s/bob/prompt""" % (m, m), check_rc=0)
        check(time.time() - t0 < 2, 'other operations are not blocked by a generation')
        reply = sh('cat %s/alice/response' % m, check_rc=0).stdout
        deadline = time.time() + 10
        seen = ''
        os.set_blocking(tail.stdout.fileno(), False)
        raw = b''
        while time.time() < deadline and (reply not in seen or not reply):
            try:  # bytes from the fd: a non-blocking text stream may raise on a partial read
                raw += os.read(tail.stdout.fileno(), 65536)
            except BlockingIOError:
                pass
            seen = raw.decode('utf-8', 'replace')
            if reply and reply in seen:
                break
            time.sleep(0.1)
        check('A story about a dog' in seen and reply in seen, 'tail -f shows the turn: %r' % seen)
    finally:
        tail.kill()
        tail.wait()
    # A reader blocked on response is interrupted at once by a signal.
    sh("""echo '{"max_tokens": 256}' > %s/alice/config.json""" % m, check_rc=0)
    for i in range(3):
        sh('echo "Tell me more %d" > %s/alice/prompt' % (i, m), check_rc=0)
    cat = subprocess.Popen(['cat', m + '/alice/response'], stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    t0 = time.time()
    cat.send_signal(signal.SIGINT)
    cat.wait(timeout=5)
    check(time.time() - t0 < 1.0, 'cat of response stops within 1 s of SIGINT')
    wait_idle(m, 'alice')


@test
def blocked_readers_hold_no_thread(t):
    # A read of response waiting for text holds no FUSE thread (it is answered later): with 2
    # request threads, 40 readers waiting on a queued turn leave ls, stat, other agents' turns
    # and their own interrupts as quick as ever.
    d = t.daemon(extra=['--fuse-threads', '2'], env={'KVFS_FAKE_DELAY_MS': '300'})  # (fake: ~2 s a turn)
    m = d.mnt
    sh('mkdir %s/alice %s/bob' % (m, m), check_rc=0)
    small_replies(m, 'bob', 8)
    sh("""echo '{"max_tokens": 256}' > %s/alice/config.json""" % m, check_rc=0)
    for i in range(3):
        sh('echo "Tell me more %d" > %s/alice/prompt' % (i, m), check_rc=0)
    cats = [subprocess.Popen(['cat', m + '/alice/response'], stdout=subprocess.DEVNULL) for _ in range(40)]
    try:
        time.sleep(0.3)
        waiting = sum(c.poll() is None for c in cats)
        t0 = time.time()
        sh('ls -l %s >/dev/null && stat %s/bob/status.json >/dev/null && mkdir %s/carol' % (m, m, m), check_rc=0)
        sh('echo hi > %s/bob/prompt && cat %s/.status >/dev/null' % (m, m), check_rc=0)
        elapsed = time.time() - t0
        if waiting > 2:  # (a fast model may have answered them all already: nothing to measure)
            check(elapsed < 1.5, '%d readers waiting, 2 threads: ls, stat, mkdir and a prompt took %.2f s'
                  % (waiting, elapsed))
        t0 = time.time()
        for c in cats:
            c.send_signal(signal.SIGINT)
        for c in cats:
            c.wait(timeout=10)
        check(time.time() - t0 < 3, '40 waiting readers stop within 3 s of SIGINT')
    finally:
        for c in cats:
            if c.poll() is None:
                c.kill()
                c.wait()
    wait_idle(m, 'alice')


@test
def concurrent_writers_and_agents(t):
    d = t.daemon()
    m = d.mnt
    sh('mkdir %s/solo' % m, check_rc=0)
    small_replies(m, 'solo', 8)
    # 10 writers on one agent at once: each accepted turn completes (the rest get EAGAIN).
    # tee reports close() errors (EAGAIN comes at close); a shell redirection would hide them.
    script = ' '.join('(echo "writer %d" | tee %s/solo/prompt >/dev/null 2>&1 && echo ok%d) &' % (i, m, i) for i in range(10))
    out = sh(script + ' wait', timeout=120).stdout.split()
    accepted = [int(w[2:]) for w in out if w.startswith('ok')]
    check(len(accepted) >= 1, 'some writers accepted')
    status = wait_idle(m, 'solo', len(accepted))
    check(user_turns(m, 'solo') == len(accepted), 'every accepted turn completed: %d of %d' % (user_turns(m, 'solo'), len(accepted)))
    transcript = sh('cat %s/solo/transcript' % m, check_rc=0).stdout
    for i in accepted:
        check(transcript.count('[user]\nwriter %d\n' % i) == 1, 'writer %d exactly once' % i)
    # 100 turns over 10 agents at once, in order per agent.
    agents = ['a%d' % i for i in range(10)]
    sh('mkdir ' + ' '.join('%s/%s' % (m, a) for a in agents), check_rc=0)
    for a in agents:
        small_replies(m, a, 4)
    loops = []
    for a in agents:
        loops.append('(for i in $(seq 0 9); do until echo "msg $i" | tee %s/%s/prompt >/dev/null 2>&1; do sleep 0.05; done; done) &'
                     % (m, a))
    sh(' '.join(loops) + ' wait', check_rc=0, timeout=300)
    for a in agents:
        status = wait_idle(m, a, 10, timeout=300)
        check(user_turns(m, a) == 10, '%s has 10 turns: %s' % (a, status))
        transcript = sh('cat %s/%s/transcript' % (m, a), check_rc=0).stdout
        positions = [transcript.find('[user]\nmsg %d\n' % i) for i in range(10)]
        check(all(p >= 0 for p in positions) and positions == sorted(positions), '%s turns in order: %s' % (a, positions))


@test
def erase_and_restart(t):
    d = t.daemon()
    m = d.mnt
    sh('mkdir %s/keep %s/gone' % (m, m), check_rc=0)
    small_replies(m, 'keep')
    small_replies(m, 'gone')
    keep_reply = say(m, 'keep', 'Remember the blue balloon')
    say(m, 'gone', 'zebra quartz xylophone')
    sh('rm -r %s/gone' % m, check_rc=0)
    check('gone' not in sh('ls %s' % m, check_rc=0).stdout, 'erased agent is not listed')
    audit = sh('cat %s/.audit.log' % m, check_rc=0).stdout.splitlines()
    erase = [json.loads(l) for l in audit if json.loads(l)['action'] == 'erase']
    check(len(erase) == 1 and erase[0]['agent'] == 'gone' and erase[0]['uid'] == 0, 'one erase line: %s' % audit)
    for key in ('time', 'bytes_freed', 'blocks_freed', 'blocks_kept_shared'):
        check(key in erase[0], 'erase line has ' + key)
    grep = sh('grep -r -l -a "zebra quartz" %s' % d.store)
    check(grep.stdout.strip() == '', 'no trace of the erased text in the store: ' + grep.stdout)
    # SIGTERM: exit 0, unmounted; a restart resumes.
    rc = d.stop()
    check(rc == 0, 'kvfsd exits 0 on SIGTERM (got %s)' % rc)
    check(not os.path.ismount(m), 'unmounted after SIGTERM')
    d.start()
    check('keep' in sh('ls %s' % m, check_rc=0).stdout, 'agent survives a restart')
    check('Remember the blue balloon' in sh('cat %s/keep/transcript' % m, check_rc=0).stdout, 'transcript survives')
    check(sh('cat %s/keep/response' % m, check_rc=0).stdout == keep_reply, 'response is the last reply')
    check(any(json.loads(l)['action'] == 'erase' for l in sh('cat %s/.audit.log' % m, check_rc=0).stdout.splitlines()),
          'the audit log survives a restart')
    say(m, 'keep', 'What was it?')
    check(user_turns(m, 'keep') == 2, 'the agent resumes')
    if not FAKE:
        # Damage that no crash makes (one letter of the stored text changed): the checksum catches
        # it and the agent comes back at its previous turn, saying so, instead of vanishing.
        d.stop()
        path = os.path.join(d.store, 'agents', 'keep', 'manifest.json')
        with open(path, 'rb') as f:
            data = f.read()
        check(b'What was it?' in data, 'the manifest holds the text')
        with open(path, 'wb') as f:
            f.write(data.replace(b'What was it?', b'what was it?'))
        d.start()
        transcript = sh('cat %s/keep/transcript' % m, check_rc=0).stdout
        check('Remember the blue balloon' in transcript and 'was it?' not in transcript,
              'back at the turn before the damaged one: %r' % transcript)
        status = json.loads(sh('cat %s/keep/status.json' % m, check_rc=0).stdout)
        check(status['state'] == 'error' and 'restored from its previous saved turn' in status['last_error'],
              'status.json says what happened: %s' % status)
        say(m, 'keep', 'What was it?')
        check(user_turns(m, 'keep') == 2, 'and it goes on from there')
        status = json.loads(sh('cat %s/keep/status.json' % m, check_rc=0).stdout)
        check(status['last_error'] == '', 'a good turn clears the error: %s' % status)
        # Both copies damaged: nothing can be read, but the agent is listed so that it can be
        # erased, refuses the rest, and rm -r removes every file it had.
        d.stop()
        for f in ('manifest.json', 'manifest.prev.json'):
            with open(os.path.join(d.store, 'agents', 'keep', f), 'wb') as out:
                out.write(b'{"format": "kvfs-man')
        d.start()
        check('keep' in sh('ls %s' % m, check_rc=0).stdout, 'an unreadable agent is listed')
        status = json.loads(sh('cat %s/keep/status.json' % m, check_rc=0).stdout)
        check(status['state'] == 'error' and 'can only be erased' in status['last_error'],
              'status.json says it can only be erased: %s' % status)
        sh('echo more > %s/keep/prompt' % m)
        status = json.loads(sh('cat %s/keep/status.json' % m, check_rc=0).stdout)
        check((status['last_refused_write'] or {}).get('code') == 'EIO', 'a prompt is refused: %s' % status)
        fails_with('mkdir %s/keep' % m, 'File exists')
        sh('rm -r %s/keep' % m, check_rc=0)
        check(not os.path.exists(os.path.join(d.store, 'agents', 'keep')), 'rm -r removes what was left of it')
        erases = [json.loads(l) for l in sh('cat %s/.audit.log' % m, check_rc=0).stdout.splitlines()]
        check(erases[-1]['action'] == 'erase' and erases[-1]['agent'] == 'keep', 'and logs it: %s' % erases[-1])


@test
def kill_during_generation(t):
    d = t.daemon(env={'KVFS_FAKE_DELAY_MS': '5'})
    m = d.mnt
    sh('mkdir %s/alice' % m, check_rc=0)
    small_replies(m, 'alice', 64)
    say(m, 'alice', 'first turn')
    before = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    sh('echo "second turn" > %s/alice/prompt' % m, check_rc=0)
    time.sleep(0.05)
    d.stop(signal.SIGKILL)
    check(sh('ls %s' % m).returncode != 0, 'the mount is stale after kill -9')
    d.start()  # cleans the stale mount
    after = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    turns = after.count('[user]\n')
    check(turns in (1, 2), 'previous or new turn: %r' % after)
    if turns == 1:
        check(after == before, 'at the previous turn exactly:\n%r\n%r' % (before, after))
    else:
        check(after.startswith(before) and '[user]\nsecond turn\n' in after, 'at the new turn: %r' % after)
    say(m, 'alice', 'third turn')


import fs_daemon_tests  # noqa: E402,F401 (registers the test of kvfsd's options and modes)
import fs_disk_tests  # noqa: E402,F401 (registers the tests on real disks: full, erased)
import fs_memory_tests  # noqa: E402,F401 (registers the test of erasure in the daemon's memory)
import fs_vulkan_tests  # noqa: E402,F401 (registers the test of the daemon on the Vulkan backend)

run_tests()
