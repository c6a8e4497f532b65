"""Can a GPU backbone run here: the GPUs this process sees and how much of their memory is used
(nvidia-smi where present, else torch.cuda), and a refusal to start on busy ones."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from ajet.errors import LaunchError

log = logging.getLogger(__name__)


def parse_nvidia_smi(text: str) -> list[dict[str, int]]:
    """Rows of `nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            continue
        index, used, total = map(int, parts)
        gpus.append({"index": index, "used_mib": used, "total_mib": total})
    return gpus


def query_gpus() -> list[dict[str, int]]:
    """The GPUs this process can see, with their memory use (MiB)."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run([smi, "--query-gpu=index,memory.used,memory.total",
                                  "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            gpus = parse_nvidia_smi(out)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is not None and visible.strip():
                keep = {int(v) for v in visible.split(",") if v.strip().isdigit()}
                gpus = [g for g in gpus if g["index"] in keep]
            elif visible is not None:
                gpus = []
            return gpus
        except (subprocess.SubprocessError, OSError) as exc:
            log.warning("nvidia-smi failed (%s); asking torch.cuda", exc)
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append({"index": i, "used_mib": (total - free) // 2**20, "total_mib": total // 2**20})
    return gpus


def visible_gpus() -> int:
    return len(query_gpus())


def free_gpus(max_used_fraction: float = 0.1, gpus: list[dict[str, int]] | None = None) -> list[int]:
    """Indices of GPUs whose memory is at most `max_used_fraction` used (pure given `gpus`)."""
    gpus = query_gpus() if gpus is None else gpus
    return [g["index"] for g in gpus if g["total_mib"] and g["used_mib"] / g["total_mib"] <= max_used_fraction]


def require_free_gpus(needed: int, backbone: str, max_used_fraction: float = 0.1) -> None:
    """Refuse to start a GPU backbone that would share busy GPUs."""
    gpus = query_gpus()
    free = free_gpus(max_used_fraction, gpus)
    if len(free) < needed:
        busy = [g for g in gpus if g["index"] not in free]
        detail = ", ".join(f"GPU {g['index']}: {g['used_mib']}/{g['total_mib']} MiB used" for g in busy)
        raise LaunchError(
            f"--backbone={backbone} needs {needed} free GPU(s); {len(free)} of {len(gpus)} are free"
            + (f" ({detail})" if detail else "")
            + ". Stop what uses them, choose others with CUDA_VISIBLE_DEVICES, or lower the GPU counts."
        )
