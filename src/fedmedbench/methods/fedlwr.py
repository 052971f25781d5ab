"""Fed-LWR (Yan et al., MICCAI 2024): layer-wise re-aggregation by CKA dissimilarity to a FedAvg anchor.

Per round (paper Alg. 1; official fedlwr.py):

1. every client trains its copy of the global model (plain FedAvg client);
2. the server forms the anchor w_G = Σ_k p_k w_k (p_k: ``aggregation.weighting``, uniform as in the
   official code) and sends it to every client (``Server.query``);
3. client k measures, on its **validation** split, the similarity δ_k^m between its local model and
   the anchor at every layer m (``Client.answer``): linear minibatch CKA with the unbiased HSIC,
   Grams formed in forward hooks in one pass (``ops/cka.py``); both models in eval mode;
4. ρ_k^m = (1 - c_k^m) / Σ_i (1 - c_i^m), c = clip(δ, 1e-4, 0.99) (Eq. 5 + the official clip);
5. w_G,m = Σ_k ρ_k^m w_k,m (Eq. 6) for **every** tensor of layer m, BN running statistics
   included (a layer = a hooked module: Conv2d, ConvTranspose2d, BatchNorm2d; its weight, bias and
   buffers share its ρ). ``num_batches_tracked`` takes the max. Tensors of modules that are not
   hooked (none in the UNet) get the anchor weights p_k.

Variants (paper Table 3): ``measure: cosine`` (Fed-LWR-v1: mean per-sample cosine similarity of the
flattened features instead of CKA); ``scope: last_layer`` (Fed-LWR-v2: one weight per client from
the CKA of ``last_layer``, the last module of the UNet encoder path, applied to the whole model).
``official_numerics: true`` uses the official CKA numerics (uncentred float32 Grams, ε-scaled clip),
for comparison only. If a client's validation split has fewer than 4 samples its CKA is NaN and the
affected layers fall back to the anchor weights (logged).

Per-client, per-layer δ and ρ go to history.csv (split ``server``, metrics ``cka:<layer>`` /
``rho:<layer>``): they are the data of the paper's Fig. 1(b).
"""

from __future__ import annotations

import copy
import logging

import numpy as np

from fedmedbench.fl import client, server
from fedmedbench.fl.data import to_tensors
from fedmedbench.ops.aggregate import aggregation_weights, layer_of_keys, layerwise_weighted_average, weighted_average
from fedmedbench.ops.cka import cka_batches, hooked_layers, layerwise_cka_weights, layerwise_similarity

log = logging.getLogger("fedmedbench.fedlwr")

DEFAULTS = {
    "measure": "cka",  # cka | cosine (Fed-LWR-v1)
    "scope": "layerwise",  # layerwise | last_layer (Fed-LWR-v2)
    "last_layer": "bottleneck.4",  # the module whose CKA weights the whole model with scope last_layer
    "unbiased": True,  # unbiased HSIC (paper, official code); false: biased HSIC
    "official_numerics": False,  # true: uncentred float32 Grams and the official ε-scaled clip
    "clip_low": 1.0e-4,
    "clip_high": 0.99,
    "log_layers": True,  # per-client per-layer δ and ρ in history.csv (Fig. 1b)
}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "measure": {"enum": ["cka", "cosine"]},
    "scope": {"enum": ["layerwise", "last_layer"]},
    "clip_low": {"type": "number", "minimum": 0, "maximum": 1},
    "clip_high": {"type": "number", "minimum": 0, "maximum": 1},
}
PERSONALIZED = False


def compared_layers(model, params: dict) -> list[str]:
    if params["scope"] == "last_layer":
        return [params["last_layer"]]
    if params["scope"] != "layerwise":
        raise ValueError(f"fedlwr: scope must be 'layerwise' or 'last_layer', got {params['scope']!r}")
    return hooked_layers(model)


class Client(client.Client):
    def __init__(self, cfg, index, data, model, generator, device):
        super().__init__(cfg, index, data, model, generator, device)
        self.anchor_model = copy.deepcopy(self.model).eval()
        self.anchor_model.requires_grad_(False)
        self.layers = compared_layers(self.model, self.params)

    def validation_batches(self):
        split = self.data.val
        for idx in cka_batches(len(split), self.cfg.batch_size):
            x, _ = to_tensors(split, np.arange(idx.start, idx.stop), self.cfg.intensity_scale)
            yield x.to(self.device)

    def answer(self, query):
        """δ_k^m: similarity of this client's trained model to the anchor, per layer, on its val split."""
        self.anchor_model.load_state_dict(query["anchor"])
        options = {"unbiased": self.params["unbiased"], "official": self.params["official_numerics"]} if self.params["measure"] == "cka" else {}
        similarity, skipped = layerwise_similarity(self.anchor_model, self.model, self.validation_batches(), self.params["measure"], self.layers, **options)
        if skipped:
            log.warning("client %s: %d validation minibatch(es) with fewer than 4 samples left out of the CKA", self.name, skipped)
        return {"similarity": similarity}


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.layers = compared_layers(model, self.params)
        self.layer_of_key = layer_of_keys(self.global_state)
        self.last_log: dict[int, dict[str, float]] = {}

    def query(self, round_index, replies):
        self.anchor_weights = aggregation_weights([r["num_samples"] for r in replies], self.cfg.aggregation.weighting)
        self.keys = sorted(set.intersection(*(set(r["state"]) for r in replies)))
        anchor = weighted_average([r["state"] for r in replies], self.anchor_weights, self.keys)
        return [{"anchor": anchor}] * len(replies)

    def aggregate(self, round_index, replies):
        similarities = [r["answer"]["similarity"] for r in replies]
        rho = layerwise_cka_weights(similarities, (self.params["clip_low"], self.params["clip_high"]))
        missing = [layer for layer in self.layers if layer not in rho]
        if missing:
            log.warning("round %d: no similarity for %d layer(s) (e.g. %s): anchor weights used there", round_index, len(missing), missing[0])
        states = [r["state"] for r in replies]
        if self.params["scope"] == "last_layer":
            per_client = rho.get(self.params["last_layer"], self.anchor_weights)
            new = layerwise_weighted_average(states, {}, {}, self.keys, default_weights=per_client)
            rho = {self.params["last_layer"]: per_client}
        else:
            new = layerwise_weighted_average(states, rho, self.layer_of_key, self.keys, default_weights=self.anchor_weights)
        self.global_state.update(new)
        self.last_log = {}
        for k in range(len(replies)):
            entry = {}
            if self.params["log_layers"]:
                entry.update({f"cka:{layer}": similarities[k][layer] for layer in self.layers})
                entry.update({f"rho:{layer}": weights[k] for layer, weights in rho.items()})
            entry["rho_mean"] = float(np.mean([weights[k] for weights in rho.values()])) if rho else self.anchor_weights[k]
            self.last_log[k] = entry

    def round_log(self, round_index):
        return self.last_log


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
