"""What travels between the ServerApp and the ClientApps: a method's packages, replies, queries and
answers as Flower records, losslessly.

A payload is any value a method's ``Server.package`` / ``Client.reply`` / ``Server.query`` /
``Client.answer`` returns. A dict's entries become: a dict of tensors (a state dict) an
``ArrayRecord`` (each tensor an ``Array`` of its own dtype and shape: bit for bit), an int or float a
``MetricRecord`` entry, a dict of named floats (scores) a ``MetricRecord`` of its own (Python floats are doubles on the wire: exact), anything else (None, strings,
lists, nested dicts, a bf16 tensor numpy cannot hold) ``torch.save`` bytes in a ``ConfigRecord``,
read back with ``torch.load(weights_only=True)``, which refuses code a site might smuggle in.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedmedbench.fl.transport import SiteError

KIND, METRICS, BLOBS, ARRAYS, SCORES = "kind", "m", "b", "a:", "s:"


def _blob(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _unblob(data: bytes, where: str):
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as err:  # an unpicklable or unsafe payload: one line naming where it came from
        raise SiteError(f"{where}: a payload that is not plain tensors and values was refused ({type(err).__name__})") from None


def _is_state(value) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(k, str) and isinstance(v, torch.Tensor) and v.dtype != torch.bfloat16 for k, v in value.items())


def pack(value, **config) -> RecordDict:
    """``value`` as a RecordDict; ``config`` (str/int/float/bool/bytes) rides along in ConfigRecord "c"."""
    records = RecordDict({"c": ConfigRecord(dict(config))})
    if not isinstance(value, dict):
        records[KIND] = ConfigRecord({"kind": "blob", "value": _blob(value)})
        return records
    metrics, blobs, shapes = {}, {}, {}
    for key, item in value.items():
        if _is_state(item):
            records[ARRAYS + key] = ArrayRecord({k: Array(np.ascontiguousarray(v.detach().cpu().numpy())) for k, v in item.items()})
            # Flower's Array stores a 0-d tensor (BatchNorm's num_batches_tracked) as shape (1,): the shapes ride along.
            shapes[key] = json.dumps({k: list(v.shape) for k, v in item.items()})
        elif isinstance(item, dict) and item and all(isinstance(k, str) and type(v) is float for k, v in item.items()):
            records[SCORES + key] = MetricRecord(item)  # scores: metric name -> value
        elif type(item) in (int, float):
            metrics[key] = item
        else:
            blobs[key] = _blob(item)
    records[KIND] = ConfigRecord({"kind": "dict", "order": list(value), "types": [type(value[k]).__name__ for k in value], **{f"shape:{k}": v for k, v in shapes.items()}})
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
            shapes = json.loads(kind[f"shape:{key}"])
            out[key] = {k: torch.from_numpy(a.numpy().copy()).reshape(shapes[k]) for k, a in records[ARRAYS + key].items()}
        elif SCORES + key in records:
            out[key] = {k: float(v) for k, v in records[SCORES + key].items()}
        elif key in records[METRICS]:
            number = records[METRICS][key]
            out[key] = int(number) if types[key] == "int" else float(number)
        elif key in records[BLOBS]:
            out[key] = _unblob(records[BLOBS][key], where)
        else:
            raise SiteError(f"{where}: the payload lists {key!r} but does not carry it")
    return out


def config_of(records: RecordDict) -> ConfigRecord:
    return records["c"]


def check_reply(where: str, reply, reference: dict[str, torch.Tensor]) -> None:
    """A site's training reply must be a dict whose ``state`` holds tensors of the global model's
    keys, shapes and dtypes, all finite, and a positive ``num_samples``: else one line naming it."""
    if not isinstance(reply, dict) or not isinstance(reply.get("state"), dict):
        raise SiteError(f"{where}: the reply is not a model update (no 'state' of tensors); refused")
    for key, tensor in reply["state"].items():
        if key not in reference:
            raise SiteError(f"{where}: the reply holds tensor {key!r}, which the global model has not; refused")
        if tuple(tensor.shape) != tuple(reference[key].shape) or tensor.dtype != reference[key].dtype:
            raise SiteError(f"{where}: tensor {key!r} is {tuple(tensor.shape)} {tensor.dtype}, the global model's is {tuple(reference[key].shape)} {reference[key].dtype}; refused")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise SiteError(f"{where}: tensor {key!r} is not finite (NaN or inf); refused")
    samples = reply.get("num_samples")
    if not isinstance(samples, int) or samples < 1:
        raise SiteError(f"{where}: num_samples {samples!r} is not a positive integer; refused")


def check_scores(where: str, scores) -> None:
    if not isinstance(scores, dict) or not all(isinstance(k, str) and isinstance(v, float) for k, v in scores.items()):
        raise SiteError(f"{where}: the scores are not a dict of named numbers; refused")
    if any(math.isinf(v) for v in scores.values()):
        raise SiteError(f"{where}: an infinite score; refused")
