"""SiloBN (Andreux, du Terrail, Beguier, Tramel, DCL@MICCAI 2020): BN running statistics stay local.

The running mean, running variance and ``num_batches_tracked`` of every batch-norm layer (found by
module type) never leave the client; the BN affine weight and bias are shared and averaged like any
other parameter. That is the one difference from FedBN, which keeps the affine parameters local too.
Each client is evaluated with the shared weights and its own statistics (the base client's model).
Selection as FedBN: one round for the federation by the mean validation metric (``PERSONALIZED =
False``), each client scored with its own statistics.
"""

from fedmedbench.fl import client
from fedmedbench.fl.server import Server
from fedmedbench.ops.aggregate import batchnorm_keys, buffer_keys

DEFAULTS: dict = {}
PERSONALIZED = False


class Client(client.Client):
    def declare_local_keys(self) -> set[str]:
        return super().declare_local_keys() | (buffer_keys(self.model) & batchnorm_keys(self.model))


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
