"""The built-in methods, one module per method (``fedmedbench.methods.<name>``), each with the
contract ``Server``, ``Client``, ``DEFAULTS`` and ``PERSONALIZED``. They are found by name and
loaded by ``fedmedbench.registry`` (which also finds plug-ins); this package imports nothing, so
that importing one method never imports the others.
"""
