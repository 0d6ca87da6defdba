"""A GPU against the CPU for the build's activation extraction (``model.device``, issue 40).

A short prepared check for a machine with an NVIDIA GPU and ``onnxruntime-gpu`` and/or a
CUDA build of torch:

1. **the bundled example** (ONNX digits MLP, model half only) built with ``device: cpu`` and
   ``device: cuda``, same key and creation time: the training set's activations of the
   monitored layers on each device (max absolute and max relative difference), the
   agreement of the two artifacts' verdicts on the held-out sets (validation and every
   unknown set, each artifact run by the agent's runtime on the CPU, as production runs
   it), and the seconds each device takes to extract the training set;
2. **a conv model** (random init, 3x64x64 inputs, three conv layers and a linear read-out),
   exported to ONNX and as a ``.pt2`` program: ``--rows`` random inputs through each format
   on each device, the pooled activations' differences and the seconds.

Without a GPU (neither onnxruntime's CUDA provider nor ``torch.cuda``) it says so and exits
0; a device the installed packages cannot run is reported by the build's own one-line error
and left out. Run: ``python bench/gpu_check.py [--rows 4096]``. Writes its table to
bench/RESULTS.md under "## gpu_check" when it measured on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_line, run_summary, write_section

from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.runtime import load_runtime
from boxwatch.agent.taps import CUDA_PROVIDER, open_tap
from boxwatch.commands.demo import write_build_config
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import EXTRACT_BATCH, build, extract, prepare

HEADING = "## gpu_check (bench/gpu_check.py)"
DEVICES = ("cpu", "cuda")


def torch_cuda() -> bool:
    """Whether torch is installed and sees a CUDA device."""
    try:
        import torch
    except ModuleNotFoundError:
        return False
    return bool(torch.cuda.is_available())


def differences(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Max absolute difference, and max relative one (to the larger magnitude, over values
    above 1e-6 of the array's largest)."""
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    scale = np.maximum(np.abs(a), np.abs(b)).astype(np.float64)
    live = scale > 1e-6 * max(float(scale.max()), 1e-30)
    rel = float((diff[live] / scale[live]).max()) if live.any() else 0.0
    return float(diff.max()) if diff.size else 0.0, rel


def example_check(folder: Path) -> list[str]:
    """Part 1: the bundled example built on each device; table rows."""
    key, pub = folder / "k.key", folder / "k.pub"
    generate_keypair(key, pub, force=True)
    base = write_build_config(folder)
    raw = yaml.safe_load(base.read_text())
    raw.pop("bn")
    built: dict[str, Any] = {}
    for device in DEVICES:
        raw["model"]["device"] = device
        config = folder / f"{device}.yaml"
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
        try:
            prepared = prepare(load_config(config))
        except ConfigError as exc:
            print(f"example on {device}: {exc}", file=sys.stderr)
            return [f"| example | {device} | not run: {exc} | | |"]
        began = time.perf_counter()
        outcome = build(prepared, load_private_key(key), created_at=1)
        seconds = time.perf_counter() - began
        artifact = folder / f"{device}.bwa"
        write_artifact(artifact, outcome.artifact)
        mi = prepared.model
        assert mi is not None
        layers = outcome.summary.to_dict()["model"]["layers"]
        pooling = outcome.summary.to_dict()["monitor"]["layer_choice"]["pooling"]
        tap = open_tap(mi.path, layers, pooling=pooling, threads=1, device=device)
        tapped = type(mi)(**{**mi.__dict__, "layers": layers, "tap": tap})
        extract(tapped, mi.data["train"][0][:EXTRACT_BATCH])  # warm-up (CUDA start-up)
        t0 = time.perf_counter()
        logits, acts = extract(tapped, mi.data["train"][0])
        runtime = load_runtime(artifact, [str(pub)], model_path=mi.path)
        verdicts = {
            name: runtime.run_model(x).verdicts
            for name, (x, _y) in mi.data.items()
            if name != "train"
        }
        built[device] = (time.perf_counter() - t0, logits, acts, verdicts, seconds)
    (t_cpu, l_cpu, a_cpu, v_cpu, s_cpu), (t_gpu, l_gpu, a_gpu, v_gpu, s_gpu) = (
        built["cpu"],
        built["cuda"],
    )
    rows = []
    for name in ("logits", *a_cpu):
        a, b = (l_cpu, l_gpu) if name == "logits" else (a_cpu[name], a_gpu[name])
        abs_d, rel_d = differences(a, b)
        rows.append(f"| example train | {name} | {abs_d:.2e} | {rel_d:.2e} | |")
    agree = {name: float(np.mean(v_cpu[name] == v_gpu[name])) for name in v_cpu}
    shown = ", ".join(f"{name} {share:.4f}" for name, share in agree.items())
    rows.append(f"| example verdicts agree | {shown} | | | |")
    rows.append(
        f"| example build s (cpu / cuda) | {s_cpu:.1f} / {s_gpu:.1f} | | | "
        f"extraction + agent run s: {t_cpu:.2f} / {t_gpu:.2f} |"
    )
    return rows


def conv_check(folder: Path, rows: int) -> list[str]:
    """Part 2: a conv model as ONNX and .pt2 on each device; table rows."""
    try:
        import torch
    except ModuleNotFoundError:
        return ["| conv model | not run: no torch | | | |"]

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 32, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(32, 64, 3, stride=2, padding=1)
            self.conv3 = torch.nn.Conv2d(64, 128, 3, stride=2, padding=1)
            self.fc = torch.nn.Linear(128, 10)

        def forward(self, x: Any) -> Any:
            x = torch.relu(self.conv1(x))
            x = torch.relu(self.conv2(x))
            x = torch.relu(self.conv3(x))
            return self.fc(x.mean(dim=(2, 3)))

    torch.manual_seed(0)
    net = Net().eval()
    example = torch.zeros(2, 3, 64, 64)
    onnx_path, pt2_path = folder / "conv.onnx", folder / "conv.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (example,),
            str(onnx_path),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "n"}},
            dynamo=False,
        )
        batch = torch.export.Dim("batch", min=1)
        program = torch.export.export(net, (example,), dynamic_shapes={"x": {0: batch}})
        torch.export.save(program, str(pt2_path))
    x = np.random.default_rng(0).normal(size=(rows, 3, 64, 64)).astype(np.float32)
    layers, pooling = ["conv2", "conv3"], {"conv2": "avg", "conv3": "grid"}
    out = []
    for fmt, path in (("onnx", onnx_path), ("pt2", pt2_path)):
        got: dict[str, tuple[float, dict[str, np.ndarray]]] = {}
        for device in DEVICES:
            try:
                tap = open_tap(path, layers, pooling=pooling, threads=1, device=device)
            except ConfigError as exc:
                out.append(f"| conv {fmt} | {device} | not run: {exc} | | |")
                continue
            tap.run(x[:EXTRACT_BATCH])  # warm-up
            t0 = time.perf_counter()
            parts = [tap.run(x[i : i + EXTRACT_BATCH]) for i in range(0, rows, EXTRACT_BATCH)]
            seconds = time.perf_counter() - t0
            acts = {name: np.concatenate([p[1][name] for p in parts]) for name in layers}
            acts["logits"] = np.concatenate([p[0] for p in parts])
            got[device] = (seconds, acts)
        if len(got) == len(DEVICES):
            (t_cpu, a_cpu), (t_gpu, a_gpu) = got["cpu"], got["cuda"]
            for name in a_cpu:
                abs_d, rel_d = differences(a_cpu[name], a_gpu[name])
                out.append(
                    f"| conv {fmt} ({rows:,} inputs) | {name} | {abs_d:.2e} | {rel_d:.2e} | |"
                )
            out.append(
                f"| conv {fmt} extraction s (cpu / cuda) | {t_cpu:.2f} / {t_gpu:.2f} | | | "
                f"{t_cpu / max(t_gpu, 1e-9):.1f}x |"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096, help="conv model inputs")
    args = parser.parse_args()
    ort_cuda = CUDA_PROVIDER in ort.get_available_providers()
    if not ort_cuda and not torch_cuda():
        print(
            "gpu_check: no GPU to check here (onnxruntime providers: "
            f"{', '.join(ort.get_available_providers())}; torch sees no CUDA device); "
            "nothing measured",
        )
        return 0
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        folder = Path(tmp)
        rows = [*example_check(folder), *conv_check(folder, args.rows)]
    gpu = ""
    if torch_cuda():
        import torch

        gpu = f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
    text = "\n".join(
        [
            machine_line(f"{gpu}onnxruntime {ort.__version__}; {run_summary(began)}"),
            "",
            "| what | layer / detail | max abs diff | max rel diff | note |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    print(text)
    write_section(HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
