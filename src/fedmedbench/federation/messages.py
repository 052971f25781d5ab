"""What travels between the ServerApp and the ClientApps: a method's packages, replies, queries and
answers as Flower records, losslessly.

A payload is any value a method's ``Server.package`` / ``Client.reply`` / ``Server.query`` /
``Client.answer`` returns. A dict's entries become: a dict of tensors (a state dict) an
``ArrayRecord`` holding one ``Array`` of all its tensors' bytes, concatenated (bit for bit; the
names, dtypes and shapes ride in the "kind" record: one Array per tensor cost about 240 bytes of
Flower framing each, 22 % of a small model's bytes, benchmarks/bench_federation.py), an int or float a
``MetricRecord`` entry, a dict of named floats (scores) a ``MetricRecord`` of its own (Python floats are doubles on the wire: exact), anything else (None, strings,
lists, nested dicts, a bf16 tensor numpy cannot hold) ``torch.save`` bytes in a ``ConfigRecord``,
read back with ``torch.load(weights_only=True)``, which refuses code a site might smuggle in.
"""

from __future__ import annotations

import io
import json
import math
import zlib
from collections import OrderedDict

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedmedbench.fl.rounds import SiteError

KIND, METRICS, BLOBS, ARRAYS, SCORES, TENSORS = "kind", "m", "b", "a:", "s:", "t:"
# Where a tensor was in a nested payload (its bytes travel in the entry's "t:" ArrayRecord).
_TENSOR_MARK = "__fedmedbench_tensor__"


def _extract(value, tensors: list):
    """``value`` with every dense tensor in its dicts, lists and tuples replaced by a marker
    (``(_TENSOR_MARK, index into tensors)``); ``tensors`` collects them. torch.save of many small
    tensors costs about 1 kB of zip framing each (Fed-LWR's peer models: 13 % over their bytes)."""
    if isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.is_quantized:
        tensors.append(value)
        return (_TENSOR_MARK, len(tensors) - 1)
    if type(value) in (dict, OrderedDict):
        return type(value)((k, _extract(v, tensors)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_extract(v, tensors) for v in value)
    return value


def _insert(value, tensors: list, where: str):
    if type(value) is tuple and len(value) == 2 and value[0] == _TENSOR_MARK:
        if not isinstance(value[1], int) or not 0 <= value[1] < len(tensors):
            raise SiteError(f"{where}: a payload names tensor {value[1]!r}, which it does not carry; refused")
        return tensors[value[1]]
    if type(value) in (dict, OrderedDict):
        return type(value)((k, _insert(v, tensors, where)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_insert(v, tensors, where) for v in value)
    return value


def _blob(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _unblob(data: bytes, where: str):
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as err:  # an unpicklable or unsafe payload: one line naming where it came from
        raise SiteError(
            f"{where}: a payload that is not plain tensors and values was refused ({type(err).__name__})"
        ) from None


def _pack_state(state: dict[str, torch.Tensor]) -> tuple[ArrayRecord, bytes]:
    """A state dict as one byte Array (every tensor's bytes in order) and its index as JSON:
    [[name, dtype, shape], ...]. One Array, not one per tensor: Flower frames each Array as an
    object of its own (a header, a SHA-256 id in its parent, a protobuf message), about 240 bytes."""
    tensors = [v.detach().cpu().contiguous() for v in state.values()]
    index = [[k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in zip(state, tensors)]
    data = b"".join(t.reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors)  # any dtype, bf16 included
    # The index is compressed: a model's tensor names repeat their prefixes (a UNet's 118 names are
    # 6 kB of JSON, 5 % of a small model; about 1 kB compressed).
    return ArrayRecord({"bytes": Array(np.frombuffer(data, dtype=np.uint8))}), zlib.compress(
        json.dumps(index).encode(), 9
    )


def _unpack_state(record: ArrayRecord, index_bytes: bytes, where: str) -> dict[str, torch.Tensor]:
    try:
        index = json.loads(zlib.decompress(index_bytes))
        data = bytearray(record["bytes"].numpy().tobytes())
    except Exception as err:
        raise SiteError(
            f"{where}: a state whose index or bytes cannot be read ({type(err).__name__}); refused"
        ) from None
    out, offset = {}, 0
    for name, dtype_name, shape in index:
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise SiteError(f"{where}: tensor {name!r} has an unknown dtype {dtype_name!r}; refused")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise SiteError(f"{where}: tensor {name!r} has an invalid shape {shape!r}; refused")
        count = math.prod(shape)
        size = count * torch.empty((), dtype=dtype).element_size()
        if offset + size > len(data):
            raise SiteError(f"{where}: the state's bytes end before tensor {name!r}; refused")
        # A copy: each tensor gets its own aligned storage (an offset in the shared buffer need not be).
        out[name] = (
            torch.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape).clone()
            if count
            else torch.empty(shape, dtype=dtype)
        )
        offset += size
    if offset != len(data):
        raise SiteError(f"{where}: the state holds {len(data) - offset} bytes its index does not name; refused")
    return out


def _is_state(value) -> bool:
    return (
        isinstance(value, dict)
        and bool(value)
        and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) and v.dtype != torch.bfloat16 for k, v in value.items()
        )
    )


def pack(value, **config) -> RecordDict:
    """``value`` as a RecordDict; ``config`` (str/int/float/bool/bytes) rides along in ConfigRecord "c"."""
    records = RecordDict({"c": ConfigRecord(dict(config))})
    if not isinstance(value, dict):
        records[KIND] = ConfigRecord({"kind": "blob", "value": _blob(value)})
        return records
    metrics, blobs, shapes = {}, {}, {}
    for key, item in value.items():
        if _is_state(item):
            records[ARRAYS + key], shapes[key] = _pack_state(item)
        elif isinstance(item, dict) and item and all(isinstance(k, str) and type(v) is float for k, v in item.items()):
            records[SCORES + key] = MetricRecord(item)  # scores: metric name -> value
        elif type(item) in (int, float):
            metrics[key] = item
        else:
            tensors: list = []
            blobs[key] = _blob(_extract(item, tensors))
            if tensors:
                records[TENSORS + key], shapes[f"tensors:{key}"] = _pack_state(
                    {str(i): t for i, t in enumerate(tensors)}
                )
    records[KIND] = ConfigRecord(
        {
            "kind": "dict",
            "order": list(value),
            "types": [type(value[k]).__name__ for k in value],
            **{k if k.startswith("tensors:") else f"shape:{k}": v for k, v in shapes.items()},
        }
    )
    records[METRICS] = MetricRecord(metrics)
    records[BLOBS] = ConfigRecord(blobs)
    return records


def unpack(records: RecordDict, where: str):
    """The value ``pack`` packed; ``where`` names the sender in an error."""
    try:
        kind = records[KIND]
    except KeyError:
        raise SiteError(f"{where}: a message without fedmedbench's payload (another app on this federation?)") from None
    if kind["kind"] == "blob":
        return _unblob(kind["value"], where)
    out = {}
    types = dict(zip(kind["order"], kind["types"]))
    for key in kind["order"]:
        if ARRAYS + key in records:
            out[key] = _unpack_state(records[ARRAYS + key], kind[f"shape:{key}"], where)
        elif SCORES + key in records:
            out[key] = {k: float(v) for k, v in records[SCORES + key].items()}
        elif key in records[METRICS]:
            number = records[METRICS][key]
            out[key] = int(number) if types[key] == "int" else float(number)
        elif key in records[BLOBS]:
            out[key] = _unblob(records[BLOBS][key], where)
            if TENSORS + key in records:
                tensors = list(_unpack_state(records[TENSORS + key], kind[f"tensors:{key}"], where).values())
                out[key] = _insert(out[key], tensors, where)
        else:
            raise SiteError(f"{where}: the payload lists {key!r} but does not carry it")
    return out


def config_of(records: RecordDict) -> ConfigRecord:
    return records["c"]


# A method's reply entries that are model-shaped: tensors named as the global model's, of its shapes
# and dtypes (a full or partial state, e.g. FedBN's without the BN tensors, or CGSV's update).
MODEL_ENTRIES = ("state", "update")


def tensors_in(value, path: str = ""):
    """(path, tensor) for every tensor anywhere in ``value`` (nested dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from tensors_in(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from tensors_in(item, f"{path}[{index}]")


def check_finite_payload(where: str, value) -> None:
    """No NaN or inf in any tensor of a payload (a method's deputies, amplitudes, answers...)."""
    for path, tensor in tensors_in(value):
        if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
            raise SiteError(f"{where}: tensor {path!r} is not finite (NaN or inf); refused")


def check_model(
    where: str, state, reference: dict[str, torch.Tensor], entry: str = "state", own_keys: bool = False
) -> None:
    """``state``: tensors of the global model's keys, shapes and dtypes (a subset of them), finite.
    ``own_keys``: the site's evaluated model may hold tensors of its own (HarmoFL's amplitude, MOON's
    head): only those it shares with the global model are compared."""
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise SiteError(f"{where}: {entry!r} is not a dict of named tensors; refused")
    for key, tensor in state.items():
        if key not in reference:
            if own_keys:
                continue
            raise SiteError(f"{where}: the reply holds tensor {key!r}, which the global model has not; refused")
        if tuple(tensor.shape) != tuple(reference[key].shape) or tensor.dtype != reference[key].dtype:
            raise SiteError(
                f"{where}: tensor {key!r} is {tuple(tensor.shape)} {tensor.dtype}, the global model's is {tuple(reference[key].shape)} {reference[key].dtype}; refused"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise SiteError(f"{where}: tensor {key!r} is not finite (NaN or inf); refused")


def check_reply(where: str, reply, reference: dict[str, torch.Tensor] | None) -> None:
    """A site's training reply: a dict; its model-shaped entries (``state``, ``update``) hold tensors
    of the global model's keys, shapes and dtypes (``reference``; None: the method sends no state at
    round 0, nothing to compare with); every tensor anywhere in it finite; a positive integer
    ``num_samples`` beside a model (the aggregation weight). Else one line naming ``where``."""
    if not isinstance(reply, dict):
        raise SiteError(
            f"{where}: the reply is not a model update (a dict of named values, got {type(reply).__name__}); refused"
        )
    models = [key for key in MODEL_ENTRIES if key in reply]
    for key in models:
        if reference is None:
            check_finite_payload(where, {key: reply[key]})
        else:
            check_model(where, reply[key], reference, key)
    check_finite_payload(where, reply)
    if models or "num_samples" in reply:
        samples = reply.get("num_samples")
        if type(samples) is not int or samples < 1:
            raise SiteError(f"{where}: num_samples {samples!r} is not a positive integer; refused")


def signature(value):
    """The shape of a payload, not its numbers: dict keys, tensor shapes and dtypes, value types."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), signature(v)) for k, v in value.items())))
    return (type(value).__name__,)


def _difference(a, b, path: str) -> str:
    """The first place where payload ``a`` differs in shape from ``b``, in words."""
    where = f"{path!r}" if path else "the payload"
    if isinstance(a, dict) and isinstance(b, dict):
        extra, missing = sorted(set(map(str, a)) - set(map(str, b))), sorted(set(map(str, b)) - set(map(str, a)))
        if extra or missing:
            return f"{where} has " + "; ".join(
                part
                for part in (f"extra key(s) {extra}" if extra else "", f"no key(s) {missing}" if missing else "")
                if part
            )
        for key in a:
            if signature(a[key]) != signature(b[key]):
                return _difference(a[key], b[key], f"{path}.{key}" if path else str(key))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return f"{where} is {tuple(a.shape)} {a.dtype}, not {tuple(b.shape)} {b.dtype}"
    return f"{where} is a {type(a).__name__}, not a {type(b).__name__}"


def check_same_shape(step: str, payloads: dict[str, object]) -> None:
    """Every site runs the same method, so its payloads have one shape (keys, tensor shapes and
    dtypes, types): the site(s) that differ from the others are refused by name. With no majority
    (e.g. two sites that differ) both are named."""
    signatures = {name: signature(value) for name, value in payloads.items()}
    counts: dict = {}
    for sig in signatures.values():
        counts[sig] = counts.get(sig, 0) + 1
    if len(counts) <= 1:
        return
    common, count = max(counts.items(), key=lambda item: item[1])
    names = list(payloads)
    if count * 2 > len(names):
        odd = next(n for n in names if signatures[n] != common)
        model = next(n for n in names if signatures[n] == common)
        raise SiteError(
            f"{step}: site {odd}: its reply differs in shape from the other sites': {_difference(payloads[odd], payloads[model], '')}; refused"
        )
    first, other = names[0], next(n for n in names if signatures[n] != signatures[names[0]])
    raise SiteError(
        f"{step}: sites {first} and {other} send replies of different shapes ({first}: {_difference(payloads[first], payloads[other], '')}); refused"
    )


def check_scores(where: str, scores) -> None:
    if (
        not isinstance(scores, dict)
        or not scores
        or not all(isinstance(k, str) and type(v) is float for k, v in scores.items())
    ):
        raise SiteError(f"{where}: the scores are not a dict of named numbers; refused")
    if any(math.isinf(v) for v in scores.values()):
        raise SiteError(f"{where}: an infinite score; refused")


def check_evaluation(where: str, value, with_test: bool) -> None:
    """An ``evaluate`` reply: {"val": scores, "test": scores on curve rounds, else None}."""
    if not isinstance(value, dict) or set(value) != {"val", "test"}:
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise SiteError(f"{where}: the evaluation reply is not {{'val', 'test'}} (got {keys}); refused")
    check_scores(f"{where} val", value["val"])
    if with_test:
        check_scores(f"{where} test", value["test"])
    elif value["test"] is not None:
        raise SiteError(f"{where}: test scores sent on a round without test evaluation; refused")


FINAL_KEYS = {"test", "flags", "counts", "model", "predictions", "round"}
WITHHOLDABLE = ("model", "predictions")  # what a site may keep to itself (node config share-model / share-predictions)


def check_final(where: str, value, reference: dict[str, torch.Tensor] | None, rounds: int) -> list[str]:
    """A ``final`` reply: the kept model's test scores, flags and class counts, the round it was kept
    at, and the model and qualitative predictions unless the site withheld them (listed in
    ``withheld``). Returns what the site withheld."""
    if not isinstance(value, dict):
        raise SiteError(f"{where}: the final reply is not a dict (got {type(value).__name__}); refused")
    withheld = value.get("withheld", [])
    if not isinstance(withheld, list) or not set(withheld) <= set(WITHHOLDABLE):
        raise SiteError(f"{where}: 'withheld' {withheld!r} is not a list of {list(WITHHOLDABLE)}; refused")
    expected = (FINAL_KEYS - set(withheld)) | ({"withheld"} if "withheld" in value else set())
    if set(value) != expected:
        extra, missing = sorted(set(value) - expected), sorted(expected - set(value))
        raise SiteError(f"{where}: the final reply has extra key(s) {extra} / lacks {missing}; refused")
    check_scores(f"{where} test", value["test"])
    if type(value["round"]) is not int or not 1 <= value["round"] <= rounds:
        raise SiteError(f"{where}: kept round {value['round']!r} is not a round of this run (1..{rounds}); refused")
    if "model" in value and reference is not None:
        check_model(where, value["model"], reference, "model", own_keys=True)
    if "predictions" in value and not (
        isinstance(value["predictions"], dict)
        and all(isinstance(v, torch.Tensor) for v in value["predictions"].values())
    ):
        raise SiteError(f"{where}: the predictions are not a dict of named tensors; refused")
    check_finite_payload(where, {k: value[k] for k in ("model",) if k in value})
    return list(withheld)


OOD_KEYS = {"mean", "ensemble", "per_model"}


def check_ood(where: str, value, sites: list[str]) -> None:
    """A test-only cohort's ``ood`` reply (``evaluation.score_cohort``): the scores of every site's
    model (``per_model``, one entry per site of the run), their ``mean`` and the ``ensemble``'s, and
    ``flags`` where a score measures no model (a dict of {kind: why} dicts)."""
    flags = value.get("flags", {}) if isinstance(value, dict) else {}
    if not (
        isinstance(flags, dict)
        and set(flags) <= {"ensemble", "per_model"}
        and all(isinstance(v, dict) for v in flags.values())
    ):
        raise SiteError(
            f"{where}: the reply's flags {flags!r} are not {{'ensemble': {{kind: why}}, 'per_model': {{site: {{kind: why}}}}}}; refused"
        )
    if isinstance(value, dict) and "flags" in value:
        value = {k: v for k, v in value.items() if k != "flags"}
    if not isinstance(value, dict) or set(value) != OOD_KEYS:
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise SiteError(f"{where}: the reply is not {sorted(OOD_KEYS)} (got {keys}); refused")
    check_scores(f"{where} mean", value["mean"])
    check_scores(f"{where} ensemble", value["ensemble"])
    per_model = value["per_model"]
    if not isinstance(per_model, dict) or sorted(per_model) != sorted(sites):
        got = sorted(per_model) if isinstance(per_model, dict) else type(per_model).__name__
        raise SiteError(f"{where}: per_model scores sites {got}, the run's sites are {sorted(sites)}; refused")
    for site in sites:
        check_scores(f"{where} per_model {site}", per_model[site])
