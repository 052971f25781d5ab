"""The errors a user can cause, and that the CLI reports as one line (no traceback without ``-v``).

Everything the pipeline raises because of its *input* (a config key, a raw file, an archive, a
checkpoint, a run that diverged) derives from :class:`FedmedbenchError`, and its message names the
file, key or round at fault. Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FedmedbenchError(Exception):
    """Base class: a problem with what the user gave us, told in one line."""


class ConfigError(FedmedbenchError, ValueError):
    """A configuration key or value is wrong (names the key, suggests the closest valid one)."""


class DataError(FedmedbenchError, ValueError):
    """A raw file, archive, store or split is missing, malformed or inconsistent (names the file)."""


class DivergenceError(FedmedbenchError, FloatingPointError):
    """Training produced a non-finite loss or parameter (names the round, client and quantity)."""


class DiskFullError(FedmedbenchError, OSError):
    """The disk (or the user's quota) filled up while a file was written: names the file, the bytes
    it needs and the bytes free. An OSError still (errno ENOSPC or EDQUOT), for code that catches those."""


class MethodError(FedmedbenchError):
    """A method's hook failed (a plug-in's or a built-in's): names the method, the hook, the round
    and the client, then the original error, which is its ``__cause__`` (``-v`` shows its traceback)."""


class HookStopped(BaseException):
    """A method hook ended by SIGTERM, Ctrl-C or ``hook_timeout_s`` (fl/hookwatch.py): ``str()`` is
    the one line naming the method, the hook, the round and the client; ``code`` the exit status. A
    BaseException, as KeyboardInterrupt: a plug-in's ``except Exception`` cannot swallow it."""

    def __init__(self, line: str, code: int):
        super().__init__(line)
        self.code = code


def closest(name: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest valid spelling, or an empty string."""
    match = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def unknown_key(where: str, key: str, valid: Iterable[str]) -> ConfigError:
    valid = sorted(valid)
    return ConfigError(f"{where}: unknown key {key!r}{closest(key, valid)}; valid keys: {', '.join(valid)}")


def plain(values) -> list:
    """Values for a message: numpy scalars as plain Python (``5``, ``'a'``, not ``np.int64(5)``)."""
    return [v.item() if hasattr(v, "item") else v for v in values]
