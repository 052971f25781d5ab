"""Solo: every client trains alone on its own data for the same number of rounds x local epochs.

Nothing is communicated; each client is evaluated with its own model and selected on its own
validation set. FedAvg with a single client is the same computation (tests check it).
"""

from fedmedbench.fl import server
from fedmedbench.fl.client import Client

DEFAULTS: dict = {}
PERSONALIZED = True


class Server(server.Server):
    def package(self, client_index, round_index):
        # Round 0 hands out the common initialisation; afterwards nothing is sent.
        return {"state": self.global_state} if round_index == 0 else None

    def aggregate(self, round_index, replies):
        pass


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
