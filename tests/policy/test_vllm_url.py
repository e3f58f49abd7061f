"""`--vllm-url` that names no vLLM server is refused, naming the URL and what it answered; two policies on one
sync folder write apart; its refusals reach the agent as a 400 or 502 (no vLLM needed: a real HTTP server on 127.0.0.1
stands in for one that lists a model and answers as vLLM does)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from harnessrl.policy import Policy
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


class _Lists(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"data": [{"id": "tiny"}]}).encode())

    def log_message(self, *args):
        pass


class _Answers(_Lists):
    def do_GET(self):  # vLLM's listing: the length the server was started with (--max-model-len)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"data": [{"id": "tiny", "max_model_len": 300}]}).encode())

    def do_POST(self):  # /v1/completions, as vLLM refuses: the server's `status` and vLLM's error body
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if self.server.status == 200:  # not a completion list: a proxy's page, another server
            self.wfile.write(b"<html>welcome</html>")
            return
        message = "Token id 999999 is out of vocabulary" if self.server.status == 400 else "EngineDeadError"
        self.wfile.write(json.dumps({"error": {"message": message, "type": "BadRequestError"}}).encode())


async def test_a_vllm_refusal_is_the_agents_400_or_the_gateways_502(tmp_path):
    import openai

    from harnessrl.gateway import GatewayClient, create_app
    from tests.conftest import ADMIN_KEY

    server = http.server.HTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    policy = Policy.load("tiny", vllm_url=url, sync_dir=tmp_path)
    assert policy.context == 300  # the server's, not the model config's
    gateway = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY))
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        _, key = await gateway.create_episode()
        agent = gateway.openai(key)
        server.status = 400  # the prompt's own fault: the agent hears vLLM's words, naming messages
        with pytest.raises(openai.BadRequestError, match="the model server refused the prompt: Token id 999999") as bad:
            await agent.chat.completions.create(**chat)
        assert bad.value.body["param"] == "messages" and bad.value.body["code"] == "invalid_prompt"
        assert url not in bad.value.body["message"]  # the server's address is the operator's, not the agent's
        server.status = 500  # vLLM's own trouble: a 502, not a 500 from the gateway
        with pytest.raises(openai.APIStatusError, match="the model server failed: EngineDeadError") as down:
            await agent.chat.completions.create(**chat)
        assert down.value.status_code == 502 and down.value.body["code"] == "upstream_error"
        server.status = 200
        with pytest.raises(openai.APIStatusError, match="not vLLM's completions") as odd:
            await agent.chat.completions.create(**chat)
        assert odd.value.status_code == 502
        server.shutdown()
        server.server_close()
        with pytest.raises(openai.APIStatusError, match="no answer") as gone:
            await agent.chat.completions.create(**chat)
        assert gone.value.status_code == 502
    finally:
        await gateway.aclose()
        policy.close()
        server.shutdown()


def test_policies_sharing_a_sync_folder_write_apart_and_clean_up(tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Lists)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        dead = _dead_pid()  # a run killed before its close left its model copy
        host = socket.gethostname()
        (tmp_path / f"run-{host}-{dead}-0123abcd" / "v3").mkdir(parents=True)
        (tmp_path / f"run-{host}-{dead}-4567abcd").mkdir()  # touched within the hour: kept (another PID namespace?)
        hour_ago = time.time() - 3700
        os.utime(tmp_path / f"run-{host}-{dead}-0123abcd", (hour_ago, hour_ago))
        (tmp_path / f"run-elsewhere-{dead}-0123abcd").mkdir()  # another host's: not checkable from here, kept
        one, two = (Policy.load("tiny", vllm_url=url, sync_dir=tmp_path) for _ in range(2))
        assert not (tmp_path / f"run-{host}-{dead}-0123abcd").exists()
        (tmp_path / f"run-elsewhere-{dead}-0123abcd").rmdir()
        (tmp_path / f"run-{host}-{dead}-4567abcd").rmdir()
        assert one.engine.sync_dir.parent == two.engine.sync_dir.parent == tmp_path
        assert one.engine.sync_dir != two.engine.sync_dir and one.engine.sync_dir.is_dir()
        (one.engine.sync_dir / "v1").mkdir()  # a synced version
        one.close()
        assert not one.engine.sync_dir.exists() and two.engine.sync_dir.is_dir()
        two.close()
        assert list(tmp_path.iterdir()) == []
    finally:
        server.shutdown()


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


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


def test_requests_pin_every_sampling_field_the_trainer_does_not_score(tmp_path):
    """vLLM fills an unset field from the model's generation_config.json (a top_k, a repetition_penalty): the
    logprobs would be under a distribution the trainer never scores. Every request sets them to neutral values."""
    from harnessrl.policy import SamplingParams

    server = http.server.HTTPServer(("127.0.0.1", 0), _Lists)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        policy = Policy.load("tiny", vllm_url=f"http://127.0.0.1:{server.server_port}", sync_dir=tmp_path)
        body = policy.engine._body([1, 2, 3], SamplingParams(temperature=0.7, top_p=0.9), 1, 0)
        policy.close()
    finally:
        server.shutdown()
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9)
    neutral = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert {k: body[k] for k in neutral} == neutral


def test_a_sync_of_the_weights_already_served_is_told_apart():
    """An all-tied batch (zero gradient) or a resume pushes the weights vLLM holds: no change to check for."""
    from harnessrl.policy.tiny import build_tiny
    from harnessrl.policy.vllm import _same_weights

    model, _ = build_tiny(seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert _same_weights(model, state)
    name = next(iter(state))
    state[name].view(-1)[0] += 1e-6
    assert not _same_weights(model, state)
    assert not _same_weights(model, {name: state[name]})  # a partial state is not the same weights
