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

A process killed outright (SIGKILL, OOM) leaves its groups behind: a group is named by its pid
(`ajet-sb-<pid>-<n>`), and a later process with the same pid found one in its way. `make_group`
removes such a leftover (empty for `LEFTOVER_S`) or, if the name is in use, takes a suffixed
one; the first group a process makes under a parent sweeps the leftovers of pids that no longer
run.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
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
                group = make_group(CGROUP_ROOT / controller / own_group(controller).lstrip("/") / name)
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
        group = make_group(parent / name)
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


_NAMED = re.compile(r"^ajet-(?:sb|probe)-(\d+)(?:-\d+)?$")


def make_group(group: Path) -> Path:
    """mkdir `group` and return it. A group of that name left empty for `LEFTOVER_S` (a killed
    process's, whose pid came back to this one) is removed first; one in use (another pid
    namespace's, sharing the hierarchy: the same pid, another process) is left alone and the
    group gets a suffixed name instead."""
    _sweep_once(group.parent)
    try:
        group.mkdir()
        return group
    except FileExistsError:
        if _leftover(group):
            _rmdir(group)
            try:
                group.mkdir()
                return group
            except FileExistsError:
                pass
    other = group.with_name(f"{group.name}-{secrets.token_hex(3)}")
    other.mkdir()
    return other


def sweep(parent: Path) -> list[Path]:
    """Remove the empty ajet sandbox groups under `parent` whose process no longer runs."""
    gone: list[Path] = []
    try:
        children = list(parent.iterdir())
    except OSError:
        return gone
    for child in children:
        match = _NAMED.match(child.name)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))) and _leftover(child):
            try:
                child.rmdir()
                gone.append(child)
            except OSError:  # raced with another sweeper, or not empty after all
                continue
    return gone


_swept: set[Path] = set()


def _sweep_once(parent: Path) -> None:
    if parent not in _swept:
        _swept.add(parent)
        sweep(parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# A group holds its sandbox's processes from just after its mkdir until it is removed: one empty
# for this long is nobody's (a killed process's), even where other pid namespaces share the hierarchy.
LEFTOVER_S = 120.0


def _leftover(group: Path) -> bool:
    try:
        old = time.time() - group.stat().st_mtime >= LEFTOVER_S
    except OSError:
        return False
    return old and _empty(group)


def _empty(group: Path) -> bool:
    try:
        return not (group / "cgroup.procs").read_text().strip()
    except FileNotFoundError:  # not a group (a test's plain directory): nothing runs in it
        return group.is_dir()
    except OSError:
        return False


def _rmdir(group: Path) -> None:
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
