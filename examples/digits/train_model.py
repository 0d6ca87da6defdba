"""Train the bundled example classifier: a small MLP on scikit-learn's digits, classes 0-7.

Digits 8 and 9 are never seen in training, so the demo can stream them as *unknown* inputs.
Seeded and single-threaded, so re-running reproduces ``model.onnx`` (committed, so the demo
needs no torch). Run: ``python examples/digits/train_model.py`` (with boxwatch installed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

from boxwatch.examples.digits_data import split_indices  # the split the demo data uses

HERE = Path(__file__).resolve().parent
KNOWN_CLASSES = 8
SEED = 0
SCALE = 1.0 / 16.0  # pixel values are 0..16; the artifact records this preprocessing
# Few epochs on purpose: a ~96%-accurate model makes training mistakes, which the monitors
# need for their "bad" boxes (and the demo for uncertainty verdicts).
EPOCHS = 3


class DigitsMLP(nn.Module):
    """64 -> 64 -> 32 -> 8; the two hidden ReLU layers are the monitored ones."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(64, 32)
        self.act2 = nn.ReLU()
        self.out = nn.Linear(32, KNOWN_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act2(self.fc2(self.act1(self.fc1(x)))))


def main() -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    digits = load_digits()
    known = digits.target < KNOWN_CLASSES
    x = (digits.data[known] * SCALE).astype(np.float32)
    y = digits.target[known].astype(np.int64)
    idx = split_indices(len(y))["train"]
    xt, yt = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
    model = DigitsMLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(SEED)
    for _epoch in range(EPOCHS):
        perm = torch.randperm(len(yt), generator=gen)
        for start in range(0, len(yt), 64):
            batch = perm[start : start + 64]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xt[batch]), yt[batch])
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(torch.from_numpy(x)).argmax(1).numpy() == y).mean()
    torch.onnx.export(
        model,
        (torch.zeros(1, 64),),
        str(HERE / "model.onnx"),
        dynamo=False,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
    )
    print(f"accuracy on all known digits: {acc:.4f}; wrote {HERE / 'model.onnx'}")


if __name__ == "__main__":
    main()
