"""Poly1305 from the system's OpenSSL (libcrypto 3) through ctypes: the tags of ``cryptography``'s, without the GIL.

``cryptography``'s ``Poly1305.update`` holds Python's global interpreter
lock while it hashes: 0.5 ms per 4 MB on the machines of
docs/benchmarks.md, during which no other thread of the process runs Python.
On a parameter server every connection's thread hashes each frame twice
(its COMMIT in, its reply out), so with the MAC on the connections took turns
on one core, and a frame's hash could not run beside its own socket copy
(``trainer.transport.overlap``). A ctypes call releases the GIL; the same
OpenSSL that Python's ``hashlib`` and ``ssl`` modules load computes the same
RFC 8439 tag.

`available()` loads libcrypto once: the copy that ``_hashlib`` already mapped
into the process, else the one the loader finds, and checks it with RFC 8439's
test vector (section 2.5.2). Anything missing (no OpenSSL 3, no
``EVP_MAC``, another platform) or a wrong tag makes it False, and callers use
``cryptography`` instead; nothing here is needed for correctness.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

import numpy as np

TAG_LEN = 16
KEY_LEN = 32
# RFC 8439, section 2.5.2.
_RFC_KEY = bytes.fromhex("85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b")
_RFC_MESSAGE = b"Cryptographic Forum Research Group"
_RFC_TAG = bytes.fromhex("a8061dc1305136c6c22b8baf0c0127a9")

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "lib", "mac" once loaded; "ok" once tried


def _candidates() -> list[str]:
    """Paths or names of libcrypto: the one this process already mapped for hashlib first."""
    names: list[str] = []
    try:
        import _hashlib  # noqa: F401  (maps libcrypto into the process where Python links it)

        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.split()[-1] if "/" in line else ""
                if "libcrypto.so" in path and path not in names:
                    names.append(path)
    except (ImportError, OSError):
        pass
    found = ctypes.util.find_library("crypto")
    return names + [n for n in (found, "libcrypto.so.3") if n and n not in names]


def _bind(lib: ctypes.CDLL) -> Any:
    """Declare the EVP_MAC functions on `lib`; returns the fetched POLY1305 algorithm (or None)."""
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    lib.EVP_MAC_fetch.restype, lib.EVP_MAC_fetch.argtypes = vp, [vp, ctypes.c_char_p, ctypes.c_char_p]
    lib.EVP_MAC_CTX_new.restype, lib.EVP_MAC_CTX_new.argtypes = vp, [vp]
    lib.EVP_MAC_CTX_free.restype, lib.EVP_MAC_CTX_free.argtypes = None, [vp]
    lib.EVP_MAC_init.restype, lib.EVP_MAC_init.argtypes = ctypes.c_int, [vp, ctypes.c_char_p, size, vp]
    lib.EVP_MAC_update.restype, lib.EVP_MAC_update.argtypes = ctypes.c_int, [vp, vp, size]
    lib.EVP_MAC_final.restype = ctypes.c_int
    lib.EVP_MAC_final.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(size), size]
    return lib.EVP_MAC_fetch(None, b"POLY1305", None)


def available() -> bool:
    """Whether libcrypto's Poly1305 is loaded and gives RFC 8439's tag (tried once per process)."""
    if "ok" in _state:
        return _state["ok"]
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _load()
    return _state["ok"]


def _load() -> bool:
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
            mac = _bind(lib)
        except (OSError, AttributeError):
            continue
        if not mac:
            continue
        _state["lib"], _state["mac"] = lib, mac
        try:
            h = Poly1305(_RFC_KEY)
            h.update(_RFC_MESSAGE[:5])
            h.update(memoryview(_RFC_MESSAGE)[5:])
            if h.finalize() == _RFC_TAG:
                return True
        except (OSError, ValueError):
            pass
        _state.pop("lib"), _state.pop("mac")
    return False


class Poly1305:
    """Poly1305 under a 32-byte one-time key; `update` hashes with the GIL released (OSError where not
    `available()`)."""

    releases_gil = True

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_LEN:
            raise ValueError(f"a Poly1305 key is {KEY_LEN} bytes, received {len(key)}")
        if "lib" not in _state and not available():  # (while available() checks the library, "lib" is set)
            raise OSError("libcrypto's Poly1305 is not available here (no OpenSSL 3 with EVP_MAC, or a wrong tag "
                          "for RFC 8439's test vector); use cryptography's Poly1305 instead")
        lib = _state["lib"]
        self._lib = lib
        self._ctx = lib.EVP_MAC_CTX_new(_state["mac"])
        if not self._ctx:
            raise OSError("EVP_MAC_CTX_new failed: libcrypto could not make a Poly1305 context")
        if lib.EVP_MAC_init(self._ctx, bytes(key), KEY_LEN, None) != 1:
            self._free()
            raise OSError("EVP_MAC_init failed: libcrypto refused the Poly1305 key")

    def update(self, data: Any) -> None:
        """Hash `data` (any C-contiguous buffer: bytes, bytearray, memoryview, numpy array)."""
        view = np.frombuffer(data, np.uint8)  # no copy; works for read-only buffers too
        if view.size and self._lib.EVP_MAC_update(self._ctx, view.__array_interface__["data"][0], view.size) != 1:
            raise OSError("EVP_MAC_update failed")

    def finalize(self) -> bytes:
        out = ctypes.create_string_buffer(TAG_LEN)
        n = ctypes.c_size_t(0)
        ok = self._lib.EVP_MAC_final(self._ctx, out, ctypes.byref(n), TAG_LEN)
        self._free()
        if ok != 1 or n.value != TAG_LEN:
            raise OSError("EVP_MAC_final failed")
        return out.raw

    def _free(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx:
            self._lib.EVP_MAC_CTX_free(ctx)

    def __del__(self) -> None:
        if getattr(self, "_ctx", None):
            self._free()
