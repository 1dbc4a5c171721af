"""Serving: the trained tiny-llama-cpu model behind real ``transformers serve`` processes, over HTTP.

Each server starts once per module (fine-tuned and base through LocalBackend.serve, plus one
extra for the port/stop lifecycle); every check talks to it over localhost with the project's
client, the official ``openai`` client or raw httpx.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from _fixtures import tiny_held_out, unused_port
from _waiting import wait_for

from playground.errors import UserError
from playground.facade import Playground
from playground.serving.client import base_url, chat, complete, list_models
from playground.serving.local import LocalServers, free_port, pid_alive, port_in_use
from playground.serving.validate import check_model_dir
from playground.types import Endpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

N_HELD_OUT = 40
N_BASE = 10
MAX_TOKENS = 12  # the blueprint's serving.max_new_tokens


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def held_out() -> list[tuple[str, str]]:
    """Held-out prompts exactly as the trainer draws them (never trained on) + the blueprint's examples."""
    from playground.blueprints.loader import get_blueprint

    bp = get_blueprint("tiny-llama-cpu")
    pairs = [(s.prompt, s.answer) for s in tiny_held_out(N_HELD_OUT)]
    return pairs + [(ex.prompt, ex.expected) for ex in bp.examples]


@pytest.fixture(scope="module")
def backend(session_home: Path):
    from playground.backends.local import LocalBackend

    return Playground(LocalBackend(home=session_home))  # the facade: jobs with their model servers


@pytest.fixture(scope="module")
def served(trained_tiny_job, backend):
    """The fine-tuned and the base model of the shared trained job, each behind its own server; the fine-tuned
    one started by ``playground serve JOB --port N`` on the port chosen here."""
    port = free_port()
    try:
        with ThreadPoolExecutor(2) as pool:  # start both at once (each is mostly single-threaded imports)
            base = pool.submit(backend.serve, trained_tiny_job.id, base=True)
            result = _cli("serve", trained_tiny_job.id, "--port", str(port), "--json", home=backend.backend.home)
            assert result.returncode == 0, result.stderr
            endpoints = {"fine-tuned": Endpoint(**json.loads(result.stdout)), "base": base.result()}
        assert endpoints["fine-tuned"].url == f"http://127.0.0.1:{port}/v1" and port_in_use(port)
        yield endpoints
    finally:
        LocalServers(backend.backend.home).stop(trained_tiny_job.id)


def _ask(endpoint, prompt: str, **kw) -> str:
    kw.setdefault("max_tokens", MAX_TOKENS)
    return chat(endpoint, [{"role": "user", "content": prompt}], **kw)


def _score(answers: list[str], pairs: list[tuple[str, str]]) -> float:
    return sum(a.strip() == e for a, (_, e) in zip(answers, pairs, strict=True)) / len(pairs)


@pytest.fixture(scope="module")
def context(trained_tiny_job) -> int:
    """The served model's context window (positions), from its config.json."""
    return json.loads((Path(trained_tiny_job.model_dir) / "config.json").read_text())["max_position_embeddings"]


@pytest.fixture(scope="module")
def fine_answers(served, held_out) -> list[str]:
    """The fine-tuned server's answers to every held-out prompt (asked once, non-streaming)."""
    return [_ask(served["fine-tuned"], p) for p, _ in held_out]


# -- correctness ----------------------------------------------------------------------------------
def test_fine_tuned_answers_held_out_prompts(served, held_out, fine_answers, trained_tiny_job):
    fine = served["fine-tuned"]
    assert fine.url.endswith("/v1") and fine.kind == "fine-tuned" and fine.job_id == trained_tiny_job.id
    assert fine.model == str(Path(trained_tiny_job.model_dir).resolve())
    assert _score(fine_answers, held_out) >= 0.9, list(zip(held_out, fine_answers, strict=True))


def test_base_model_answers_differ_and_score_near_zero(served, held_out, fine_answers):
    pairs = held_out[:N_BASE]
    base_answers = [_ask(served["base"], p) for p, _ in pairs]
    assert _score(base_answers, pairs) <= 0.1, base_answers
    assert sum(b != f for b, f in zip(base_answers, fine_answers, strict=False)) >= N_BASE - 1


def test_streaming_yields_the_same_text(served, held_out, fine_answers):
    for (prompt, _), answer in zip(held_out[:4], fine_answers, strict=False):
        chunks = list(_ask(served["fine-tuned"], prompt, stream=True))
        assert len(chunks) > 1  # really streamed, token by token
        assert "".join(chunks) == answer
    base_chunks = list(_ask(served["base"], held_out[0][0], stream=True))
    assert "".join(base_chunks) == _ask(served["base"], held_out[0][0])


def test_the_chat_panel_marks_an_answer_cut_at_the_token_limit(served, held_out, fine_answers):
    """An answer that reaches the blueprint's token limit is marked as cut there; one that ends by itself carries no
    mark (issue 20: truncated answers marked)."""
    from playground.blueprints.loader import get_blueprint
    from widgets.chat import ChatPanel

    blueprint = get_blueprint("tiny-llama-cpu")
    short = blueprint.model_copy(update={"serving": blueprint.serving.model_copy(update={"max_new_tokens": 2})})
    prompt, answer = held_out[0][0], fine_answers[0]
    for bp, cut in ((short, True), (blueprint, False)):
        panel = ChatPanel(bp, operator=False)
        panel.set_endpoints({"fine-tuned": served["fine-tuned"]})
        assert panel.ask(prompt) and panel.wait(timeout=120)
        turn = panel.transcripts["fine-tuned"].turns[-1]
        assert not turn.error and turn.truncated is cut, turn
        assert ("… (cut)" in panel.answers["fine-tuned"].value) is cut
        assert (turn.answer == answer) is not cut and answer.startswith(turn.answer)


def test_completions_models_and_the_official_openai_client(served, trained_tiny_job):
    import jinja2
    from openai import OpenAI

    fine = served["fine-tuned"]
    assert list_models(fine.url) == [fine.model]
    # /v1/completions takes the raw prompt: the model's chat template rendered here gives the chat answer
    template = (Path(trained_tiny_job.model_dir) / "chat_template.jinja").read_text()
    text = jinja2.Template(template).render(
        messages=[{"role": "user", "content": "reverse: kube"}], add_generation_prompt=True
    )
    assert complete(fine, text, max_tokens=MAX_TOKENS).strip() == "ebuk"
    assert "".join(complete(fine, text, max_tokens=MAX_TOKENS, stream=True)).strip() == "ebuk"
    # a bare URL: the client asks /v1/models for the model name
    assert _ask(fine.url, "reverse: flow") == "wolf"
    # any OpenAI client works against the endpoint
    client = OpenAI(base_url=fine.url, api_key="unused")
    reply = client.chat.completions.create(
        model=fine.model, messages=[{"role": "user", "content": "reverse: gpu"}], max_tokens=MAX_TOKENS, temperature=0
    )
    assert reply.choices[0].message.content == "upg"
    assert reply.choices[0].finish_reason == "stop"  # stopped at EOS, not at max_tokens
    stream = client.chat.completions.create(
        model=fine.model, messages=[{"role": "user", "content": "reverse: gpu"}], max_tokens=MAX_TOKENS, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "upg"


# -- bad requests ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({}).encode(), 400, "messages: Field required"),
        (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"messages": []}).encode(), 400, "at least 1"),
        (json.dumps({"messages": [{"content": "x"}]}).encode(), 400, "messages.0.role"),
        (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "messages.0.content"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "x"}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": 9}).encode(), 400, "temperature"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "bogus": 1}).encode(), 422, "bogus"),
        (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).encode(), 404, "nope"),
        (
            json.dumps({"model": "m" * 10**6, "messages": [{"role": "user", "content": "hi"}]}).encode(),
            404,
            "(1,000,000 ",
        ),
        ("PROMPT_OVER_CONTEXT", 400, "context window is CONTEXT tokens"),
        (json.dumps({"messages": [{"role": "user", "content": "a" * (2 << 20)}]}).encode(), 413, "at most"),
    ],
    ids=[
        "not-json",
        "array",
        "empty",
        "messages-str",
        "no-messages",
        "no-role",
        "content-int",
        "max-tokens-0",
        "max-tokens-str",
        "temperature-9",
        "unknown-field",
        "unknown-model",
        "unknown-model-1MB",
        "prompt-over-context",
        "body-over-1MiB",
    ],
)
def test_bad_requests_get_4xx_with_the_reason_and_the_server_keeps_serving(served, context, body, status, needle):
    fine = served["fine-tuned"]
    if body == "PROMPT_OVER_CONTEXT":
        body = json.dumps({"messages": [{"role": "user", "content": "a" * (context + 10)}]}).encode()
        needle = needle.replace("CONTEXT", str(context))
    response = httpx.post(
        fine.url + "/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=60
    )
    assert response.status_code == status, response.text[:2000]
    assert needle in response.text and len(response.text) < 2000  # the reason, never the whole input echoed
    assert _ask(fine, "reverse: kube") == "ebuk"


def test_client_raises_user_error_with_the_servers_message(served, context):
    fine = served["fine-tuned"]
    too_long = "reverse: " + "x" * context
    with pytest.raises(
        UserError, match=rf"answered 400: prompt is \d+ tokens; this model's context window is {context}\b"
    ):
        _ask(fine, too_long)
    with pytest.raises(UserError, match=r"answered 400: .*prompt is"):
        list(_ask(fine, too_long, stream=True))  # raised when the stream opens
    with pytest.raises(UserError, match=r"answered 400: invalid request: messages\.0\.role"):
        chat(fine, [{"content": "no role"}])
    with pytest.raises(UserError, match="cannot reach"):
        chat(f"http://127.0.0.1:{unused_port()}/v1", "hi", model="m")
    with pytest.raises(UserError, match="must look like"):
        chat("localhost:8000", "hi")
    assert base_url("http://127.0.0.1:9") == "http://127.0.0.1:9/v1"
    # max_tokens beyond the room left in the context window is clamped to it, not an error
    body = {"messages": [{"role": "user", "content": "a" * (context - 20)}], "max_tokens": 10**6, "temperature": 0}
    reply = httpx.post(served["base"].url + "/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= context


def test_eight_concurrent_clients_all_get_correct_answers(served, held_out, fine_answers):
    fine = served["fine-tuned"]
    n = 16  # 8 clients, 2 requests each, half of them streaming

    def one(i: int) -> str:
        prompt = held_out[i][0]
        return "".join(_ask(fine, prompt, stream=True)) if i % 2 else _ask(fine, prompt)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, range(n)))
    assert _score(answers, held_out[:n]) >= 0.9, answers
    assert answers == fine_answers[:n]  # concurrency changes nothing


# -- lifecycle ------------------------------------------------------------------------------------
def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLAYGROUND_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "playground.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_a_new_process_lists_the_servers_and_serving_again_reuses_them(served, backend, trained_tiny_job):
    result = _cli("servers", "--json", home=backend.backend.home)
    assert result.returncode == 0, result.stderr
    listed = {(e["url"], e["model"], e["kind"], e["job_id"]) for e in json.loads(result.stdout)}
    for ep in served.values():
        assert (ep.url, ep.model, ep.kind, ep.job_id) in listed
    record = json.loads((backend.backend.home / "servers" / f"{served['base'].name}.json").read_text())
    assert {"pid", "port", "url", "model_dir", "job_id", "kind", "log"} <= set(record)
    assert record["model_dir"] == str(Path(trained_tiny_job.base_model).resolve())
    assert Path(record["log"]).is_file()
    # serving the same thing again returns the running server, it starts no second one
    assert backend.serve(trained_tiny_job.id) == served["fine-tuned"]
    result = _cli("serve", trained_tiny_job.id, "--json", home=backend.backend.home)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["url"] == served["fine-tuned"].url
    result = _cli("servers", home=backend.backend.home)
    assert served["fine-tuned"].url in result.stdout and "base" in result.stdout


def test_serve_port_that_is_bad_or_taken_is_one_line_exit_2_and_starts_nothing(served, backend, trained_tiny_job):
    """``playground serve JOB --port N`` (and ``playground.api.serve``): an invalid port, a port another process
    listens on, or a port other than the one the job's running server has, each in one line naming --port."""
    from playground import api

    job = trained_tiny_job.id
    before = sorted((r["name"], r["pid"]) for r in LocalServers(backend.backend.home).records())
    running = int(served["fine-tuned"].url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        cases = {
            "0": "--port must be a whole number from 1 to 65535, got '0'",
            "65536": "--port must be a whole number from 1 to 65535, got '65536'",
            "http": "--port must be a whole number from 1 to 65535, got 'http'",
            str(busy): f"--port {busy} is taken on 127.0.0.1 (another process listens there)",
        }
        for port, message in cases.items():
            result = _cli("serve", job, "--base", "--port", port, home=backend.backend.home)
            assert result.returncode == 2 and result.stderr.count("\n") == 1, (port, result.stderr)
            assert result.stderr.startswith(f"playground: error: {message}"), result.stderr
        with pytest.raises(UserError, match=f"--port {busy} is taken") as refused:
            api.serve(job, port=busy)
        assert refused.value.field == "--port"
    other = free_port()
    result = _cli("serve", job, "--port", str(other), home=backend.backend.home)  # the job's server runs elsewhere
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"--port {other}: server {served['fine-tuned'].name} already serves" in result.stderr
    assert f"on port {running}; stop it first" in result.stderr
    with pytest.raises(UserError, match="--port must be a whole number from 1 to 65535, got -1"):
        api.serve(job, port=-1)
    assert api.serve(job, port=running) == served["fine-tuned"]  # the running server, on the port asked for
    result = _cli("serve", job, "--port", "8080", "--backend", "kubernetes", home=backend.backend.home)
    assert result.returncode == 2 and "--port applies to the local backend's model servers" in result.stderr
    assert sorted((r["name"], r["pid"]) for r in LocalServers(backend.backend.home).records()) == before
    assert not port_in_use(other)


def test_cli_chat(served, backend, trained_tiny_job):
    fine = served["fine-tuned"]
    result = _cli("chat", fine.url, "reverse: flow", "--max-tokens", "12", home=backend.backend.home)
    assert (result.returncode, result.stdout.strip()) == (0, "wolf"), result.stderr
    result = _cli("chat", fine.url, "reverse: serve", "--stream", "--model", fine.model, home=backend.backend.home)
    assert (result.returncode, result.stdout.strip()) == (0, "evres"), result.stderr
    result = _cli("chat", trained_tiny_job.id, "reverse: kube", home=backend.backend.home)  # a job id finds its server
    assert (result.returncode, result.stdout.strip()) == (0, "ebuk"), result.stderr
    result = _cli("chat", fine.url, "reverse: kube", "--model", "other", home=backend.backend.home)
    assert result.returncode == 2 and "'other' is not served here" in result.stderr
    assert result.stderr.count("\n") == 1  # one line
    result = _cli("unserve", "http://127.0.0.1:1/v1", home=backend.backend.home)
    assert result.returncode == 2 and "no local model server matches" in result.stderr


def test_a_port_in_use_is_refused_another_is_used_and_stop_frees_it(trained_tiny_job, tmp_path):
    servers = LocalServers(tmp_path / "home")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"--port {busy} is taken on 127.0.0.1") as refused:
            servers.start(trained_tiny_job.model_dir, name="extra", port=busy)
        assert refused.value.field == "--port" and servers.records() == []  # nothing started
        requested = free_port()
        ep = servers.start(trained_tiny_job.model_dir, name="extra", port=str(requested))
    try:
        port = int(ep.url.rsplit(":", 1)[1].split("/")[0])
        assert port == requested != busy and port_in_use(port)
        assert _ask(ep, "reverse: kube") == "ebuk"
        pid = servers.records()[0]["pid"]
        assert [e.url for e in LocalServers(tmp_path / "home").list()] == [ep.url]
    finally:
        stopped = servers.stop(ep.url)
    assert [e.url for e in stopped] == [ep.url]
    assert not pid_alive(pid) and not port_in_use(port)
    assert servers.list() == [] and not (tmp_path / "home" / "servers" / "extra.json").exists()
    assert servers.stop(ep.url) == []
    # a server that died on its own (killed, machine rebooted) is dropped from the list
    record = tmp_path / "home" / "servers" / "extra.json"
    record.write_text(json.dumps({"name": "extra", "pid": pid, "url": ep.url, "model": ep.model, "model_dir": "x"}))
    assert servers.list() == [] and not record.exists()


def test_a_server_that_dies_reports_its_last_log_lines(trained_tiny_job, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(trained_tiny_job.model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["NoSuchArchitectureForCausalLM"]
    (broken / "config.json").write_text(json.dumps(config))
    servers = LocalServers(tmp_path / "home")
    started = time.monotonic()
    with pytest.raises(
        UserError, match=r"exited with code \d+ before it was ready: \w+Error: .*NoSuchArchitecture"
    ) as caught:
        servers.start(str(broken), timeout=120)
    assert time.monotonic() - started < 120  # noticed the death, did not wait for the timeout
    assert "Traceback" not in str(caught.value) and str(caught.value).count("NoSuchArchitecture") == 1  # once
    assert servers.list() == []


def test_the_start_timeout_setting_is_used_and_a_bad_one_is_a_one_line_error(trained_tiny_job, tmp_path, monkeypatch):
    """PLAYGROUND_SERVER_START_TIMEOUT: a server that cannot answer within it is given up (and stopped); a bad value
    names the variable and starts nothing."""
    servers = LocalServers(tmp_path / "home")
    for bad in ("soon", "0", "-5", "1e9"):
        monkeypatch.setenv("PLAYGROUND_SERVER_START_TIMEOUT", bad)
        with pytest.raises(UserError, match=r"PLAYGROUND_SERVER_START_TIMEOUT=.* is not valid \(allowed: seconds"):
            servers.start(str(trained_tiny_job.model_dir))
        assert servers.records() == []
    monkeypatch.setenv("PLAYGROUND_SERVER_START_TIMEOUT", "0.2")  # far less than loading torch takes
    with pytest.raises(UserError, match=r"was not ready after 0.2s"):
        servers.start(str(trained_tiny_job.model_dir))
    assert servers.list() == []


@pytest.mark.parametrize("damage", ["gone", "config.json", "model.safetensors", "tokenizer.json", "chat template"])
def test_missing_or_incomplete_model_dir_names_the_missing_file(trained_tiny_job, tmp_path, damage):
    model = tmp_path / "model"
    shutil.copytree(trained_tiny_job.model_dir, model)
    check_model_dir(model)  # the trainer's directory is complete
    if damage == "gone":
        shutil.rmtree(model)
        needle = "does not exist"
    elif damage == "chat template":
        (model / "chat_template.jinja").unlink(missing_ok=True)
        tok = json.loads((model / "tokenizer_config.json").read_text())
        tok.pop("chat_template", None)
        (model / "tokenizer_config.json").write_text(json.dumps(tok))
        needle = "chat_template.jinja"
    else:
        (model / damage).unlink()
        needle = damage
    servers = LocalServers(tmp_path / "home")
    with pytest.raises(UserError, match=needle):
        servers.start(str(model))
    assert not (tmp_path / "home" / "servers").exists() or not list((tmp_path / "home" / "servers").iterdir())


def test_truncated_weights_are_reported(trained_tiny_job, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(trained_tiny_job.model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(UserError, match=r"incomplete model\.safetensors"):
        check_model_dir(model)


def test_a_running_job_serves_its_base_model_but_not_a_fine_tuned_one_and_delete_stops_it(backend, session_home):
    from playground.api import make_request

    # batch_size 1: little data to generate, so the base weights are written within seconds
    job = backend.submit(make_request("tiny-llama-cpu", {"max_steps": 5000, "batch_size": 1}))
    try:
        with pytest.raises(UserError, match=r"can be served once it has Succeeded"):
            backend.serve(job.id)
        result = _cli("serve", job.id, home=session_home)
        assert result.returncode == 2 and "once it has Succeeded" in result.stderr
        # the trainer writes the untrained weights before its first step
        wait_for(lambda: backend.get(job.id).base_model, 180, "the job's base model", interval=0.5)
        base = backend.serve(job.id, base=True)  # compare against the base while the job trains
        assert base.kind == "base" and chat(base, "reverse: kube", max_tokens=MAX_TOKENS) != "ebuk"
        port = int(base.url.rsplit(":", 1)[1].split("/")[0])
    finally:
        backend.delete(job.id)  # cancels the job and stops its servers
    assert not any(e.job_id == job.id for e in backend.endpoints())
    assert not port_in_use(port)


def test_unserve_by_job_id_stops_both_servers(served, backend, trained_tiny_job):
    urls = [ep.url for ep in served.values()]
    job = trained_tiny_job.id
    result = _cli("unserve", job, home=backend.backend.home)
    assert result.returncode == 0, result.stderr
    said = sorted(result.stdout.splitlines())  # what stopped, one line per server
    expected = sorted(f"stopped {ep.kind} server {ep.name} of job {job} ({ep.url})" for ep in served.values())
    assert said == expected
    assert not any(e.job_id == trained_tiny_job.id for e in backend.endpoints())
    for url in urls:
        assert not port_in_use(int(url.rsplit(":", 1)[1].split("/")[0]))
        with pytest.raises(UserError, match="cannot reach"):
            chat(url, "hi", model="m")
    result = _cli("chat", job, "reverse: kube", home=backend.backend.home)  # the job is known; its servers are gone
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"job {job} has no running model server; start one with `playground serve {job}`" in result.stderr
