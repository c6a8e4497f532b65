"""The seccomp filter on the code in a sandbox: a classic BPF program, built here and handed to
bubblewrap (`--seccomp FD`), which loads it on the fork server before it starts; every call's
process inherits it.

It refuses, with EPERM (so a program gets a clear error, not a kill), the system calls that
model code has no use for and that reach beyond the sandbox or past its caps:

- ptrace, process_vm_readv/writev: no looking into or steering another process;
- unshare and clone with a new-namespace flag, setns, the mount calls (old and new API):
  no new user namespace (and with it no new mount, network, PID ... namespace);
- keyctl, add_key, request_key: the kernel keyrings are not namespaced;
- bpf, userfaultfd, perf_event_open, io_uring: kernel attack surface;
- memfd_create, memfd_secret and shmget: memory that `RLIMIT_AS` does not count (a memfd or a
  SysV segment is memory with no mapping); POSIX shared memory lives in the capped /dev/shm.

clone3 gets ENOSYS instead: its flags are in memory a filter cannot read, and ENOSYS makes
glibc (threads, posix_spawn) fall back to clone, whose flags the filter checks. System calls of
another ABI (i386 on x86_64, arm32 on aarch64, x32) are refused.
"""

from __future__ import annotations

import errno
import platform
import struct

# asm/unistd_64.h (x86_64) and asm-generic/unistd.h (aarch64)
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "setns": 308,
               "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429,
               "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
               "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "userfaultfd": 323,
               "perf_event_open": 298, "io_uring_setup": 425, "io_uring_enter": 426,
               "io_uring_register": 427, "memfd_create": 319, "memfd_secret": 447, "shmget": 29,
               "clone": 56, "clone3": 435, "unshare": 272},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "setns": 268,
                "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428, "move_mount": 429,
                "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
                "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "userfaultfd": 282,
                "perf_event_open": 241, "io_uring_setup": 425, "io_uring_enter": 426,
                "io_uring_register": 427, "memfd_create": 279, "memfd_secret": 447, "shmget": 194,
                "clone": 220, "clone3": 435, "unshare": 97},
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED = [name for name in SYSCALLS["x86_64"] if name not in ("clone", "clone3", "unshare")]

# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET; unshare also takes NEWTIME
# (0x80, which in clone's flags is part of the exit signal)
CLONE_NEW_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
UNSHARE_NEW_NAMESPACES = CLONE_NEW_NAMESPACES | 0x00000080
X32_BIT = 0x40000000

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_EPERM = 0x00050000 | errno.EPERM
RET_ENOSYS = 0x00050000 | errno.ENOSYS
# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6] (little-endian on both arches, so
# the low 32 bits of args[0], where the flags are, sit at offset 16)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16


def filter_program(machine: str = "") -> bytes:
    """The filter for `machine` (this one's by default), as bubblewrap reads it: an array of
    `struct sock_filter`. Raises `ValueError` for a machine it has no system-call table for."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        raise ValueError(f"no seccomp system-call table for {machine!r} (only {', '.join(SYSCALLS)})")
    table = SYSCALLS[machine]
    # (opcode, k, jump-if-true label, jump-if-false label); a label is an index resolved below
    code: list[tuple[int, int, str, str]] = [
        (_LD_ABS, _ARCH, "", ""),
        (_JEQ, AUDIT_ARCH[machine], "", "deny"),
        (_LD_ABS, _NR, "", ""),
    ]
    if machine == "x86_64":
        code.append((_JGE, X32_BIT, "deny", ""))
    code += [(_JEQ, table[name], "deny", "") for name in DENIED]
    code += [(_JEQ, table["clone3"], "enosys", ""), (_JEQ, table["clone"], "clone", ""),
             (_JEQ, table["unshare"], "unshare", ""), (_RET, RET_ALLOW, "", "")]
    labels = {"clone": len(code)}
    code += [(_LD_ABS, _ARG0_LOW, "", ""), (_JSET, CLONE_NEW_NAMESPACES, "deny", ""), (_RET, RET_ALLOW, "", "")]
    labels["unshare"] = len(code)
    code += [(_LD_ABS, _ARG0_LOW, "", ""), (_JSET, UNSHARE_NEW_NAMESPACES, "deny", ""), (_RET, RET_ALLOW, "", "")]
    labels["enosys"] = len(code)
    code.append((_RET, RET_ENOSYS, "", ""))
    labels["deny"] = len(code)
    code.append((_RET, RET_EPERM, "", ""))

    def offset(at: int, label: str) -> int:
        if not label:
            return 0
        jump = labels[label] - at - 1
        assert 0 <= jump < 256, (label, jump)
        return jump

    return b"".join(struct.pack("=HBBI", op, offset(i, jt), offset(i, jf), k)
                    for i, (op, k, jt, jf) in enumerate(code))
