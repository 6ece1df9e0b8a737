#!/usr/bin/env python3
"""How long other requests of a kvfs mount take while many readers wait on `response`.

usage: bench/waiting_readers.py KVFSD MODEL [READERS]   (as root or a FUSE user; needs fusermount3)

Mounts a fresh store in a temporary directory, queues three long turns for one agent, opens
READERS (default 80) `cat response` bound to the last of them, then times five rounds of stat,
ls and a read of another agent's status.json. Prints the median and the slowest round. A reader
that held a FUSE request thread while waiting made the slowest round wait for the turns.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    daemon, model = sys.argv[1], sys.argv[2]
    readers = int(sys.argv[3]) if len(sys.argv) > 3 else 80
    root = tempfile.mkdtemp(prefix='kvfs_readers_')
    mnt, store = os.path.join(root, 'mnt'), os.path.join(root, 'store')
    subprocess.run([daemon, '--mount', mnt, '--store', store, '-m', model, '-t', '1'], check=True)
    cats = []
    try:
        os.mkdir(mnt + '/alice')
        os.mkdir(mnt + '/bob')
        with open(mnt + '/alice/config.json', 'w') as f:
            f.write(json.dumps({'max_tokens': 1500, 'temperature': 0.8}))
        for i in range(3):
            with open(mnt + '/alice/prompt', 'w') as f:
                f.write('Once upon a time %d' % i)
        cats = [subprocess.Popen(['cat', mnt + '/alice/response'], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for _ in range(readers)]
        time.sleep(0.5)
        waiting = sum(c.poll() is None for c in cats)
        rounds = []
        for _ in range(5):
            t0 = time.time()
            os.stat(mnt + '/bob/status.json')
            os.listdir(mnt)
            with open(mnt + '/bob/status.json') as f:
                f.read()
            rounds.append(time.time() - t0)
        print('%d readers waiting: stat + ls + read of another agent: median %.3f s, slowest %.3f s'
              % (waiting, statistics.median(rounds), max(rounds)))
    finally:
        for c in cats:
            c.kill()
            c.wait()
        subprocess.run(['fusermount3', '-u', mnt])
        time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    main()
