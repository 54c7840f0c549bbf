"""The autotune cache: winners of ``jax_swiglu.autotune`` on this machine's GPU, on disk.

One JSON file per (package version, device fingerprint) in ``JAX_SWIGLU_CACHE_DIR``, by
default the user cache directory (``$XDG_CACHE_HOME/jax_swiglu`` or ``~/.cache/jax_swiglu``),
each entry keyed by dtype, M, N and K. Writes are atomic (a temporary file renamed over the
old one) under a lock file, and merge with what other processes wrote meanwhile. A directory
that cannot be created or written, or a file that does not parse, degrades to an in-memory
cache with one warning: tuning is lost at exit, nothing fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import warnings

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None

CACHE_DIR_ENV_VAR = "JAX_SWIGLU_CACHE_DIR"
FORMAT = "jax_swiglu-autotune/1"


def default_directory() -> str:
    configured = os.environ.get(CACHE_DIR_ENV_VAR, "").strip()
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jax_swiglu")


def entry_key(dtype: str, m: int, n: int, k: int) -> str:
    return f"{dtype}:{m}x{n}x{k}"


class AutotuneCache:
    """Autotune winners for one directory (see the module docstring)."""

    def __init__(self, directory: str, version: str):
        self.directory = directory
        self.version = version
        self._memory: dict[str, dict] = {}  # file name -> entries
        self._lock = threading.Lock()
        self._warned = False
        self._loaded: set[str] = set()

    def _file(self, fingerprint: str) -> str:
        digest = hashlib.sha1(fingerprint.encode()).hexdigest()[:12]
        return f"autotune-{self.version}-{digest}.json"

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"jax_swiglu: the autotune cache in {self.directory!r} {why}; "
                          "keeping autotune results in memory only", RuntimeWarning,
                          stacklevel=4)

    def _read(self, name: str, fingerprint: str) -> dict:
        path = os.path.join(self.directory, name)
        try:
            with open(path) as f:
                document = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            self._warn(f"has an unreadable file {name} ({error})")
            return {}
        if (not isinstance(document, dict) or document.get("format") != FORMAT
                or document.get("device") != fingerprint
                or not isinstance(document.get("entries"), dict)):
            self._warn(f"has a file {name} that is not an autotune cache of this device")
            return {}
        return document["entries"]

    def lookup(self, fingerprint: str, dtype: str, m: int, n: int, k: int) -> dict | None:
        name = self._file(fingerprint)
        with self._lock:
            if name not in self._loaded:
                self._loaded.add(name)
                on_disk = self._read(name, fingerprint)
                self._memory[name] = {**on_disk, **self._memory.get(name, {})}
            return self._memory.get(name, {}).get(entry_key(dtype, m, n, k))

    def store(self, fingerprint: str, dtype: str, m: int, n: int, k: int, record: dict) -> bool:
        """Adds ``record`` (the winner's launch id and times) and writes the file; returns
        whether it reached the disk."""
        name = self._file(fingerprint)
        key = entry_key(dtype, m, n, k)
        with self._lock:
            self._memory.setdefault(name, {})[key] = record
            self._loaded.add(name)
            try:
                os.makedirs(self.directory, exist_ok=True)
                with self._file_lock():
                    entries = {**self._read(name, fingerprint), **self._memory[name]}
                    self._memory[name] = entries
                    document = {"format": FORMAT, "device": fingerprint,
                                "version": self.version, "entries": entries}
                    descriptor, temporary = tempfile.mkstemp(prefix=".autotune-",
                                                             dir=self.directory)
                    try:
                        with os.fdopen(descriptor, "w") as f:
                            json.dump(document, f, indent=1, sort_keys=True)
                        os.replace(temporary, os.path.join(self.directory, name))
                    except BaseException:
                        with contextlib.suppress(OSError):
                            os.unlink(temporary)
                        raise
            except OSError as error:
                self._warn(f"cannot be written ({error})")
                return False
        return True

    @contextlib.contextmanager
    def _file_lock(self):
        if fcntl is None:
            yield
            return
        with open(os.path.join(self.directory, ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


_caches: dict[tuple[str, str], AutotuneCache] = {}
_caches_lock = threading.Lock()


def cache(version: str) -> AutotuneCache:
    """The cache of the current ``JAX_SWIGLU_CACHE_DIR`` (or the default directory)."""
    directory = default_directory()
    with _caches_lock:
        return _caches.setdefault((directory, version), AutotuneCache(directory, version))
