"""FedBN (Li et al., ICLR 2021): batch-norm layers stay local, everything else is FedAvg.

Every tensor of a batch-norm layer (affine weight and bias, running mean and variance,
num_batches_tracked) never leaves the client and is never overwritten. The layers are found by module
type (``ops.aggregate.batchnorm_keys``: torch's ``_NormBase``, i.e. BatchNorm1d/2d/3d, SyncBatchNorm
and InstanceNorm), not by the substring ``'bn'`` in the key as FedBN's code does, so a layer named
``norm`` or ``downsample.1`` is kept local too. GroupNorm and LayerNorm have no running statistics
and are shared like any other layer. A model without BN tensors (e.g. ``model.bn: stateless``) gives
FedAvg exactly.

The server averages the remaining keys with the run's weights (FedBN's code: uniform). Its own copy of
the BN tensors stays at the initial values and is never used: each client is evaluated with its
composite model (shared weights + its own BN) on its own data, which is the base client's
``eval_model``.

Model selection: ``PERSONALIZED = False``, one round for the whole federation by the mean validation
metric over clients, each client scored with its own composite model at that round. The shared
weights are one global model per round; picking a different round per client would give each client a
different shared part, which FedBN never produces. This is also how HarmoFL's code selects every
method it compares, FedBN included (best mean validation metric).
"""

from fedmedbench.fl import client
from fedmedbench.fl.server import Server
from fedmedbench.ops.aggregate import batchnorm_keys

DEFAULTS: dict = {}
PERSONALIZED = False


class Client(client.Client):
    def declare_local_keys(self) -> set[str]:
        return super().declare_local_keys() | batchnorm_keys(self.model)


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
