"""Hostile inputs to the BN builder and the model readers (issue 37), shared by the tests
(tests/offline/bn/test_hostile_bn.py, small sizes) and the bench (bench/hostile_bn.py, the
issue's sizes times ten).

Each family writes its files into a folder and returns the command line to run on them;
:func:`run_boxwatch` runs that command line as ``python -m boxwatch`` in a child process
and measures what the targets are about: the exit code, the lines on stderr, the seconds
of the command itself (after the imports its verb needs) and its peak resident memory
(``VmHWM``) above what those imports took.
"""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from boxwatch.offline.progress import LINE

MIB = 1 << 20
GIB = 1 << 30

_WRAPPER = """
import atexit, importlib, os, resource, runpy, sys, time
limit = int(os.environ["HOSTILE_AS"])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
def _hwm():
    # the peak of this process's own memory (ru_maxrss would count its parent's at fork)
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name in os.environ["HOSTILE_PRELOAD"].split(","):
    importlib.import_module(name)
base = _hwm()
start = time.perf_counter()
def _report():
    peak = _hwm()
    with open(os.environ["HOSTILE_OUT"], "w") as fh:
        fh.write(f"{base} {peak} {time.perf_counter() - start}")
atexit.register(_report)
runpy.run_module("boxwatch", run_name="__main__", alter_sys=True)
"""

PRELOAD = {
    "compile-bn": ("boxwatch.cli", "boxwatch.commands.compile_bn"),
    "verify-bn": ("boxwatch.cli", "boxwatch.commands.verify_bn", "pysat.solvers"),
    "layers": ("boxwatch.cli", "boxwatch.commands.layers", "onnx", "onnxruntime", "torch"),
}
"""What each verb imports before it reads its inputs: loaded before the baseline."""


@dataclass(frozen=True)
class Outcome:
    """What one run of the command line did."""

    rc: int
    stdout: str
    stderr: str
    seconds: float | None
    """Of the command itself, imports excluded (None: the child never reported)."""
    growth: int | None
    """Bytes of peak resident memory above the imports' (None: never reported)."""
    peak: int | None = None
    """Bytes of peak resident memory, imports included (None: never reported)."""

    def error_lines(self) -> list[str]:
        """Lines of stderr but click's usage boilerplate and progress lines (a phase that
        runs over 2 s shows one): what reports an error, or should not be there."""
        return [
            line
            for line in self.stderr.splitlines()
            if line.strip() and not line.startswith(("Usage:", "Try '")) and not LINE.match(line)
        ]


def run_boxwatch(
    args: Sequence[str],
    cwd: Path,
    *,
    address_space: int = 4 * GIB,
    timeout: float = 300,
) -> Outcome:
    """``python -m boxwatch ARGS`` in a child held to ``address_space`` (RLIMIT_AS)."""
    out = cwd / f".hostile-{os.getpid()}-{abs(hash(tuple(args)))}.txt"
    env = {
        **os.environ,
        "HOSTILE_OUT": str(out),
        "HOSTILE_AS": str(address_space),
        "HOSTILE_PRELOAD": ",".join(PRELOAD[args[0]]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *args],
        capture_output=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    seconds = growth = peak = None
    if out.is_file():
        base, top, took = out.read_text().split()
        growth, peak, seconds = (int(top) - int(base)) * 1024, int(top) * 1024, float(took)
        out.unlink()
    return Outcome(
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
        seconds,
        growth,
        peak,
    )


def gz_repeat(path: Path, head: bytes, body: bytes, size: int, tail: bytes = b"") -> Path:
    """``path`` := gzip of ``head``, ``size`` bytes of ``body`` repeated, ``tail``; written
    a MiB at a time (a 2.5 GiB stream never exists in memory)."""
    block = body * max(1, MIB // len(body))
    with gzip.open(path, "wb", compresslevel=6) as fh:
        fh.write(head)
        for _ in range(size // len(block)):
            fh.write(block)
        fh.write(tail)
    return path


# ---------------------------------------------------------------------------- UAI readers
UAI_NETWORK = b"BAYES\n2\n2 2\n2\n1 0\n2 0 1\n2\n0.5 0.5\n4\n0.3 0.7 0.6 0.4\n"
"""A valid UAI network: var_0 (the class) and its child var_1."""

UAI_BOMBS = (
    "numbers-after",
    "newlines-before",
    "spaces-before",
    "one-token",
    "numbers-in-a-table",
    "declared-states",
)
"""The kinds of :func:`uai_bomb`: which tokens fill the stream, and where."""


def uai_bomb(folder: Path, kind: str, size: int) -> Path:
    """A ``.uai.gz`` inflating to about ``size`` bytes of one kind of token.

    ``numbers-after``: a network then ``0.5`` tokens; ``newlines-before`` and
    ``spaces-before``: blanks then a valid network; ``one-token``: a header then one
    endless token; ``numbers-in-a-table``: binary variables, the last the child of all the
    others, whose table declares the numbers that follow (rows of 0.4 + 0.4: not 1);
    ``declared-states``: one variable declaring as many states as the numbers that follow.
    """
    path = folder / f"{kind}-{size // MIB}.uai.gz"
    cells = size // 4
    n = max(2, cells.bit_length() - 1)  # binary variables: the child's table has 2**n cells
    table_head = "".join(
        [
            f"BAYES\n{n}\n{' '.join(['2'] * n)}\n{n}\n",
            *(f"1 {i}\n" for i in range(n - 1)),
            f"{n} {' '.join(map(str, range(n)))}\n",
            "2\n0.5 0.5\n" * (n - 1),
            f"{2**n}\n",
        ]
    )
    heads = {
        "numbers-after": (UAI_NETWORK, b"0.5 ", b""),
        "newlines-before": (b"", b"\n", UAI_NETWORK),
        "spaces-before": (b"", b" ", UAI_NETWORK),
        "one-token": (b"BAYES\n1\n", b"7", b""),
        "numbers-in-a-table": (table_head.encode(), b"0.4 ", b""),
        "declared-states": (f"BAYES\n1\n{cells}\n1\n1 0\n{cells}\n".encode(), b"0.1 ", b""),
    }
    head, body, tail = heads[kind]
    return gz_repeat(path, head, body, size, tail)


def wide_scope_uai(n: int) -> bytes:
    """A UAI network of ``n`` one-state variables, the last one's CPT scoped over all ``n``
    (numpy's arrays have at most 64 axes)."""
    text = f"BAYES\n{n}\n{' '.join(['1'] * n)}\n{n}\n"
    text += "".join(f"1 {i}\n" for i in range(n - 1))
    text += f"{n} {' '.join(map(str, range(n)))}\n" + "1 1.0\n" * n
    return text.encode()


def uai_args(path: Path, *extra: str) -> list[str]:
    """compile-bn of a UAI network's var_0 (argmax)."""
    return ["compile-bn", str(path), "--class", "var_0", "--decision", "argmax", *extra]


# ---------------------------------------------------------------------------- argmax
ARGMAX_TIES = ("none", "pairs", "all")


def argmax_network(folder: Path, k: int, ties: str, features: int = 1, seed: int = 0) -> Path:
    """A UAI network: class var_0 of ``k`` states and ``features`` ternary children, tied as
    ``ties`` says (``none``: distinct random numbers; ``pairs``: states 2j and 2j+1 share
    their numbers; ``all``: every state has the same)."""
    rng = np.random.default_rng(seed)
    n = features + 1

    def rows(shape: tuple[int, ...]) -> np.ndarray:
        if ties == "none":
            t = rng.random(shape) + 0.1
        elif ties == "pairs":
            t = np.repeat(rng.random((shape[0] // 2, *shape[1:])) + 0.1, 2, axis=0)
        else:
            t = np.ones(shape)
        return t / t.sum(axis=-1, keepdims=True)

    if ties == "none":
        prior = rng.random(k) + 0.1
    elif ties == "pairs":
        prior = np.repeat(rng.random(k // 2) + 0.1, 2)
    else:
        prior = np.ones(k)
    prior = prior / prior.sum()
    lines = ["BAYES", str(n), " ".join([str(k)] + ["3"] * features), str(n), "1 0"]
    lines += [f"2 0 {i}" for i in range(1, n)]
    lines += [str(k), " ".join(map(repr, prior.tolist()))]
    for _ in range(features):
        table = rows((k, 3))
        lines += [str(table.size), " ".join(map(repr, table.reshape(-1).tolist()))]
    path = folder / f"argmax-{ties}-{k}x{features}.uai"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------- planning
def naive_bayes_bif(folder: Path, n: int, card: int = 2, *, hidden: bool = False) -> Path:
    """BIF naive Bayes: class ``c`` (a, b) and ``n`` features of ``card`` states; with
    ``hidden``, a hidden root ``h`` (u, v) is a parent of the class and of every feature
    (so the default order compares the depth-first and the frontier orders)."""
    states = ", ".join(f"v{j}" for j in range(card))
    row = ", ".join([repr(1 / card)] * card)
    lines = ["network nb {}", "variable c { type discrete [ 2 ] { a, b }; }"]
    lines += [f"variable f{i} {{ type discrete [ {card} ] {{ {states} }}; }}" for i in range(n)]
    if hidden:
        lines.append("variable h { type discrete [ 2 ] { u, v }; }")
        lines.append("probability ( h ) { table 0.5, 0.5; }")
        lines.append("probability ( c | h ) { (u) 0.5, 0.5; (v) 0.4, 0.6; }")
        rows = " ".join(f"({x}, {y}) {row};" for x in ("a", "b") for y in ("u", "v"))
        lines += [f"probability ( f{i} | c, h ) {{ {rows} }}" for i in range(n)]
    else:
        lines.append("probability ( c ) { table 0.5, 0.5; }")
        lines += [f"probability ( f{i} | c ) {{ (a) {row}; (b) {row}; }}" for i in range(n)]
    path = folder / f"nb-{n}x{card}{'-hidden' if hidden else ''}.bif"
    path.write_text("\n".join(lines) + "\n")
    return path


THRESHOLD = ["--class", "c", "--positive", "a", "--threshold", "0.5"]
ARGMAX_C = ["--class", "c", "--decision", "argmax"]


# ---------------------------------------------------------------------------- rules
RULE_SPACINGS = (
    ">= x_y",
    "<=_x~y",
    "x_y",
    "x_.._",
    "x.._y_z",
    "== x_and_y",
    "in [_x_y_]",
    "x_..y..._z",
)
"""Conditions with whitespace runs (``_`` spaces, ``~`` tabs) where a backtracking regex
rescans them: all refused (none names a state), in time linear in their length."""


def rules_network(folder: Path, k: int) -> Path:
    """BIF: class ``c`` (a, b), feature ``f`` of ``k`` states ``s0 ..``, feature ``g`` (x, y, z)."""
    names = ", ".join(f"s{j}" for j in range(k))
    f_row = ", ".join([repr(1 / k)] * k)
    text = "\n".join(
        [
            "network r {}",
            "variable c { type discrete [ 2 ] { a, b }; }",
            f"variable f {{ type discrete [ {k} ] {{ {names} }}; }}",
            "variable g { type discrete [ 3 ] { x, y, z }; }",
            "probability ( c ) { table 0.5, 0.5; }",
            f"probability ( f | c ) {{ (a) {f_row}; (b) {f_row}; }}",
            "probability ( g | c ) { (a) 0.2, 0.3, 0.5; (b) 0.5, 0.3, 0.2; }",
        ]
    )
    path = folder / f"rules-net-{k}.bif"
    path.write_text(text + "\n")
    return path


def rules_file(folder: Path, name: str, *conditions: str, feature: str = "g") -> Path:
    """A rules file of one rule per condition, premise ``feature: condition`` (quoted)."""
    rules = []
    for i, condition in enumerate(conditions):
        quoted = condition.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t")
        rules.append(f'  - name: r{i}\n    if: {{{feature}: "{quoted}"}}\n    then: a\n')
    path = folder / f"{name}.yaml"
    path.write_text("rules:\n" + "".join(rules))
    return path


def spaced(pattern: str, n: int) -> str:
    """``pattern`` with each ``_`` a run of ``n`` spaces and each ``~`` of ``n`` tabs."""
    return pattern.replace("_", " " * n).replace("~", "\t" * n)


def many_states_condition(names: int, k: int) -> str:
    """``in [...]`` listing ``names`` state names of a ``k``-state feature (the last ones,
    over and over: a list scan per name costs the most there)."""
    return "in [" + ", ".join(f"s{k - 1 - (j % 8)}" for j in range(names)) + "]"


def verify_args(net: Path, rules: Path, *extra: str) -> list[str]:
    return ["verify-bn", str(net), *THRESHOLD, "--rules", str(rules), *extra]


# ---------------------------------------------------------------------------- models
def onnx_model(folder: Path, kind: str) -> Path:
    """An ONNX model onnxruntime refuses: ``cyclic`` (a graph with a cycle) or
    ``mismatched`` (a matrix product of shapes (n, 4) and (3, 2))."""
    import onnx
    from onnx import helper, numpy_helper

    def vi(name: str, shape: list) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)

    if kind == "cyclic":
        nodes = [
            helper.make_node("Add", ["x", "b"], ["a"]),
            helper.make_node("Relu", ["a"], ["b"]),
        ]
        graph = helper.make_graph(nodes, kind, [vi("x", [None, 4])], [vi("b", [None, 4])])
    else:
        weight = numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
        graph = helper.make_graph(nodes, kind, [vi("x", [None, 4])], [vi("y", [None, 2])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / f"{kind}.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def torch_zip(folder: Path, kind: str, size: int = 8 * MIB) -> Path:
    """A ZIP shaped like a torch file: ``junk`` (members torch cannot read, .pt2),
    ``not-a-zip`` (.pt2), or ``bomb`` (TorchScript-shaped, .pt: members of zeros deflated,
    about ``size`` bytes on disk declaring ~1000 times that)."""
    if kind == "not-a-zip":
        path = folder / "not-a-zip.pt2"
        path.write_bytes(b"PK\x03\x04" + b"\0" * 100)
        return path
    if kind == "junk":
        path = folder / "junk.pt2"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/data.pkl", b"junk")
            archive.writestr("archive/version", b"3")
        return path
    path = folder / f"bomb-{size // MIB}.pt"
    _deflated_zeros_zip(path, "model/data/", BOMB_MEMBER, max(1, size // BOMB_PACKED))
    return path


BOMB_MEMBER = 64 * MIB
"""Zeros in each member of a torch-shaped zip bomb..."""
BOMB_PACKED = 64 * 1024
"""...and about what they deflate to."""


def _deflated_zeros_zip(path: Path, prefix: str, member: int, count: int) -> None:
    """A ZIP of ``count`` members of ``member`` zeros each, deflated once and written
    ``count`` times (zipfile would deflate each one again)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed = packer.compress(b"\0" * member) + packer.flush()
    crc = zlib.crc32(b"\0" * member)
    central = []
    with open(path, "wb") as fh:
        for i in range(count):
            name = f"{prefix}{i}".encode()
            offset = fh.tell()
            fh.write(
                struct.pack(
                    "<IHHHHHIIIHH",
                    0x04034B50,
                    20,
                    0,
                    8,
                    0,
                    0,
                    crc,
                    len(packed),
                    member,
                    len(name),
                    0,
                )
            )
            fh.write(name)
            fh.write(packed)
            central.append(
                struct.pack(
                    "<IHHHHHHIIIHHHHHII",
                    0x02014B50,
                    20,
                    20,
                    0,
                    8,
                    0,
                    0,
                    crc,
                    len(packed),
                    member,
                    len(name),
                    0,
                    0,
                    0,
                    0,
                    0,
                    offset,
                )
                + name
            )
        start = fh.tell()
        directory = b"".join(central)
        fh.write(directory)
        fh.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(directory), start, 0))
