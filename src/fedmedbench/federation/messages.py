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


def _pack_state(state: dict[str, torch.Tensor]) -> tuple[ArrayRecord, bytes]:
    """A state dict as one byte Array (every tensor's bytes in order) and its index as JSON:
    [[name, dtype, shape], ...]. One Array, not one per tensor: Flower frames each Array as an
    object of its own (a header, a SHA-256 id in its parent, a protobuf message), about 240 bytes."""
    tensors = [v.detach().cpu().contiguous() for v in state.values()]
    index = [[k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in zip(state, tensors)]
    data = b"".join(t.numpy().tobytes() for t in tensors)
    # The index is compressed: a model's tensor names repeat their prefixes (a UNet's 118 names are
    # 6 kB of JSON, 5 % of a small model; about 1 kB compressed).
    return ArrayRecord({"bytes": Array(np.frombuffer(data, dtype=np.uint8))}), zlib.compress(json.dumps(index).encode(), 9)


def _unpack_state(record: ArrayRecord, index_bytes: bytes, where: str) -> dict[str, torch.Tensor]:
    try:
        index = json.loads(zlib.decompress(index_bytes))
        data = bytearray(record["bytes"].numpy().tobytes())
    except Exception as err:
        raise SiteError(f"{where}: a state whose index or bytes cannot be read ({type(err).__name__}); refused") from None
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
        out[name] = torch.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape).clone() if count else torch.empty(shape, dtype=dtype)
        offset += size
    if offset != len(data):
        raise SiteError(f"{where}: the state holds {len(data) - offset} bytes its index does not name; refused")
    return out


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
            records[ARRAYS + key], shapes[key] = _pack_state(item)
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
            out[key] = _unpack_state(records[ARRAYS + key], kind[f"shape:{key}"], where)
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
