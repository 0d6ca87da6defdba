"""``boxwatch layers``: list a model's candidate layers to monitor, with shapes."""

from __future__ import annotations

import json
from pathlib import Path

import click

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.taps import POOLINGS, list_layers
from boxwatch.commands.console import EXIT_USAGE, fail


@click.command("layers")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--pooling",
    type=click.Choice(POOLINGS),
    default="flatten",
    show_default=True,
    help="How conv maps become features (sets the feature counts shown).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def layers(model: Path, pooling: str, as_json: bool) -> None:
    """List the layers of MODEL that a box monitor can watch.

    MODEL is an ONNX file (.onnx), a torch.export program (.pt2) or a TorchScript file
    (.pt/.ts). Each row gives the layer name to put in the build config, its kind (the ONNX
    op, or the torch module's class), its output shape (batch axis shown as '?') and how many
    features it yields with --pooling. A torch module called more than once per forward pass
    is listed once and named below the table: a monitor taps its last call.

    \b
    Examples:
      boxwatch layers examples/digits/model.onnx
      boxwatch layers model.pt2 --pooling avg --json > layers.json
    """

    try:
        infos = list_layers(model)
    except ConfigError as exc:
        fail(exc, EXIT_USAGE)
    if as_json:
        rows = [{**info.as_dict(), "features": info.n_features(pooling)} for info in infos]
        click.echo(json.dumps({"model": str(model), "pooling": pooling, "layers": rows}, indent=2))
        return
    click.echo(f"{model}: {len(infos)} candidate layers (pooling={pooling})", err=True)
    table = [("layer", "kind", "shape", "features")]
    for info in infos:
        shape = "(" + ", ".join("?" if d is None else str(d) for d in info.shape) + ")"
        feats = info.n_features(pooling)
        table.append((info.name, info.kind, shape, "?" if feats is None else str(feats)))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    repeated = [info for info in infos if info.calls > 1]
    if repeated:
        names = ", ".join(f"{info.name} ({info.calls}x)" for info in repeated)
        click.echo(
            f"called more than once per forward pass: {names}; a monitor on such a module "
            "taps its last call (shape shown), so monitor a module called once when the "
            "first call matters",
            err=True,
        )
