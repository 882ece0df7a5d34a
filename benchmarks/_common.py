"""What every benchmark in this folder shares: naming the machine, and writing results as JSON + PNG."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform

import torch

from parlab.lab.launch.plan import cpu_count


def machine(backend: str) -> dict:
    """Which machine and backend produced a result: a number means little without this."""
    info = {
        "host_cpu": platform.processor() or platform.machine(),
        "cpu_cores": cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "backend": backend,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["host_cpu"] = names[0]
    except OSError:
        pass
    return info


def describe(m: dict) -> str:
    where = ", ".join(m["gpus"]) if m["gpus"] else f"{m['cpu_cores']} CPU cores ({m['host_cpu']})"
    return f"{where} · {m['backend']} · torch {m['torch']}"


def results_dir(path: str | None = None) -> str:
    out = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out, exist_ok=True)
    return out


def write(out_dir: str, name: str, data: dict, fig) -> tuple[str, str]:
    """Writes ``name.json`` and ``name.png``; returns their paths."""
    js, png = os.path.join(out_dir, f"{name}.json"), os.path.join(out_dir, f"{name}.png")
    with open(js, "w") as f:
        json.dump(data, f, indent=2)
    fig.savefig(png, dpi=120, bbox_inches="tight")
    return js, png


def timing_parser(description: str, presets: dict, steps: int, rounds: int = 6,
                  warmup: int = 2) -> argparse.ArgumentParser:
    """The options every timing benchmark takes: ranks, model preset, steps, rounds, warm-up, output folder."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--preset", choices=sorted(presets), default=None,
                    help="model size; default: gpu when world-size GPUs are visible, else cpu")
    ap.add_argument("--steps", type=int, default=steps, help="optimizer steps per timed block")
    ap.add_argument("--rounds", type=int, default=rounds, help="timed blocks per implementation, interleaved")
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    return ap


def timing_setup(ap: argparse.ArgumentParser, args) -> tuple[str, str]:
    """Check the timing options and choose: (preset, backend), GPUs when ``world_size`` of them are visible."""
    import matplotlib

    matplotlib.use("Agg")  # a script writes PNGs; a notebook importing plot() keeps its own backend
    for name in ("world_size", "steps", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpus = gpus >= args.world_size
    return args.preset or ("gpu" if on_gpus else "cpu"), "nccl" if on_gpus else "gloo"


class Kernel:
    """A fresh Jupyter kernel, driven as JupyterLab drives it."""

    def __init__(self):
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3")

    def execute(self, code: str) -> str:
        out, errors = [], []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                errors.append("\n".join(msg["content"]["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=600, output_hook=hook)
        if reply["content"]["status"] != "ok" or errors:
            raise RuntimeError(f"the kernel failed on:\n{code}\n" + "\n".join(errors))
        return "".join(out)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
