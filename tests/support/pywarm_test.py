"""tests/support/pywarm.py runs a script as /usr/bin/python3 would: each case runs both ways and must give the
same exit code (or signal), stdout and stderr. Run by ctest (`pywarm_equivalence`); exit 0 iff all agree.
The cases run on a server of their own (a PYTHON* variable of the test picks it), stopped at the end."""
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PLAIN = ["/usr/bin/python3"]
WARM = ["/usr/bin/python3", "-S", os.path.join(HERE, "pywarm.py")]

SCRIPTS = {
    "args.py": "import sys, os\nprint(__name__, sys.argv[1:], os.path.basename(sys.argv[0]), os.getcwd())\n",
    "path0.py": "import sys, os\nprint(sys.path[0] == os.path.dirname(os.path.abspath(__file__)))\n",
    "exit3.py": "import sys\nprint('before')\nsys.exit(3)\n",
    "exitmsg.py": "import sys\nsys.exit('a message')\n",
    "raise.py": "def f():\n    raise KeyError('k')\nf()\n",
    "stdin.py": "import sys\nprint(sys.stdin.read().upper(), end='')\n",
    "leftopen.py": "f = open('left.txt', 'w')\nf.write('flushed at exit')\n",
    "atexit.py": "import atexit\natexit.register(lambda: print('atexit ran'))\nprint('main')\n",
    "env.py": "import os\nprint(os.environ.get('PYWARM_CASE'), os.environ.get('PYTHONPATH'))\n",
    "pythonpath.py": "import helper_mod\nprint(helper_mod.VALUE)\n",
    "torch_use.py": "import torch\nprint(torch.arange(4).sum().item())\n",
    "pickle_main.py": "import pickle\nclass C:\n    x = 1\nprint(type(pickle.loads(pickle.dumps(C()))).__module__)\n",
    "thread.py": "import threading, time\n"
                 "t = threading.Thread(target=lambda: (time.sleep(0.3), print('thread done')))\nt.start()\n",
    "stderr.py": "import sys\nprint('to err', file=sys.stderr)\nprint('to out')\n",
    "sigterm.py": "import time, sys\nprint('ready', flush=True)\ntime.sleep(30)\n",
}


def take(path):
    """The file's text, removed; None when there is none (what a script left open must be flushed at exit)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    return text


def run(cmd, cwd, env, stdin=b""):
    return subprocess.run(cmd, cwd=cwd, env=env, input=stdin, capture_output=True, timeout=120)


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in SCRIPTS.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        lib = os.path.join(tmp, "lib")
        os.mkdir(lib)
        with open(os.path.join(lib, "helper_mod.py"), "w") as f:
            f.write("VALUE = 'from PYTHONPATH'\n")
        env = {k: v for k, v in os.environ.items() if k != "UCPKIT_PYWARM"}
        env["PYTHONWARM_KEY"] = "test"  # PYTHON* variables pick the server: this test's own
        cases = [(name, [os.path.join(tmp, name), "a b", "c"], {}, b"") for name in SCRIPTS if name != "sigterm.py"]
        cases += [
            ("relative script", ["args.py", "x"], {}, b""),
            ("-c", ["-c", "import sys; print(sys.argv, __name__)", "p", "q"], {}, b""),
            ("-c exit", ["-c", "raise SystemExit(7)"], {}, b""),
            ("stdin", [os.path.join(tmp, "stdin.py")], {}, b"piped text\n"),
            ("- (code on stdin)", ["-", "r", "s"], {}, b"import sys\nprint(sys.argv, __name__, sys.stdin.read())\n"),
            ("- raising", ["-"], {}, b"x = 1\nraise ValueError(x)\n"),
            ("env", [os.path.join(tmp, "env.py")], {"PYWARM_CASE": "42"}, b""),
            ("PYTHONPATH", [os.path.join(tmp, "pythonpath.py")], {"PYTHONPATH": lib}, b""),
            ("unbuffered", [os.path.join(tmp, "stderr.py")], {"PYTHONUNBUFFERED": "1"}, b""),
        ]
        for label, argv, extra, stdin in cases:
            e = dict(env, **extra)
            left = os.path.join(tmp, "left.txt")
            a = run(PLAIN + argv, tmp, e, stdin)
            left_a = take(left)
            b = run(WARM + argv, tmp, e, stdin)
            left_b = take(left)
            same = (a.returncode, a.stdout, a.stderr, left_a) == (b.returncode, b.stdout, b.stderr, left_b)
            print(f"{'ok  ' if same else 'DIFF'} {label}: exit {a.returncode}/{b.returncode}")
            if not same:
                failures += 1
                print(f"  plain: {a.stdout!r} {a.stderr[-300:]!r} {left_a!r}")
                print(f"  warm:  {b.stdout!r} {b.stderr[-300:]!r} {left_b!r}")
        # SIGTERM to the client reaches the script; the client ends by it, as python does.
        for cmd in (PLAIN, WARM):
            p = subprocess.Popen(cmd + [os.path.join(tmp, "sigterm.py")], cwd=tmp, env=env, stdout=subprocess.PIPE)
            p.stdout.readline()
            p.send_signal(signal.SIGTERM)
            start = time.monotonic()
            rc = p.wait(timeout=10)
            took = time.monotonic() - start
            print(f"{'ok  ' if rc == -signal.SIGTERM else 'DIFF'} SIGTERM ({cmd[-1]}): {rc} in {took:.2f} s")
            failures += rc != -signal.SIGTERM
        # Two children do not share the server's random state (a fresh python seeds from entropy).
        seeds = [run(WARM + ["-c", "import torch, numpy, random; print(torch.initial_seed(), numpy.random.rand(), "
                             "random.random())"], tmp, env).stdout for _ in range(2)]
        print(f"{'ok  ' if seeds[0] != seeds[1] else 'DIFF'} random states of two warm children differ")
        failures += seeds[0] == seeds[1]
        # What it is for: the script finds torch imported (plain python: not yet).
        probe = ["-c", "import sys; print('torch' in sys.modules)"]
        warm = run(WARM + probe, tmp, env).stdout.strip()
        print(f"{'ok  ' if warm == b'True' else 'DIFF'} torch already imported in a warm child: {warm.decode()}")
        failures += warm != b"True"
    # This test's server only (the other tests' may be in use beside it).
    sys.path.insert(0, HERE)
    import pywarm
    path = pywarm.socket_path(env)
    if path:
        pywarm.stop(path)
    print("pywarm: " + ("every case as plain python3" if not failures else f"{failures} case(s) differ"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
