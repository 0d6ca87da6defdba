"""``boxwatch layers``: list a model's candidate layers to monitor, with shapes; with a build
config, rank them as ``layers: auto`` does and mark the ones it picks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import msgspec

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.taps import POOLINGS, InputInfo, LayerInfo, infer_input_kind, open_tap
from boxwatch.commands.console import EXIT_USAGE, aligned, fail


@click.command("layers")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--pooling",
    type=click.Choice(POOLINGS),
    default=None,
    help="How conv maps become features (sets the feature counts shown). "
    "[default: flatten; with --config, the config's model.pooling]",
)
@click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A build config whose model.path is MODEL: rank the candidates on its known data "
    "(data.train, data.validation; never data.unknown*) with its monitor settings, and mark "
    "the layers `layers: auto` picks (what build-artifact would monitor).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def layers(model: Path, pooling: str | None, config: Path | None, as_json: bool) -> None:
    """List the layers of MODEL that a box monitor can watch.

    MODEL is an ONNX file (.onnx), a torch.export program (.pt2) or a TorchScript file
    (.pt/.ts). The first line gives the model's input: its name (model.input_name), shape
    (batch axis '?'; model.preprocessing.shape is the rest), dtype and kind (image, signal
    or vector: from its shape, or the config's model.input_kind), which sets how the build
    pools it; an image is listed twice, as 'input' and as 'input_coarse' (the same input on
    a 5x5 grid), and the build monitors both. Each row gives the layer name to put in the
    build config, its kind (the ONNX
    op, or the torch module's class), its output shape (batch axis shown as '?') and how
    many features it yields with --pooling. For an ONNX file torch exported, a 'module'
    column gives the torch modules whose output the tensor is (layer2.1.relu): the config
    takes either name, and no name the listing does not show. A torch module called more
    than once per forward pass is named below the table: a monitor taps its last call.

    With --config, the build's layer choice runs (the same function build-artifact calls
    for `layers: auto`, or with `layers` omitted): the features are those of the pooling it
    uses (a conv map over the feature cap is pooled), and two more columns give each
    candidate's held-out-class AUROC and whether auto picks it, with the reason (rank,
    pooling, or why it cannot be monitored). It trains box monitors on the config's data,
    so it takes about as long as that part of the build.

    \b
    Examples:
      boxwatch layers examples/digits/model.onnx
      boxwatch layers model.pt2 --pooling avg --json > layers.json
      boxwatch layers model.onnx --config build.yaml
    Exit codes: 0 listed; 2 model, config or data error; 70 internal error.
    """
    choice = None
    kind = None
    try:
        tap = open_tap(model)
        infos = tap.candidates()
        if config is not None:
            choice, pooling, kind = _choice(model, config, pooling)
    except ConfigError as exc:
        fail(exc, EXIT_USAGE)
    pooling = pooling or "flatten"
    marks = {c["layer"]: c for c in choice.candidates} if choice is not None else {}
    kind = kind or (infer_input_kind(tap.input.shape) if tap.input.shape else None)

    def features(info: LayerInfo) -> int | None:
        mark = marks.get(info.name)
        return mark["features"] if mark is not None else info.n_features(pooling)

    if as_json:
        rows = [
            {
                **info.as_dict(),
                "features": features(info),
                **({"auto": _auto_row(marks[info.name])} if info.name in marks else {}),
            }
            for info in infos
        ]
        out: dict[str, Any] = {
            "model": str(model),
            "input": {**tap.input.as_dict(), "kind": kind},
            "pooling": pooling,
            "layers": rows,
        }
        if choice is not None:
            summary = msgspec.to_builtins(choice.summary())
            out["auto"] = {k: v for k, v in summary.items() if k != "candidates"}
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"{model}: {len(infos)} candidate layers (pooling={pooling})", err=True)
    click.echo(_input_line(tap.input, kind))
    named = any(_modules(info) for info in infos)
    header = ("layer", *(("module",) if named else ()), "kind", "shape", "features")
    table = [header + (("AUROC", "auto") if choice is not None else ())]
    for info in infos:
        shape = "(" + ", ".join("?" if d is None else str(d) for d in info.shape) + ")"
        feats = features(info)
        module = (", ".join(_modules(info)) or "-",) if named else ()
        row: tuple[str, ...] = (
            info.name,
            *module,
            info.kind,
            shape,
            "?" if feats is None else str(feats),
        )
        if choice is not None:
            mark = marks.get(info.name) or {"auroc": None, "chosen": False, "reason": "-"}
            auroc = "-" if mark["auroc"] is None else f"{mark['auroc']:.4f}"
            row += (auroc, ("* " if mark["chosen"] else "  ") + mark["reason"])
        table.append(row)
    click.echo(aligned(table))
    if choice is not None:
        click.echo(
            f"auto picks {', '.join(choice.layers)} ({choice.rule}; ranked on "
            f"{choice.n_train} train and {choice.n_validation} {choice.set} inputs)",
            err=True,
        )
    repeated = [info for info in infos if info.calls > 1]
    if repeated:
        names = ", ".join(
            f"{(info.modules or (info.name,))[0]} ({info.calls}x)" for info in repeated
        )
        click.echo(
            f"called more than once per forward pass: {names}; a monitor on such a module "
            "taps its last call (shape shown), so monitor a module called once when the "
            "first call matters",
            err=True,
        )


def _modules(info: LayerInfo) -> list[str]:
    """The torch module paths that name ``info`` besides its own name."""
    return [m for m in info.modules if m != info.name]


def _input_line(info: InputInfo, kind: str | None) -> str:
    shape = (
        "(" + ", ".join("?" if d is None else str(d) for d in info.shape) + ")"
        if info.shape
        else "not declared"
    )
    name = info.name if info.name is not None else "not declared"
    return (
        f"input: {name}, shape {shape}, dtype {info.dtype or 'not declared'}, "
        f"kind {kind or 'not declared'}"
    )


def _auto_row(mark: dict[str, Any]) -> dict[str, Any]:
    return {k: mark.get(k) for k in ("pooling", "auroc", "tau", "rank", "chosen", "reason")}


def _choice(model: Path, config: Path, pooling: str | None) -> tuple[Any, str, str]:
    """The build's layer choice for ``config`` (its model must be ``model``)."""
    # The offline builder is imported only here: listing layers needs the agent's taps alone.
    from boxwatch.offline.release.config import load_config
    from boxwatch.offline.release.pipeline import choose_layers, input_plan, prepare_model

    cfg = load_config(config)
    configured = cfg.resolve(cfg.section("model").get("path", ""))
    if not model.exists() or not configured.exists() or not model.samefile(configured):
        raise ConfigError(
            f"--config {config}: its model.path is {configured}, not MODEL {model}; "
            "give the config's model"
        )
    wanted = cfg.section("model").get("pooling", "flatten")
    if pooling is not None and pooling != wanted:
        raise ConfigError(
            f"--pooling {pooling}: the config's model.pooling is {wanted}; the layer "
            "choice uses the config's (drop --pooling or change the config)"
        )
    mi = prepare_model(cfg, auto=True)
    return choose_layers(mi, cfg.section("monitor")), wanted, input_plan(mi).kind
