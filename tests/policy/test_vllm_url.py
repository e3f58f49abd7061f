"""`--vllm-url` that names no vLLM server is refused, naming the URL and what it answered (no vLLM
needed: a real HTTP server on 127.0.0.1 stands in for a misconfigured one)."""

from __future__ import annotations

import http.server
import socket
import threading

from tests.conftest import cli


class _Refuses(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # a vLLM started with --api-key, asked without one
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Unauthorized"}')
        self.server.paths.append(self.path)

    def log_message(self, *args):
        pass


def test_a_url_that_is_no_vllm_model_list_is_refused_naming_it():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Refuses)
    server.paths = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        refused = cli("serve", "--model", "tiny", "--vllm-url", url + "/v1")  # an OpenAI base URL: /v1 stripped
        assert refused.exit_code == 2, refused.output
        assert f"--vllm-url: vLLM server {url}: GET /v1/models answered 401" in refused.output
        assert server.paths == ["/v1/models"]
    finally:
        server.shutdown()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    silent = cli("serve", "--model", "tiny", "--vllm-url", closed)
    assert silent.exit_code == 2 and f"vLLM server {closed}: no answer (ConnectError" in silent.output
