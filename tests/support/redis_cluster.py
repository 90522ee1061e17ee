"""A private local Redis Cluster for tests and benchmarks: never the machine's shared Redis.

`LocalCluster(workdir, primaries=3, replicas=0)` starts `redis-server --cluster-enabled yes`
on free ports (each port and its cluster-bus port, +10000, free), joins them with
`redis-cli --cluster create ... --cluster-yes`, and waits until every node says
`cluster_state:ok`. `kill(port)` is SIGKILL, for failover tests; `url` is the
`redis+cluster://` URL mrtr takes (two seeds, either is enough).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.ports import restartable_ports


def cluster_ports(count: int) -> list[int]:
    """`count` free ports whose cluster-bus ports (+10000) are free too, all below the ephemeral range
    (`tests.support.ports`: a killed node's port there may be taken, or self-connected)."""
    return restartable_ports(count, bus_offset=10000)


def _field(info: str, name: str) -> int:
    """An integer field of an `INFO` section's text."""
    for line in info.splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split(":", 1)[1])
    raise LookupError(f"{name} not in INFO")


def cli(port: int, *args: str, timeout: float = 10) -> str:
    """`redis-cli -p port args...`, its output (raises on a non-zero exit)."""
    done = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return done.stdout


class LocalCluster:
    """`primaries` primaries with `replicas` replicas each, on 127.0.0.1, no persistence."""

    def __init__(self, workdir: Path, *, primaries: int = 3, replicas: int = 0, node_timeout_ms: int = 1500) -> None:
        self.workdir = workdir
        self.primaries = primaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.ports = cluster_ports(primaries * (1 + replicas))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @staticmethod
    def available() -> str | None:
        """None when redis-server and redis-cli are installed, else what is missing."""
        missing = [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]
        return None if not missing else f"{' and '.join(missing)} not installed"

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{port}" for port in self.ports[:2])
        return f"redis+cluster://{seeds}"

    def _spawn(self, port: int) -> None:
        node_dir = self.workdir / f"node-{port}"
        node_dir.mkdir(parents=True, exist_ok=True)
        args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", str(self.node_timeout_ms), "--dir", str(node_dir), "--daemonize", "no"]
        self.processes[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        for port in self.ports:
            self._spawn(port)
        for port in self.ports:
            self._wait_listening(port)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True,
            check=True,
            timeout=60,
        )
        self.wait_ok()

    def _wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on {port}")

    def live_ports(self) -> list[int]:
        return [port for port, process in self.processes.items() if process.poll() is None]

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every live node says `cluster_state:ok` and sees every slot served."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                infos = [cli(port, "cluster", "info") for port in self.live_ports()]
                healthy = all("cluster_state:ok" in info and "cluster_slots_ok:16384" in info for info in infos)
                if healthy and (self.replicas == 0 or self._replicas_synced()):
                    return
            except subprocess.SubprocessError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the local Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.1)

    def _replicas_synced(self) -> bool:
        """Every live node is a primary serving slots or a replica done with its sync, each by its own account.

        Right after `--cluster create` a replica may still be a slotless primary in other
        nodes' views, or in its first sync (diskless, after a delay): a primary killed then
        is replaced by a replica that holds none of its data.
        """
        for port in self.live_ports():
            replication = cli(port, "info", "replication")
            if "role:slave" in replication:
                if "master_link_status:up" not in replication or "master_sync_in_progress:0" not in replication:
                    return False
                continue
            myself = next(line for line in cli(port, "cluster", "nodes").splitlines() if "myself" in line.split()[2])
            if len(myself.split()) <= 8:  # a primary with no slots: a replica not configured yet
                return False
        return True

    def wait_replicated(self, port: int, timeout: float = 10) -> None:
        """Until the replicas of the primary on `port` hold every write it had taken when called.

        Replication is asynchronous: a primary killed right after a write may leave a replica
        promoted without it. A test that means to show what a failover does to mrtr, not what
        asynchronous replication loses, waits for this before the kill. (`WAIT` would not do:
        it counts only the calling connection's own writes.)
        """
        taken = _field(cli(port, "info", "replication"), "master_repl_offset")
        nodes = [line.split() for line in cli(port, "cluster", "nodes").splitlines()]
        me = next(fields[0] for fields in nodes if "myself" in fields[2])
        replicas = [int(f[1].split(":")[1].split("@")[0]) for f in nodes if f[3] == me and "fail" not in f[2]]
        deadline = time.monotonic() + timeout
        for replica in replicas:
            while _field(cli(replica, "info", "replication"), "slave_repl_offset") < taken:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {replica} of {port} did not reach offset {taken}")
                time.sleep(0.02)

    def nodes_text(self) -> str:
        """`CLUSTER NODES` as a live node sees it (for a failing test's message)."""
        try:
            return cli(self.live_ports()[0], "cluster", "nodes")
        except (subprocess.SubprocessError, IndexError) as exc:
            return f"CLUSTER NODES failed: {exc!r}"

    def primary_ports(self) -> list[int]:
        """Ports of the live primaries, as the cluster sees them now."""
        out = cli(self.live_ports()[0], "cluster", "nodes")
        found = []
        for line in out.splitlines():
            fields = line.split()
            if "master" in fields[2] and "fail" not in fields[2]:
                port = int(fields[1].split(":")[1].split("@")[0])
                if port in self.live_ports():
                    found.append(port)
        return found

    def primary_of(self, key: str) -> int:
        """The port of the primary serving `key`'s slot."""
        slot = int(cli(self.live_ports()[0], "cluster", "keyslot", key).strip())
        for line in cli(self.live_ports()[0], "cluster", "nodes").splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for span in fields[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return int(fields[1].split(":")[1].split("@")[0])
        raise LookupError(f"no primary serves slot {slot}")

    def kill(self, port: int) -> None:
        """SIGKILL the node on `port` (a primary's replica takes over after the node timeout)."""
        process = self.processes.get(port)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["LocalCluster", "cli", "cluster_ports"]
