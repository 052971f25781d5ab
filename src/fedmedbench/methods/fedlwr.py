"""Fed-LWR (Yan et al., MICCAI 2024): layer-wise re-aggregation by CKA dissimilarity to a FedAvg anchor.

Per round (paper Alg. 1; official fedlwr.py):

1. every client trains its copy of the global model (plain FedAvg client);
2. the server forms the anchor w_G = Σ_k p_k w_k (p_k: ``aggregation.weighting``, uniform as in the
   paper's Eq. 1 and the official code) and sends it to every client (``Server.query``);
3. client k measures the similarity δ_k^m between its local model and the anchor at every layer m
   (``Client.answer``), both models in eval mode;
4. ρ_k^m = (1 - c_k^m) / Σ_i (1 - c_i^m), c = clip(δ, 1e-4, 0.99) (Eq. 5 + the official clip);
5. w_G,m = Σ_k ρ_k^m w_k,m (Eq. 6) for **every** tensor of layer m, BN running statistics
   included (a layer = a hooked module: Conv2d, ConvTranspose2d, BatchNorm2d; its weight, bias and
   buffers share its ρ). ``num_batches_tracked`` takes the max. Tensors of modules that are not
   hooked (none in the UNet) get the anchor weights p_k.

How δ is measured (step 3) — the paper and the official code differ, and both are parameters:

* **paper (the defaults)**: Eq. 2-4 as printed. δ_k^m = HSIC(K,L) / sqrt(HSIC(K,K) HSIC(L,L)) with
  HSIC(K,L) = vec(K')·vec(L') / (n-1)², the **biased** HSIC of the **centred** Grams K' = HKH, L' = HLH
  of the layer's outputs over the client's **training** data [X_1 .. X_{n_k}] (Eq. 4: the n_k training
  samples of D_k): ``hsic: biased``, ``gram: dataset`` (one n_k x n_k Gram over the whole split,
  ``ops.cka.dataset_grams``, exact for any ``gram_block``), ``similarity_data: train``.
* **official code** (the ``official`` variant): the unbiased minibatch HSIC (Song et al. 2012 /
  Nguyen et al. 2021, numpee's ``hsic1``) on the **validation** loader, 5 passes, with the official
  numerics: uncentred float32 Grams, each minibatch HSIC x 1e-4, CKA = ΣKL / sqrt(max(ΣKK·ΣLL, 1e-4)
  + 1e-4), and +1e-9 in Eq. 5's denominator: ``official_numerics: true`` (which selects that
  estimator, whatever ``hsic`` and ``gram`` say), ``similarity_data: val``, ``passes: 5``. Not
  reproduced: the official RIF loader ignores the index it is given (every pass resamples the split
  with replacement; we pass over it in order), and its unbiased HSIC fails on a minibatch of n < 4
  (n = 2 raises ZeroDivisionError, n = 1 and 3 give inf/NaN), which a last partial minibatch can be (we
  merge it into the previous one, ``cka_batches``; a task ``batch_size`` < 4 is refused before training,
  ``check_minibatch_size``); ``num_batches_tracked`` is truncated from a
  weighted mean there (max here; unused by eval-mode BN with a momentum). Equal to the official code
  up to that code's own float32 noise, not bit for bit: the uncentred float32 Grams round differently
  with another summation order (an audit of the official code as is: per-layer δ up to 3.5e-2 apart;
  a transcription on the test task: up to 4e-5, ``tests/test_fedlwr_official.py``).
* other combinations are switches: ``hsic: unbiased`` (unbiased HSIC, on the data-set Grams or per
  minibatch), ``gram: minibatch`` (HSIC terms summed over minibatches of ``batch_size``, features
  centred per minibatch, sound numerics), ``similarity_data: val``, ``passes`` (minibatch passes).
  ``unbiased`` (legacy, null by default) overrides ``hsic`` when set (true: unbiased, false: biased).

Variants (paper Table 3): ``measure: cosine`` (Fed-LWR-v1: mean per-sample cosine similarity of the
flattened features instead of CKA, on the same data); ``scope: last_layer`` (Fed-LWR-v2: one weight
per client from the CKA of ``last_layer``, the last module of the UNet encoder path, applied to the
whole model). If a client's data cannot define δ (too few samples) the layers fall back to the
anchor weights (logged).

Logging (history.csv, split ``server``): per client and layer δ (``cka:<layer>``) and ρ
(``rho:<layer>``); and, at the first and last rounds (and every ``pairwise_every`` rounds if > 0), the
quantity of the paper's Fig. 1(b), the CKA between **pairs of local models**: client k measures, on
its own similarity data and with the same estimator, CKA(w_k, w_j) to every other client's local
model (the server sends them in the query; a diagnostic, not part of the method), logged as
``pair_cka:<client j>:<layer>`` on client k's row (``log_pairwise``).
"""

from __future__ import annotations

import copy
import logging

import numpy as np

from fedmedbench.errors import ConfigError
from fedmedbench.fl import client, server
from fedmedbench.fl.data import to_tensors
from fedmedbench.ops.aggregate import aggregation_weights, layer_of_keys, layerwise_weighted_average, weighted_average
from fedmedbench.ops.cka import (
    MIN_SAMPLES,
    cka_batches,
    cka_from_grams,
    dataset_grams,
    hooked_layers,
    layerwise_cka_weights,
    layerwise_similarity,
)

log = logging.getLogger("fedmedbench.fedlwr")

DEFAULTS = {
    "measure": "cka",  # cka | cosine (Fed-LWR-v1)
    "scope": "layerwise",  # layerwise | last_layer (Fed-LWR-v2)
    "last_layer": "bottleneck.4",  # the module whose CKA weights the whole model with scope last_layer
    "hsic": "biased",  # biased (Eq. 2: vec(K')·vec(L')/(n-1)² of centred Grams) | unbiased (the official hsic1)
    "gram": "dataset",  # dataset (one Gram over the whole split, Eq. 2-4) | minibatch (HSIC summed over minibatches)
    "similarity_data": "train",  # train (Eq. 4: the client's n_k training samples) | val (the official code)
    "passes": 1,  # passes over the data with gram: minibatch (the official code: 5)
    "official_numerics": False,  # true: the official estimator and numerics (see the module docstring)
    "unbiased": None,  # legacy switch: when set, overrides hsic (true: unbiased, false: biased)
    "gram_block": 32,  # gram: dataset: samples whose outputs are held at once (memory vs passes; exact either way)
    "clip_low": 1.0e-4,
    "clip_high": 0.99,
    "log_layers": True,  # per-client per-layer δ and ρ in history.csv
    "log_pairwise": True,  # Fig. 1(b): CKA between pairs of local models, first and last rounds
    "pairwise_every": 0,  # > 0: also every this many rounds
}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "measure": {"enum": ["cka", "cosine"]},
    "scope": {"enum": ["layerwise", "last_layer"]},
    "hsic": {"enum": ["biased", "unbiased"]},
    "gram": {"enum": ["dataset", "minibatch"]},
    "similarity_data": {"enum": ["train", "val"]},
    "passes": {"type": "integer", "minimum": 1},
    "unbiased": {"type": ["boolean", "null"]},
    "gram_block": {"type": "integer", "minimum": 1},
    "clip_low": {"type": "number", "minimum": 0, "maximum": 1},
    "clip_high": {"type": "number", "minimum": 0, "maximum": 1},
    "pairwise_every": {"type": "integer", "minimum": 0},
}
PERSONALIZED = False
OFFICIAL_RHO_EPS = 1e-9  # the official code's term in Eq. 5's denominator


def compared_layers(model, params: dict) -> list[str]:
    if params["scope"] == "last_layer":
        return [params["last_layer"]]
    if params["scope"] != "layerwise":
        raise ValueError(f"fedlwr: scope must be 'layerwise' or 'last_layer', got {params['scope']!r}")
    return hooked_layers(model)


def check_minibatch_size(params: dict, batch_size: int, task: str) -> None:
    """Refuse, before any training, a minibatch CKA whose minibatches are too small to define it.

    The unbiased HSIC divides by n(n - 3) and n - 2: in the official code a minibatch of n = 2 raises
    ZeroDivisionError and n = 1 or 3 gives inf/NaN. Ours would leave every such minibatch out of the
    sum (all but a merged last one), so δ would rest on almost no data; a task batch of >= 4 is needed."""
    minibatch = params["measure"] == "cka" and (params["official_numerics"] or params["gram"] == "minibatch")
    if minibatch and batch_size < MIN_SAMPLES:
        estimator = "official_numerics: true" if params["official_numerics"] else "gram: minibatch"
        raise ConfigError(
            f"tasks.{task}.batch_size: fedlwr's minibatch CKA ({estimator}) needs batches of at least "
            f"{MIN_SAMPLES} samples (the unbiased HSIC divides by n(n-3) and n-2), got {batch_size}"
        )


def unbiased_hsic(params: dict) -> bool:
    """The HSIC in use: the legacy ``unbiased`` switch when set, else ``hsic``."""
    return params["unbiased"] if params["unbiased"] is not None else params["hsic"] == "unbiased"


def pairwise_round(params: dict, round_index: int, rounds: int) -> bool:
    every = params["pairwise_every"]
    return params["log_pairwise"] and (round_index in (1, rounds) or (every > 0 and round_index % every == 0))


class Client(client.Client):
    def __init__(self, cfg, index, data, model, generator, device):
        super().__init__(cfg, index, data, model, generator, device)
        # The model compared with this client's: the anchor, then (Fig. 1b rounds) each peer in turn.
        self.other_model = copy.deepcopy(self.model).eval()
        self.other_model.requires_grad_(False)
        self.layers = compared_layers(self.model, self.params)

    def similarity_split(self):
        return self.data.train if self.params["similarity_data"] == "train" else self.data.val

    def load(self, start: int, stop: int):
        x, _ = to_tensors(self.similarity_split(), np.arange(start, stop), self.cfg.intensity_scale)
        return x.to(self.device)

    def minibatches(self):
        """``passes`` passes over the similarity split in minibatches of ``batch_size`` (a last one
        with < 4 samples merged into the previous one)."""
        for _ in range(self.params["passes"]):
            for idx in cka_batches(len(self.similarity_split()), self.cfg.batch_size):
                yield self.load(idx.start, idx.stop)

    def grams(self, model):
        return dataset_grams(
            model, self.load, len(self.similarity_split()), self.layers, self.cfg.batch_size, self.params["gram_block"]
        )

    def similarity(self, other, own_grams=None) -> dict[str, float]:
        """δ per layer between this client's model and ``other`` (see the module docstring)."""
        p = self.params
        if p["measure"] == "cka" and not p["official_numerics"] and p["gram"] == "dataset":
            own = own_grams if own_grams is not None else self.grams(self.model)
            theirs = self.grams(other)
            return {layer: cka_from_grams(theirs[layer], own[layer], unbiased_hsic(p)) for layer in self.layers}
        options = {}
        if p["measure"] == "cka":
            options = {"official": True} if p["official_numerics"] else {"unbiased": unbiased_hsic(p)}
        similarity, skipped = layerwise_similarity(
            other, self.model, self.minibatches(), p["measure"], self.layers, **options
        )
        if skipped:
            log.warning("client %s: %d minibatch(es) with fewer than 4 samples left out of the CKA", self.name, skipped)
        return similarity

    def answer(self, query):
        """δ_k^m to the anchor; on Fig. 1(b) rounds also the CKA to every peer's local model."""
        p = self.params
        dataset = p["measure"] == "cka" and not p["official_numerics"] and p["gram"] == "dataset"
        own = self.grams(self.model) if dataset else None  # this model's Grams serve every comparison
        self.other_model.load_state_dict(query["anchor"])
        out = {"similarity": self.similarity(self.other_model, own)}
        if query.get("peers"):
            out["pairwise"] = {}
            for peer, state in query["peers"].items():
                self.other_model.load_state_dict(state)
                out["pairwise"][peer] = self.similarity(self.other_model, own)
        return out


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        check_minibatch_size(self.params, cfg.batch_size, cfg.task)
        self.layers = compared_layers(model, self.params)
        self.layer_of_key = layer_of_keys(self.global_state)
        self.last_log: dict[int, dict[str, float]] = {}

    def query(self, round_index, replies):
        self.anchor_weights = aggregation_weights([r["num_samples"] for r in replies], self.cfg.aggregation.weighting)
        self.keys = sorted(set.intersection(*(set(r["state"]) for r in replies)))
        anchor = weighted_average([r["state"] for r in replies], self.anchor_weights, self.keys)
        if not pairwise_round(self.params, round_index, self.cfg.rounds):
            return [{"anchor": anchor}] * len(replies)
        names = self.cfg.clients
        return [
            {"anchor": anchor, "peers": {names[j]: r["state"] for j, r in enumerate(replies) if j != k}}
            for k in range(len(replies))
        ]

    def aggregate(self, round_index, replies):
        similarities = [r["answer"]["similarity"] for r in replies]
        eps = OFFICIAL_RHO_EPS if self.params["official_numerics"] else 0.0
        rho = layerwise_cka_weights(similarities, (self.params["clip_low"], self.params["clip_high"]), eps)
        missing = [layer for layer in self.layers if layer not in rho]
        if missing:
            log.warning(
                "round %d: no similarity for %d layer(s) (e.g. %s): anchor weights used there",
                round_index,
                len(missing),
                missing[0],
            )
        states = [r["state"] for r in replies]
        if self.params["scope"] == "last_layer":
            per_client = rho.get(self.params["last_layer"], self.anchor_weights)
            new = layerwise_weighted_average(states, {}, {}, self.keys, default_weights=per_client)
            rho = {self.params["last_layer"]: per_client}
        else:
            new = layerwise_weighted_average(
                states, rho, self.layer_of_key, self.keys, default_weights=self.anchor_weights
            )
        self.global_state.update(new)
        self.last_log = {}
        for k in range(len(replies)):
            entry = {}
            if self.params["log_layers"]:
                entry.update({f"cka:{layer}": similarities[k][layer] for layer in self.layers})
                entry.update({f"rho:{layer}": weights[k] for layer, weights in rho.items()})
            entry["rho_mean"] = (
                float(np.mean([weights[k] for weights in rho.values()])) if rho else self.anchor_weights[k]
            )
            for peer, values in replies[k]["answer"].get("pairwise", {}).items():
                entry.update({f"pair_cka:{peer}:{layer}": values[layer] for layer in self.layers})
            self.last_log[k] = entry

    def round_log(self, round_index):
        return self.last_log


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
