"""What a process tree listens on, and whether a listening socket beyond loopback lets a client in without Ray's token.

Helpers of tests/test_exposure.py and tests/test_cluster.py (not a test module)."""

from __future__ import annotations

import contextlib
import ipaddress
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: the process that holds it and its local address."""

    pid: int
    name: str
    ip: str
    port: int

    @property
    def loopback(self) -> bool:
        """Reachable from this machine only (127.0.0.0/8, ::1, or an IPv4-mapped loopback address)."""
        ip = ipaddress.ip_address(self.ip.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid}) on {self.ip}:{self.port}"


def tree(root: int) -> list[psutil.Process]:
    """``root`` and every process below it (Ray's GCS, raylet, agents and workers descend from the process that
    started the node)."""
    try:
        proc = psutil.Process(root)
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listening(procs: list[psutil.Process]) -> set[Listener]:
    """The listening TCP sockets the processes hold now (a process that ended meanwhile is skipped)."""
    out: set[Listener] = set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            name = p.name()
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    out.add(Listener(p.pid, name, c.laddr.ip, c.laddr.port))
    return out


class Watch:
    """Collect the listening sockets of the tree under a pid every ``every_s`` seconds until ``stop()``: what a
    run opened at any moment, including the workers that ended before the run did."""

    def __init__(self, root: int, every_s: float = 0.3) -> None:
        self.root = root
        self.seen: set[Listener] = set()
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.seen |= listening(tree(self.root))
            self._stop.wait(self._every)

    def stop(self) -> set[Listener]:
        self._stop.set()
        self._thread.join()
        return self.seen


# One method of each of Ray's RPC services that a node serves: the GCS, the raylet's node manager and object manager,
# a core worker (drivers and actors), and the dashboard agent. Called with an empty request and no token: a
# service with token authentication answers UNAUTHENTICATED before it reads the request; a service without it
# answers something else (or the call's own error), and a service that does not have the method UNIMPLEMENTED.
RAY_RPCS = (
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.ObjectManagerService/Pull",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
    "/ray.rpc.ReporterService/HealthCheck",
)


def answer_without_token(host: str, port: int) -> str:
    """How the socket answers a client that has no token: ``refused: ...`` (an RPC answered UNAUTHENTICATED, or an
    HTTP request answered 401/403) or ``open: ...`` (what it answered instead)."""
    import grpc

    codes: list[str] = []
    for method in RAY_RPCS:
        channel = grpc.insecure_channel(f"{host}:{port}")
        try:
            channel.unary_unary(method)(b"", timeout=5)
            codes.append(f"{method}: OK")
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return f"refused: {method} -> UNAUTHENTICATED {e.details()}"
            codes.append(f"{method}: {code.name}")
        finally:
            channel.close()
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/", timeout=5) as r:
            codes.append(f"HTTP GET / -> {r.status}")
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return f"refused: HTTP GET / -> {e.code}"
        codes.append(f"HTTP GET / -> {e.code}")
    except OSError as e:
        codes.append(f"HTTP GET / -> {type(e).__name__}")
    return "open: " + "; ".join(codes)
