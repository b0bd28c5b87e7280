"""A warm python for the tests' Python checks: `python3 -S pywarm.py SCRIPT ARGS...`, `... -c CODE ARGS...` or
`... - ARGS...` (the code on stdin) runs like `python3 SCRIPT ARGS...`, but in a child forked from a server
that has imported torch already.

Why: `import torch` (Debian's 1.13) is about 1.5 s of CPU, and the C++ tests start /usr/bin/python3 for a
generator or a check hundreds of times (17 times, 25 of the 28 CPU seconds, in one MoE test alone), a third
or more of the test run on a 2-core CI machine (docs/notes/ci-times.md). A forked child starts in a few ms.

How: the client (this file, no torch) passes its argv, working folder, environment and its three standard
file descriptors over a UNIX socket (in /tmp/ucpkit-pywarm-<uid>, a folder only its user may enter); the
server forks a waiter, the waiter forks the child, which takes them over and runs the script as `__main__`
(runpy), then finishes like an interpreter exit (atexit, the script's objects collected, streams flushed).
The waiter sends the child's pid, then its wait status; the client forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT
to the child and ends with the child's exit code (or by the child's signal). The first client starts the
server (flock), which exits after 2 idle minutes or on `pywarm.py --stop` (scripts/test.sh calls it when the
tests are done).

What a script can tell: `sys.modules` holds torch and numpy already, and torch's import has added pybind11's
internals to `builtins` (a test that lists the builtins namespace runs plain python: UCPKIT_PYWARM=0).

The variables python and the imported libraries read when they load (PYTHON*, OMP_*, MKL_*, TORCH_*, LD_*,
...) pick the server: one per set of their values (PYTHONPATH, PYTHONUNBUFFERED and PYTHONDONTWRITEBYTECODE
are applied in each child). Plain `python3` is run instead (exec) when UCPKIT_PYWARM=0, for python options
other than -c and -, or when no server can be started.
"""
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import time

PYTHON = "/usr/bin/python3"
IDLE_S = 120
# Read by python or by the libraries the server imports when they load: a server per set of their values.
READ_AT_IMPORT = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "GOMP_", "KMP_", "TORCH_", "LD_", "CUDA_")
EMULATED = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")  # applied in each child


def import_env(env):
    return sorted((k, v) for k, v in env.items() if k.startswith(READ_AT_IMPORT) and k not in EMULATED)


def private_dir():
    """/tmp/ucpkit-pywarm-<uid>, made 0700 and checked to be ours: the sockets, locks and pid files live there
    (no other user can plant a server or a link in our way); None when it is not ours."""
    d = f"/tmp/ucpkit-pywarm-{os.getuid()}"
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return d


def socket_path(env):
    d = private_dir()
    if d is None:
        return None
    me = os.path.abspath(__file__)
    key = hashlib.sha256(json.dumps([PYTHON, me, import_env(env)]).encode() + open(me, "rb").read()).hexdigest()[:16]
    return os.path.join(d, key + ".sock")


def run_plain(argv):
    os.execv(PYTHON, [PYTHON] + argv)


def warm_possible(argv, env):
    if env.get("UCPKIT_PYWARM") == "0" or not argv:
        return False
    if argv[0].startswith("-") and argv[0] not in ("-c", "-"):
        return False
    return argv[0] != "-c" or len(argv) >= 2


# ---- client ------------------------------------------------------------------------------------------

def send_msg(conn, obj, fds=()):
    data = json.dumps(obj).encode()
    header = struct.pack("!I", len(data))
    if fds:
        sent = socket.send_fds(conn, [header + data], list(fds))
        conn.sendall((header + data)[sent:])
    else:
        conn.sendall(header + data)


def recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        part = conn.recv(n - len(buf))
        if not part:
            raise ConnectionError("pywarm: connection closed")
        buf += part
    return buf


def recv_msg(conn, with_fds=False):
    if with_fds:
        data, fds, _, _ = socket.recv_fds(conn, 4, 3)
        if len(data) < 4:
            raise ConnectionError("pywarm: short message")
        (n,) = struct.unpack("!I", data[:4])
        body = data[4:]
        if len(body) < n:
            body += recv_exact(conn, n - len(body))
        return json.loads(body), fds
    (n,) = struct.unpack("!I", recv_exact(conn, 4))
    return json.loads(recv_exact(conn, n)), []


def connect(path):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        return conn
    except OSError:
        conn.close()
        return None


def start_server(path):
    """Starts the server once (others wait on the lock); the connection, or None when it does not come up."""
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = connect(path)
        if conn:
            return conn
        try:
            os.unlink(path)  # a server that died left it
        except FileNotFoundError:
            pass
        env = {k: v for k, v in os.environ.items() if k not in EMULATED}
        pid = os.fork()
        if pid == 0:
            os.setsid()
            fd = os.open(os.devnull, os.O_RDWR)
            for i in (0, 1, 2):
                os.dup2(fd, i)
            os.closerange(3, 1024)
            os.execve(PYTHON, [PYTHON, os.path.abspath(__file__), "--serve", path], env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            conn = connect(path)
            if conn:
                os.waitpid(pid, os.WNOHANG)
                return conn
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:  # the server failed to start
                return None
            time.sleep(0.02)
        return None


def client(argv):
    env = dict(os.environ)
    if not warm_possible(argv, env):
        run_plain(argv)
    path = socket_path(env)
    if path is None:
        run_plain(argv)
    conn = connect(path) or start_server(path)
    if conn is None:
        run_plain(argv)
    try:
        send_msg(conn, {"argv": argv, "cwd": os.getcwd(), "env": env}, (0, 1, 2))
        child = recv_msg(conn)[0]["pid"]
    except (OSError, ConnectionError, ValueError):
        run_plain(argv)  # nothing ran yet
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    while True:
        try:
            status = recv_msg(conn)[0]["status"]
            break
        except InterruptedError:
            continue
        except (OSError, ConnectionError, ValueError):
            sys.stderr.write("pywarm: lost the server while the script ran\n")
            sys.exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(status))


# ---- the child: the script as __main__ ---------------------------------------------------------------

def run_child(argv, cwd, env, fds):
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # The standard streams as python makes them for these descriptors and this environment.
    import io
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    enc, err = sys.stdout.encoding, sys.stdout.errors

    def writer(fd, errors, line):
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=enc, errors=errors,
                                line_buffering=line, write_through=unbuffered)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding=enc, errors=err)
    sys.stdout = sys.__stdout__ = writer(1, err, os.isatty(1))
    sys.stderr = sys.__stderr__ = writer(2, "backslashreplace", True)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    # A fresh python seeds torch's and numpy's default generators from entropy (python's `random` reseeds
    # itself after a fork): not the server's state shared by every child.
    sys.modules["torch"].seed()
    sys.modules["numpy"].random.seed()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import runpy
    import types
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    code = 0
    try:
        if argv[0] in ("-c", "-"):  # the code on the command line, or read from stdin
            source, name = (argv[1], "<string>") if argv[0] == "-c" else (sys.stdin.read(), "<stdin>")
            sys.argv = [argv[0]] + argv[2 if argv[0] == "-c" else 1:]
            sys.path[0:1] = [""] + extra
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(source, name, "exec"), main.__dict__)
            main.__dict__.clear()
        else:
            sys.argv = list(argv)
            sys.path[0:1] = [os.path.dirname(os.path.abspath(argv[0]))] + extra
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            sys.stderr.write(f"{e.code}\n")
            code = 1
    except KeyboardInterrupt:
        sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as e:
        import traceback
        tb = e.__traceback__  # from the script's first frame on, as python prints it
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        code = 1
    # What an interpreter's exit does for a script: its atexit functions, its objects collected (files
    # it left open flushed), the streams flushed.
    import atexit
    import gc
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()  # non-daemon threads are waited for, as at exit
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing more to say
            pass
    os._exit(code & 0xFF)


# ---- server ------------------------------------------------------------------------------------------

def handle(conn, listener):
    """In the waiter (a fork of the server): forks the child, reports its pid and its wait status."""
    listener.close()
    try:
        req, fds = recv_msg(conn, with_fds=True)
    except (OSError, ConnectionError, ValueError):
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        conn.close()
        run_child(req["argv"], req["cwd"], req["env"], fds)
    for fd in fds:
        os.close(fd)
    try:
        send_msg(conn, {"pid": pid})
    except OSError:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    try:
        send_msg(conn, {"status": status})
    except OSError:
        pass
    os._exit(0)


def serve(path):
    import torch  # noqa: F401  (what the children then find imported)
    import numpy  # noqa: F401
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(64)
    with open(path + ".pid", "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, path)  # clients connect only once it listens
    ino = os.stat(path).st_ino
    last = time.monotonic()
    while True:
        ready, _, _ = select.select([listener], [], [], 1.0)
        while True:  # reap the waiters
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not done:
                break
        if ready:
            conn, _ = listener.accept()
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                handle(conn, listener)
            conn.close()
            last = time.monotonic()
        elif time.monotonic() - last > IDLE_S:
            try:
                if os.stat(path).st_ino == ino:  # not a newer server's
                    os.unlink(path)
            except OSError:
                pass
            return


def stop(path):
    """Ends the server of socket `path` (SIGTERM) and removes its socket, pid and lock files."""
    try:
        with open(path + ".pid") as f:
            os.kill(int(f.read()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    for leftover in (path + ".pid", path, path + ".lock"):
        try:
            os.unlink(leftover)
        except OSError:
            pass


def stop_all():
    """Ends every server of this user."""
    import glob
    d = private_dir()
    for pid_file in glob.glob(os.path.join(d, "*.sock.pid")) if d else []:
        stop(pid_file[: -len(".pid")])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["--stop"]:
        stop_all()
    else:
        client(sys.argv[1:])
