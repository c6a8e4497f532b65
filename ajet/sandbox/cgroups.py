"""A cgroup around one sandbox, where this process may make one: a memory limit over all its
processes (memfds, tmpfs pages and page cache included, which `RLIMIT_AS` does not count) and
`pids.max`.

- cgroup v1 (`CgroupV1`): writable pids and memory hierarchies (root on a host, a privileged
  container); the group is made under this process's own group in each.
- cgroup v2 (`CgroupV2`): a delegated subtree, that is this process's own group (in the
  cgroup2 mount) is writable and lists `memory` and `pids` in its `cgroup.subtree_control`
  (systemd's `Delegate=yes`, a container given its own cgroup namespace with the controllers
  enabled); the group is made under it.
- neither: no group; the rlimits, the server's process count, the seccomp filter and the
  size-capped tmpfs mounts are what holds (docs/sandbox.md says which caps hold where).

`usable()` says which kind this host gives, by making (and removing) a probe group.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


class Cgroup:
    """The groups of one sandbox (one per v1 hierarchy, or one v2 group)."""

    kind = ""
    dirs: list[Path]

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into the groups, so that bubblewrap and
        everything it starts are born inside them (adding bubblewrap's pid after the start
        raced with its first fork: the sandbox's processes stayed outside)."""
        moves = " && ".join(f'echo $$ > "{group / "cgroup.procs"}"' for group in self.dirs)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "sh", *argv]

    def oom_kills(self) -> int:
        raise NotImplementedError

    def remove(self) -> None:
        for group in self.dirs:
            _rmdir(group)


class CgroupV1(Cgroup):
    """pids.max and memory.limit_in_bytes for one sandbox, where cgroup v1 is writable."""

    kind = "v1"

    def __init__(self, name: str, memory_bytes: int, pids: int) -> None:
        self.dirs = []
        try:
            for controller, settings in (("pids", {"pids.max": str(pids)}),
                                         ("memory", {"memory.limit_in_bytes": str(memory_bytes),
                                                     "memory.swappiness": "0"})):
                group = CGROUP_ROOT / controller / own_group(controller).lstrip("/") / name
                group.mkdir()
                self.dirs.append(group)
                for key, value in settings.items():
                    try:
                        (group / key).write_text(value)
                    except OSError:
                        if key != "memory.swappiness":  # absent where swap accounting is off
                            raise
        except OSError:
            self.remove()
            raise

    def oom_kills(self) -> int:
        for group in self.dirs:
            failcnt = group / "memory.failcnt"
            if failcnt.exists():
                return int(failcnt.read_text() or 0)
        return 0


class CgroupV2(Cgroup):
    """memory.max (no swap) and pids.max for one sandbox, in a delegated cgroup-v2 subtree."""

    kind = "v2"

    def __init__(self, name: str, memory_bytes: int, pids: int, parent: Path | None = None) -> None:
        parent = parent if parent is not None else delegated_v2_parent()
        if parent is None:
            raise OSError("no delegated cgroup v2 subtree with the memory and pids controllers")
        group = parent / name
        group.mkdir()
        self.dirs = [group]
        try:
            (group / "memory.max").write_text(str(memory_bytes))
            (group / "pids.max").write_text(str(pids))
            if (group / "memory.swap.max").exists():  # absent where swap accounting is off
                (group / "memory.swap.max").write_text("0")
        except OSError:
            self.remove()
            raise

    def oom_kills(self) -> int:
        events = self.dirs[0] / "memory.events"
        if not events.exists():
            return 0
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0


def own_group(controller: str) -> str:
    """This process's group in `controller`'s v1 hierarchy ("" for the v2 one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):  # "" matches the v2 line, 0::/path
            return path
    raise OSError(f"no {controller or 'v2'} cgroup")


def v2_mount() -> Path | None:
    """Where the cgroup2 hierarchy is mounted (/sys/fs/cgroup, or .../unified on a hybrid host)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        if fields[dash + 1] == "cgroup2":
            return Path(fields[4])
    return None


def delegated_v2_parent() -> Path | None:
    """This process's own cgroup-v2 group, if this process may make groups under it with the
    memory and pids controllers on."""
    mount = v2_mount()
    if mount is None:
        return None
    try:
        parent = mount / own_group("").lstrip("/")
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    if {"memory", "pids"} <= set(enabled) and os.access(parent, os.W_OK):
        return parent
    return None


def create(kind: str, name: str, memory_bytes: int, pids: int) -> Cgroup:
    return CgroupV1(name, memory_bytes, pids) if kind == "v1" else CgroupV2(name, memory_bytes, pids)


@functools.cache
def usable() -> str:
    """"v1" or "v2" where this process may make a sandbox's pids and memory group (v1 first: a
    hybrid host keeps the controllers there), "" where it may not (asked once)."""
    for kind in ("v1", "v2"):
        try:
            group = create(kind, f"ajet-probe-{os.getpid()}", 256 << 20, 64)
        except OSError:
            continue
        group.remove()
        return kind
    return ""


def _rmdir(group: Path) -> None:
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
