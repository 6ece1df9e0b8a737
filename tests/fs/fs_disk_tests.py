"""fs integration tests on real disks (imported by fs_integration_test.py, which runs them): a
store on a full tmpfs, and erasure checked on the raw bytes of an ext4 image."""
import errno, json, os, subprocess

from fs_harness import CI, FAKE, Failure, Skip, check, sh, small_replies, test


@test
def full_disk(t):
    store = os.path.join(t.dir, 'tmpfs')
    os.makedirs(store)
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=256k', 'tmpfs', store], capture_output=True, text=True)
    if r.returncode != 0:
        if CI:
            raise Failure('cannot mount a tmpfs: ' + r.stderr)
        raise Skip('cannot mount a tmpfs: ' + r.stderr.strip())  # counted as a skip, not a pass
    t.unmount_later(store)
    d = t.daemon(store=store, env={'KVFS_FAKE_KV_BYTES_PER_TOKEN': '1024'})
    m = d.mnt
    sh('mkdir %s/alice' % m, check_rc=0)
    small_replies(m, 'alice', 64)
    committed = ''
    failed = None
    for i in range(200):
        sh("printf 'Turn %d: %s' > %s/alice/prompt" % (i, 'a long line of filler text ' * 8, m), check_rc=0)
        r = sh('cat %s/alice/response' % m)
        status = json.loads(sh('cat %s/alice/status.json' % m, check_rc=0).stdout)
        if r.returncode != 0:
            failed = status
            break
        committed = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    check(failed is not None, 'the store filled up')
    check(failed['last_error_code'] == 'ENOSPC', 'ENOSPC in status.json: %s' % failed)
    now = sh('cat %s/alice/transcript' % m, check_rc=0).stdout
    check(now.startswith(committed), 'nothing stored before is lost:\n--- before ---\n%s\n--- now ---\n%s'
          % (committed[-300:], now[-300:]))
    check(now == committed, 'a failed turn leaves the agent at its previous turn:\n%r\n%r' % (committed[-200:], now[-200:]))
    sh('ls -l %s && cat %s/.status > /dev/null' % (m, m), check_rc=0)  # still serving
    d.stop()
    d.start()
    check(sh('cat %s/alice/transcript' % m, check_rc=0).stdout == committed, 'and it survives a restart')

    # No room left at all: an edit fails at close and changes nothing, then or after a restart,
    # and rm -r still erases the agent (its cache's files go first, to make room).
    sh('dd if=/dev/zero of=%s/filler bs=4k' % store)  # ends with ENOSPC
    config_before = sh('cat %s/alice/config.json' % m, check_rc=0).stdout
    system_before = sh('cat %s/alice/system' % m, check_rc=0).stdout
    for name, text in (('config.json', '{"max_tokens": 9}'), ('system', 'Be terse.')):
        try:
            with open(os.path.join(m, 'alice', name), 'w') as f:
                f.write(text)
            raise Failure('an edit of %s on a full disk succeeded' % name)
        except OSError as e:
            check(e.errno == errno.ENOSPC, 'ENOSPC for %s: %s' % (name, e))
    check(sh('cat %s/alice/config.json' % m, check_rc=0).stdout == config_before, 'config.json unchanged')
    check(sh('cat %s/alice/system' % m, check_rc=0).stdout == system_before, 'system unchanged')
    d.stop()
    d.start()
    check(sh('cat %s/alice/config.json' % m, check_rc=0).stdout == config_before, 'config.json after a restart')
    sh('rm -r %s/alice' % m, check_rc=0)
    check(not os.path.exists(os.path.join(m, 'alice')), 'rm -r on a full disk erases the agent')
    os.remove(os.path.join(store, 'filler'))
    d.stop()
    d.start()
    check(not os.path.exists(os.path.join(m, 'alice')), 'and it stays erased')


@test
def erasure_leaves_no_text_on_the_disk(t):
    """rm leaves none of an agent's or a prefix's text on the disk, free blocks included: turns
    (each one replacing the manifest that holds the conversation so far), a prefix written twice,
    then rm, all on a small ext4 image whose raw bytes are searched once it is unmounted."""
    if FAKE:
        raise Skip('the fake engine keeps plain files of its own; the store that erases is the real engine\'s '
                   '(kvfsd runs this)')
    img, disk = os.path.join(t.dir, 'ext4.img'), os.path.join(t.dir, 'disk')
    os.makedirs(disk)
    with open(img, 'wb') as f:
        f.truncate(64 << 20)
    r = subprocess.run('mkfs.ext4 -q -F %s && mount -o loop %s %s' % (img, img, disk), shell=True,
                       capture_output=True, text=True)
    if r.returncode != 0:
        if CI:
            raise Failure('cannot make and mount an ext4 image (e2fsprogs, a loop device): ' + r.stderr)
        raise Skip('cannot make and mount an ext4 image: ' + r.stderr.strip())
    t.unmount_later(disk)
    d = t.daemon(store=os.path.join(disk, 'store'), extra=['--block-tokens', '16'])
    m = d.mnt
    sh('mkdir %s/alice' % m, check_rc=0)
    markers = ['zqx%dsecret' % i for i in range(5)]
    for marker in markers:
        sh("echo 'Once upon a time there was %s in the garden' > %s/alice/prompt" % (marker, m), check_rc=0)
        sh('cat %s/alice/response' % m, check_rc=0)
    for marker in ['zqxprefixone', 'zqxprefixtwo']:  # the second write replaces the first record
        sh("echo 'Once upon a time %s lived' > %s/.prefixes/story" % (marker, m), check_rc=0)
    markers += ['zqxprefixone', 'zqxprefixtwo']
    sh('sync', check_rc=0)
    with open(img, 'rb') as f:
        raw = f.read()
    # The search sees what is on the disk: every marker is there before the erasure.
    check(all(mk.encode() in raw for mk in markers[:5] + ['zqxprefixtwo']),
          'the markers are on the disk before rm: %s' % [mk for mk in markers if mk.encode() not in raw])
    sh('rm -r %s/alice %s/.prefixes/story' % (m, m), check_rc=0)
    d.stop()
    r = subprocess.run(['umount', disk], capture_output=True, text=True)
    check(r.returncode == 0, 'umount: ' + r.stderr)
    with open(img, 'rb') as f:
        raw = f.read()
    left = {mk: raw.count(mk.encode()) for mk in markers if mk.encode() in raw}
    check(not left, 'text left on the disk after rm (count of each marker): %s' % left)
