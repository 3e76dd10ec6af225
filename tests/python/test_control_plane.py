#!/usr/bin/env python3
"""test_control_plane.py — strangers on the coordinator's port, while a real two-host job trains.

The job (2 hosts x 1 device, started as a multi-node job is, with a secret file) must finish with exit 0 on both
hosts while, on its control-plane port: a c10d TCPStore client tries to set the abort key, a client that speaks the
protocol but guesses the secret is refused, and a connection sends one byte and holds still. Host 0 logs each
dropped connection with its address, and the job trains on; a SIGTERM then ends it as a scheduler would. The listening socket is bound to the master address (127.0.0.1), not to every
address (/proc/net/tcp).
"""
import hashlib
import hmac
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

from host_processes import start_job, stop_job, wait_job

GREETING = b"meshtrain-control-plane/1"
TCPSTORE_CLIENT = """
import datetime, sys, torch.distributed as dist
try:
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=4))
    store.set("meshtrain/abort", "1\\na stranger ends the job")  # sent without waiting for an answer
    print("read:", repr(store.get("meshtrain/joined/0")))
except Exception as e:
    print("stranger refused:", type(e).__name__)
"""


def read_frame(sock):
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            return None
        header += chunk
    (length,) = struct.unpack("<I", header)
    payload = b""
    while len(payload) < length:
        chunk = sock.recv(length - len(payload))
        if not chunk:
            return None
        payload += chunk
    return payload


def dropped_lines(host):
    return [line for _, line in host.lines if "control plane: dropped the connection from 127.0.0.1" in line]


def step_lines(host):
    return [line for _, line in host.lines if ", step: " in line]


def wait_for_line(host, text, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.first_time(text) is not None:
            return True
        if host.poll():
            return False
        time.sleep(0.05)
    return False


def listening_sockets():
    """(local address in hex as the kernel writes it, port, inode) of every listening TCP socket."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                address, port = fields[1].split(":")
                if fields[3] == "0A":
                    found.append((address, int(port, 16), fields[9]))
    return found


def socket_inodes(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


class ControlPlaneTest(unittest.TestCase):
    def test_strangers_cannot_read_write_or_stall_the_job(self):
        tmp = tempfile.mkdtemp(prefix="meshtrain-control-")
        out = os.path.join(tmp, "run")
        hosts = start_job([out, out], 1, ["max_steps=100000", "checkpoint.resume=false", "block_size=32",
                                          "runtime.failure_timeout_s=4", "runtime.heartbeat_interval_s=0.5"])
        try:
            self.assertTrue(wait_for_line(hosts[0], "Control plane: served at"), hosts[0].output[-3000:])
            port = int(hosts[0].cmd[hosts[0].cmd.index("--master-port") + 1])
            self.assertEqual([a for a, p, _ in listening_sockets() if p == port], ["0100007F"],
                             "the control plane must listen on 127.0.0.1 alone")
            self.assertTrue(wait_for_line(hosts[0], "step: 2/"), hosts[0].output[-3000:])
            # No socket of either host (the control plane, Gloo's ports) listens on every address.
            for h in hosts:
                mine = socket_inodes(h.process.pid)
                wildcard = [(a, p) for a, p, inode in listening_sockets() if inode in mine and set(a) == {"0"}]
                self.assertEqual(wildcard, [], f"host {h.host} listens on every address")

            # One byte, then silence, past the handshake deadline, while the job goes on.
            stall = socket.create_connection(("127.0.0.1", port))
            stall.sendall(b"\x00")
            # The right protocol, a guessed secret.
            guess = socket.create_connection(("127.0.0.1", port), timeout=10)
            greeting = read_frame(guess)
            self.assertTrue(greeting.startswith(GREETING))
            server_nonce, client_nonce = greeting[len(GREETING):], os.urandom(32)
            proof = hmac.new(b"a guess", b"client\0" + server_nonce + client_nonce, hashlib.sha256).digest()
            guess.sendall(struct.pack("<I", 64) + client_nonce + proof)
            self.assertEqual(read_frame(guess), b"\x01", "a wrong proof must be refused")
            guess.close()
            # A c10d TCPStore client (another process, as an attacker would run it).
            stranger = subprocess.run([sys.executable, "-c", TCPSTORE_CLIENT, str(port)], capture_output=True,
                                      text=True, timeout=60)
            self.assertNotIn("read: b'1'", stranger.stdout, "a TCPStore client read the job's keys")
            # Host 0 drops all three, and the job trains on meanwhile: steps after the last drop.
            deadline = time.monotonic() + 60
            while (len(dropped_lines(hosts[0])) < 3 or not any("stalled" in d for d in dropped_lines(hosts[0]))) \
                    and time.monotonic() < deadline and not hosts[0].poll():
                time.sleep(0.1)
            steps_before = len(step_lines(hosts[0]))
            time.sleep(1)
            self.assertGreater(len(step_lines(hosts[0])), steps_before, "the job stopped training")
            stall.close()
            # End the long job as a scheduler would: it saves and every host exits 0.
            os.kill(hosts[0].process.pid, signal.SIGTERM)
            wait_job(hosts, 120)
        finally:
            stop_job(hosts)
        for h in hosts:
            self.assertEqual(h.exit_code, 0, f"host {h.host}\n{h.output[-4000:]}")
            self.assertNotIn("stranger ends the job", h.output)
        drops = dropped_lines(hosts[0])
        self.assertGreaterEqual(len(drops), 3, hosts[0].output[-4000:])
        self.assertTrue(any("does not know the job secret" in line for line in drops), drops)
        self.assertTrue(any("stalled" in line for line in drops), drops)


if __name__ == "__main__":
    unittest.main()
