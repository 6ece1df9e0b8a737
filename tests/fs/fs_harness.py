"""The harness of fs_integration_test.py: its arguments and environment checks, shell helpers,
kvfsd in the foreground (Daemon), a test's temporary directory and cleanup (TestContext), the
test registry (@test) and the runner (run_tests). Python 3 standard library only."""
import json, os, shutil, signal, subprocess, sys, tempfile, time, traceback

DAEMON, MODEL, OTHER_MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
KVFS_CLI = sys.argv[4] if len(sys.argv) > 4 else None
FAKE = os.path.basename(DAEMON).startswith('kvfsd_fake')
CI = os.environ.get('CI') == 'true'
ONLY = set(os.environ.get('KVFS_FS_TESTS', '').split(',')) - {''}


def skip(why):
    if CI:
        print('FAIL (CI=true):', why)
        sys.exit(1)
    print('SKIP:', why)
    sys.exit(0)


for path in (MODEL, OTHER_MODEL):
    if not os.path.exists(path):
        skip('test data not found: ' + path)
if os.geteuid() != 0:
    skip('needs root (allow_other, a second uid via setpriv, a tmpfs mount)')
if not os.path.exists('/dev/fuse') or shutil.which('fusermount3') is None:
    skip('no FUSE here (/dev/fuse, fusermount3)')
for tool in ('jq', 'getfattr', 'setpriv'):
    if shutil.which(tool) is None:
        skip(tool + ' is not installed (scripts/debian-packages.txt lists it)')


class Failure(Exception):
    pass


class Skip(Exception):
    """A test that cannot run here (said, not counted as passed)."""


def check(cond, what):
    if not cond:
        raise Failure(what)


def sh(cmd, check_rc=None, timeout=120, user=None, **kw):
    """Runs a shell command line; returns CompletedProcess (text)."""
    argv = ['bash', '-c', cmd]
    if user is not None:
        argv = ['setpriv', '--reuid=%d' % user, '--regid=%d' % user, '--clear-groups'] + argv
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, errors='replace', **kw)
    if check_rc is not None and r.returncode != check_rc:
        raise Failure('%r: exit %d (want %d)\nstdout: %s\nstderr: %s' % (cmd, r.returncode, check_rc, r.stdout, r.stderr))
    return r


def fails_with(cmd, message, user=None):
    r = sh(cmd, user=user)
    check(r.returncode != 0 and message in r.stderr,
          '%r should fail with %r; exit %d, stderr %r' % (cmd, message, r.returncode, r.stderr))


class Daemon:
    """kvfsd in the foreground on DIR/mnt with its store in DIR/store (or `store`)."""

    def __init__(self, root, model=MODEL, store=None, extra=(), env=None):
        self.root, self.model = root, model
        self.mnt = os.path.join(root, 'mnt')
        self.store = store or os.path.join(root, 'store')
        self.extra, self.env = list(extra), env or {}
        self.proc = None
        self.log = os.path.join(root, 'kvfsd.log')

    def start(self, expect_ok=True):
        try:
            os.makedirs(self.mnt, exist_ok=True)
        except FileExistsError:
            # A stale mount after kill -9 whose root's attributes the kernel no longer caches:
            # stat fails (ENOTCONN), so makedirs takes it for a file. kvfsd unmounts it itself
            # (fusermount3 -u -z) before mounting: that is under test, not done here.
            pass
        os.chmod(self.root, 0o755)
        env = dict(os.environ, **self.env)
        self.logf = open(self.log, 'a')
        self.proc = subprocess.Popen([DAEMON, '-m', self.model, '--mount', self.mnt, '--store', self.store,
                                      '--foreground', '-t', '2'] + self.extra,
                                     stdout=self.logf, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                if expect_ok:
                    raise Failure('kvfsd exited with %d:\n%s' % (self.proc.returncode, open(self.log).read()))
                return
            if os.path.ismount(self.mnt) and os.path.exists(os.path.join(self.mnt, '.status')):
                return
            time.sleep(0.05)
        raise Failure('kvfsd did not mount within 60 s:\n' + open(self.log).read())

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            raise Failure('kvfsd did not stop within %d s of %s' % (timeout, sig))
        finally:
            self.logf.close()
            self.proc = None
        return rc

    def cleanup(self):
        try:
            if self.proc is not None:
                self.proc.kill()
                self.proc.wait()
        finally:
            subprocess.run(['fusermount3', '-u', '-z', self.mnt], capture_output=True)


def jq(path, expr, user=None):
    r = sh("jq -r '%s' %s" % (expr, path), check_rc=0, user=user)
    return r.stdout.strip()


def user_turns(mnt, agent):
    """Committed turns, counted in the transcript (status.json's "turns" counts the engine's
    commits, which include configuration changes)."""
    return sh('cat %s/%s/transcript' % (mnt, agent), check_rc=0).stdout.count('[user]\n')


def wait_idle(mnt, agent, turns=None, timeout=120):
    """Waits until the agent has no queued turn (and `turns` committed, when given)."""
    deadline = time.time() + timeout
    status = {}
    while time.time() < deadline:
        status = json.loads(sh('cat %s/%s/status.json' % (mnt, agent), check_rc=0).stdout)
        if status['queued_turns'] == 0 and (turns is None or user_turns(mnt, agent) >= turns):
            return status
        time.sleep(0.05)
    raise Failure('agent %s not idle after %d s: %s' % (agent, timeout, status))


def say(mnt, agent, text):
    """echo TEXT > agent/prompt, then the reply (cat response)."""
    sh("echo %s > %s/%s/prompt" % (shquote(text), mnt, agent), check_rc=0)
    return sh('cat %s/%s/response' % (mnt, agent), check_rc=0).stdout


def shquote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def small_replies(mnt, agent, max_tokens=16):
    # Short replies keep the suite fast (and within a tiny model's context).
    sh("""echo '{"max_tokens": %d, "temperature": 0}' > %s/%s/config.json""" % (max_tokens, mnt, agent), check_rc=0)


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def cmdline_of(pid):
    try:
        with open('/proc/%s/cmdline' % pid, 'rb') as f:
            return f.read().decode(errors='replace').split('\0')[:-1]
    except OSError:
        return None


class TestContext:
    def __init__(self, name):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix='kvfs_it_%s_' % name)
        os.chmod(self.dir, 0o755)  # the second uid must reach the mount
        self.daemons = []
        self.mounts = []
        self.fuse_mounts = []
        self.pids = []  # daemons started in the background by a test (by their id)

    def daemon(self, name='d', **kw):
        d = Daemon(os.path.join(self.dir, name), **kw)
        self.daemons.append(d)
        d.start()
        return d

    def unmount_later(self, path):
        self.mounts.append(path)

    def unmount_later_fuse(self, path):
        self.fuse_mounts.append(path)

    def kill_later(self, pid):
        self.pids.append((pid, cmdline_of(str(pid))))

    def cleanup(self):
        for d in self.daemons:
            try:
                d.cleanup()
            except Exception:
                traceback.print_exc()
        for pid, cmdline in self.pids:
            if cmdline_of(str(pid)) != cmdline:
                continue  # gone (the id may belong to another process now)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for p in self.fuse_mounts:
            subprocess.run(['fusermount3', '-u', '-z', p], capture_output=True)
        for p in self.mounts:
            subprocess.run(['umount', '-l', p], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def run_tests():
    failed = 0
    passed = 0
    skipped = 0
    for fn in TESTS:
        if ONLY and fn.__name__ not in ONLY:
            continue
        t = TestContext(fn.__name__)
        t0 = time.time()
        try:
            fn(t)
            passed += 1
            print('ok   %s (%.1f s)' % (fn.__name__, time.time() - t0), flush=True)
        except Skip as e:
            skipped += 1
            print('SKIP %s: %s' % (fn.__name__, e), flush=True)
        except Exception as e:
            failed += 1
            print('FAIL %s: %s' % (fn.__name__, e), flush=True)
            if not isinstance(e, Failure):
                traceback.print_exc()
            for d in t.daemons:
                if os.path.exists(d.log):
                    print('--- %s ---\n%s' % (d.log, open(d.log).read()[-3000:]))
        finally:
            t.cleanup()
    print('%d passed, %d failed, %d skipped' % (passed, failed, skipped))
    sys.exit(1 if failed else 0)
