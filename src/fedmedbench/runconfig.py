"""The typed configuration of one training run, with every default in one place.

``config.resolve_run`` turns config.yaml (task section + method + variant) into a plain dict; that
dict is what Snakemake passes to a job (``--run-config``) and what ``final.json`` records.
:meth:`RunConfig.from_dict` reads it strictly: an unknown key at any level is a
:class:`~fedmedbench.errors.ConfigError` that names the key and its closest valid spelling, so a typo
can never be silently dropped. No torch import here (the Snakefile loads this module).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field

from fedmedbench.errors import ConfigError, unknown_key


class Strict:
    """``from_dict``: build from a mapping; an unknown key is an error naming it and its closest spelling."""

    @classmethod
    def from_dict(cls, values: dict, where: str | None = None):
        return _build(cls, values, where or cls.__name__)


@dataclass(frozen=True)
class OptimizerConfig(Strict):
    name: str  # adam | sgd
    lr: float
    betas: tuple[float, float] = (0.9, 0.999)  # adam
    momentum: float = 0.0  # sgd
    weight_decay: float = 0.0
    lr_decay_every_rounds: int = 0  # > 0: lr x lr_decay_factor every this many rounds (step decay)
    lr_decay_factor: float = 0.5


@dataclass(frozen=True)
class ModelConfig(Strict):
    name: str  # unet | densenet | vgg16_bn (PRR-FL's paper) | vgg_slim (PRR-FL's official code)
    in_channels: int = 3
    num_classes: int = 2
    bn: str = "standard"  # standard | stateless (no running statistics)
    init_features: int = 32  # unet: widths init_features .. 16 x init_features; vgg_slim: base width (32 = official)
    growth_rate: int = 32  # densenet (defaults: DenseNet-121)
    block_config: tuple[int, ...] = (6, 12, 24, 16)
    num_init_features: int = 64


@dataclass(frozen=True)
class AggregationConfig(Strict):
    weighting: str = "uniform"  # uniform | samples
    bn_buffers: str = "average"  # average | local (BN running statistics never leave the client)


@dataclass(frozen=True)
class DataRef(Strict):
    store: str
    split: str
    synthetic: bool = False


@dataclass(frozen=True)
class RunConfig(Strict):
    # identity of the run
    task: str
    method: str
    run: str
    seed: int
    data: DataRef
    # the task
    kind: str  # segmentation | classification
    clients: tuple[str, ...]
    model: ModelConfig
    loss: str
    optimizer: OptimizerConfig
    rounds: int
    local_epochs: int
    batch_size: int
    selection_metric: str
    variant: str | None = None
    client_labels: tuple[str, ...] = ()  # default: the client names
    channels: str = "rgb"  # rgb | slices (figures show the centre slice of `slices`)
    eval_batch_size: int | None = None  # default: batch_size
    augment: str = "none"
    intensity_scale: float = 1.0
    truncate_to_smallest: bool = False
    drop_last: bool = False  # drop each epoch's last partial training batch (the official Fed-LWR RIF loader)
    aggregation: AggregationConfig = AggregationConfig()
    reset_optimizer_each_round: bool = False
    qualitative_samples: int = 4
    local_epoch_curve: bool = False  # also evaluate test after receiving and after every local epoch
    precision: str = "fp32"  # fp32 (the papers) | bf16 (autocast + channels_last; faster on GPUs)
    curve_every: int = 0  # test curves every this many rounds (0: ~50 points per run); reported test scores are always the selected models'
    selection_window: float = (
        1.0  # model selection only in the last this fraction of rounds (PRR-FL's official code: 0.2)
    )
    selection_scope: str = "auto"  # auto: per client for personalized methods, else one round by the mean; per_client | pooled: for every method (PRR-FL's tables: per_client)
    ood_clients: tuple[
        str, ...
    ] = ()  # test-only clients (e.g. skin's OOD cohort), scored at the end with the selected models
    # engine | flower-simulation (the same round loop under Flower's simulation runtime, Ray; federation/simulation.py).
    # It changes no number, and its default is left out of to_dict: an engine run's fingerprint and final.json stay as they were.
    runtime: str = "engine"
    # the method's hyperparameters (checked against its DEFAULTS when the run starts)
    method_params: dict = field(default_factory=dict)
    method_module: str | None = None  # a plug-in's module (None: built in)
    method_digest: str | None = None  # a digest of the plug-in's source (its edits re-run its jobs)

    @classmethod
    def from_dict(cls, values: dict, where: str = "run config") -> RunConfig:
        return super().from_dict(values, where)

    def to_dict(self) -> dict:
        """JSON-ready (tuples as lists): the form stored in ``final.json`` and hashed for resume."""
        values = json.loads(json.dumps(dataclasses.asdict(self)))
        if values["runtime"] == "engine":
            del values[
                "runtime"
            ]  # the default, absent: engine runs keep the fingerprint they had before the option existed
        return values

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.client_labels or self.clients

    @property
    def eval_batch(self) -> int:
        return self.eval_batch_size or self.batch_size

    def fingerprint(self) -> str:
        """Everything that can change the run's numbers, hashed (a checkpoint of another config is ignored)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _build(cls, values: dict, where: str):
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            raise unknown_key(where, key, fields)
    kwargs = {}
    for name, f in fields.items():
        if name not in values:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where}: missing required key {name!r}")
            continue
        kwargs[name] = _convert(hints[name], values[name], f"{where}.{name}")
    return cls(**kwargs)


def _convert(hint, value, where: str):
    """``value`` as the field's type; a value of another type is a ConfigError naming ``where``
    (a string is never read as a boolean or a number, a boolean never as a number)."""
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _wrong_type(where, "a list", value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)  # JSON Schema's integer admits 2.0; the run config stores 2
    expected = {bool: (bool,), int: (int,), float: (int, float), str: (str,), dict: (dict,)}.get(origin or hint)
    if expected is not None and (not isinstance(value, expected) or (hint is not bool and isinstance(value, bool))):
        raise _wrong_type(
            where,
            {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string", dict: "a mapping"}[
                origin or hint
            ],
            value,
        )
    if hint is float and not math.isfinite(
        value
    ):  # a hand-written run config's NaN / Infinity (Python's json reads both)
        raise _wrong_type(where, "a finite number", value)
    return value


def _wrong_type(where: str, expected: str, value) -> ConfigError:
    return ConfigError(f"{where}: expected {expected}, got {json.dumps(value)} ({type(value).__name__})")
