"""Layer taps: run a classifier once and get its logits plus chosen intermediate activations.

Two model formats, both without pickled Python objects:

* **ONNX** (``.onnx``): the chosen tensors are appended to the graph's outputs (after ONNX
  shape inference), so one ``onnxruntime`` session call returns logits and activations.
  Editing the graph needs the small ``onnx`` package, imported only when a tap is opened.
* **Torch** (``.pt2``: a ``torch.export`` program): forward hooks by module name on the
  unflattened program. TorchScript files (``.pt`` / ``.ts``) are loaded for listing and
  logits only, since TorchScript modules refuse forward hooks. torch is imported lazily.

Activations of rank > 2 (conv maps, ``(n, C, H, W)``) are reduced per the ``pooling`` option:
``"flatten"`` (default, row-major ``C*H*W`` features), ``"avg"`` or ``"max"`` (global pooling
over every axis after the channel axis, giving ``C`` features), or ``"grid"`` (averages over
a grid of at most :data:`GRID_CELLS` cells per axis after the channel axis: ``C*7*7``
features for an image, which keeps where things are). ``pooling`` may also map layer names
to options (layers not named use ``"flatten"``).

``device`` runs the model on ``"cpu"`` (default) or an NVIDIA GPU (``"cuda"``, ``"cuda:N"``):
ONNX through onnxruntime's ``CUDAExecutionProvider`` (the ``onnxruntime-gpu`` package, which
replaces ``onnxruntime`` under the same import name), torch by moving the program to the
device; activations come back as numpy either way. A device the installed packages or the
machine cannot run is refused with one line saying what to install (:func:`parse_device`).

The layer :data:`INPUT_LAYER` (``"input"``) is the model's input itself, as the tap receives
it (preprocessed): monitoring it catches inputs unlike the training data (other data sets,
broken sensors) that a well-trained network maps into familiar activations. What the input
is (an image, a signal, a vector: :data:`INPUT_KINDS`) follows from its shape
(:func:`infer_input_kind`). An input with two or more axes after the channel axis (an
image) is offered a second time as :data:`COARSE_INPUT_LAYER` (``"input_coarse"``): the
same input averaged over a coarser grid, at most :data:`COARSE_GRID_CELLS` cells per axis
(:func:`coarse_view`), which a box monitor sees as a separate layer.

Layer names: an ONNX layer is a tensor (its graph name) or, where torch's exporter recorded
it, the torch module whose output the tensor is (``layer2.1.relu``: the dynamo exporter's
``pkg.torch.onnx.name_scopes`` node metadata, else the legacy exporter's node names such as
``/layer2/layer2.1/relu/Relu``); a module called more than once names its last call, as a
``.pt2`` forward hook taps it. A ``.pt2`` layer is a module path. :meth:`Tap.candidates`
lists exactly the names a tap accepts.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import os
import re
import threading
import warnings
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from boxwatch.agent import vocab
from boxwatch.agent.errors import ConfigError, MissingModelError
from boxwatch.agent.inputs import one_line

POOLINGS = vocab.POOLINGS
INPUT_KINDS = vocab.INPUT_KINDS
INPUT_LAYER = "input"
GRID_CELLS = 7
COARSE_INPUT_LAYER = "input_coarse"
COARSE_GRID_CELLS = 5
THREADS_ENV = "BOXWATCH_ORT_THREADS"
DEFAULT_THREADS = 1
ONNX_SUFFIXES = (".onnx",)
EXPORT_SUFFIXES = (".pt2",)
TORCHSCRIPT_SUFFIXES = (".pt", ".ts", ".torchscript")
MAX_INFLATION = 32
"""How many times its compressed size a compressed member of a torch file may declare
(torch compresses only its code, a few times at most; tensors are stored as they are)."""
MAX_ERROR_ECHO = 300
"""Characters of a library's error message quoted in ours."""
CPU = "cpu"
CUDA = "cuda"
DEVICE_PATTERN = r"^(cpu|cuda(:[0-9]+)?)$"
"""The devices a model runs on: ``cpu``, ``cuda`` (GPU 0), ``cuda:N``."""
CUDA_PROVIDER = "CUDAExecutionProvider"
ORT_GPU_HINT = (
    "install onnxruntime-gpu in place of onnxruntime (pip uninstall onnxruntime, then pip "
    "install onnxruntime-gpu: the same import name) on a machine with an NVIDIA GPU, or "
    "set model.device: cpu"
)
TORCH_GPU_HINT = (
    "install a CUDA build of torch (PyTorch's CUDA wheels, pytorch.org 'Get started') on a "
    "machine with an NVIDIA GPU and its driver, or set model.device: cpu"
)


@dataclass(frozen=True)
class LayerInfo:
    """One candidate layer: its name, output shape (``None`` = dynamic axis) and kind, and
    the torch module paths that name it too (deepest first; empty where none does)."""

    name: str
    shape: tuple[int | None, ...]
    kind: str
    # Calls per forward pass (a torch module used twice); a monitor taps the last call.
    calls: int = 1
    modules: tuple[str, ...] = ()

    def n_features(self, pooling: str = "flatten") -> int | None:
        """Feature count after ``pooling``; ``None`` when unknown (no shape, or a dynamic axis)."""
        if not self.shape:
            return None
        dims = self.shape[1:]
        if pooling == "grid" and len(self.shape) > 2:
            dims = (dims[0], *(None if d is None else min(d, GRID_CELLS) for d in dims[1:]))
        elif pooling != "flatten" and len(self.shape) > 2:
            dims = dims[:1]
        known = [d for d in dims if d is not None]
        if len(known) < len(dims):
            return None
        return int(np.prod(known)) if known else 1

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shape": list(self.shape), "modules": list(self.modules)}


def infer_input_kind(shape: Sequence[int | None]) -> str:
    """The kind (:data:`INPUT_KINDS`) of a model input of ``shape``, batch axis first: three
    or more axes after it an image, two a signal ``[C, L]``, one or none a vector."""
    rank = len(shape) - 1
    return "image" if rank >= 3 else "signal" if rank == 2 else "vector"


@dataclass(frozen=True)
class InputInfo:
    """A model's input tensor: name, shape (``None`` = dynamic axis, empty when the model
    file does not declare it) and element type; ``None`` where the file does not say."""

    name: str | None
    shape: tuple[int | None, ...]
    dtype: str | None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shape": list(self.shape)}


def parse_device(device: str) -> tuple[str, int]:
    """``("cpu", 0)``, ``("cuda", 0)`` or ``("cuda", N)`` for ``cpu``, ``cuda``, ``cuda:N``;
    :class:`ConfigError` for anything else."""
    if not re.fullmatch(DEVICE_PATTERN, str(device)):
        raise ConfigError(
            f"model.device: {str(device)[:40]!r} is not a device (cpu, cuda or cuda:N)"
        )
    kind, _, index = str(device).partition(":")
    return kind, int(index or 0)


def resolve_threads(threads: int | None) -> int:
    """Intra-op threads: the argument, else ``BOXWATCH_ORT_THREADS``, else 1."""
    if threads is None:
        env = os.environ.get(THREADS_ENV)
        if env is None:
            return DEFAULT_THREADS
        try:
            threads = int(env)
        except ValueError:
            raise ConfigError(f"{THREADS_ENV}={env!r} is not an integer") from None
    if int(threads) < 1:
        raise ConfigError(f"threads={threads} should be >= 1")
    return int(threads)


def pool(x: np.ndarray, pooling: str) -> np.ndarray:
    """Reduce one activation batch to (n_samples, n_features) float32; see module doc."""
    x = np.asarray(x)
    if x.ndim <= 2 or pooling == "flatten":
        return x.reshape(len(x), -1).astype(np.float32, copy=False)
    axes = tuple(range(2, x.ndim))
    if pooling == "avg":
        return x.mean(axis=axes).astype(np.float32, copy=False)
    if pooling == "max":
        return x.max(axis=axes).astype(np.float32, copy=False)
    if pooling == "grid":
        return _grid_means(x, GRID_CELLS).reshape(len(x), -1)
    raise ConfigError(f"pooling={pooling!r}: expected one of {POOLINGS}")


def _grid_means(x: np.ndarray, cells: int) -> np.ndarray:
    """Means of ``x`` (batch, channel, then spatial axes) over a grid of at most ``cells``
    cells per spatial axis, float32, axes kept."""
    out: np.ndarray = np.asarray(x).astype(np.float32, copy=False)
    for ax in range(2, out.ndim):
        size = out.shape[ax]
        edges = np.linspace(0, size, min(size, cells) + 1).round().astype(np.int64)
        sums = np.add.reduceat(out, edges[:-1], axis=ax)
        shape = [1] * out.ndim
        shape[ax] = len(edges) - 1
        out = (sums / np.diff(edges).reshape(shape)).astype(np.float32)
    return out


def coarse_view(x: np.ndarray) -> np.ndarray:
    """The layer :data:`COARSE_INPUT_LAYER` of an input batch ``x`` (batch, channel, two or
    more spatial axes): means over at most :data:`COARSE_GRID_CELLS` cells per spatial axis,
    shape kept. On 28x28 images the 7x7 grid separates digits from other digit-like shapes,
    the 5x5 one clothing from digits (the detection bench); monitoring both catches both."""
    return _grid_means(x, COARSE_GRID_CELLS)


def coarse_info(input_info: LayerInfo) -> LayerInfo | None:
    """The candidate :data:`COARSE_INPUT_LAYER` of a model whose input is ``input_info``;
    ``None`` when the input has fewer than two axes after the channel axis, or none that
    the coarse grid shrinks."""
    shape = input_info.shape
    if len(shape) < 4 or all(d is not None and d <= COARSE_GRID_CELLS for d in shape[2:]):
        return None
    spatial = tuple(None if d is None else min(d, COARSE_GRID_CELLS) for d in shape[2:])
    return LayerInfo(COARSE_INPUT_LAYER, (None, shape[1], *spatial), "Input")


def is_coarse_view(info: LayerInfo) -> bool:
    """Whether candidate ``info`` is the input's coarse view (not a graph tensor that
    happens to be named :data:`COARSE_INPUT_LAYER`)."""
    return info.name == COARSE_INPUT_LAYER and info.kind == "Input"


def offers_coarse(infos: Sequence[LayerInfo]) -> bool:
    """Whether a tap's candidates ``infos`` include the input's coarse view."""
    return any(map(is_coarse_view, infos))


def _check_pooling(pooling: str | Mapping[str, str], layers: Sequence[str]) -> dict[str, str]:
    """Per-layer pooling from one option or a ``{layer: option}`` mapping."""
    if not isinstance(pooling, Mapping) and pooling not in POOLINGS:
        raise ConfigError(f"pooling={pooling!r}: expected one of {POOLINGS}")
    per = dict(pooling) if isinstance(pooling, Mapping) else {name: pooling for name in layers}
    problems = [
        f"pooling={p!r} for layer {n!r}: expected one of {POOLINGS}"
        for n, p in per.items()
        if p not in POOLINGS
    ]
    problems += [
        f"pooling given for layer {n!r}, which is not tapped; tapped: {list(layers)}"
        for n in per
        if n not in layers
    ]
    if problems:
        raise ConfigError(problems)
    return {name: per.get(name, "flatten") for name in layers}


def _check_names(
    wanted: Sequence[str],
    valid: Sequence[str],
    model: str,
    renamed: Mapping[str, str] | None = None,
) -> None:
    """Refuse names a tap does not accept, listing those it does; ``renamed`` maps a name
    an older release accepted (an ONNX node name) to the layer to write instead."""
    unknown = [name for name in wanted if name not in valid]
    if unknown:
        raise ConfigError(
            [
                f"{model}: layer {name!r} is an ONNX node name, no longer accepted; "
                f"name its output {renamed[name]!r} instead (boxwatch layers lists the names)"
                if renamed and name in renamed
                else f"{model}: unknown layer {name!r}; valid layers: {list(valid)}"
                for name in unknown
            ]
        )


class Tap(Protocol):
    """What runs a model for boxwatch (:class:`OnnxTap`, :class:`TorchTap`): the builder
    extracts training activations and the agent monitors with the same object."""

    layers: list[str]
    pooling: dict[str, str]
    input: InputInfo
    device: str  # where the model runs: cpu, cuda, cuda:N

    def candidates(self) -> list[LayerInfo]:
        """Every layer the tap could expose, with its output shape."""
        ...

    def run(self, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Logits of a preprocessed batch and the chosen layers' pooled activations."""
        ...


class _ModelTap:
    """The constructor :class:`OnnxTap` and :class:`TorchTap` share: the pooling is checked
    first, then :meth:`_open` loads the model file and its ``layers``."""

    def __init__(
        self,
        model: str | Path,
        layers: Sequence[str] = (),
        *,
        pooling: str | Mapping[str, str] = "flatten",
        threads: int | None = None,
        device: str = CPU,
    ):
        self.pooling = _check_pooling(pooling, list(layers))
        self.device = str(device)
        self._device = parse_device(self.device)
        self._open(Path(model), list(layers), threads)

    def _open(self, path: Path, layers: list[str], threads: int | None) -> None:
        raise NotImplementedError


class OnnxTap(_ModelTap):
    """ONNX model whose session returns logits plus the chosen layers' activations.

    Parameters
    ----------
    model : str or Path
        ``.onnx`` file (external weight files beside it are loaded too).
    layers : sequence of str
        Tensor names, or the torch module paths the export recorded for them, to expose;
        see :meth:`candidates`.
    pooling : {"flatten", "avg", "max", "grid"} or mapping of layer to it, default="flatten"
    threads : int, optional
        onnxruntime intra-op threads (default ``BOXWATCH_ORT_THREADS`` or 1; more threads
        worsen tail latency for small models).
    device : {"cpu", "cuda", "cuda:N"}, default="cpu"
        ``cuda`` runs the model through onnxruntime-gpu's ``CUDAExecutionProvider`` (nodes
        it lacks stay on the CPU), deterministic compute on.
    """

    def _open(self, path: Path, layers: list[str], threads: int | None) -> None:
        self.path = path
        self.threads = resolve_threads(threads)
        onnx = _import_onnx()
        import onnxruntime as ort

        providers: list[Any] = ["CPUExecutionProvider"]
        if self._device[0] == CUDA:
            available = ort.get_available_providers()
            if CUDA_PROVIDER not in available:
                raise ConfigError(
                    f"model.device: {self.device}, but this onnxruntime {ort.__version__} has "
                    f"no {CUDA_PROVIDER} (it has {', '.join(available)}): {ORT_GPU_HINT}"
                )
            # TF32 matrix products keep 10 bits of mantissa: full float32 keeps the GPU's
            # activations within float32 rounding of the CPU's.
            options = {"device_id": self._device[1], "use_tf32": 0}
            providers = [(CUDA_PROVIDER, options), *providers]

        if not self.path.is_file():
            raise MissingModelError(f"{self.path}: no such model file")
        try:
            proto = onnx.load(str(self.path))
            inferred = onnx.shape_inference.infer_shapes(proto)
        except Exception as exc:  # onnx raises several unrelated types for bad files
            raise ConfigError(f"{self.path}: not a readable ONNX model ({exc})") from None
        graph = inferred.graph
        initializers = {t.name for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in initializers]
        if len(self.input_names) != 1:
            raise ConfigError(f"{self.path}: expected one input tensor, found {self.input_names}")
        self.output_name = graph.output[0].name
        declared = next(i for i in graph.input if i.name == self.input_names[0])
        self.input = InputInfo(
            self.input_names[0],
            _onnx_shape(declared),
            _onnx_dtype(onnx, declared.type.tensor_type.elem_type),
        )
        infos = {v.name: v for v in [*graph.value_info, *graph.output]}
        produced = [  # (tensor, node) of every float tensor a node produces, graph order
            (out, node)
            for node in graph.node
            for out in node.output
            if out in infos and infos[out].type.tensor_type.elem_type in _FLOAT_TYPES
        ]
        source = self.input_names[0]
        paths, calls = _module_paths(proto, produced)
        taken = {INPUT_LAYER, source, *(t for t, _ in produced)}
        self._layers: dict[str, LayerInfo] = {}
        for tensor, node in produced:
            names = tuple(p for p in paths.get(tensor, ()) if p not in taken)
            self._layers[tensor] = LayerInfo(
                tensor,
                _onnx_shape(infos[tensor]),
                node.op_type,
                calls.get(names[0], 1) if names else 1,
                names,
            )
        # The graph input is the layer "input", unless a node's tensor has that name: then
        # it keeps its own name.
        input_name = INPUT_LAYER if INPUT_LAYER not in self._layers else source
        graph_input = next(i for i in graph.input if i.name == source)
        self._input = LayerInfo(input_name, _onnx_shape(graph_input), "Input")
        coarse = coarse_info(self._input)
        self._coarse = coarse if coarse is not None and coarse.name not in self._layers else None
        aliases = {p: info.name for info in self._layers.values() for p in info.modules}
        aliases[input_name] = source
        if self._coarse is not None:
            aliases[self._coarse.name] = source
        valid = [info.name for info in self.candidates()] + list(
            dict.fromkeys(p for info in self._layers.values() for p in info.modules)
        )
        renamed = {
            node.name: (info.modules or (info.name,))[0]
            for tensor, node in produced
            if node.name and node.output[0] == tensor
            for info in [self._layers[tensor]]
        }
        _check_names(layers, valid, str(self.path), renamed)
        self.layers = list(layers)
        self._tensor = {name: aliases.get(name, name) for name in self.layers}
        present = {o.name for o in proto.graph.output}
        for tensor in dict.fromkeys(self._tensor.values()):
            if tensor not in present and tensor != source:
                proto.graph.output.append(infos[tensor])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if self._device[0] == CUDA:
            opts.use_deterministic_compute = True  # the same artifact from the same inputs
        try:
            self.session = ort.InferenceSession(
                proto.SerializeToString(), opts, providers=providers
            )
        except Exception as exc:  # onnxruntime's own types (Fail, InvalidGraph, ...)
            raise ConfigError(
                f"{self.path}: onnxruntime cannot run this model on {self.device} "
                f"({_first_line(exc)})"
            ) from None
        if self._device[0] == CUDA and CUDA_PROVIDER not in self.session.get_providers():
            raise ConfigError(
                f"model.device: {self.device}: onnxruntime-gpu could not start CUDA there "
                "(no GPU of that index, or the CUDA and cuDNN libraries onnxruntime-gpu needs "
                "are missing: see its install notes), so it fell back to the CPU; set "
                "model.device: cpu to build on the CPU"
            )
        fetched = [t for t in dict.fromkeys(self._tensor.values()) if t != source]
        self._fetch = [self.output_name, *fetched]

    def candidates(self) -> list[LayerInfo]:
        """The model's input (:data:`INPUT_LAYER`; an image's also as
        :data:`COARSE_INPUT_LAYER`), then every float tensor a node produces, in graph
        order, each with the module paths that name it (the config takes either name, and no
        other)."""
        return [self._input, *([self._coarse] if self._coarse else []), *self._layers.values()]

    def run(self, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One session call: ``(logits, {layer: (n_samples, n_features) float32})``."""
        x = np.asarray(x, dtype=np.float32)
        outs = self.session.run(self._fetch, {self.input_names[0]: x})
        by_tensor = dict(zip(self._fetch, outs, strict=True))
        by_tensor[self.input_names[0]] = x
        return outs[0], {
            name: pool(
                coarse_view(x) if self._is_coarse(name) else by_tensor[self._tensor[name]],
                self.pooling[name],
            )
            for name in self.layers
        }

    def _is_coarse(self, name: str) -> bool:
        """Whether ``name`` is the input's coarse view (computed here, not by the model)."""
        return self._coarse is not None and name == self._coarse.name


_FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_SCOPES_KEY = "pkg.torch.onnx.name_scopes"  # torch's dynamo exporter, per node
_REPEAT = re.compile(r"^(.+)_(\d+)$")  # the legacy exporter's scope of a module's later call


def _node_scopes(node: Any) -> tuple[list[str], bool]:
    """The module paths enclosing ``node``, outermost first, as torch's exporter recorded
    them, and whether they come from a legacy node name: the dynamo exporter's
    ``name_scopes`` metadata (root first, the op's own name last), else a legacy node name
    (``/layer1/layer1.0/relu/Relu``); empty without either."""
    for prop in node.metadata_props:
        if prop.key == _SCOPES_KEY:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return [], False
            if not isinstance(scopes, list) or not all(isinstance(x, str) for x in scopes):
                return [], False
            return [x for x in scopes[1:-1] if x], False
    parts = node.name.split("/")
    if len(parts) < 3 or parts[0] or not all(parts[1:-1]):
        return [], False
    out: list[str] = []
    for part in parts[1:-1]:  # each scope is a full path, or a child's name under the last
        path = out[-1] if out else ""
        out.append(part if not path or part.startswith(path + ".") else f"{path}.{part}")
    return out, True


def _module_paths(
    proto: Any, produced: Sequence[tuple[str, Any]]
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Which torch modules each tensor is the output of (deepest first), and how many calls
    each module has, for a graph torch exported (none for others).

    A module's output is the last tensor (graph order) among those its nodes produce; its
    calls are the runs of consecutive such tensors. The legacy exporter scopes a module's
    later calls ``relu_1``, ``relu_2``: such a scope counts as ``relu`` where its parent
    also holds ``relu``.
    """
    if proto.producer_name != "pytorch":
        return {}, {}
    chains = [(tensor, *_node_scopes(node)) for tensor, node in produced]
    known = {p for _, chain, _ in chains for p in chain}

    def same_module(path: str, legacy: bool) -> str:
        match = _REPEAT.match(path) if legacy else None
        return match.group(1) if match and match.group(1) in known else path

    last: dict[str, str] = {}
    depth: dict[str, int] = {}
    calls: dict[str, int] = {}
    before: set[str] = set()
    for tensor, chain, legacy in chains:
        here = list(dict.fromkeys(same_module(p, legacy) for p in chain))
        for level, path in enumerate(here):
            last[path], depth[path] = tensor, level
            if path not in before:
                calls[path] = calls.get(path, 0) + 1
        before = set(here)
    paths: dict[str, list[str]] = {}
    for path in sorted(last, key=lambda p: -depth[p]):
        paths.setdefault(last[path], []).append(path)
    return paths, calls


def _onnx_shape(info) -> tuple[int | None, ...]:
    dims = info.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)


def _onnx_dtype(onnx, elem_type: int) -> str | None:
    """numpy's name of an ONNX element type (``None`` for one numpy lacks)."""
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name)
    except (KeyError, TypeError, ValueError):
        return None


def _import_onnx():
    try:
        import onnx
    except ModuleNotFoundError:
        raise ConfigError(
            "tapping ONNX layers needs the 'onnx' package: pip install onnx"
        ) from None
    return onnx


class TorchTap(_ModelTap):
    """``torch.export`` program (``.pt2``) with forward hooks on the chosen modules.

    Parameters
    ----------
    model : str or Path
        ``.pt2`` file from ``torch.export.save``; a TorchScript file is accepted for listing
        and logits only (TorchScript modules refuse forward hooks).
    layers : sequence of str
        Module names as in ``named_modules()``, e.g. ``"fc1"`` or ``"block.conv"``.
    pooling : {"flatten", "avg", "max", "grid"} or mapping of layer to it, default="flatten"
    threads : int, optional
        ``torch.set_num_threads`` (process-wide), default ``BOXWATCH_ORT_THREADS`` or 1.
    device : {"cpu", "cuda", "cuda:N"}, default="cpu"
        Where the program runs (a ``.pt2`` is moved there with torch's
        ``move_to_device_pass``); inputs go there and outputs come back as numpy.
    """

    def _open(self, path: Path, layers: list[str], threads: int | None) -> None:
        try:
            import torch
        except ModuleNotFoundError:
            raise ConfigError("Torch models need torch: pip install 'boxwatch[torch]'") from None
        self._target = _torch_device(torch, self.device, self._device)
        self.path = path
        self.threads = resolve_threads(threads)
        torch.set_num_threads(self.threads)
        self._threads_set = {threading.get_ident()}
        if not self.path.is_file():
            raise MissingModelError(f"{self.path}: no such model file")
        self._torch = torch
        self.scripted = self.path.suffix not in EXPORT_SUFFIXES
        self._kinds: dict[str, str] = {}
        self.input = InputInfo(None, (), None)  # TorchScript declares no input
        self._calls: dict[str, int] = {}
        check_torch_archive(self.path)
        heard = _Heard()
        try:
            with _quiet_torch(heard):
                if self.scripted:
                    self.module = torch.jit.load(str(self.path), map_location=self._target)
                    self._example = None
                else:
                    program = torch.export.load(str(self.path))
                    if self._device[0] != CPU:
                        from torch.export.passes import move_to_device_pass

                        program = move_to_device_pass(program, self._target)
                    self.module = torch.export.unflatten(program)
                    self._example = _example_input(program).to(self._target)
                    _compiled_calls(torch, self.module, self._example)
                    self.input = _program_input(program)
                    self._kinds, self._calls = _module_calls(program)
        except Exception as exc:  # torch raises many types for unreadable files
            raise ConfigError(
                f"{self.path}: not a loadable torch.export/TorchScript model "
                f"({heard.reason or _first_line(exc)})"
            ) from None
        self.module.eval()
        modules = dict(self.module.named_modules())
        named = [name for name in modules if name and not name.startswith("_")]
        for taken in (INPUT_LAYER, COARSE_INPUT_LAYER):
            if taken in named:
                raise ConfigError(
                    f"{self.path}: a module is named {taken!r}, a name boxwatch gives the "
                    "model's input; rename the module"
                )
        self._shape_cache: dict[str, tuple[int | None, ...]] | None = None
        self._named = named
        if layers and self.scripted:
            _check_names(layers, [INPUT_LAYER, COARSE_INPUT_LAYER, *named], str(self.path))
            raise ConfigError(
                f"{self.path}: TorchScript modules do not accept forward hooks; "
                "save the model with torch.export (.pt2) or export it to ONNX"
            )
        if layers:  # only modules whose forward returns a tensor can be tapped (and listed)
            _check_names(layers, [info.name for info in self.candidates()], str(self.path))
        self.layers = list(layers)
        self._captured: dict[str, Any] = {}
        for name in self.layers:
            if name not in (INPUT_LAYER, COARSE_INPUT_LAYER):
                modules[name].register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        def capture(_module, _inputs, output):
            self._captured[name] = output[0] if isinstance(output, tuple | list) else output

        return capture

    def _shapes(self) -> dict[str, tuple[int | None, ...]]:
        """Each module's output shape (batch axis ``None``) on one run of a zero example
        input, in the order the modules finish their (last) call: a module's children come
        before it, as in the graph. Modules that return no tensor are left out."""
        if self._shape_cache is not None:
            return self._shape_cache
        torch = self._torch
        shapes: dict[str, tuple[int | None, ...]] = {}
        modules = dict(self.module.named_modules())
        handles = []
        for name in self._named:

            def record(_m, _i, out, name=name):
                t = out[0] if isinstance(out, tuple | list) else out
                if isinstance(t, torch.Tensor):
                    shapes.pop(name, None)  # a later call moves the module to its place
                    shapes[name] = (None, *t.shape[1:])

            handles.append(modules[name].register_forward_hook(record))
        try:
            with torch.no_grad():
                self.module(self._example)
        finally:
            for h in handles:
                h.remove()
        self._shape_cache = shapes
        return shapes

    def candidates(self) -> list[LayerInfo]:
        """The model's input (an image's twice: :data:`COARSE_INPUT_LAYER`), then every
        module whose forward returns a tensor, with its output shape (from one run on a zero
        example input), in the order the modules finish: exactly the names the tap accepts.
        TorchScript: every module, no shapes."""
        if self._example is None:
            modules = dict(self.module.named_modules())
            return [LayerInfo(INPUT_LAYER, (), "Input")] + [
                LayerInfo(n, (), type(modules[n]).__name__.split(".")[-1], modules=(n,))
                for n in self._named
            ]
        modules = dict(self.module.named_modules())
        source = LayerInfo(INPUT_LAYER, (None, *self._example.shape[1:]), "Input")
        coarse = coarse_info(source)
        return [source, *([coarse] if coarse else [])] + [
            LayerInfo(
                n,
                shape,
                self._kinds.get(n, type(modules[n]).__name__),
                self._calls.get(n, 1),
                (n,),
            )
            for n, shape in self._shapes().items()
        ]

    def run(self, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One forward pass: ``(logits, {layer: (n_samples, n_features) float32})``."""
        torch = self._torch
        if threading.get_ident() not in self._threads_set:
            # torch.set_num_threads holds for the calling thread only (OpenMP, MKL): a
            # model run from another thread would get one thread per core.
            torch.set_num_threads(self.threads)
            self._threads_set.add(threading.get_ident())
        self._captured.clear()
        x = np.ascontiguousarray(x, dtype=np.float32)
        self._captured[INPUT_LAYER] = torch.from_numpy(x)
        if COARSE_INPUT_LAYER in self.layers:
            self._captured[COARSE_INPUT_LAYER] = torch.from_numpy(coarse_view(x))
        with torch.no_grad():
            out = self.module(torch.from_numpy(x).to(self._target))
        logits = out[0] if isinstance(out, tuple | list) else out
        return (
            logits.detach().cpu().numpy(),
            {
                name: pool(self._captured[name].detach().cpu().numpy(), self.pooling[name])
                for name in self.layers
            },
        )


def _torch_device(torch: Any, device: str, parsed: tuple[str, int]) -> Any:
    """The ``torch.device`` of ``device``; :class:`ConfigError` when torch cannot run there
    (a CPU-only build, no GPU visible, no GPU of that index). For ``cuda`` it turns TF32
    off, process-wide (torch's own switches)."""
    kind, index = parsed
    if kind == CUDA:
        # Full float32 products (cuDNN convolutions default to TF32), as onnxruntime's.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible"
            raise ConfigError(
                f"model.device: {device}, but torch {torch.__version__} sees no CUDA device "
                f"({build}): {TORCH_GPU_HINT}"
            )
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"model.device: {device}, but torch sees {torch.cuda.device_count()} CUDA "
                f"device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})"
            )
    return torch.device(device)


def _module_calls(program) -> tuple[dict[str, str], dict[str, int]]:
    """Each module's original class name and how often one forward pass calls it.

    ``torch.export.unflatten`` turns every module into an ``InterpreterModule``; the graph's
    ``nn_module_stack`` still names the original class, and a module called twice appears
    under two stack keys (``fc1`` and ``fc1@1``) with the same path.
    """
    kinds: dict[str, str] = {}
    keys: dict[str, set[str]] = {}
    for node in program.graph.nodes:
        for key, entry in (node.meta.get("nn_module_stack") or {}).items():
            path, kind = entry[0], entry[1]
            name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
            kinds[path] = name.rsplit(".", 1)[-1]
            keys.setdefault(path, set()).add(key)
    return kinds, {path: len(k) for path, k in keys.items()}


def _program_input(program) -> InputInfo:
    """The program's (first) user input: placeholder name, shape (symbolic axes ``None``)."""
    placeholder = next(
        n
        for n in program.graph.nodes
        if n.op == "placeholder" and n.name in program.graph_signature.user_inputs
    )
    val = placeholder.meta["val"]
    shape = tuple(d if isinstance(d, int) else None for d in val.shape)
    return InputInfo(str(placeholder.name), shape, str(val.dtype).removeprefix("torch."))


def _compiled_calls(torch: Any, module: Any, example: Any) -> None:
    """Let an unflattened program's submodules run their generated code rather than
    torch.fx's interpreter (which runs the graph node by node: ~4x a small model's call),
    where that code runs: it does not for a module called more than once (torch names its
    later calls ``relu@1``), and then every submodule keeps the interpreter."""
    switched = [m for m in module.modules() if getattr(m, "_run_with_interpreter", False)]
    for m in switched:
        m._run_with_interpreter = False
    try:
        with torch.no_grad():
            module(example)
    except Exception:  # the generated code's failures vary (AttributeError, TypeError)
        for m in switched:
            m._run_with_interpreter = True


def _example_input(program) -> Any:
    """A zero input of the program's input shape, dynamic axes set to 2."""
    import torch

    placeholder = next(
        n
        for n in program.graph.nodes
        if n.op == "placeholder" and n.name in program.graph_signature.user_inputs
    )
    val = placeholder.meta["val"]
    shape = [d if isinstance(d, int) else 2 for d in val.shape]
    return torch.zeros(shape, dtype=val.dtype)


def check_torch_archive(path: Path) -> None:
    """Refuse a torch file whose ZIP index declares more than the file can hold.

    Read from the index alone (nothing is inflated): torch reads a member into a buffer of
    its declared size, so a few MB can make it allocate GBs. A stored member (tensors) must
    declare what it stores; a compressed one (code) at most :data:`MAX_INFLATION` times
    its compressed bytes, and every member must lie inside the file.
    """
    where = str(path)
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        raise ConfigError(
            f"{where}: not a loadable torch.export/TorchScript model (not a ZIP archive: "
            f"{_first_line(exc)})"
        ) from None
    packed = sum(m.compress_size for m in members)
    for m in members:
        stored = m.compress_type == zipfile.ZIP_STORED
        allowed = m.compress_size if stored else MAX_INFLATION * m.compress_size
        if m.file_size > allowed or packed > size:
            raise ConfigError(
                f"{where}: member {m.filename[:100]!r} declares {m.file_size:,} bytes from "
                f"{m.compress_size:,} in a file of {size:,}; a torch model file is never so "
                "compressed, so it is not loaded"
            )


class _Heard(logging.Handler):
    """Keeps the reason of the last exception torch logged (its deserializer logs the real
    error, then raises one that says "see the warnings above")."""

    def __init__(self) -> None:
        super().__init__()
        self.reason: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.reason = _first_line(record.exc_info[1])


@contextlib.contextmanager
def _quiet_torch(heard: _Heard) -> Iterator[None]:
    """Route torch's loggers to ``heard`` (nothing printed) and silence its warnings while
    it reads a file: its deserializer logs a whole traceback before raising, and its format
    notices are not ours to fix."""
    loggers = [
        logger
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and (name == "torch" or name.startswith("torch."))
    ]
    was = [(logger.handlers, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers, logger.propagate = [heard], False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, (handlers, propagate) in zip(loggers, was, strict=True):
            logger.handlers, logger.propagate = handlers, propagate


def _first_line(exc: BaseException) -> str:
    """A library's error as one short line: its deepest cause's first line (torch wraps
    the real reason in "see the warnings above")."""
    while True:
        deeper = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if deeper is None:
            break
        exc = deeper
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return one_line(text or type(exc).__name__, limit=MAX_ERROR_ECHO)


def open_tap(
    model: str | Path,
    layers: Sequence[str] = (),
    *,
    pooling: str | Mapping[str, str] = "flatten",
    threads: int | None = None,
    device: str = CPU,
) -> Tap:
    """Open ``model`` with the tap its suffix calls for (``.onnx``; ``.pt2``; ``.pt``/``.ts``),
    running on ``device`` (``cpu``, ``cuda``, ``cuda:N``)."""
    suffix = Path(model).suffix.lower()
    if suffix in ONNX_SUFFIXES:
        return OnnxTap(model, layers, pooling=pooling, threads=threads, device=device)
    if suffix in EXPORT_SUFFIXES + TORCHSCRIPT_SUFFIXES:
        return TorchTap(model, layers, pooling=pooling, threads=threads, device=device)
    raise ConfigError(
        f"{model}: unknown model format {suffix!r}; expected .onnx, .pt2 "
        "(torch.export) or .pt/.ts (TorchScript)"
    )


def list_layers(model: str | Path, *, threads: int | None = None) -> list[LayerInfo]:
    """Candidate layers of ``model`` with output shapes."""
    return open_tap(model, (), threads=threads).candidates()
