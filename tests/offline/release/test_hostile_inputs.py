"""Hostile and careless inputs to the offline builder (issue 25): one clean line, exit 2.

Every case runs the real command line (``python -m boxwatch ...``) in a child process
under two backstops, RLIMIT_CPU 10 s and RLIMIT_AS 4 GiB. The child imports the CLI and
the builder first, then records its peak resident size (``ru_maxrss``); the test asserts
that the command's own growth stays under 1 GiB, that it exits with the documented code
(2, ``EXIT_USAGE``), that stderr holds exactly one error line (click's ``Usage:`` and
``Try ...`` lines around a usage error are not error lines) and no traceback, and that
the line is free of control characters. Cases per reader: BN files (BIF, .bif.gz,
XMLBIF, Hugin .net), the three YAML files (rules, build config, agent config), the data
sets (IDX, .npz, CSV) and the verbs' arguments; each reader also gets one oversize, one
deep-nesting, one bad-encoding and one control-character case.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from boxwatch.commands.console import EXIT_OK, EXIT_USAGE
from boxwatch.examples import example_path
from boxwatch.offline.progress import LINE as PROGRESS

GIB = 1 << 30
SECRET = "hostile-secret-6f1d2c"

_WRAPPER = """
import atexit, os, resource, runpy, sys
resource.setrlimit(resource.RLIMIT_CPU, (10, 10))
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import importlib
for name in os.environ["HOSTILE_PRELOAD"].split(","):
    importlib.import_module(name)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def _report():
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(os.environ["HOSTILE_RSS_FILE"], "w") as fh:
        fh.write(f"{base} {peak}")
atexit.register(_report)
runpy.run_module("boxwatch", run_name="__main__", alter_sys=True)
"""


# What each verb imports before it reads its inputs: loaded before the RSS baseline.
PRELOAD = {
    "compile-bn": ["boxwatch.cli", "boxwatch.commands.compile_bn"],
    "verify-bn": ["boxwatch.cli", "boxwatch.commands.verify_bn"],
    "build-artifact": [
        "boxwatch.cli",
        "boxwatch.commands.build",
        "boxwatch.offline.release.pipeline",
    ],
    "agent": ["boxwatch.cli", "boxwatch.commands.agent"],
}


@dataclass
class Outcome:
    rc: int
    stdout: str
    stderr: str
    growth_kib: int | None


def run_cli(args: list[str], tmp: Path, env: dict[str, str] | None = None) -> Outcome:
    """``python -m boxwatch ARGS`` under the backstops; its exit code, output and RSS growth."""
    rss_file = tmp / "rss.txt"
    full_env = {
        **os.environ,
        "HOSTILE_RSS_FILE": str(rss_file),
        "HOSTILE_PRELOAD": ",".join(PRELOAD[args[0]]),
        HOSTILE_ENV: SECRET,
    }
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *args],
        capture_output=True,
        env=full_env,
        cwd=tmp,
        timeout=120,
    )
    growth = None
    if rss_file.is_file():
        base, peak = map(int, rss_file.read_text().split())
        growth = peak - base
    return Outcome(
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
        growth,
    )


HOSTILE_ENV = "HOSTILE_TEST_SECRET"


def error_lines(stderr: str) -> list[str]:
    """Lines of stderr that report an error (click's usage boilerplate and the progress
    lines of phases that ran over 2 s excluded)."""
    return [
        line
        for line in stderr.splitlines()
        if line.strip() and not line.startswith(("Usage:", "Try '")) and not PROGRESS.match(line)
    ]


def assert_clean_refusal(out: Outcome, needle: str | None = None) -> str:
    """Exit 2, one error line without control characters or traceback, RSS growth < 1 GiB."""
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.rc == EXIT_USAGE, (out.rc, out.stderr[-2000:])
    lines = error_lines(out.stderr)
    assert len(lines) == 1, out.stderr[-2000:]
    line = lines[0]
    assert line.lower().startswith("error"), line
    assert not any(ord(c) < 32 or ord(c) == 127 for c in line), repr(line)
    assert len(line) <= 2000, len(line)
    assert SECRET not in out.stderr and SECRET not in out.stdout
    assert out.growth_kib is not None, "the child did not report its peak RSS"
    assert out.growth_kib * 1024 < GIB, f"RSS grew by {out.growth_kib / 1024:.0f} MiB"
    if needle is not None:
        assert needle.lower() in line.lower(), line
    return line


# ------------------------------------------------------------------------------ builders
def bif(variables: dict[str, list[str]], cpts: list[str]) -> str:
    """BIF text: ``variables`` name -> states, ``cpts`` literal probability blocks."""
    out = ["network n {}"]
    for v, states in variables.items():
        out.append(f"variable {v} {{ type discrete [ {len(states)} ] {{ {', '.join(states)} }}; }}")
    return "\n".join([*out, *cpts]) + "\n"


def binary_root(v: str) -> str:
    return f"probability ( {v} ) {{ table 0.5, 0.5; }}"


def many_parents(n: int, card: int = 2) -> str:
    """The class ``c`` with ``n`` parents of ``card`` states, one ``default`` line."""
    states = [f"s{i}" for i in range(card)]
    parents = [f"p{i}" for i in range(n)]
    cpts = [f"probability ( c | {', '.join(parents)} ) {{ default 0.5, 0.5; }}"]
    cpts += [
        f"probability ( {p} ) {{ table {', '.join([repr(1 / card)] * card)}; }}" for p in parents
    ]
    return bif({"c": ["a", "b"], **{p: states for p in parents}}, cpts)


def naive_bayes(n: int) -> str:
    feats = [f"f{i}" for i in range(n)]
    cpts = [binary_root("c")]
    cpts += [f"probability ( {f} | c ) {{ (a) 0.3, 0.7; (b) 0.6, 0.4; }}" for f in feats]
    return bif({"c": ["a", "b"], **{f: ["x", "y"] for f in feats}}, cpts)


def sparse(path: Path, size: int = 2 * GIB) -> Path:
    """A sparse file of ``size`` bytes (NULs), cheap on disk."""
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def gz_zeros(members: int, prefix: bytes = b"") -> bytes:
    """A gzip file of ``members`` members of 64 MiB of zeros each (after ``prefix``)."""
    chunk = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    return (gzip.compress(prefix) if prefix else b"") + chunk * members


def gz_stream(head: bytes, body: bytes, repeat: int, tail: bytes) -> bytes:
    """gzip of ``head + body * repeat + tail`` compressed piecewise (no big buffer)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [comp.compress(head)]
    block = body * max(1, (1 << 20) // len(body))
    for _ in range(repeat * len(body) // len(block)):
        parts.append(comp.compress(block))
    parts += [comp.compress(tail), comp.flush()]
    return b"".join(parts)


SIXTEEN = " ".join(f'"s{j}"' for j in range(16))
BN_ARGS = ["--class", "c", "--positive", "a", "--threshold", "0.5"]
CREDIT_ARGS = ["--class", "CreditWorthiness", "--positive", "Positive", "--threshold", "0.5"]

ALIAS_BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"{b}: &{b} [{', '.join(['*' + a] * 9)}]"
        for a, b in zip("abcdefgh", "bcdefghi", strict=True)
    ]
)


def yaml_bomb(key_line: str) -> str:
    """The alias bomb, with ``key_line`` (e.g. a known key) using the last alias."""
    return ALIAS_BOMB + "\n" + key_line + "\n"


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from boxwatch.examples.digits_data import write_datasets

    folder = tmp_path_factory.mktemp("digits")
    write_datasets(folder)
    return folder


def model_config(data_dir: Path, tmp: Path, change: Callable[[dict], None] | None = None) -> str:
    """A model-only build config over the digits example, edited by ``change``."""
    raw = {
        "version": 1,
        "model": {
            "path": str(example_path("digits", "model.onnx")),
            "input_name": "input",
            "preprocessing": {"shape": [64], "dtype": "float32", "scale": 0.0625},
        },
        "classes": [str(i) for i in range(8)],
        "layers": ["/act1/Relu_output_0"],
        "data": {
            "train": {"path": str(data_dir / "train.npz")},
            "validation": {"path": str(data_dir / "validation.npz")},
        },
    }
    if change is not None:
        change(raw)
    path = tmp / "build.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def bn_config(tmp: Path) -> str:
    """A BN-only build config over the credit example."""
    raw = {
        "version": 1,
        "bn": {
            "file": str(example_path("credit", "credit.net")),
            "class": "CreditWorthiness",
            "positive": "Positive",
            "threshold": 0.5,
        },
    }
    path = tmp / "bn-build.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def train(tmp: Path, x: np.ndarray, y: np.ndarray | None = None, name: str = "t.npz") -> str:
    path = tmp / name
    if y is None:
        np.savez(path, x=x)
    else:
        np.savez(path, x=x, y=y)
    return str(path)


def npz_claiming(shape: tuple[int, ...], dtype: str = "<f8") -> bytes:
    """A tiny .npz whose x.npy header claims ``shape`` but holds no data."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("x.npy", head.getvalue())
        zf.writestr("y.npy", b"")
    return buf.getvalue()


def idx_header(dtype_code: int, dims: tuple[int, ...]) -> bytes:
    import struct

    return bytes([0, 0, dtype_code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)


# ------------------------------------------------------------------------------ cases
# Each case: (id, build(tmp, data_dir) -> (args, env or None), needle or None, slow).
Case = tuple[str, Callable[[Path, Path], tuple[list[str], dict | None]], str | None, bool]


def _write(tmp: Path, name: str, content: str | bytes) -> str:
    path = tmp / name
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return str(path)


def _bn(name: str, content: str | bytes, *extra: str) -> Callable:
    return lambda tmp, _d: (["compile-bn", _write(tmp, name, content), *BN_ARGS, *extra], None)


def _bif_gz_bomb(tmp: Path, _d: Path):
    head = b"network n {}\nvariable c { type discrete [2] {a, b}; }\nprobability (c) { table "
    data = gz_stream(head, b"0.5,", 50 << 20, b"0.5; }\n")
    return ["compile-bn", _write(tmp, "bomb.bif.gz", data), *BN_ARGS], None


BN_CASES: list[Case] = [
    ("bif-gz-bomb", _bif_gz_bomb, "decompress", False),
    ("bif-26-parents", _bn("p26.bif", many_parents(26), "--max-memory", "512M"), "memory", False),
    ("bif-29-parents", _bn("p29.bif", many_parents(29)), "memory", False),
    (
        "xmlbif-billion-laughs",
        _bn(
            "lol.xml",
            '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n<!ENTITY lol0 "lol">\n'
            + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">\n' for i in range(1, 10))
            + ']>\n<BIF VERSION="0.3"><NETWORK><NAME>&lol9;</NAME></NETWORK></BIF>\n',
        ),
        "DTD",
        False,
    ),
    (
        "bif-unterminated-comment",
        _bn("comment.bif", "network n {}\n" + "/* " * 40_000),
        "comment",
        False,
    ),
    ("naive-bayes-400", _bn("nb400.bif", naive_bayes(400)), None, False),
    ("naive-bayes-800", _bn("nb800.bif", naive_bayes(800)), None, False),
    ("bif-65-parent-axes", _bn("p65.bif", many_parents(65, card=1)), "parents", False),
    (
        "net-prod-wraps",
        _bn(
            "wrap.net",
            'net {}\nnode c { states = ("a" "b"); }\n'
            + "".join(f"node p{i} {{ states = ({SIXTEEN}); }}\n" for i in range(16))
            + f"potential (c | {' '.join(f'p{i}' for i in range(16))}) {{ data = (); }}\n"
            + "".join(
                f"potential (p{i}) {{ data = ({' '.join(['0.0625'] * 16)}); }}\n" for i in range(16)
            ),
        ),
        "memory",
        False,
    ),
    (
        "bif-duplicate-parent",
        _bn(
            "dup.bif",
            bif(
                {"c": ["a", "b"], "p": ["x", "y"]},
                ["probability ( c | p, p ) { default 0.5, 0.5; }", binary_root("p")],
            ),
        ),
        "twice",
        False,
    ),
    (
        "bif-class-only",
        _bn("alone.bif", bif({"c": ["a", "b"]}, [binary_root("c")])),
        "feature",
        False,
    ),
    # per reader: oversize, deep nesting, bad encoding, control characters
    (
        "bif-oversize",
        lambda t, _d: (["compile-bn", str(sparse(t / "big.bif")), *BN_ARGS], None),
        "bytes",
        False,
    ),
    (
        "xmlbif-oversize",
        lambda t, _d: (["compile-bn", str(sparse(t / "big.xml")), *BN_ARGS], None),
        "bytes",
        False,
    ),
    (
        "net-oversize",
        lambda t, _d: (["compile-bn", str(sparse(t / "big.net")), *BN_ARGS], None),
        "bytes",
        False,
    ),
    ("bif-deep-nesting", _bn("deep.bif", "network n " + "{" * 200_000), None, False),
    (
        "xmlbif-deep-nesting",
        _bn("deep.xml", "<BIF><NETWORK>" + "<X>" * 100_000 + "</X>" * 100_000 + "</NETWORK></BIF>"),
        None,
        False,
    ),
    (
        "net-deep-nesting",
        _bn(
            "deep.net",
            "net {}\npotential (c) { data = " + "(" * 100_000 + "0.5 0.5" + ")" * 100_000 + "; }\n",
        ),
        None,
        False,
    ),
    (
        "bif-bad-encoding",
        _bn("u16.bif", bif({"c": ["a", "b"]}, [binary_root("c")]).encode("utf-16")),
        None,
        False,
    ),
    (
        "xmlbif-bad-encoding",
        _bn("bad.xml", b'<?xml version="1.0"?><BIF>\xff\xfe\x00</BIF>'),
        None,
        False,
    ),
    (
        "net-bad-encoding",
        _bn("u16.net", 'net {}\nnode c { states = ("a" "b"); }\n'.encode("utf-16")),
        None,
        False,
    ),
    (
        "bif-control-chars",
        _bn("evil\n\x1b[31m.bif", "network n {}\nvariable\x1b[2J x\x07 {"),
        None,
        False,
    ),
    ("xmlbif-control-chars", _bn("evil\n\x1b[31m.xml", "<BIF>\x1b</BIF>"), None, False),
    (
        "net-control-chars",
        _bn("evil\r\x1b[31m.net", 'net {}\nnode \x1b[2Jc { states = ("a"); }\n'),
        None,
        False,
    ),
    # item 6: arguments and state counts
    (
        "bif-superscript-count",
        _bn("sup.bif", "network n {}\nvariable c { type discrete [ \u00b2 ] { a, b }; }\n"),
        "states",
        False,
    ),
    (
        "max-memory-huge",
        lambda t, _d: (
            [
                "compile-bn",
                str(example_path("credit", "credit.net")),
                *CREDIT_ARGS,
                "--max-memory",
                "99999999999999999999T",
            ],
            None,
        ),
        "max-memory",
        False,
    ),
    (
        "max-seconds-nan",
        lambda t, _d: (
            [
                "compile-bn",
                str(example_path("credit", "credit.net")),
                *CREDIT_ARGS,
                "--max-seconds",
                "nan",
            ],
            None,
        ),
        "max-seconds",
        False,
    ),
    (
        "verify-bn-cpt-too-big",
        lambda t, _d: (
            [
                "verify-bn",
                _write(t, "p29.bif", many_parents(29)),
                *BN_ARGS,
                "--rules",
                _write(t, "r.yaml", "rules: []\n"),
            ],
            None,
        ),
        "memory",
        False,
    ),
]


def _rules(content: str | bytes, name: str = "rules.yaml") -> Callable:
    return lambda tmp, _d: (
        [
            "verify-bn",
            str(example_path("credit", "credit.net")),
            *CREDIT_ARGS,
            "--rules",
            _write(tmp, name, content),
        ],
        None,
    )


def _rules_path(path: str) -> Callable:
    return lambda tmp, _d: (
        ["verify-bn", str(example_path("credit", "credit.net")), *CREDIT_ARGS, "--rules", path],
        None,
    )


def _config(content: str | bytes, name: str = "build.yaml") -> Callable:
    return lambda tmp, _d: (["build-artifact", _write(tmp, name, content), "--dry-run"], None)


def _agent(content: str | bytes, name: str = "agent.yaml") -> Callable:
    return lambda tmp, _d: (["agent", "-c", _write(tmp, name, content)], None)


DEEP = "x: " + "[" * 5000 + "]" * 5000 + "\n"
BIG_INT = "1" * 5000

YAML_CASES: list[Case] = [
    ("rules-alias-bomb", _rules(yaml_bomb("rules: *i")), "alias", False),
    ("config-alias-bomb", _config(yaml_bomb("version: 1\nmetadata: {name: *i}")), "alias", False),
    ("agent-alias-bomb", _agent(yaml_bomb("kafka: {bootstrap_servers: *i}")), "alias", False),
    ("rules-deep", _rules(DEEP), "deep", False),
    ("config-deep", _config(DEEP), "deep", False),
    ("agent-deep", _agent(DEEP), "deep", False),
    ("rules-big-int", _rules(f"rules: [{BIG_INT}]\n"), "digits", False),
    ("config-big-int", _config(f"version: {BIG_INT}\n"), "digits", False),
    ("agent-big-int", _agent(f"kafka: {{partitions: {BIG_INT}}}\n"), "digits", False),
    ("rules-inf", _rules("rules: [.inf]\n"), "finite", False),
    (
        "config-inf",
        _config("version: 1\nbn: {file: x.bif, class: c, positive: a, threshold: .inf}\n"),
        "finite",
        False,
    ),
    ("agent-inf", _agent("kafka: {partitions: .inf}\n"), "finite", False),
    ("rules-dev-zero", _rules_path("/dev/zero"), "regular file", False),
    (
        "config-dev-zero",
        lambda t, _d: (["build-artifact", "/dev/zero", "--dry-run"], None),
        "regular file",
        False,
    ),
    ("agent-dev-zero", lambda t, _d: (["agent", "-c", "/dev/zero"], None), "regular file", False),
    (
        "key-dev-zero",
        lambda t, _d: (
            ["build-artifact", bn_config(t), "--key", "/dev/zero", "--out", str(t / "x.bwa")],
            None,
        ),
        "regular file",
        True,
    ),
    (
        "rules-oversize",
        lambda t, _d: _rules_path(str(sparse(t / "big.yaml")))(t, _d),
        "bytes",
        False,
    ),
    (
        "config-oversize",
        lambda t, _d: (["build-artifact", str(sparse(t / "big.yaml")), "--dry-run"], None),
        "bytes",
        False,
    ),
    (
        "agent-oversize",
        lambda t, _d: (["agent", "-c", str(sparse(t / "big.yaml"))], None),
        "bytes",
        False,
    ),
    ("rules-bad-encoding", _rules(b"rules: [\xff\xfe]\n"), "UTF-8", False),
    ("config-bad-encoding", _config(b"version: \xff\xfe\n"), "UTF-8", False),
    ("agent-bad-encoding", _agent(b"artifact: \xff\xfe\n"), "UTF-8", False),
    ("rules-control-chars", _rules("rules: [x]\n", "evil\n\x1b[31m.yaml"), None, False),
    (
        "config-control-chars",
        _config("version: 1\n\x1b[2J: 1\n", "evil\n\x1b[31m.yaml"),
        None,
        False,
    ),
    (
        "agent-control-chars",
        _agent("artifact: a\n\x1b[2J: 1\n", "evil\n\x1b[31m.yaml"),
        None,
        False,
    ),
    (
        "agent-metrics-superscript",
        _agent("artifact: a.bwa\npublic_keys: [k.pub]\nmetrics: {address: '127.0.0.1:\u00b2'}\n"),
        "metrics.address",
        False,
    ),
]


def _data(change: Callable[[Path, dict], None]) -> Callable:
    def build(tmp: Path, data_dir: Path):
        return [
            "build-artifact",
            model_config(data_dir, tmp, lambda raw: change(tmp, raw)),
            "--dry-run",
        ], None

    return build


def _train_file(name: str, content: bytes, fmt: str | None = None, **extra) -> Callable:
    def change(tmp: Path, raw: dict) -> None:
        spec = {"path": _write(tmp, name, content), **extra}
        if fmt:
            spec["format"] = fmt
        raw["data"]["train"] = spec

    return _data(change)


def _digits(data_dir: Path, name: str = "train") -> tuple[np.ndarray, np.ndarray]:
    with np.load(data_dir / f"{name}.npz") as npz:
        return npz["x"], npz["y"]


def _edit_train(edit: Callable[[np.ndarray, np.ndarray], tuple], name: str = "train") -> Callable:
    def build(tmp: Path, data_dir: Path):
        x, y = edit(*_digits(data_dir, name))
        path = train(tmp, x, y)

        def change(raw: dict) -> None:
            raw["data"][name] = {"path": path}

        return ["build-artifact", model_config(data_dir, tmp, change), "--dry-run"], None

    return build


def _nan_first(x, y):
    x = x.astype(np.float32).copy()
    x[3, 5] = np.nan
    return x, y


def _inf_first(x, y):
    x = x.astype(np.float32).copy()
    x[0, 0] = np.inf
    return x, y


def _model_change(change: Callable[[dict], None]) -> Callable:
    return lambda tmp, data_dir: (
        ["build-artifact", model_config(data_dir, tmp, change), "--dry-run"],
        None,
    )


DATA_CASES: list[Case] = [
    (
        "idx-gz-bad-magic",
        _train_file("imgs-ubyte.gz", gz_zeros(64), "idx", labels="l"),
        "magic",
        True,
    ),
    (
        "idx-gz-header-huge",
        _train_file(
            "imgs2-ubyte.gz", gz_zeros(64, idx_header(0x08, (100_000, 100_000))), "idx", labels="l"
        ),
        "bytes",
        True,
    ),
    ("npz-header-huge", _train_file("huge.npz", npz_claiming((100_000, 100_000))), "bytes", True),
    ("csv-gz-not-gzip", _train_file("plain.csv.gz", b"a,label\n1,0\n"), "gzip", True),
    (
        "csv-long-field",
        _train_file("long.csv", b"a,label\n" + b"1" * 200_000 + b",0\n"),
        "field",
        True,
    ),
    (
        "npz-complex",
        lambda t, d: _edit_train(lambda x, y: (x.astype(np.complex64), y))(t, d),
        "complex",
        True,
    ),
    (
        "data-dev-zero",
        _data(lambda t, raw: raw["data"].update(train={"path": "/dev/zero", "format": "csv"})),
        None,
        True,
    ),
    (
        "csv-proc-environ",
        _data(
            lambda t, raw: raw["data"].update(train={"path": "/proc/self/environ", "format": "csv"})
        ),
        None,
        True,
    ),
    (
        "csv-first-line-leak",
        _train_file("secret.csv", f"{SECRET},x\n1,2\n".encode(), "csv"),
        None,
        True,
    ),
    ("train-missing-class", _edit_train(lambda x, y: (x[y != 7], y[y != 7])), "class", True),
    ("train-nan", _edit_train(_nan_first), "finite", True),
    ("validation-inf", _edit_train(_inf_first, "validation"), "finite", True),
    (
        "preprocessing-wrong-rank",
        _model_change(lambda raw: raw["model"]["preprocessing"].update(shape=[8, 8])),
        "shape",
        True,
    ),
    (
        "input-name-unknown",
        _model_change(lambda raw: raw["model"].update(input_name="no_such_input")),
        "input_name",
        True,
    ),
    # per reader: oversize, deep nesting, bad encoding, control characters
    (
        "csv-oversize",
        _data(
            lambda t, raw: raw["data"].update(
                train={"path": str(sparse(t / "big.csv")), "format": "csv"}
            )
        ),
        "bytes",
        True,
    ),
    (
        "idx-deep-nesting",
        _train_file("deep-ubyte", idx_header(0x08, (1,) * 100) + b"\0", "idx", labels="l"),
        "dimensions",
        True,
    ),
    ("npz-deep-nesting", _train_file("deep.npz", npz_claiming((1,) * 100)), "dimensions", True),
    (
        "csv-bad-encoding",
        _train_file("u16.csv", "a,label\n1,0\n".encode("utf-16"), "csv"),
        None,
        True,
    ),
    (
        "csv-control-chars",
        _train_file("evil\n\x1b[31m.csv", b"a\x1b[2J,b\n1,0\n", "csv"),
        None,
        True,
    ),
]

ALL_CASES = BN_CASES + YAML_CASES + DATA_CASES


@pytest.fixture(scope="module")
def started(request, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """The selected cases' children, started a few at a time as soon as the module begins.

    A child spends most of its time importing; running them concurrently keeps the suite
    short. Each child keeps its own backstops and its own peak-RSS measurement.
    """
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if item.module is request.module
        and hasattr(item, "callspec")
        and "case" in item.callspec.params
    ]
    data_dir = (
        request.getfixturevalue("data_dir") if any(c in DATA_CASES for c in selected) else None
    )
    workers = min(4, max(2, os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures: dict[str, Future] = {}
        for name, build, _needle, _slow in selected:
            tmp = tmp_path_factory.mktemp(name)
            args, env = build(tmp, data_dir or tmp)
            futures[name] = pool.submit(run_cli, args, tmp, env)
        yield futures
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c[0], marks=[pytest.mark.slow] if c[3] else []) for c in ALL_CASES],
)
def test_hostile_input_is_refused_in_one_line(case: Case, started: dict[str, Future]) -> None:
    assert_clean_refusal(started[case[0]].result(), case[2])


def test_valid_xmlbif_with_one_number_per_line_parses(tmp_path: Path) -> None:
    """A valid 4 MB XMLBIF (one number per line) compiles within the CPU backstop."""
    parents = [f"p{i}" for i in range(19)]
    var = "".join(
        f"<VARIABLE TYPE='nature'><NAME>{v}</NAME><OUTCOME>x</OUTCOME><OUTCOME>y</OUTCOME>"
        "</VARIABLE>\n"
        for v in ["c", *parents]
    )
    defs = "".join(
        f"<DEFINITION><FOR>{p}</FOR><TABLE>0.5 0.5</TABLE></DEFINITION>\n" for p in parents
    )
    given = "".join(f"<GIVEN>{p}</GIVEN>" for p in parents)
    table = "\n".join(["0.25", "0.75"] * (1 << 19))
    text = (
        f"<BIF VERSION='0.3'><NETWORK><NAME>n</NAME>\n{var}{defs}"
        f"<DEFINITION><FOR>c</FOR>{given}<TABLE>\n{table}\n</TABLE></DEFINITION>\n"
        "</NETWORK></BIF>\n"
    )
    path = tmp_path / "lines.xml"
    path.write_text(text)
    assert path.stat().st_size > 3_500_000
    out = run_cli(
        ["compile-bn", str(path), "--class", "c", "--positive", "x", "--threshold", "0.5"],
        tmp_path,
    )
    assert out.rc == EXIT_OK, out.stderr[-2000:]
    assert out.growth_kib is not None and out.growth_kib * 1024 < GIB


def test_one_yaml_dialect_for_all_three_files(tmp_path: Path) -> None:
    """yes/no/on/off stay strings in the build config (as in rules.yaml and the agent's)."""
    from boxwatch.agent.inputs import load_yaml
    from boxwatch.offline.release.config import load_config

    text = "version: 1\nbn: {file: x.net, class: Approved, positive: yes, threshold: 0.5}\n"
    path = tmp_path / "build.yaml"
    path.write_text(text)
    assert load_config(path).raw["bn"]["positive"] == "yes"
    doc = load_yaml("a: [yes, no, on, off, true, false, 2001-01-01, 0o17, 1_000]\n", where="t")
    assert doc == {"a": ["yes", "no", "on", "off", True, False, "2001-01-01", 15, "1_000"]}


def test_unicode_digits_are_not_a_schema_version() -> None:
    """``'²'.isdigit()`` is true but ``int('²')`` fails: the artifact reader says no cleanly."""
    from boxwatch.agent.artifact import SCHEMA, _check_manifest
    from boxwatch.agent.errors import ArtifactError

    with pytest.raises(ArtifactError, match="not supported"):
        _check_manifest({"schema": SCHEMA, "schema_version": "\u00b2.0"}, "x.bwa")
