"""The report's HTML pieces: number formatting, escaped text, tables, figures, the style sheet."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from msgspec import UnsetType

MISSING = "n/a"
T = TypeVar("T")

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:1.5em auto;
max-width:62em;padding:0 1em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.15em 1em}dl.meta dt{font-weight:600}
dl.meta dd{margin:0;overflow-wrap:anywhere}
.status{display:inline-block;font-weight:700;padding:.15em .7em;border-radius:.3em;color:#fff}
.pass{background:#2e7d32}.fail{background:#c62828}
.holds{color:#2e7d32;font-weight:600}.violated{color:#c62828;font-weight:600}
.cannot_flip_twice{color:#555}
figure{margin:1em 0;page-break-inside:avoid;break-inside:avoid}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#444;margin-top:.3em}
.omitted{color:#666;font-style:italic}code{font-size:.9em;overflow-wrap:anywhere}
nav ul{columns:2;font-size:.92em}
@media print{body{max-width:none;margin:0}nav{display:none}h2{page-break-after:avoid}
.status{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
"""


def given(value: T | UnsetType) -> T | None:
    """A summary field's value, None when the summary leaves it out."""
    return None if isinstance(value, UnsetType) else value


def fmt_value(value: Any) -> str:
    """How every number is shown: ints plainly, floats with 4 decimals (or 3-digit exponent
    form outside [1e-3, 1e5)), None as ``n/a``."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0 or 1e-3 <= abs(value) < 1e5:
            return f"{value:.4f}"
        return f"{value:.3e}"
    return str(value)


def esc(value: Any) -> str:
    """HTML-escaped text of ``value`` (None as ``n/a``)."""
    return html.escape(MISSING if value is None else str(value), quote=True)


def num(elem_id: str, value: Any) -> str:
    """A number with a stable id, its exact value in ``data-value`` and its formatted text."""
    return (
        f'<span id="{esc(elem_id)}" class="num" data-value="{esc(json.dumps(value))}">'
        f"{esc(fmt_value(value))}</span>"
    )


def text(elem_id: str, value: Any) -> str:
    """A string field with a stable id."""
    return f'<span id="{esc(elem_id)}">{esc(value)}</span>'


def table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    numeric: Sequence[bool] = (),
    table_id: str | None = None,
) -> str:
    """An HTML table; ``rows`` hold ready HTML cells, ``numeric`` right-aligns columns."""
    right = (list(numeric) + [False] * len(header))[: len(header)]
    attr = f' id="{esc(table_id)}"' if table_id else ""
    head = "".join(
        f"<th{' class=n' if n else ''}>{esc(h)}</th>" for h, n in zip(header, right, strict=True)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if n else ''}>{c}</td>" for c, n in zip(row, right, strict=True))
        + "</tr>"
        for row in rows
    )
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(elem_id: str, uri: str, alt: str, caption: str) -> str:
    """An embedded figure with its caption."""
    return (
        f'<figure id="{esc(elem_id)}"><img src="{uri}" alt="{esc(alt)}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def omitted(elem_id: str, why: str) -> str:
    """The sentence that stands for a section the summary has no data for."""
    return f'<p id="{esc(elem_id)}" class="omitted">{esc(why)}</p>'


def cube_text(
    cube: Mapping[str, Any], features: Sequence[str] = (), empty: str = "any input"
) -> str:
    """``f in {a, b}; g = c`` for a cube of allowed state names (escaped), in feature order.

    A value may be one state name or a list of them.
    """
    if not cube:
        return esc(empty)
    order = [f for f in features if f in cube] + [f for f in cube if f not in features]
    parts = []
    for feature in order:
        value = cube[feature]
        names = [value] if isinstance(value, str) or not isinstance(value, Sequence) else value
        names = list(names)
        parts.append(
            f"{feature} = {names[0]}"
            if len(names) == 1
            else f"{feature} \u2208 {{{', '.join(map(str, names))}}}"
        )
    return esc("; ".join(parts))


def witness_text(witness: Any) -> str:
    """An FMO witness: fixed features, the feature's rising values and the classes they get."""
    if isinstance(witness, Mapping) and {"fixed", "values", "classes"} <= set(witness):
        fixed = "; ".join(f"{k} = {v}" for k, v in (witness["fixed"] or {}).items())
        rise = " \u2192 ".join(map(str, witness["values"]))
        classes = " \u2192 ".join(map(str, witness["classes"]))
        return esc(f"{fixed + ': ' if fixed else ''}{rise} gives {classes}")
    return f"<code>{esc(json.dumps(witness, sort_keys=True))}</code>"
