"""Reading networks: BIF, .bif.gz, Hugin .net, XMLBIF, UAI and pgmpy models; errors name lines;
the table of formats drives the choice by suffix, its errors and the help texts."""

from __future__ import annotations

import gzip
import json
import warnings
from decimal import Decimal

import numpy as np
import pytest
from bn_synthetic import random_dag
from click.testing import CliRunner
from deadlines import Countdown
from locations import ROOT, SHARED_BN

from boxwatch.agent.errors import ConfigError
from boxwatch.cli import cli
from boxwatch.offline.bn.formats import (
    FORMATS,
    format_of,
    formats_text,
    from_pgmpy,
    load_network,
    parse_bif,
    parse_net,
    parse_uai,
    parse_xmlbif,
    read_uai,
    write_bif,
    write_network,
)
from boxwatch.offline.bn.formats import uai as uai_format
from boxwatch.offline.bn.formats.writing import cpt_texts
from boxwatch.offline.bn.limits import CompileTimeError
from boxwatch.offline.bn.network import Network

SHARED = SHARED_BN

BIF = """\
// a comment
network test { property author = me; }
variable A { type discrete [ 2 ] { yes, no }; property position = (1, 2); }
variable B { type discrete [ 3 ] { <7.5, >=7.5, "odd name" }; }
variable C { type discrete [ 2 ] { t, f }; }
/* block
   comment */
probability ( A ) { table 0.3, 0.7; }
probability ( B | A ) {
  (yes) 0.1, 0.2, 0.7;
  (no) 0.5, 0.25, 0.25;
}
probability ( C | A, B ) {
  default 0.5, 0.5;
  (yes, <7.5) 0.9, 0.1;
  (no, "odd name") 0.2, 0.8;
}
"""

NET = """\
% Hugin comment
net { node_size = (80 40); }
node A { label = "A"; position = (10 20); states = ("yes" "no"); }
discrete node B { states = ("x" "y" "z"); }
potential ( A ) { data = ( 0.3 0.7 ); }
potential ( B | A ) { data = ((0.1 0.2 0.7) (0.5 0.25 0.25)); }
"""


def assert_same(a: Network, b: Network) -> None:
    assert set(a.variables) == set(b.variables)
    for v in a.variables:
        assert a.states[v] == b.states[v], v
        assert a.parents[v] == b.parents[v], v
        np.testing.assert_allclose(a.cpts[v], b.cpts[v], err_msg=v)


def test_bif_syntax_variants():
    net = parse_bif(BIF)
    assert net.name == "test"
    assert net.states["B"] == ("<7.5", ">=7.5", "odd name")
    assert net.parents["C"] == ("A", "B")
    np.testing.assert_allclose(net.cpts["B"], [[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    assert net.cpts["C"][0, 0].tolist() == [0.9, 0.1]
    assert net.cpts["C"][1, 2].tolist() == [0.2, 0.8]
    assert net.cpts["C"][0, 1].tolist() == [0.5, 0.5]
    assert net.leaves() == ("C",)


def test_bif_table_for_a_conditional_lists_the_child_slowest():
    text = BIF.replace(
        "(yes) 0.1, 0.2, 0.7;\n  (no) 0.5, 0.25, 0.25;", "table 0.1, 0.5, 0.2, 0.25, 0.7, 0.25;"
    )
    np.testing.assert_allclose(parse_bif(text).cpts["B"], parse_bif(BIF).cpts["B"])


def test_bif_reads_pgmpy_writer_output():
    from pgmpy.readwrite import BIFWriter

    net = random_dag(6, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = str(BIFWriter(net.to_pgmpy()))
    assert_same(parse_bif(text), net)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("(yes) 0.1, 0.2, 0.7;", "(yes) 0.1, 0.2;", r":10: 'B' entry has 2 values, expected 3"),
        ("(yes) 0.1, 0.2, 0.7;", "(maybe) 0.1, 0.2, 0.7;", r":10: 'maybe' is not a state of 'A'"),
        ("probability ( B | A )", "probability ( B | Z )", r":9: 'B' has undeclared parent"),
        ("(no) 0.5, 0.25, 0.25;", "", r":9: probability of 'B' has no entry for parents \(no\)"),
        ("0.5, 0.25, 0.25", "0.5, 0.25, x", r":11: expected a number, found 'x'"),
        ("[ 3 ]", "[ 4 ]", r":4: variable 'B' declares \[4\] states but lists 3"),
        ("table 0.3, 0.7;", "table 0.3, 0.6;", r":3: probabilities of 'A' sum to 0.9"),
        ("probability ( A ) { table 0.3, 0.7; }", "", r":3: variable 'A' has no probability"),
        ("variable C", "varible C", r":5: expected 'network', 'variable' or 'probability'"),
        (
            "probability ( A ) { table 0.3, 0.7; }",
            "probability ( A | C ) { table 0.3, 0.3, 0.7, 0.7; }",
            "cycle",
        ),
    ],
)
def test_bif_errors_name_file_line_and_problem(old, new, message):
    assert old in BIF
    with pytest.raises(ConfigError, match="net.bif" + ".*" + message):
        parse_bif(BIF.replace(old, new, 1), where="net.bif")


def test_bif_truncated_file():
    with pytest.raises(ConfigError, match=r"x.bif:\d+: unexpected end of file"):
        parse_bif(BIF[:-30], where="x.bif")


def test_hugin_net_matches_pgmpy(tmp_path):
    from pgmpy.readwrite import NETReader

    path = tmp_path / "small.net"
    path.write_text(NET)
    ours = load_network(path)
    assert ours.states["A"] == ("yes", "no")
    np.testing.assert_allclose(ours.cpts["B"], [[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(ours, from_pgmpy(NETReader(str(path)).get_model()))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("(0.5 0.25 0.25)", "(0.5 0.25)", r":6: data for 'B' has 5 numbers, expected 6"),
        ("discrete node B", "continuous node B", r":4: continuous nodes are not supported"),
        ('states = ("x" "y" "z");', 'label = "B";', r":4: node 'B' has no 'states"),
        ("( 0.3 0.7 )", "( 0.3 0.7 ", r":5: expected a number, found ';'"),
    ],
)
def test_hugin_errors_name_file_line_and_problem(old, new, message):
    assert old in NET
    with pytest.raises(ConfigError, match="n.net" + ".*" + message):
        parse_net(NET.replace(old, new, 1), where="n.net")


def test_xmlbif_round_trip_through_pgmpy_writer(tmp_path):
    from pgmpy.readwrite import XMLBIFWriter

    net = random_dag(7, seed=3)
    path = tmp_path / "net.xml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        XMLBIFWriter(net.to_pgmpy()).write(str(path))
    assert_same(load_network(path), net)
    broken = tmp_path / "broken.xml"
    broken.write_text(path.read_text().replace("</VARIABLE>", "</VARIABLES>", 1))
    with pytest.raises(ConfigError, match=r"broken.xml:\d+: XML error"):
        load_network(broken)


def test_gzip_and_path_errors(tmp_path):
    gz = tmp_path / "net.bif.gz"
    gz.write_bytes(gzip.compress(BIF.encode()))
    assert_same(load_network(gz), parse_bif(BIF))
    bad = tmp_path / "bad.bif.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match="bad.bif.gz: not a valid gzip"):
        load_network(bad)
    with pytest.raises(ConfigError, match="no such file"):
        load_network(tmp_path / "missing.bif")
    other = tmp_path / "net.csv"
    other.write_text("a,b")
    with pytest.raises(ConfigError, match="unknown network format"):
        load_network(other)
    with pytest.raises(ConfigError, match="expected a path or a pgmpy"):
        load_network(42)


@pytest.mark.parametrize("seed", range(5))
def test_write_bif_round_trips_exactly(seed):
    net = random_dag(8, seed=seed)
    back = parse_bif(write_bif(net))
    for v in net.variables:
        assert back.parents[v] == net.parents[v] and back.states[v] == net.states[v]
        assert np.array_equal(back.cpts[v], net.cpts[v])
    with pytest.raises(ConfigError, match="names that BIF cannot hold"):
        write_bif(
            Network("n", ("a,b",), {"a,b": ("x", "y")}, {"a,b": ()}, {"a,b": np.array([0.5, 0.5])})
        )


@pytest.mark.parametrize("suffix", [".bif", ".net", ".xml", ".uai", ".bif.gz", ".net.gz"])
def test_every_format_writes_what_it_reads_back_exactly(tmp_path, suffix):
    """A written network reads back with every number as written (the file's decimals, not
    the floats' round trip), so both define the same exact classifier."""
    net = renamed(random_dag(7, seed=4))
    first = tmp_path / f"a{suffix}"
    write_network(net, first)
    read = load_network(first)
    # numbers with more digits than a float keeps, as a file may write them
    texts = {u: cpt_texts(read, u).copy() for u in read.variables}
    v = read.variables[0]
    tiny = Decimal("0." + "1" * 21)
    row = [str(tiny)] * (read.card(v) - 1) + [str(1 - (read.card(v) - 1) * tiny)]
    texts[v][(0,) * (texts[v].ndim - 1)] = row
    cpts = {u: texts[u].astype(np.float64) for u in read.variables}
    exact = Network(read.name, read.variables, read.states, read.parents, cpts, texts=texts)
    second = tmp_path / f"b{suffix}"
    write_network(exact, second)
    back = load_network(second)
    for u in net.variables:
        assert back.parents[u] == net.parents[u] and back.states[u] == net.states[u]
        if suffix == ".uai":  # the UAI reader keeps floats, not the file's decimals
            assert np.array_equal(back.cpts[u], exact.cpts[u]), u
        else:
            assert np.array_equal(back.exact_cpt(u), exact.exact_cpt(u)), u
    if suffix.endswith(".gz"):
        assert gzip.decompress(second.read_bytes())


def test_writers_refuse_names_their_format_cannot_hold(tmp_path):
    net = Network("n", ("a b",), {"a b": ("x", "y")}, {"a b": ()}, {"a b": np.array([0.5, 0.5])})
    with pytest.raises(ConfigError, match="names that Hugin cannot hold"):
        write_network(net, tmp_path / "n.net")
    with pytest.raises(ConfigError, match="names that UAI cannot hold"):
        write_network(net, tmp_path / "n.uai")
    with pytest.raises(ConfigError, match="unknown network format"):
        write_network(net, tmp_path / "n.txt")
    write_network(net, tmp_path / "n.xml")  # XML escapes any name
    assert load_network(tmp_path / "n.xml").variables == ("a b",)


def test_pgmpy_round_trip():
    net = random_dag(9, seed=11)
    assert_same(from_pgmpy(net.to_pgmpy()), net)
    assert_same(load_network(net.to_pgmpy()), net)


@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data/bn (absent in a plain clone)")
@pytest.mark.parametrize("name", ["child", "alarm", "credit"])
def test_shared_networks_parse_like_pgmpy(name):
    from pgmpy.readwrite import BIFReader, NETReader

    path = SHARED / (f"{name}.net" if name == "credit" else f"{name}.bif.gz")
    ours = load_network(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "credit":
            model = NETReader(str(path)).get_model()
        else:
            model = BIFReader(string=gzip.decompress(path.read_bytes()).decode()).get_model()
    assert_same(ours, from_pgmpy(model))


# ---------------------------------------------------------------------------- UAI
def uai_text(net: Network) -> str:
    """UAI text of a network whose variables are ``var_<i>`` with states ``"0"``, ``"1"``..."""
    index = {v: i for i, v in enumerate(net.variables)}
    lines = ["BAYES", str(len(net.variables))]
    lines.append(" ".join(str(net.card(v)) for v in net.variables))
    lines.append(str(len(net.variables)))
    for v in net.variables:
        scope = [*net.parents[v], v]
        lines.append(" ".join(str(x) for x in [len(scope), *(index[u] for u in scope)]))
    lines.append("")
    for v in net.variables:
        table = net.cpts[v]
        lines.append(str(table.size))
        for row in table.reshape(-1, table.shape[-1]):
            lines.append(" " + " ".join(repr(float(x)) for x in row))
        lines.append("")
    return "\n".join(lines)


def renamed(net: Network) -> Network:
    """``net`` with variables ``var_<i>`` and states ``"0"``, ``"1"``... (UAI's names)."""
    name = {v: f"var_{i}" for i, v in enumerate(net.variables)}
    return Network(
        net.name,
        tuple(name[v] for v in net.variables),
        {name[v]: tuple(str(j) for j in range(net.card(v))) for v in net.variables},
        {name[v]: tuple(name[p] for p in net.parents[v]) for v in net.variables},
        {name[v]: net.cpts[v] for v in net.variables},
    )


UAI = """\
BAYES
3
2 3 2
3
1 0
2 0 1
3 0 1 2

2
 0.3 0.7
6
 0.1 0.2 0.7
 0.5 0.25 0.25
12
 0.9 0.1  0.5 0.5  0.5 0.5
 0.5 0.5  0.5 0.5  0.2 0.8
"""


@pytest.mark.parametrize("seed", range(4))
def test_uai_reads_the_same_network_as_bif(tmp_path, seed):
    net = renamed(random_dag(9, seed=seed))
    plain = tmp_path / "net.uai"
    plain.write_text(uai_text(net))
    packed = tmp_path / "net.uai.gz"
    packed.write_bytes(gzip.compress(uai_text(net).encode()))
    bif = parse_bif(write_bif(net))
    for path in (plain, packed):
        ours = load_network(path)
        assert ours.variables == net.variables
        assert_same(ours, bif)
        for v in net.variables:
            assert np.array_equal(ours.cpts[v], bif.cpts[v])


def test_uai_layout_parents_then_child_fastest():
    net = parse_uai(UAI)
    assert net.variables == ("var_0", "var_1", "var_2")
    assert net.states["var_1"] == ("0", "1", "2")
    assert net.parents["var_2"] == ("var_0", "var_1")
    assert net.cpts["var_1"][1].tolist() == [0.5, 0.25, 0.25]
    assert net.cpts["var_2"][1, 2].tolist() == [0.2, 0.8]
    assert net.cpts["var_2"][0, 0].tolist() == [0.9, 0.1]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("BAYES", "MARKOV", r":1: expected 'BAYES'"),
        ("2 3 2", "2 x 2", r":3: expected the number of states of variable 1"),
        ("3\n1 0", "2\n1 0", r":4: 2 functions for 3 variables"),
        ("2 0 1\n", "2 0 0\n", r":6: function 1 names a variable twice"),
        ("2 0 1\n", "2 1 0\n", r":6: functions 0 and 1 are both CPTs of var_0"),
        ("3 0 1 2", "3 0 1 9", r":7: expected a variable index"),
        ("6\n 0.1", "5\n 0.1", r":11: table of function 1 \(var_1\) declares 5 entries"),
        ("0.25 0.25\n12", "0.25 0.35\n12", r":11: probabilities of 'var_1' sum to 1\.1, not 1"),
        ("0.5 0.25", "0.5 zz", r":13: table of function 1 \(var_1\): 'zz' is not a number"),
        (" 0.3 0.7", " 0.3 -0.7", r":9: probabilities of 'var_0' must be finite and >= 0"),
        ("0.2 0.8\n", "0.2 0.8 1\n", r":16: unexpected '1' after the last table"),
        (
            "0.2 0.8\n",
            "0.2\n",
            r":14: table of function 2 \(var_2\) has 11 of its 12 entries before the end",
        ),
        ("2\n 0.3", "99999999999999999999\n 0.3", r":9: expected the number of entries"),
    ],
)
def test_uai_errors_name_file_line_and_problem(old, new, message):
    assert old in UAI
    with pytest.raises(ConfigError, match=r"<uai>" + message):
        parse_uai(UAI.replace(old, new, 1))


def test_uai_cycle_empty_and_bounded_reading(tmp_path):
    cyclic = UAI.replace("1 0\n2 0 1", "2 1 0\n2 0 1", 1).replace(
        "2\n 0.3 0.7", "6\n 0.3 0.7 0.3 0.7 0.3 0.7"
    )
    with pytest.raises(ConfigError, match="cycle"):
        parse_uai(cyclic)
    with pytest.raises(ConfigError, match="empty file"):
        parse_uai("")
    bomb = tmp_path / "bomb.uai.gz"
    bomb.write_bytes(gzip.compress(UAI.encode() + b" " * 5000))
    with pytest.raises(ConfigError, match=r"bomb.uai.gz: more than 4,096 bytes"):
        read_uai(bomb, max_bytes=4096)
    bad = tmp_path / "bad.uai.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(ConfigError, match="bad.uai.gz: not a valid gzip"):
        load_network(bad)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("2 3 2", "2 \u00b3 2", r":3: expected the number of states of variable 1"),
        ("2 3 2", "2 \u0663 2", r":3: expected the number of states of variable 1"),
        ("3\n1 0", "\u00b3\n1 0", r":4: expected the number of functions"),
        ("2\n 0.3", "\u00b2\n 0.3", r":9: expected the number of entries"),
        ("0.5 0.25", "0.5 0.\u00b25", r":13: table of function 1 \(var_1\): '0\.\u00b25' is not"),
        ("2 3 2", "2 " + "3" * 5000 + " 2", r":3: expected the number of states of variable 1"),
    ],
)
def test_uai_numbers_are_ascii_digits_only(old, new, message):
    """Unicode digits (superscripts, other scripts) and huge integers are bad input, not
    a crash: ``str.isdigit``/``int`` accept some of them, the reader does not."""
    with pytest.raises(ConfigError, match=r"<uai>" + message):
        parse_uai(UAI.replace(old, new, 1))


def test_uai_scope_of_more_than_64_variables_is_refused_naming_the_function():
    n = 70
    head = ["BAYES", str(n), " ".join(["1"] * n), str(n)]
    scopes = [f"1 {i}" for i in range(n - 1)] + [f"{n} " + " ".join(map(str, range(n)))]
    tables = ["1 1.0"] * n
    text = "\n".join([*head, *scopes, *tables]) + "\n"
    with pytest.raises(ConfigError, match=r"<uai>:74: function 69 \(var_69\) has a scope of 70 "):
        parse_uai(text)


def _uai_lines(text: str, chunk: int, monkeypatch) -> tuple | str:
    """``parse_uai(text)`` read ``chunk`` bytes at a time: the network's parts or the error."""
    monkeypatch.setattr(uai_format, "CHUNK_BYTES", chunk)
    try:
        net = parse_uai(text)
    except ConfigError as exc:
        return str(exc)
    return net.variables, net.states, net.parents, {v: t.tolist() for v, t in net.cpts.items()}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("", ""),
        ("0.5 0.25", "0.5 zz"),
        ("0.2 0.8\n", "0.2\n"),
        ("0.2 0.8\n", "0.2 0.8 1\n"),
        ("3 0 1 2", "3 0 1 9"),
        ("2\n 0.3 0.7", "2\r\n\r\n\t 0.3\x0b0.7\x0c"),
    ],
)
def test_uai_reads_the_same_in_any_chunk_size(chunk, old, new, monkeypatch):
    """Tokens and line numbers do not depend on where the stream is cut."""
    text = UAI.replace(old, new, 1)
    whole = _uai_lines(text, 1 << 20, monkeypatch)
    assert _uai_lines(text, chunk, monkeypatch) == whole


def _gz_repeat(path, head: bytes, body: bytes, mib: int, tail: bytes = b"") -> None:
    """``path`` := gzip of ``head + body * (mib MiB) + tail``, compressed piecewise."""
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(head)
        block = body * ((1 << 20) // len(body))
        for _ in range(mib):
            fh.write(block)
        fh.write(tail)


@pytest.mark.parametrize(
    ("head", "body", "tail"),
    [
        (UAI.encode(), b"0.5 ", b""),
        (b"", b"\n", UAI.encode()),
        (b"", b" ", UAI.encode()),
        (b"BAYES\n1\n", b"7", b""),
    ],
    ids=["numbers-after", "newlines-before", "spaces-before", "one-token"],
)
def test_uai_gz_is_read_within_the_memory_limit(tmp_path, head, body, tail):
    """A small .uai.gz that inflates far past ``max_memory / TEXT_SHARE`` is refused once
    the cap is reached, its memory the cap's, not the file's."""
    import tracemalloc

    path = tmp_path / "bomb.uai.gz"
    _gz_repeat(path, head, body, 24, tail)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"bomb\.uai\.gz"):
            load_network(path, max_memory=64 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"peak {peak / 2**20:.0f} MiB"


def test_uai_newlines_before_a_network_count_in_its_line_numbers(tmp_path):
    path = tmp_path / "late.uai.gz"
    _gz_repeat(path, b"", b"\n", 2, UAI.replace("0.5 0.25", "0.5 zz").encode())
    with pytest.raises(ConfigError, match=rf"late\.uai\.gz:{(2 << 20) + 13}: .*'zz' is not"):
        load_network(path)


def test_uai_declared_states_and_tables_are_sized_before_they_are_made():
    """A few bytes declaring millions of states (their names) or cells are refused from
    the declaration, against ``max_memory``, before anything of that size is allocated."""
    many_states = "BAYES\n1\n50000000\n1\n1 0\n50000000\n0.5\n"
    with pytest.raises(ConfigError, match=r"<uai>:5: the CPT of 'var_0' .*--max-memory"):
        parse_uai(many_states, max_memory=64 << 20)
    wide = "BAYES\n2\n40000 40000\n2\n1 0\n2 0 1\n"
    with pytest.raises(ConfigError, match=r"<uai>:6: the CPT of 'var_1' .*--max-memory"):
        parse_uai(wide, max_memory=64 << 20)


@pytest.mark.parametrize("fmt", ["BIF", "XMLBIF", "Hugin", "UAI"])
def test_reading_stops_at_the_deadline(tmp_path, fmt):
    """Every reader checks the clock as it tokenizes and parses, not only when done."""
    net = renamed(random_dag(9, seed=0))
    text = {
        "BIF": write_bif(net),
        "XMLBIF": XMLBIF,
        "Hugin": NET,
        "UAI": uai_text(net),
    }[fmt]
    suffix = FORMATS[fmt].suffixes[0]
    path = tmp_path / f"net{suffix}"
    # enough tokens (or elements) for several checks
    path.write_text(_padded(text, fmt))
    deadline = Countdown(3, path.name)
    deadline.enter("reading the network", "give a smaller network")
    with pytest.raises(CompileTimeError, match=r"while reading the network \(.*line"):
        load_network(path, deadline=deadline)


def _padded(text: str, fmt: str) -> str:
    """``text`` with 70,000 empty blocks, 200,000 empty elements or 3 MiB of blank lines."""
    if fmt == "UAI":
        return "\n" * (3 << 20) + text
    if fmt == "XMLBIF":
        return text.replace("</NETWORK>", "<PROPERTY/>" * 200_000 + "</NETWORK>")
    return text + "\n".join(["net {}" if fmt == "Hugin" else "network n { }"] * 70_000) + "\n"


@pytest.mark.shared_data
@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data/bn (absent in a plain clone)")
def test_every_shared_problem_network_loads():
    problems = json.loads((SHARED / "problems.json").read_text())
    assert problems
    for problem in problems:
        net = load_network(SHARED / problem["network"])
        assert problem["class"] in net.variables
        assert problem["positive"] in net.states[problem["class"]]
        assert set(problem["features"]) <= set(net.variables), problem["name"]
        assert all(net.states[v] == ("0", "1") for v in net.variables)


XMLBIF = """\
<?xml version="1.0"?>
<BIF VERSION="0.3"><NETWORK><NAME>n</NAME>
<VARIABLE TYPE="nature"><NAME>A</NAME><OUTCOME>yes</OUTCOME><OUTCOME>no</OUTCOME></VARIABLE>
<VARIABLE TYPE="nature"><NAME>B</NAME><OUTCOME>x</OUTCOME><OUTCOME>y</OUTCOME><OUTCOME>z</OUTCOME>
</VARIABLE>
<DEFINITION><FOR>A</FOR><TABLE>0.3 0.7</TABLE></DEFINITION>
<DEFINITION><FOR>B</FOR><GIVEN>A</GIVEN><TABLE>0.1 0.2 0.7 0.5 0.25 0.25</TABLE></DEFINITION>
</NETWORK></BIF>
"""
SAMPLES = {
    "BIF": (BIF, parse_bif),
    "XMLBIF": (XMLBIF, parse_xmlbif),
    "Hugin": (NET, parse_net),
    "UAI": (UAI, parse_uai),
}
"""A small file of each format and its parser: a new format needs a sample here."""


def test_every_format_has_a_sample():
    assert SAMPLES.keys() == FORMATS.keys()


def test_each_format_is_declared_by_its_own_module():
    modules = {fmt.read.__module__ for fmt in FORMATS.values()}
    assert len(modules) == len(FORMATS)
    for name, fmt in FORMATS.items():
        assert fmt.name == name and fmt.suffixes
        assert all(s.startswith(".") and s == s.lower() for s in fmt.suffixes), name


def test_no_suffix_ends_another_formats_suffix():
    """The choice by suffix does not depend on the table's order."""
    for fmt in FORMATS.values():
        for other in FORMATS.values():
            if other is not fmt:
                clash = [s for s in fmt.suffixes if s.endswith(other.suffixes)]
                assert clash == [], (fmt.name, other.name)


@pytest.mark.parametrize(
    ("name", "suffix"), [(f.name, s) for f in FORMATS.values() for s in f.suffixes]
)
def test_every_suffix_of_every_format_is_read(tmp_path, name, suffix):
    text, parse = SAMPLES[name]
    path = tmp_path / f"Net{suffix.upper()}"
    data = text.encode()
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    assert format_of(path) is FORMATS[name]
    assert_same(load_network(path), parse(text))


def test_an_unknown_suffix_names_the_file_and_every_format(tmp_path):
    path = tmp_path / "net.bif.txt"
    with pytest.raises(ConfigError) as err:
        load_network(path)  # refused by its name: the file is never opened
    message = str(err.value)
    assert message.startswith(f"{path}: unknown network format; expected ")
    assert message.endswith(formats_text())
    for fmt in FORMATS.values():
        assert fmt.name in message and all(s in message for s in fmt.suffixes)


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("verb", ["compile-bn", "verify-bn"])
def test_help_names_every_format(verb):
    res = CliRunner().invoke(cli, [verb, "--help"])
    assert res.exit_code == 0, res.output
    assert formats_text() in _words(res.output)
    assert "{formats}" not in res.output


@pytest.mark.parametrize("doc", ["README.md", "docs/build-config.md", "docs/yaml.md"])
def test_docs_name_every_format(doc):
    assert formats_text() in _words((ROOT / doc).read_text()), f"{doc}: list {formats_text()}"
