#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""sd_emu.py: the part of systemd that vased meets, for tests without systemd as PID 1.

    sd_emu.py --runtime-dir DIR --log FILE [--on-demand] [--bind PATH] [--stream]
              [--no-socket] [--fdstore-max N] [--next-args FILE] [--corrupt-state FILE]
              [--stale-state FILE] [--blank-arena FILE] -- VASED [ARG...]

It plays vased.socket and vased.service:

- Socket activation: it binds and listens on DIR/session.sock (or --bind PATH; --stream makes a
  SOCK_STREAM socket instead, to test the daemon's refusal), mode 0660, and passes it to the
  daemon as fd 3 with LISTEN_FDS, LISTEN_PID (the child's pid, set after fork) and
  LISTEN_FDNAMES=vased.socket. With --on-demand the daemon is started only when the socket
  becomes readable (an engine connected), as systemd does; otherwise at once.
- The notification socket: NOTIFY_SOCKET names a datagram socket on which it reads READY=1,
  STOPPING=1, STATUS=, FDSTORE=1 with FDNAME= and the descriptors (SCM_RIGHTS), and
  FDSTOREREMOVE=1 with FDNAME=. Stored descriptors (at most --fdstore-max, default 16; one
  file stored twice is kept once) are handed back at the next start after the socket, at fds
  4.., with their names in LISTEN_FDNAMES.
- Tests: at each restart, when the file --next-args names exists, its lines are added to the
  daemon's arguments (a changed configuration); when the file --corrupt-state names exists,
  one byte of the stored "state" is flipped before it is handed back (a corrupt snapshot); when
  the file --stale-state names exists, the first "state" ever stored is handed back instead of
  the last (a snapshot of an earlier stop); when the file --blank-arena names exists, "arena-0"
  is replaced by a new memfd of the same size and seals, all zeros (not the arena's memory).
  Each flag file is removed when used.
- Signals to this program: SIGUSR1 restarts the daemon cleanly (SIGTERM, wait, start: what
  `systemctl restart` does), SIGUSR2 kills it (SIGKILL) and starts it again (a crash with
  Restart=on-failure: the store is kept), SIGTERM or SIGINT stop it and end this program.

Everything it sees goes to --log, one line each ("started pid N fds NAME,NAME", "READY",
"FDSTORE NAME", "FDSTOREREMOVE NAME", "exited pid N status S"), so a test waits for lines.
It exits with the daemon's last exit status (128+signal when killed by one), or 1 when the
daemon never started.
"""

import argparse
import array
import fcntl
import os
import selectors
import signal
import socket
import stat
import sys


class Emu:
    def __init__(self, args):
        self.args = args
        self.log_file = open(args.log, "a", buffering=1)
        self.store = []  # [(name, fd)]
        self.first_state = None  # a dup of the first "state" stored (--stale-state)
        self.pid = 0
        self.status = None
        self.pending = []  # signals received, handled in the loop
        self.listener = None
        if not args.no_socket:
            path = args.bind or os.path.join(args.runtime_dir, "session.sock")
            kind = socket.SOCK_STREAM if args.stream else socket.SOCK_SEQPACKET
            self.listener = socket.socket(socket.AF_UNIX, kind)
            if os.path.exists(path) and stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
            self.listener.bind(path)
            os.chmod(path, 0o660)
            self.listener.listen(128)
        self.notify_path = os.path.join(args.runtime_dir, "notify.sock")
        if os.path.exists(self.notify_path):
            os.unlink(self.notify_path)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)

    def log(self, line):
        self.log_file.write(line + "\n")

    def before_restart(self):
        a = self.args
        if a.next_args and os.path.exists(a.next_args):
            with open(a.next_args) as f:
                a.command = a.command + [line.strip() for line in f if line.strip()]
            os.unlink(a.next_args)
            self.log("arguments now " + " ".join(a.command[1:]))
        if a.corrupt_state and os.path.exists(a.corrupt_state):
            os.unlink(a.corrupt_state)
            for i, (name, fd) in enumerate(self.store):
                if name != "state":
                    continue
                data = bytearray(os.pread(fd, os.fstat(fd).st_size, 0))
                data[len(data) // 2] ^= 0xFF
                new = os.memfd_create("vase-state", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                os.write(new, bytes(data))
                fcntl.fcntl(new, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK
                            | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
                os.close(fd)
                self.store[i] = (name, new)
                self.log("corrupted state")
        if a.stale_state and os.path.exists(a.stale_state) and self.first_state is not None:
            os.unlink(a.stale_state)
            for name, fd in [e for e in self.store if e[0] == "state"]:
                os.close(fd)
            self.store = [e for e in self.store if e[0] != "state"]
            self.store.append(("state", os.dup(self.first_state)))
            self.log("stale state")
        if a.blank_arena and os.path.exists(a.blank_arena):
            os.unlink(a.blank_arena)
            for i, (name, fd) in enumerate(self.store):
                if name != "arena-0":
                    continue
                new = os.memfd_create("vase-arena-0", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                os.ftruncate(new, os.fstat(fd).st_size)
                fcntl.fcntl(new, fcntl.F_ADD_SEALS,
                            fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
                os.close(fd)
                self.store[i] = (name, new)
                self.log("blank arena-0")

    def start(self):
        fds = ([self.listener.fileno()] if self.listener else []) + [fd for _, fd in self.store]
        names = (["vased.socket"] if self.listener else []) + [n for n, _ in self.store]
        pid = os.fork()
        if pid == 0:
            try:
                # Out of the way of 3.. first, so that no source is overwritten by another.
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
                for i, fd in enumerate(high):
                    os.dup2(fd, 3 + i, inheritable=True)
                    os.close(fd)
                env = dict(os.environ)
                env["NOTIFY_SOCKET"] = self.notify_path
                if fds:
                    env["LISTEN_FDS"] = str(len(fds))
                    env["LISTEN_PID"] = str(os.getpid())
                    env["LISTEN_FDNAMES"] = ":".join(names)
                for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
                    signal.signal(s, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.execve(self.args.command[0], self.args.command, env)
            except OSError as e:
                os.write(2, f"sd_emu: cannot start {self.args.command[0]}: {e}\n".encode())
            os._exit(127)
        self.pid = pid
        self.log(f"started pid {pid} fds {','.join(names)}")

    def reap(self, block):
        if not self.pid:
            return
        pid, st = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return
        self.status = os.waitstatus_to_exitcode(st)
        if self.status < 0:
            self.status = 128 - self.status
        self.log(f"exited pid {self.pid} status {self.status}")
        self.pid = 0

    def stop(self, sig):
        if self.pid:
            os.kill(self.pid, sig)
            self.reap(True)

    def on_notify(self):
        try:
            msg, anc, _, _ = self.notify.recvmsg(4096, socket.CMSG_SPACE(253 * 4))
        except BlockingIOError:
            return
        fds = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(data[: len(data) - len(data) % a.itemsize])
                fds.extend(a)
        kv = dict(line.split("=", 1) for line in msg.decode().split("\n") if "=" in line)
        name = kv.get("FDNAME", "stored")
        if kv.get("READY") == "1":
            self.log("READY")
        if kv.get("STOPPING") == "1":
            self.log("STOPPING")
        if kv.get("FDSTOREREMOVE") == "1":
            for n, fd in [e for e in self.store if e[0] == name]:
                os.close(fd)
            self.store = [e for e in self.store if e[0] != name]
            self.log(f"FDSTOREREMOVE {name}")
        if kv.get("FDSTORE") == "1":
            for fd in fds:
                st = os.fstat(fd)
                same = any(
                    (os.fstat(f).st_dev, os.fstat(f).st_ino) == (st.st_dev, st.st_ino)
                    for _, f in self.store
                )
                if same or len(self.store) >= self.args.fdstore_max:
                    self.log(f"FDSTORE {name} refused ({'stored already' if same else 'full'})")
                    os.close(fd)
                    continue
                os.set_inheritable(fd, False)
                if name == "state" and self.first_state is None:
                    self.first_state = os.dup(fd)
                self.store.append((name, fd))
                self.log(f"FDSTORE {name}")
            fds = []
        for fd in fds:
            os.close(fd)

    def run(self):
        for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
            signal.signal(s, lambda sig, _frame: self.pending.append(sig))
        sel = selectors.DefaultSelector()
        sel.register(self.notify, selectors.EVENT_READ)
        on_demand = self.args.on_demand and self.listener is not None
        if on_demand:
            sel.register(self.listener, selectors.EVENT_READ)
        else:
            self.start()
        while True:
            for key, _ in sel.select(0.05):
                if key.fileobj is self.notify:
                    self.on_notify()
                elif not self.pid:
                    self.log("activated")
                    sel.unregister(self.listener)
                    self.start()
            self.reap(False)
            if not self.pid and self.status is not None and not self.pending:
                return self.status  # it stopped by itself: a failure systemd would report
            while self.pending:
                sig = self.pending.pop(0)
                if sig in (signal.SIGTERM, signal.SIGINT):
                    self.stop(signal.SIGTERM)
                    # What arrived while it stopped (STOPPING, the state) is logged too.
                    self.notify.setblocking(False)
                    for _ in range(64):
                        self.on_notify()
                    return 1 if self.status is None else self.status
                self.stop(signal.SIGTERM if sig == signal.SIGUSR1 else signal.SIGKILL)
                self.notify.setblocking(False)
                for _ in range(64):
                    self.on_notify()
                self.notify.setblocking(True)
                self.before_restart()
                self.start()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runtime-dir", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--on-demand", action="store_true")
    p.add_argument("--bind")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--no-socket", action="store_true")
    p.add_argument("--fdstore-max", type=int, default=16)
    p.add_argument("--next-args")
    p.add_argument("--corrupt-state")
    p.add_argument("--stale-state")
    p.add_argument("--blank-arena")
    p.add_argument("command", nargs="+")
    return Emu(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
