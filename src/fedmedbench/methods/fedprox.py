"""FedProx (Li et al., 2020): local objective F_k(w) + mu/2 ||w - w_t||^2.

The proximal gradient mu (w - w_t) is added to ``.grad`` before the optimizer step, so it passes
through momentum/Adam like the task gradient (FL-bench's choice; docs/reviewers/harmofl.md). w_t is a
detached copy of the received global weights, taken at ``receive``.
"""

import torch

from fedmedbench.fl import client
from fedmedbench.fl.server import Server

DEFAULTS = {"mu": 1e-2}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {"mu": {"type": "number", "minimum": 0}}
PERSONALIZED = False


class Client(client.Client):
    def receive(self, package):
        super().receive(package)
        self.anchor = [p.detach().clone() for p in self.model.parameters()]

    @torch.no_grad()
    def after_backward(self):
        mu = self.params["mu"]
        for param, anchor in zip(self.model.parameters(), self.anchor):
            if param.grad is not None:
                param.grad.add_(param - anchor, alpha=mu)

    def state_dict(self):
        return {**super().state_dict(), "anchor": self.anchor}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.anchor = state["anchor"]


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
