"""Every method on Flower's deployment runtime: a generic ServerApp (``serverapp``) and ClientApp
(``clientapp``) around the engine's round loop (``fedmedbench.fl.rounds``), the records they
exchange (``messages``) and a local federation for tests and demos (``local``). Needs the
``flower`` extra (``pip install -e .[flower]``); see docs/federation.md."""
