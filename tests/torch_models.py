"""Test helper: small seeded torch models a user might bring, trained on synthetic data and
saved as torch saves them by default (issue 39).

* :func:`residual_cnn`: a residual CNN with BatchNorm on 12x12 images of 3 classes (its
  conv maps, 8x12x12, pass the layer choice's 1,024-feature cap flattened), exported
  by ``torch.onnx.export`` with its default (dynamo) exporter and by ``torch.export.save``;
* :func:`signal_cnn`: a 1-D CNN on signals of shape ``[1, 40]`` of 3 classes, exported to
  ONNX (one file).

Each writes the model files and the data sets (``.npz``: train, validation, and unknown
sets of two far kinds) into a folder; a build config over them is :func:`build_config`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from onnx_export import export_onnx

CLASSES = ["0", "1", "2"]


@dataclass(frozen=True)
class SavedModel:
    """A trained model's files and data sets: ``onnx``, ``pt2`` (``None``: not saved),
    ``folder`` with the ``.npz`` sets, and the input ``shape`` (without the batch axis)."""

    onnx: Path
    pt2: Path | None
    folder: Path
    shape: tuple[int, ...]


def _train(model: Any, x: np.ndarray, y: np.ndarray, steps: int) -> Any:
    """``steps`` full-batch Adam steps on ``(x, y)``; the model in eval mode."""
    import torch

    torch.set_num_threads(1)  # tiny models: threads only contend
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    return model.eval()


def _save_sets(folder: Path, x: np.ndarray, y: np.ndarray, far: dict[str, np.ndarray]) -> None:
    """Train (two thirds) and validation (one third) sets, and each far unknown set."""
    cut = 2 * len(x) // 3
    np.savez(folder / "train.npz", x=x[:cut], y=y[:cut])
    np.savez(folder / "validation.npz", x=x[cut:], y=y[cut:])
    for name, values in far.items():
        np.savez(folder / f"unknown_{name}.npz", x=values.astype(np.float32))


def _save_program(model: Any, example: Any, path: Path) -> None:
    import torch

    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(path))


def residual_cnn(folder: Path, *, n: int = 180, seed: int = 0) -> SavedModel:
    """A residual CNN with BatchNorm (stem conv-BN-ReLU, two residual blocks, global average
    pooling, a linear head) on 12x12 images whose class is the bright quadrant."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
            self.relu = nn.ReLU()

        def forward(self, x: Any) -> Any:
            h = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(h)) + x)

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.layer1 = nn.Sequential(Block(8), Block(8))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(8, len(CLASSES))

        def forward(self, x: Any) -> Any:
            return self.fc(self.pool(self.layer1(self.stem(x))).flatten(1))

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(CLASSES), n)
    x = rng.normal(0, 0.3, (n, 1, 12, 12)).astype(np.float32)
    for i, label in enumerate(y):
        r, c = divmod(int(label), 2)
        x[i, 0, 6 * r : 6 * r + 6, 6 * c : 6 * c + 6] += 1.0
    torch.manual_seed(seed)
    model = _train(ResNet(), x, y, 25)
    far = {
        "noise": rng.uniform(-3, 3, (60, 1, 12, 12)),
        "stripes": np.tile((np.arange(12) % 2 * 2.0)[None, None, None, :], (60, 1, 12, 1)),
    }
    _save_sets(folder, x, y, far)
    example = torch.zeros(2, 1, 12, 12)
    onnx_path, pt2 = folder / "resnet.onnx", folder / "resnet.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(onnx_path),
            dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1)}},
            external_data=False,
            verbose=False,
        )
        _save_program(model, example, pt2)
    return SavedModel(onnx_path, pt2, folder, (1, 12, 12))


def signal_cnn(folder: Path, *, n: int = 240, seed: int = 0) -> SavedModel:
    """A 1-D CNN (conv1d 4 k5, ReLU, conv1d 8 k5 stride 2, ReLU, linear) on signals of shape
    ``[1, 40]``: a bump early, in the middle or late, plus noise."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.act1 = nn.Conv1d(1, 4, 5, padding=2), nn.ReLU()
            self.conv2, self.act2 = nn.Conv1d(4, 8, 5, stride=2, padding=2), nn.ReLU()
            self.fc = nn.Linear(8 * 20, len(CLASSES))

        def forward(self, x: Any) -> Any:
            return self.fc(self.act2(self.conv2(self.act1(self.conv1(x)))).flatten(1))

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(CLASSES), n)
    t = np.arange(40)
    centres = np.array([8, 20, 32])[y] + rng.integers(-2, 3, n)
    x = np.exp(-0.5 * ((t[None, :] - centres[:, None]) / 2.0) ** 2)
    x = (x + rng.normal(0, 0.1, x.shape)).astype(np.float32)[:, None, :]
    torch.manual_seed(seed)
    model = _train(Net(), x, y, 40)
    known = x[-60:]
    far = {  # noise, and known signals with a spike of +-0.6 at every step
        "noise": rng.normal(float(x.mean()), float(x.std()), known.shape),
        "spiky": known + rng.choice([-0.6, 0.6], known.shape),
    }
    _save_sets(folder, x, y, far)
    onnx_path = folder / "signal.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx(model, torch.zeros(2, 1, 40), onnx_path)
    return SavedModel(onnx_path, None, folder, (1, 40))


def build_config(
    saved: SavedModel, name: str, *, model: Path | None = None, **changes: Any
) -> Path:
    """A build config over ``saved`` (its ONNX file unless ``model``), a short tau list for
    speed, written as ``<name>.yaml`` beside the data; ``changes`` replace top-level keys,
    ``model_keys`` (a mapping) adds keys to ``model``."""
    extra_model = changes.pop("model_keys", {})
    sets = ["train", "validation", *sorted(p.stem for p in saved.folder.glob("unknown_*.npz"))]
    raw: dict[str, Any] = {
        "version": 1,
        "model": {
            "path": str(model or saved.onnx),
            "preprocessing": {"shape": list(saved.shape)},
            **extra_model,
        },
        "classes": CLASSES,
        "data": {s: {"path": str(saved.folder / f"{s}.npz")} for s in sets},
        "monitor": {"tau": [0.5, 0.1]},
        **changes,
    }
    path = saved.folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
