"""A TCP forwarder in front of a real server, to cut it off (refused connections) or make it hang.

Why: restarting a real MLflow server takes tens of seconds here; a gate on loopback gives the
client the same outage (connection refused, or a server that accepts and never answers) in
milliseconds, while the server behind it stays real. Every socket and thread it opens is
closed by `close()`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self


class TcpGate:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target = (host, target_port)
        self.mode = "open"
        probe = socket.socket()
        probe.bind((host, 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.set("open")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def set(self, mode: str) -> None:
        """`open` forwards, `refuse` stops listening (and drops live connections), `hang` accepts and
        never answers."""
        assert mode in ("open", "refuse", "hang")
        with self._lock:
            self.mode = mode
            if mode == "refuse":
                self._drop_all()
            elif self._listener is None:
                listener = socket.socket()
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((self.host, self.port))
                listener.listen(64)
                self._listener = listener
                threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
            if mode == "hang":
                self._drop_connections()

    def _drop_connections(self) -> None:
        for sock in list(self._sockets):
            if sock is not self._listener:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
                self._sockets.discard(sock)

    def _drop_all(self) -> None:
        self._drop_connections()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                if self.mode != "open":
                    self._sockets.add(client)  # held open, never answered
                    continue
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
                self._sockets.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
