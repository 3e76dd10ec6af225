"""host_processes.py — the hosts of one job as separate processes, one per node as on a real cluster, timed.

`start_job(...)` starts `meshtrain train --nnodes H --node-rank h --secret-file F ...` once per host (optionally under
a command prefix per host, such as `ip netns exec <ns>`), each in its own session, all given one fresh job secret as a
multi-node job is; every output line and each exit is
recorded with the time it happened, so a failure test can assert *when* each host ended, and with what.
"""
import atexit
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import threading
import time

from training_runs import BASE, BINARY


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HostProcess:
    """One host: its process, its output lines with their times, and when it exited."""

    def __init__(self, host, cmd, env):
        self.host = host
        self.cmd = cmd
        self.lines = []  # (monotonic time, line)
        self.exit_time = None
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                        start_new_session=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def output(self):
        return "\n".join(line for _, line in self.lines)

    @property
    def exit_code(self):
        return self.process.returncode

    def first_time(self, text):
        """When the first line containing `text` was printed, or None."""
        return next((t for t, line in self.lines if text in line), None)

    def poll(self):
        if self.exit_time is None and self.process.poll() is not None:
            self.exit_time = time.monotonic()
        return self.exit_time is not None

    def kill(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.poll()

    def finish(self):
        self._reader.join(timeout=10)
        self.process.stdout.close()


def make_secret_file():
    """A fresh job secret in a file of mode 0600, as a user makes one for a multi-node job."""
    fd, path = tempfile.mkstemp(prefix="meshtrain-job-", suffix=".secret")
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)  # mkstemp creates it with mode 0600
    atexit.register(os.remove, path)
    return path


def start_job(output_dirs, devices_per_host, overrides, per_host_overrides=None, prefixes=None,
              master_addr="127.0.0.1", master_port=None, base=BASE):
    """Starts every host of a `train` job; output_dirs[h] is host h's output_dir (usually all the same)."""
    hosts = len(output_dirs)
    port = master_port or free_port()
    secret_file = make_secret_file()
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "MESHTRAIN_IFACE")}
    processes = []
    for h in range(hosts):
        cmd = [*(prefixes[h] if prefixes else []), BINARY, "train", "--nnodes", str(hosts), "--node-rank", str(h),
               "--master-addr", master_addr, "--master-port", str(port), "--secret-file", secret_file,
               "--devices-per-host", str(devices_per_host),
               *base, f"output_dir={output_dirs[h]}", *overrides, *((per_host_overrides or {}).get(h, []))]
        processes.append(HostProcess(h, cmd, env))
    return processes


def wait_job(processes, timeout, on_poll=None):
    """Waits until every host exits (killing all after `timeout` s; a killed host's exit_code is -9)."""
    deadline = time.monotonic() + timeout
    while not all(p.poll() for p in processes):
        if on_poll:
            on_poll()
        if time.monotonic() > deadline:
            for p in processes:
                p.kill()
            break
        time.sleep(0.05)
    for p in processes:
        p.finish()
    return processes


def stop_job(processes):
    for p in processes:
        p.kill()
        p.finish()
