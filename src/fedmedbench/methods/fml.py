"""FML, federated mutual learning (Shen et al., arXiv 2006.16765, 2020).

Each client keeps a private model L (never sent) and trains the shared meme model M (``self.model``:
uploaded, averaged by the FedAvg server, received back every round) on the same batches:

    loss_L = alpha * task(L) + (1 - alpha) * KL(p_M || p_L)
    loss_M = beta  * task(M) + (1 - beta)  * KL(p_L || p_M)

each KL with the other model detached (``ops.distill.kl_to_teacher``), both optimizers stepping on
every batch (PFLlib's version lets gradients leak across the models; ours does not). alpha = beta =
0.5 (the paper's experiments; PFLlib's argparse defaults 1.0 / 0.0 are degenerate). Each client is
evaluated with its private model (``PERSONALIZED``). A term whose weight is 0 is not computed, so
alpha = beta = 1 gives exactly Solo for L and FedAvg for M (tests check it). The private model starts
at the common initialisation and has its own optimizer (reset with the meme's when the run resets
optimizers each round).
"""

from __future__ import annotations

import copy

from fedmedbench.fl import client
from fedmedbench.fl.client import build_optimizer
from fedmedbench.fl.server import Server
from fedmedbench.ops.distill import kl_to_teacher

DEFAULTS = {"alpha": 0.5, "beta": 0.5}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "alpha": {"type": "number", "minimum": 0, "maximum": 1},
    "beta": {"type": "number", "minimum": 0, "maximum": 1},
}
PERSONALIZED = True


def mixed_loss(task, kl_fn, weight: float):
    """weight * task + (1 - weight) * KL, skipping a term whose factor is 0 (exactness at the ends)."""
    if weight == 1.0:
        return task
    kl = kl_fn()
    return kl * (1.0 - weight) if weight == 0.0 else task * weight + kl * (1.0 - weight)


class Client(client.Client):
    def __init__(self, cfg, index, data, model, generator, device):
        super().__init__(cfg, index, data, model, generator, device)
        self.private = copy.deepcopy(self.model)
        self.private_optimizer = build_optimizer(self.private.parameters(), cfg.optimizer)

    def receive(self, package):
        super().receive(package)
        if package is not None and self.cfg.reset_optimizer_each_round:
            self.private_optimizer = build_optimizer(self.private.parameters(), self.cfg.optimizer)

    def optimizers(self):
        return [self.optimizer, self.private_optimizer]

    def train_step(self, x, y):
        self.private.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.private_optimizer.zero_grad(set_to_none=True)
        meme_logits, private_logits = self.model(x), self.private(x)
        loss_private = mixed_loss(
            self.task_loss(private_logits, y), lambda: kl_to_teacher(private_logits, meme_logits), self.params["alpha"]
        )
        loss_meme = mixed_loss(
            self.task_loss(meme_logits, y), lambda: kl_to_teacher(meme_logits, private_logits), self.params["beta"]
        )
        loss_private.backward()
        loss_meme.backward()
        self.private_optimizer.step()
        self.optimizer.step()
        return loss_meme.detach()

    def eval_model(self):
        return self.private

    def state_dict(self):
        return {
            **super().state_dict(),
            "private": self.private.state_dict(),
            "private_optimizer": self.private_optimizer.state_dict(),
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.private.load_state_dict(state["private"])
        self.private_optimizer.load_state_dict(state["private_optimizer"])


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
