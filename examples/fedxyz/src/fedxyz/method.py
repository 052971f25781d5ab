"""fedxyz: a federated learning method of your own, run by fedmedbench like a built-in one.

The contract: ``DEFAULTS``, ``PARAM_SCHEMA`` (optional), ``PERSONALIZED``, ``Server`` and ``Client``.
The base classes are FedAvg; override only the hooks your method changes (each is listed below
with what it does). As written, with ``mu = 0`` this method is FedAvg; ``mu > 0`` adds FedProx's
proximal term, to show a hyperparameter in use.
"""

import torch

from fedmedbench.fl.client import Client as BaseClient
from fedmedbench.fl.server import Server as BaseServer

# Hyperparameters: `methods.fedxyz.<key>` in config/config.yaml (and its variants). Types come from these
# values (a string is never read as a number or a boolean); checked when Snakemake builds the DAG.
DEFAULTS = {"mu": 0.0}
# Optional: ranges, choices, and the type of a parameter whose default is None (JSON Schema).
PARAM_SCHEMA = {"mu": {"type": "number", "minimum": 0}}
# True: every client keeps its own model (model selection per client).
PERSONALIZED = False


class Client(BaseClient):
    """Hooks (self.cfg: the run config, self.params: the hyperparameters, self.model, self.data):
    receive(package)        load the server's package (default: the shared weights)
    before_epoch(epoch)     called before each local epoch of a round
    loss(x, y)              the training loss of a batch (default: the task's loss)
    after_backward()        between backward() and optimizer.step(): gradient corrections
    train_step(x, y)        one optimizer step (override for e.g. a two-pass step)
    reply()                 what goes up to the server (default: model, sample count, steps)
    answer(query)           reply to the server's optional second exchange
    eval_model()            the model that is validated, selected and tested
    state_dict() / load_state_dict(state)   extra state to checkpoint (resume is exact)
    """

    def receive(self, package):
        super().receive(package)
        self.anchor = [p.detach().clone() for p in self.model.parameters()]

    @torch.no_grad()
    def after_backward(self):
        mu = self.params["mu"]
        if mu:
            for param, anchor in zip(self.model.parameters(), self.anchor):
                if param.grad is not None:
                    param.grad.add_(param - anchor, alpha=mu)


class Server(BaseServer):
    """Hooks (self.cfg, self.params, self.global_state: the global weights):
    package(client_index, round_index)   what each client receives
    query(round_index, replies)          an optional second exchange before aggregation
    aggregate(round_index, replies)      combine the replies (default: FedAvg)
    round_log(round_index)               per-client scalars for history.csv
    state_dict() / load_state_dict(state)   extra state to checkpoint
    """
