"""fs integration test of kvfsd's own options and modes (imported by fs_integration_test.py, which
runs it): bad options, background start, one daemon per store and mount point, refused store,
mount and log paths, SIGHUP log reopening, SIGTERM unmounting."""
import json, os, signal, subprocess, time

from fs_harness import DAEMON, MODEL, check, cmdline_of, sh, test


@test
def daemon_modes(t):
    # Bad options and a missing model: exit 2 with one line naming the problem, nothing mounted.
    mnt = os.path.join(t.dir, 'mnt')
    r = subprocess.run([DAEMON, '--mount', mnt, '--bogus'], capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and '--bogus' in r.stderr, 'unknown option: %d %r' % (r.returncode, r.stderr))
    r = subprocess.run([DAEMON, '--mount', mnt, '-m', '/no/such.gguf'], capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and 'model not found' in r.stderr, 'missing model: %d %r' % (r.returncode, r.stderr))
    config = os.path.join(t.dir, 'kvfsd.json')
    with open(config, 'w') as f:
        json.dump({'mount': mnt, 'kv_budget': 'lots'}, f)
    r = subprocess.run([DAEMON, '--config', config, '-m', MODEL], capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and 'kv_budget' in r.stderr, 'bad config value: %d %r' % (r.returncode, r.stderr))
    # Background mode (the README's command): returns once mounted, logs to the store.
    store = os.path.join(t.dir, 'store')
    with open(config, 'w') as f:
        json.dump({'mount': mnt, 'store': store, 'model': MODEL, 'threads': 1}, f)
    t.unmount_later_fuse(mnt)
    check(not os.path.exists(mnt), 'no mount point before the start')
    r = subprocess.run([DAEMON, '--config', config], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, 'background start: %d %r' % (r.returncode, r.stderr))
    check(os.path.ismount(mnt), 'mounted when kvfsd returns')
    pids = [int(p) for p in os.listdir('/proc') if p.isdigit() and cmdline_of(p) == [DAEMON, '--config', config]]
    check(len(pids) == 1, 'one daemon process: %s' % pids)
    t.kill_later(pids[0])
    sh('mkdir %s/alice' % mnt, check_rc=0)
    # One daemon per store and per mount point: a second one says why and leaves the first alone.
    other = os.path.join(t.dir, 'mnt2')
    r = subprocess.run([DAEMON, '--mount', other, '--store', store, '-m', MODEL, '-t', '1'],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and 'in use by another kvfsd (pid %d)' % pids[0] in r.stderr,
          'a second daemon on the store: %d %r' % (r.returncode, r.stderr))
    check(not os.path.ismount(other), 'the second daemon mounted nothing')
    r = subprocess.run([DAEMON, '--mount', mnt, '--store', os.path.join(t.dir, 'store2'), '-m', MODEL, '-t', '1'],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and 'served by a running kvfsd' in r.stderr,
          'a second daemon on the mount point: %d %r' % (r.returncode, r.stderr))
    check(not os.path.exists(os.path.join(t.dir, 'store2')), 'and it made no store')
    check(os.path.isdir(os.path.join(mnt, 'alice')), 'the first daemon still serves its mount')
    # A store inside its own mount point would hang kvfsd on itself: refused before mounting.
    inside = os.path.join(t.dir, 'inside')
    r = subprocess.run([DAEMON, '--mount', inside, '--store', os.path.join(inside, 'store'), '-m', MODEL, '-t', '1'],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and 'is inside the mount point' in r.stderr and not os.path.ismount(inside),
          'a store inside the mount point: %d %r' % (r.returncode, r.stderr))
    # Nor a store or mount point inside the running daemon's mount: no agent is made there.
    for args in (['--mount', os.path.join(t.dir, 'm3'), '--store', os.path.join(mnt, 'st')],
                 ['--mount', os.path.join(mnt, 'alice', 'm'), '--store', os.path.join(t.dir, 'store3')]):
        r = subprocess.run([DAEMON] + args + ['-m', MODEL, '-t', '1'], capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and 'is inside the kvfs mount at %s' % mnt in r.stderr,
              'inside a running kvfsd\'s mount: %d %r' % (r.returncode, r.stderr))
    check(not os.path.exists(os.path.join(mnt, 'st')), 'and no agent was made there')
    # The log is appended to: never one of the store's files (an agent's manifest, the audit
    # trail) nor the model. (The store is the running daemon's: refused before its lock.)
    manifest = os.path.join(store, 'agents', 'alice', 'manifest.json')
    for log_file, what in ((manifest, 'inside the store'), (os.path.join(store, 'audit.log'), 'inside the store'),
                           (MODEL, 'is the model file')):
        before = open(log_file, 'rb').read() if os.path.exists(log_file) else None
        r = subprocess.run([DAEMON, '--mount', os.path.join(t.dir, 'm4'), '--store', store, '-m', MODEL, '-t', '1',
                            '--log-file', log_file], capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and what in r.stderr, '--log-file %s: %d %r' % (log_file, r.returncode, r.stderr))
        check(before is None or open(log_file, 'rb').read() == before, 'and %s is unchanged' % log_file)
    # logrotate: the log moved away, SIGHUP; the daemon serves on and logs to a new file.
    log = os.path.join(store, 'kvfsd.log')
    os.rename(log, log + '.1')
    os.kill(pids[0], signal.SIGHUP)
    # (The new file exists before its first line is written: wait for the line, not the file.)
    reopened = lambda: os.path.exists(log) and 'reopened' in open(log).read()
    deadline = time.time() + 10
    while time.time() < deadline and not reopened():
        time.sleep(0.05)
    check(reopened(), 'SIGHUP reopens the log file')
    sh('mkdir %s/carol' % mnt, check_rc=0)
    os.kill(pids[0], signal.SIGTERM)
    deadline = time.time() + 30
    while time.time() < deadline and os.path.ismount(mnt):
        time.sleep(0.05)
    check(not os.path.ismount(mnt), 'SIGTERM unmounts')
    # The mount point it made goes with it (removed right after the unmount).
    while time.time() < deadline and os.path.exists(mnt):
        time.sleep(0.05)
    check(not os.path.exists(mnt), 'the mount point kvfsd made is removed when it stops')
    check('mounted at' in open(log + '.1').read() and 'shutting down' in open(log).read(), 'the log is in the store')
    # One that existed stays.
    os.mkdir(mnt)
    # Started with its output to a pipe nobody reads any more (`kvfsd ... | head -0`): it still
    # mounts and serves (no death by SIGPIPE while it logs to the pipe before detaching).
    rd, wr = os.pipe()
    os.close(rd)
    p = subprocess.Popen([DAEMON, '--config', config], stdout=wr, stderr=wr)
    os.close(wr)
    rc = p.wait(timeout=60)
    check(rc == 0 and os.path.ismount(mnt), 'background start with a closed pipe as output: rc %d, mounted %s'
          % (rc, os.path.ismount(mnt)))
    pids = [int(q) for q in os.listdir('/proc') if q.isdigit() and cmdline_of(q) == [DAEMON, '--config', config]]
    check(len(pids) == 1, 'one daemon process: %s' % pids)
    t.kill_later(pids[0])
    sh('mkdir %s/bob && ls %s/bob/prompt' % (mnt, mnt), check_rc=0)
    os.kill(pids[0], signal.SIGTERM)
    deadline = time.time() + 30
    while time.time() < deadline and (os.path.ismount(mnt) or os.path.exists('/proc/%d' % pids[0])):
        time.sleep(0.05)
    check(not os.path.ismount(mnt), 'SIGTERM unmounts')
    check(os.path.isdir(mnt), 'a mount point that was there before the start stays')

