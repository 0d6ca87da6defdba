"""Test and bench helper: a torch model as the ONNX file the layer taps read."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def export_onnx(model: Any, example: Any, path: Path, *, opset: int | None = 17) -> Path:
    """``model`` (run on ``example``) as ONNX at ``path``: the legacy exporter (one file),
    tensors ``input`` and ``logits`` with a dynamic batch axis; ``opset`` None is torch's."""
    import torch

    torch.onnx.export(
        model,
        (example,),
        str(path),
        dynamo=False,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=opset,
    )
    return path
