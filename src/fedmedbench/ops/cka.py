"""Linear centred kernel alignment (CKA) between two networks' layer representations.

* :func:`linear_cka` — CKA of two feature matrices X (n x p) and Y (n x q), in float64. Default:
  the **unbiased** HSIC U-statistic (Song et al. 2012; the estimator of Nguyen, Raghu & Kornblith
  2021), ``unbiased=False``: the classic biased form ||YᵀX||²_F / (||XᵀX||_F ||YᵀY||_F) on
  column-centred features (Kornblith et al. 2019).
* :class:`MinibatchCKA` — minibatch CKA (Nguyen et al. 2021): for each pair of same-named layers of
  two models, the three HSIC terms HSIC(K,L), HSIC(K,K), HSIC(L,L) are computed per minibatch from
  n x n Gram matrices formed **inside forward hooks** and summed over minibatches;
  CKA = ΣHSIC(K,L) / sqrt(ΣHSIC(K,K) ΣHSIC(L,L)). Activations are never kept beyond the hook
  (only one n x n Gram per layer of the first model waits for the second model's pass), so one
  pass over the data suffices.
* :class:`MinibatchCosine` — the ``cosine`` ablation of Fed-LWR (v1): mean over samples of the
  cosine similarity of the two layers' flattened outputs.
* :func:`dataset_grams` + :func:`cka_from_grams` — Fed-LWR's Eq. 2 as printed: one n x n centred
  Gram per layer over a **whole** data set (exact, built block by block with bounded memory), and the
  CKA of two such Grams with the biased HSIC vec(K')·vec(L')/(n-1)² (or the unbiased one).

Conventions:

* Layers are matched by **module name** (``encoders.0.1``), never by position: a name present in
  one model and not the other, or with another module type, is an error.
* Hooked module types: Conv2d, ConvTranspose2d, BatchNorm2d (as Fed-LWR's hook_manager.py); the
  feature of a layer is its full output flattened per sample (n x C·H·W, no pooling).
* Small minibatches: the unbiased HSIC needs n >= 4 (it divides by n(n-3) and n-2). A minibatch
  with fewer than 4 samples is **skipped** (and counted in ``skipped``); callers batch the data
  with :func:`cka_batches`, which **merges** a remainder of fewer than 4 samples into the previous
  batch, so only a data set with fewer than 4 samples in total is skipped, and then CKA is NaN.
* Numerics: features are centred over the minibatch before the Gram (the unbiased HSIC is
  invariant to it; the Gram of uncentred float32 features is what broke the official code, and
  centring alone fixed every layer in the specs' measurements); the Gram of the centred features is
  formed in ``gram_dtype`` (float32 by default: a float64 copy of every activation cost more than the
  forward pass on the CPU, benchmarks/results/2026-11-22-fedlwr-cka-cpu.md; ``torch.float64`` for full precision) and every HSIC
  and CKA operation is float64. :func:`linear_cka` is float64 throughout.
* ``official=True`` reproduces the official Fed-LWR numerics **for comparison only**: uncentred
  float32 Grams and float32 HSIC, each minibatch HSIC multiplied by ε = 1e-4 before summing, and
  CKA = ΣHSIC(K,L) / sqrt(max(ΣHSIC(K,K)·ΣHSIC(L,L), ε) + ε). On noise inputs this gives NaN,
  ±inf, negative or > 1 values on most layers of the 384² UNet (../specs/official_code.md §3.3).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

HOOKED_TYPES = (nn.Conv2d, nn.ConvTranspose2d, nn.BatchNorm2d)
MIN_SAMPLES = 4  # the unbiased HSIC is undefined below 4 samples
OFFICIAL_EPS = 1e-4


# ------------------------------------------------------------------------------------------
# HSIC estimators on Gram matrices
# ------------------------------------------------------------------------------------------


def hsic_unbiased(K: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """Unbiased HSIC (Song et al. 2012, Eq. 5) of two n x n Gram matrices (n >= 4).

    [tr(K̃L̃) + 1ᵀK̃1·1ᵀL̃1 / ((n-1)(n-2)) - 2/(n-2)·1ᵀK̃L̃1] / (n(n-3)), K̃, L̃ with zero diagonals.
    """
    n = K.shape[0]
    if n < MIN_SAMPLES:
        raise ValueError(f"the unbiased HSIC needs at least {MIN_SAMPLES} samples, got {n}")
    K = K - torch.diag_embed(torch.diagonal(K))
    L = L - torch.diag_embed(torch.diagonal(L))
    trace = (K * L).sum()  # tr(K L) for symmetric matrices
    k_row, l_row = K.sum(0), L.sum(0)
    middle = k_row.sum() * l_row.sum() / ((n - 1) * (n - 2))
    last = 2.0 / (n - 2) * (k_row @ l_row)  # 1ᵀ K L 1 = (K1)ᵀ(L1)
    return (trace + middle - last) / (n * (n - 3))


def hsic_biased(K: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """Biased HSIC tr(K H L H) / (n-1)² (H the centring matrix)."""
    n = K.shape[0]
    H = torch.eye(n, dtype=K.dtype, device=K.device) - 1.0 / n
    return ((H @ K @ H) * (H @ L @ H)).sum() / (n - 1) ** 2


def _hsic_official(K: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """The official ``hsic1`` (numpee's minibatch CKA), in the Grams' own dtype (float32 there), with
    its operations in its order (K L formed once; its trace, its sum and the Grams' sums), so that the
    rounding of uncentred float32 Grams, which dominates the result, is the official one."""
    n = K.shape[0]
    K, L = K.clone(), L.clone()
    K.fill_diagonal_(0)
    L.fill_diagonal_(0)
    KL = K @ L
    trace = KL.diagonal().sum()
    middle = K.sum() * L.sum() / ((n - 1) * (n - 2))
    right = KL.sum() * (2 / (n - 2))
    return (trace + middle - right) / (n**2 - 3 * n)


def gram(features: torch.Tensor, centre: bool = True, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Linear-kernel Gram X Xᵀ of per-sample flattened features (optionally centred over the batch)."""
    x = features.detach().flatten(1).to(dtype)
    if centre:  # the mean as a matrix-vector product: much faster than a reduction over dim 0 on CPU
        x = x - (torch.ones(1, len(x), dtype=x.dtype, device=x.device) @ x) / len(x)
    return x @ x.T


# ------------------------------------------------------------------------------------------
# Full-batch CKA
# ------------------------------------------------------------------------------------------


def linear_cka(x: torch.Tensor, y: torch.Tensor, unbiased: bool = True) -> float:
    """Linear CKA of x (n x p) and y (n x q), in float64.

    ``unbiased=True``: HSIC_u(K,L) / sqrt(HSIC_u(K,K) HSIC_u(L,L)) with K = XXᵀ, L = YYᵀ (n >= 4).
    ``unbiased=False``: ||YᵀX||²_F / (||XᵀX||_F ||YᵀY||_F) on column-centred X and Y.
    """
    x = torch.as_tensor(x).detach().flatten(1).to(torch.float64)
    y = torch.as_tensor(y).detach().flatten(1).to(torch.float64)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y need the same number of samples, got {x.shape[0]} and {y.shape[0]}")
    x = x - x.mean(0, keepdim=True)
    y = y - y.mean(0, keepdim=True)
    if not unbiased:
        cross = torch.linalg.matrix_norm(y.T @ x) ** 2
        return float(cross / (torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)))
    K, L = x @ x.T, y @ y.T
    return float(hsic_unbiased(K, L) / torch.sqrt(hsic_unbiased(K, K) * hsic_unbiased(L, L)))


# ------------------------------------------------------------------------------------------
# Minibatch CKA with forward hooks
# ------------------------------------------------------------------------------------------


def hooked_layers(model: nn.Module, types: tuple[type, ...] = HOOKED_TYPES) -> list[str]:
    """Names of the modules whose outputs are compared, in registration order."""
    return [name for name, module in model.named_modules() if name and isinstance(module, types)]


def matched_layers(model_a: nn.Module, model_b: nn.Module, names: Sequence[str] | None = None) -> list[str]:
    """The layers compared between two models, matched by module name (an unmatched name is an error)."""
    modules_a, modules_b = dict(model_a.named_modules()), dict(model_b.named_modules())
    names = list(names) if names is not None else hooked_layers(model_a)
    for name in names:
        if name not in modules_a or name not in modules_b:
            raise ValueError(f"layer {name!r} is not a module of both models")
        if type(modules_a[name]) is not type(modules_b[name]):
            raise ValueError(f"layer {name!r}: {type(modules_a[name]).__name__} vs {type(modules_b[name]).__name__}")
    return names


def cka_batches(n: int, batch_size: int, min_samples: int = MIN_SAMPLES) -> Iterator[range]:
    """Consecutive index ranges of about ``batch_size``; a last batch with fewer than ``min_samples``
    items is merged into the previous one (10 items, batch 8 -> one batch of 10)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] < min_samples:
        starts.pop()
    for i, start in enumerate(starts):
        yield range(start, starts[i + 1] if i + 1 < len(starts) else n)


class _PairedHooks:
    """Forward hooks on same-named layers of two models; subclasses say what a hook does."""

    def __init__(self, model_a: nn.Module, model_b: nn.Module, layers: Sequence[str] | None = None):
        self.model_a, self.model_b = model_a, model_b
        self.layers = matched_layers(model_a, model_b, layers)
        self.skipped = 0  # minibatches left out (fewer than MIN_SAMPLES samples)
        self.samples = 0

    def _run(self, model: nn.Module, hook_for) -> list:
        modules = dict(model.named_modules())
        handles = [modules[name].register_forward_hook(hook_for(name)) for name in self.layers]
        return handles

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """One minibatch through both models (in their current train/eval mode)."""
        if len(x) < self.min_samples:
            self.skipped += 1
            return
        handles = self._run(self.model_a, self._hook_a)
        try:
            self.model_a(x)
        finally:
            for h in handles:
                h.remove()
        handles = self._run(self.model_b, self._hook_b)
        try:
            self.model_b(x)
        finally:
            for h in handles:
                h.remove()
        self.samples += len(x)

    min_samples = 1


class MinibatchCKA(_PairedHooks):
    """Layer-wise minibatch CKA between ``model_a`` and ``model_b`` (see the module docstring).

    ``update(x)`` runs one minibatch through both models (no grad, modes unchanged: put them in
    eval mode first for running-statistics BN); ``compute()`` -> {layer name: CKA}.
    """

    min_samples = MIN_SAMPLES

    def __init__(
        self,
        model_a: nn.Module,
        model_b: nn.Module,
        layers: Sequence[str] | None = None,
        unbiased: bool = True,
        official: bool = False,
        gram_dtype: torch.dtype = torch.float32,
    ):
        super().__init__(model_a, model_b, layers)
        self.unbiased, self.official, self.gram_dtype = unbiased, official, gram_dtype
        dtype = torch.float32 if official else torch.float64
        self.sums = {name: [torch.zeros((), dtype=dtype) for _ in range(3)] for name in self.layers}  # KL, KK, LL
        self._pending: dict[str, torch.Tensor] = {}

    def _gram(self, output: torch.Tensor) -> torch.Tensor:
        if self.official:
            return gram(output, centre=False, dtype=torch.float32)
        # Centred features (the fix the official numerics need), Gram in gram_dtype, HSIC in float64.
        return gram(output, centre=True, dtype=self.gram_dtype).to(torch.float64)

    def _hsic(self, K, L):
        if self.official:
            return _hsic_official(K, L) * OFFICIAL_EPS
        return hsic_unbiased(K, L) if self.unbiased else hsic_biased(K, L)

    def _hook_a(self, name):
        def hook(module, inputs, output):
            self._pending[name] = self._gram(output)

        return hook

    def _hook_b(self, name):
        def hook(module, inputs, output):
            K = self._pending.pop(name)
            L = self._gram(output)
            sums = self.sums[name]
            for i, value in enumerate((self._hsic(K, L), self._hsic(K, K), self._hsic(L, L))):
                sums[i] = sums[i].to(value.device) + value

        return hook

    def compute(self) -> dict[str, float]:
        out = {}
        for name, (kl, kk, ll) in self.sums.items():
            if self.samples == 0:
                out[name] = math.nan
            elif self.official:
                out[name] = float(kl / torch.sqrt(torch.clamp(kk * ll, min=OFFICIAL_EPS) + OFFICIAL_EPS))
            else:
                out[name] = float(kl / torch.sqrt(kk * ll))
        return out


class MinibatchCosine(_PairedHooks):
    """Layer-wise mean over samples of cos(f_a(x_i), f_b(x_i)) (flattened outputs), Fed-LWR-v1's measure.

    The first model's normalised features of one minibatch wait for the second model's pass, so
    memory grows with the batch: ``chunk`` splits a minibatch (the result does not depend on it).
    """

    def __init__(self, model_a: nn.Module, model_b: nn.Module, layers: Sequence[str] | None = None, chunk: int = 4):
        super().__init__(model_a, model_b, layers)
        self.chunk = chunk
        self.sums = {name: torch.zeros((), dtype=torch.float64) for name in self.layers}
        self._pending: dict[str, torch.Tensor] = {}

    @staticmethod
    def _normalised(output):
        x = output.detach().flatten(1).to(torch.float64)
        return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)

    def _hook_a(self, name):
        def hook(module, inputs, output):
            self._pending[name] = self._normalised(output)

        return hook

    def _hook_b(self, name):
        def hook(module, inputs, output):
            cos = (self._pending.pop(name) * self._normalised(output)).sum(1)
            self.sums[name] = self.sums[name].to(cos.device) + cos.sum()

        return hook

    def update(self, x: torch.Tensor) -> None:
        for start in range(0, len(x), self.chunk):
            super().update(x[start : start + self.chunk])

    def compute(self) -> dict[str, float]:
        return {name: float(s) / self.samples if self.samples else math.nan for name, s in self.sums.items()}


MEASURES = {"cka": MinibatchCKA, "cosine": MinibatchCosine}


def layerwise_similarity(
    model_a: nn.Module,
    model_b: nn.Module,
    batches,
    measure: str = "cka",
    layers: Sequence[str] | None = None,
    **options,
) -> tuple[dict[str, float], int]:
    """One pass of ``batches`` (tensors on the models' device) through both models in eval mode:
    ({layer: similarity}, skipped minibatches). The models' train/eval modes are restored."""
    if measure not in MEASURES:
        raise ValueError(f"unknown similarity measure {measure!r}; expected one of {sorted(MEASURES)}")
    modes = (model_a.training, model_b.training)
    model_a.eval()
    model_b.eval()
    try:
        meter = MEASURES[measure](model_a, model_b, layers, **options)
        for x in batches:
            meter.update(x)
        return meter.compute(), meter.skipped
    finally:
        model_a.train(modes[0])
        model_b.train(modes[1])


# ------------------------------------------------------------------------------------------
# Data-set Grams: Eq. 2 of Fed-LWR as printed (one n x n Gram over a client's whole split)
# ------------------------------------------------------------------------------------------


@torch.no_grad()
def dataset_grams(
    model: nn.Module,
    load,
    n: int,
    layers: Sequence[str],
    batch_size: int,
    block: int = 32,
    gram_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Per layer, the centred Gram K' = H K H (K = U Uᵀ, U the n x p flattened outputs of the layer
    over the **whole** data set, H = I - 11ᵀ/n), as an n x n float64 matrix on the model's device.

    ``load(start, stop)`` returns samples [start, stop) as one batch on the model's device; the model
    runs in eval mode (its mode is restored). Outputs are never kept for more than ``block`` samples:
    block by block, a block's outputs at every hooked layer are held (about 325 MB per sample for the
    paper's UNet at 384 px) and the samples after it are streamed past them, so the data are passed
    about n / (2 block) + 1 times (once when n <= block) and K is exact whatever ``block`` is.

    Numerics: every output is shifted by one common vector per layer (the first minibatch's mean)
    before its Gram is formed in ``gram_dtype``; H K H does not depend on a common shift, and the
    shift removes the large mean that made the official uncentred float32 Grams cancel
    catastrophically. The centring H · H is then applied in float64.
    """
    modules = dict(model.named_modules())
    grams: dict[str, torch.Tensor] = {}
    shift: dict[str, torch.Tensor] = {}
    held: dict[str, list[torch.Tensor] | torch.Tensor] = {}
    where = {"hold": True, "block": (0, 0), "rows": (0, 0)}

    def hook_for(name):
        def hook(module, inputs, output):
            x = output.detach().flatten(1).to(gram_dtype)
            if name not in shift:
                shift[name] = x.mean(0, keepdim=True)
                grams[name] = torch.zeros(n, n, dtype=torch.float64, device=x.device)
            x = x - shift[name]  # a new tensor: an in-place ReLU after this layer cannot change it
            if where["hold"]:
                held[name].append(x)
                return
            (a0, a1), (b0, b1) = where["block"], where["rows"]
            cross = (x @ held[name].T).to(torch.float64)
            grams[name][b0:b1, a0:a1] = cross
            grams[name][a0:a1, b0:b1] = cross.T

        return hook

    was_training = model.training
    model.eval()
    handles = [modules[name].register_forward_hook(hook_for(name)) for name in layers]
    try:
        for a0 in range(0, n, block):
            a1 = min(a0 + block, n)
            where["hold"], where["block"] = True, (a0, a1)
            held.update({name: [] for name in layers})
            for start in range(a0, a1, batch_size):
                model(load(start, min(start + batch_size, a1)))
            for name in layers:
                held[name] = torch.cat(held[name])
                grams[name][a0:a1, a0:a1] = (held[name] @ held[name].T).to(torch.float64)
            where["hold"] = False
            for b0 in range(a1, n, batch_size):
                where["rows"] = (b0, min(b0 + batch_size, n))
                model(load(*where["rows"]))
            held.clear()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    # H K H = K - row means - column means + grand mean, in float64
    return {name: K - K.mean(0, keepdim=True) - K.mean(1, keepdim=True) + K.mean() for name, K in grams.items()}


def cka_from_grams(K: torch.Tensor, L: torch.Tensor, unbiased: bool = False) -> float:
    """CKA of two n x n centred Grams (:func:`dataset_grams`). ``unbiased=False``: Fed-LWR Eq. 2,
    HSIC(K, L) = vec(K')·vec(L') / (n-1)², the biased HSIC of centred Grams; ``True``: the unbiased HSIC
    (n >= 4; it does not depend on the centring). NaN when undefined (n < 2, or n < 4 unbiased, or a
    layer whose outputs do not vary over the data)."""
    n = K.shape[0]
    if n < (MIN_SAMPLES if unbiased else 2):
        return math.nan
    if unbiased:
        kl, kk, ll = hsic_unbiased(K, L), hsic_unbiased(K, K), hsic_unbiased(L, L)
    else:
        kl, kk, ll = ((A * B).sum() / (n - 1) ** 2 for A, B in ((K, L), (K, K), (L, L)))
    denominator = float(torch.sqrt(kk * ll))
    return float(kl) / denominator if denominator > 0 else math.nan


__all__ = [
    "linear_cka",
    "hsic_unbiased",
    "hsic_biased",
    "gram",
    "MinibatchCKA",
    "MinibatchCosine",
    "layerwise_similarity",
    "cka_batches",
    "hooked_layers",
    "matched_layers",
    "HOOKED_TYPES",
    "MIN_SAMPLES",
    "dataset_grams",
    "cka_from_grams",
    "layerwise_cka_weights",
]


def layerwise_cka_weights(
    similarities: Sequence[dict[str, float]], clip: tuple[float, float] = (1e-4, 0.99), eps: float = 0.0
) -> dict[str, list[float]]:
    """Fed-LWR Eq. 5: per layer m, ρ_k^m = (1 - c_k^m) / (Σ_i (1 - c_i^m) + eps), c = clip(δ, *clip).

    ``similarities[k]`` maps layer -> δ_k^m for client k. Lower similarity to the anchor gives a
    larger weight. A layer whose δ is NaN for some client (too few samples) is left out, so the
    caller's default weights apply to it. The official code adds eps = 1e-9 to the denominator; with
    c <= 0.99 the denominator is >= 0.01 K and the term only breaks exact uniformity, so by default
    it is left out (identical clients get exactly equal weights); ``eps=1e-9`` is the official form.
    """
    low, high = clip
    if not 0 <= low < high < 1:
        raise ValueError(f"clip must satisfy 0 <= low < high < 1, got {clip}")
    layers = list(similarities[0])
    weights = {}
    for layer in layers:
        values = [s[layer] for s in similarities]
        if any(math.isnan(v) for v in values):
            continue
        gaps = [1.0 - min(max(v, low), high) for v in values]
        total = math.fsum(gaps) + eps
        weights[layer] = [g / total for g in gaps]
    return weights
