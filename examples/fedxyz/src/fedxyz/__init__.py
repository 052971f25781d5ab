"""fedxyz: a fedmedbench method (see method.py)."""
