"""How a machine's GPUs are linked, as a graph: :func:`gpu_links` (chapter 02).

:func:`parse_topology` reads the matrix ``nvidia-smi topo -m`` prints (``NV#``: NVLink with # links;
``PIX``/``PXB``: through PCIe switches; ``PHB``/``NODE``/``SYS``: through the host bridge or the CPUs).
:func:`gpu_links` draws each GPU, a direct edge per NVLink or PCIe-switch pair, and the host below them:
the path NCCL takes when ``NCCL_P2P_DISABLE=1`` forbids GPU-to-GPU copies.
``EXAMPLE_TOPOLOGY`` is the matrix the Hugging Face hardware guide prints for its 2× TITAN RTX with NVLink
(the machine of the DP-vs-DDP timings the chapter quotes), drawn where no GPU is visible.
"""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt

EXAMPLE_TOPOLOGY = """\
        GPU0    GPU1    CPU Affinity    NUMA Affinity
GPU0     X      NV2     0-23            N/A
GPU1    NV2      X      0-23            N/A
"""

LINK_STYLE = {"NV": ("#55A868", "NVLink"), "PIX": ("#DD8452", "PCIe switch"), "PXB": ("#DD8452", "PCIe switches")}


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """``{(i, j): kind}`` for every GPU pair ``i < j`` of an ``nvidia-smi topo -m`` matrix (``"NV2"``, ``"SYS"``…)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)   # a terminal's colour codes, if any
    rows = [line.split() for line in text.splitlines() if re.match(r"\s*GPU\d+\s", line)]
    header = next((line.split() for line in text.splitlines() if re.match(r"\s+GPU0\s", line)), [])
    gpus = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    links = {}
    for row in rows:
        i = int(row[0][3:])
        for j, kind in enumerate(row[1:1 + len(gpus)]):
            if i < j:
                links[(i, j)] = kind
    return links


def gpu_links(links: dict[tuple[int, int], str], title: str = ""):
    """The GPUs on a circle, an edge per direct link (NVLink green, labelled with its count; a PCIe switch
    orange), and every GPU's PCIe path to the host below, dashed: where data goes with P2P off."""
    gpus = sorted({g for pair in links for g in pair}) or [0]
    n = len(gpus)
    place = {g: (math.cos(math.pi / 2 + 2 * math.pi * k / n) * (1 if n > 1 else 0),
                 1.2 + 0.8 * math.sin(math.pi / 2 + 2 * math.pi * k / n)) if n > 2 else (2.0 * k - 1.0, 1.4)
             for k, g in enumerate(gpus)}
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    host = (0.0, -0.6)
    for g, (x, y) in place.items():
        ax.plot([x, host[0]], [y, host[1]], ls="--", color="#999999", lw=1.2, zorder=1)
    seen = set()
    for (i, j), kind in links.items():
        style = LINK_STYLE.get("NV" if kind.startswith("NV") else kind)
        if style is None:
            continue
        color, name = style
        (x0, y0), (x1, y1) = place[i], place[j]
        ax.plot([x0, x1], [y0, y1], color=color, lw=4 if kind.startswith("NV") else 2.5, zorder=2,
                label=None if name in seen else name)
        seen.add(name)
        if len(links) <= 6:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, kind, ha="center", fontsize=9, color=color)
    for g, (x, y) in place.items():
        ax.text(x, y, f"GPU{g}", ha="center", va="center", fontsize=10, zorder=3,
                bbox=dict(boxstyle="round,pad=0.5", facecolor="#4C72B0", edgecolor="none"), color="white")
    ax.text(*host, "CPU / host memory", ha="center", va="center", fontsize=10, zorder=3,
            bbox=dict(boxstyle="round,pad=0.5", facecolor="#D9D9D9", edgecolor="#666666"))
    ax.plot([], [], ls="--", color="#999999", label="PCIe to the host: the path with NCCL_P2P_DISABLE=1")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), frameon=False, fontsize=8, ncol=2)
    ax.set_xlim(-1.8, 1.8)
    ax.set_ylim(-1.0, 2.3)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
