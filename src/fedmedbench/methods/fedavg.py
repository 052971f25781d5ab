"""FedAvg (McMahan et al., 2017): w <- sum_k p_k w_k over all shared keys.

p_k uniform or by sample count (``aggregation.weighting``); BN running statistics averaged or kept
local (``aggregation.bn_buffers``); both live in the engine's base classes, which are FedAvg.
"""

from fedmedbench.fl.client import Client
from fedmedbench.fl.server import Server

DEFAULTS: dict = {}
PERSONALIZED = False

__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
