"""A small OpenAI-compatible server for tests: `/v1/models` names model "m", and each chat
request is answered by a function of its JSON body.

    with chat_server(lambda body: {"choices": [...]}) as url:   # url ends with /v1
        ...
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def chat_server(answer: Callable[[dict[str, Any]], dict[str, Any]]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            model = {"id": "m", "object": "model", "owned_by": "test", "max_model_len": 8192}
            self._send({"object": "list", "data": [model]})

        def do_POST(self) -> None:
            self._send(answer(json.loads(self.rfile.read(int(self.headers["Content-Length"])))))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
