"""Serving on vLLM, over HTTP: LoRA adapters loaded onto the one SmolLM2 base server, a full fine-tune on a server
of its own, bad input, a crashed server, and the CLI.

One vLLM process serves the whole run (25 s to start on idle cores, 60-140 s on busy ones): the SmolLM2 base server
(conftest's ``smollm2_base``, shared with tests/test_smollm2_blueprint.py and tests/test_booth_servers.py across the
xdist lanes), onto which the default blueprint's trained adapter and random PEFT adapters load in well under a
second; its tests check vLLM's own answers and errors. The tests of a full fine-tune's server of its own (the
session's trained tiny job, ``playground serve JOB --port N``), of a crashed server and of the CLI are about the
playground's server lifecycle, the same for either engine: they use the suite's default engine, transformers'
``transformers serve`` (~10 s a start), and a second vLLM start would cost the run a minute or two of its 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from _fixtures import adapter_job, tiny_held_out, unused_port
from _waiting import wait_for

from playground.errors import UserError
from playground.facade import Playground
from playground.serving.client import base_url, chat
from playground.serving.local import LocalServers, free_port, pid_alive, port_in_use
from playground.serving.validate import check_model_dir
from playground.types import Endpoint

# 1800: the first test's setup converts and trains SmolLM2 and starts the base server (~25 min under load 15)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

N_HELD_OUT = 24
MAX_TOKENS = 12  # tiny-llama-cpu's serving.max_new_tokens
KUBECTL_TOKENS = 24  # the longest kubectl command is ~20 tokens


# -- helpers and fixtures -------------------------------------------------------------------------
def _cli(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLAYGROUND_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "playground.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _ask(endpoint, prompt: str, **kw) -> str:
    kw.setdefault("max_tokens", MAX_TOKENS)
    kw.setdefault("temperature", 0.0)
    return chat(endpoint, [{"role": "user", "content": prompt}], **kw)


def _served_models(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url.rstrip("/") + "/models", timeout=30).json()["data"]}


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture(scope="module")
def held_out() -> list[tuple[str, str]]:
    """tiny-llama-cpu's held-out prompts exactly as its trainer draws them (never trained on)."""
    return [(s.prompt, s.answer) for s in tiny_held_out(N_HELD_OUT)]


@pytest.fixture(scope="module")
def backend(session_home: Path) -> Playground:
    from playground.backends.local import LocalBackend

    return Playground(LocalBackend(home=session_home))  # the facade: jobs with their model servers


@pytest.fixture(scope="module")
def tiny_served(trained_tiny_job, session_home: Path) -> Endpoint:
    """The session's trained tiny full fine-tune on a server of its own (the suite's default engine), started by
    ``playground serve JOB --port N --json`` on the port chosen here (stopped at the end of the run)."""
    port = free_port()
    result = _cli("serve", trained_tiny_job.id, "--port", str(port), "--json", home=session_home, timeout=900)
    assert result.returncode == 0, result.stderr
    endpoint = Endpoint(**json.loads(result.stdout))
    assert endpoint.url == f"http://127.0.0.1:{port}/v1" and port_in_use(port)
    return endpoint


@pytest.fixture(scope="module")
def tiny_answers(tiny_served, held_out) -> list[str]:
    """The tiny server's answers to the held-out prompts (asked once, non-streaming, greedy)."""
    return [_ask(tiny_served, p) for p, _ in held_out]


def _score(answers: list[str], pairs: list[tuple[str, str]]) -> float:
    return sum(a.strip() == e for a, (_, e) in zip(answers, pairs, strict=True)) / len(pairs)


# -- 1. LoRA adapters on the shared base server ---------------------------------------------------
def test_lora_adapters_load_onto_the_shared_base_server_and_unload(
    shared_base, smollm2_job, random_adapters, smollm2_dir, session_home
):
    """A LoRA job's serve loads its adapter onto the running base server under the job's id (same URL, well under
    2 s); a second one loads beside it; the base model answers on the same server; unserve unloads it."""
    from playground.blueprints import get_blueprint
    from playground.models.adapters import is_adapter_dir

    _, job, _ = smollm2_job
    assert is_adapter_dir(job.model_dir), job.model_dir  # a LoRA job's model is its PEFT adapter
    servers = LocalServers(session_home)
    other = adapter_job("lora-random-a", random_adapters[0], smollm2_dir)
    started = time.monotonic()
    tuned = servers.serve(job)
    click = time.monotonic() - started
    assert click < 2.0, click  # measured ~0.05-0.3 s: nothing starts, a few MB load
    assert (tuned.url, tuned.model, tuned.job_id, tuned.kind) == (shared_base.url, job.id, job.id, "fine-tuned")
    second = servers.serve(other)
    assert (second.url, second.model) == (shared_base.url, other.id)
    assert {shared_base.model, job.id, other.id} <= _served_models(shared_base.url)
    assert servers.serve(job) == tuned  # serving it again: the same endpoint, still loaded

    # the three models on one server answer differently: the trained adapter with commands, the base in sentences
    example = get_blueprint("smollm2-135m-lora-kubectl").examples[0]
    answers = {ep.model: _ask(ep, example.prompt, max_tokens=KUBECTL_TOKENS) for ep in (tuned, second, shared_base)}
    assert answers[job.id].startswith("kubectl "), answers
    assert len(answers[shared_base.model].split()) >= 3 and not answers[shared_base.model].startswith("kubectl")
    assert len(set(answers.values())) == 3, answers
    base_side = servers.serve(job, base=True)  # the job's base model: the same server, the base model's name
    assert (base_side.url, base_side.model, base_side.job_id, base_side.kind) == (
        shared_base.url, shared_base.model, job.id, "base",
    )  # fmt: skip

    # the adapters are endpoints of their jobs on the base server's URL, for any process (the records say so); the
    # operator's `playground servers` shows the one base server and how many use it
    assert {(shared_base.url, job.id, job.id, "fine-tuned"), (shared_base.url, other.id, other.id, "fine-tuned")} <= {
        (e.url, e.model, e.job_id, e.kind) for e in LocalServers(session_home).endpoints()
    }
    result = _cli("servers", "--json", home=session_home)
    assert result.returncode == 0, result.stderr
    (row,) = [e for e in json.loads(result.stdout) if e["url"] == shared_base.url]
    assert row["kind"] == "base" and row["shared"] and row["users"] >= 3, row  # two adapters, one base-side job

    servers.unserve(other.id)
    assert other.id not in _served_models(shared_base.url) and job.id in _served_models(shared_base.url)
    with pytest.raises(UserError) as gone:
        _ask(second, "hello")
    assert "404" in str(gone.value) and "\n" not in str(gone.value)
    assert _ask(shared_base, "hello") and _ask(tuned, example.prompt, max_tokens=KUBECTL_TOKENS) == answers[job.id]
    assert [e.job_id for e in servers.endpoints() if e.model == other.id] == []


def test_the_adapter_cap_unloads_the_least_recently_used(shared_base, random_adapters, smollm2_dir, session_home):
    """At ``max_adapters`` (2 here) one more adapter unloads the least recently used one (by its last chat request,
    which the server records); it is served again on its next serve."""
    from playground.booth import BoothPolicy

    servers = LocalServers(session_home, policy=BoothPolicy(max_adapters=2))
    jobs = [adapter_job(f"lora-cap-{i}", path, smollm2_dir) for i, path in enumerate(random_adapters)]
    first, second = servers.serve(jobs[0]), servers.serve(jobs[1])
    assert _ask(second, "hello", max_tokens=2) is not None
    assert _ask(first, "hello", max_tokens=2) is not None  # the first is now the most recently used
    servers.serve(jobs[2])
    loaded = _served_models(shared_base.url)
    assert jobs[0].id in loaded and jobs[2].id in loaded and jobs[1].id not in loaded, loaded
    assert {e.model for e in servers.endpoints() if e.kind == "fine-tuned"} >= {jobs[0].id, jobs[2].id}
    assert jobs[1].id not in {e.model for e in servers.endpoints()}
    again = servers.serve(jobs[1])  # served again: the least recently used of the others makes room
    assert again.model in _served_models(shared_base.url) and _ask(again, "hello", max_tokens=2) is not None


# -- 2. the same answers as the trainer's own evaluation ------------------------------------------
def test_the_adapter_on_vllm_answers_as_the_trainers_evaluation(shared_base, smollm2_job, session_home):
    """The trainer's final held-out answers (``output/eval_answers.jsonl``, greedy, in-process) against the job's
    adapter on the vLLM base server (temperature 0): token for token alike, or at least the same verdict by the
    evaluation's own rule, on every request (10 here: >= 99 % means all). vLLM renders every model of a server with
    the base model's chat template, SmolLM2's with its default system prompt; the adapter's chats must be rendered
    with the template it was trained with (measured: 3 of the 8 answers that fit in 24 tokens differed without it,
    none with it)."""
    from playground.answers import answer_is_correct
    from playground.blueprints import get_blueprint
    from playground.train.recipe import EVAL_ANSWERS

    _, job, _ = smollm2_job
    records = [json.loads(line) for line in (Path(job.model_dir).parent / EVAL_ANSWERS).read_text().splitlines()]
    assert len(records) == 10 and {"messages", "answer", "expected", "correct"} <= set(records[0])
    assert sum(r["correct"] for r in records) / len(records) == pytest.approx(job.metrics["eval_exact_match"])
    tuned = LocalServers(session_home).serve(job)
    budget = get_blueprint(job.blueprint_id).serving.max_new_tokens  # the trainer's is within it
    served = [chat(tuned, r["messages"], max_tokens=budget, temperature=0.0) for r in records]
    same_text = sum(s == r["answer"] for s, r in zip(served, records, strict=True))
    same_verdict = sum(
        bool(answer_is_correct(s, r["expected"])) == r["correct"] for s, r in zip(served, records, strict=True)
    )
    assert same_verdict == len(records), list(zip(served, records, strict=True))
    assert same_text >= len(records) - 1, list(zip(served, records, strict=True))


def test_the_cli_says_vllms_unknown_model_in_one_line(shared_base, session_home):
    result = _cli("chat", shared_base.url, "list the pods", "--model", "other", home=session_home)
    assert result.returncode == 2 and "The model `other` does not exist" in result.stderr
    assert result.stderr.count("\n") == 1  # one line


# -- 3. bad input, with the official openai client ------------------------------------------------
def test_bad_requests_get_their_status_and_the_server_keeps_serving(shared_base, smollm2_job, session_home):
    import openai

    _, job, _ = smollm2_job
    tuned = LocalServers(session_home).serve(job)
    client = openai.OpenAI(base_url=tuned.url, api_key="unused", max_retries=0, timeout=120)
    context = json.loads((Path(shared_base_dir(session_home, shared_base)) / "config.json").read_text())[
        "max_position_embeddings"
    ]
    hello = [{"role": "user", "content": "list the pods"}]
    expected = _ask(tuned, "list the pods", max_tokens=KUBECTL_TOKENS)
    cases = [
        ("body over 1 MiB", dict(model=job.id, messages=[{"role": "user", "content": "a" * (1 << 20)}]), 413,
         "this server accepts at most 1048576 bytes"),
        ("bad field", dict(model=job.id, messages=hello, temperature="hot"), 400, "temperature"),
        ("bad max_tokens", dict(model=job.id, messages=hello, max_tokens=-3), 400, "max_tokens"),
        ("over the context", dict(model=job.id, messages=[{"role": "user", "content": "hello " * (context + 10)}]),
         400, f"maximum context length is {context} tokens"),
        ("unknown model", dict(model="no-such-job", messages=hello), 404, "no-such-job"),
    ]  # fmt: skip
    for what, request, status, needle in cases:
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(**request)
        assert refused.value.status_code == status, (what, refused.value)
        assert needle in str(refused.value) and len(str(refused.value)) < 4000, (what, str(refused.value)[:500])
        assert _ask(tuned, "list the pods", max_tokens=KUBECTL_TOKENS) == expected, what  # still serving
    # the project's client says the same in one line
    with pytest.raises(UserError, match=r"413") as caught:
        chat(tuned, "a" * (1 << 20))
    assert "\n" not in str(caught.value)


def shared_base_dir(session_home: Path, endpoint: Endpoint) -> str:
    """The model directory the base server at ``endpoint`` loaded (its record's)."""
    return next(r["model_dir"] for r in LocalServers(session_home).records() if r["url"] == endpoint.url)


# -- 5. a full fine-tune on a server of its own --------------------------------------------------
def test_full_fine_tune_answers_the_held_out_prompts(
    tiny_served, trained_tiny_job, held_out, tiny_answers, session_home
):
    assert tiny_served.kind == "fine-tuned" and tiny_served.job_id == trained_tiny_job.id
    record = next(r for r in LocalServers(session_home).records() if r["url"] == tiny_served.url)
    model_dir = str(Path(trained_tiny_job.model_dir).resolve())
    assert record["engine"] == "transformers" and record["model_dir"] == model_dir  # the suite's default engine
    assert tiny_served.model == model_dir  # `transformers serve` loads by path (vLLM: the job id, as the adapters)
    assert _score(tiny_answers, held_out) >= 0.9, list(zip(held_out, tiny_answers, strict=True))


def test_streaming_equals_non_streaming(tiny_served, held_out, tiny_answers):
    pieces = []
    for (prompt, _), answer in zip(held_out[:4], tiny_answers, strict=False):
        chunks = list(_ask(tiny_served, prompt, stream=True))
        assert "".join(chunks) == answer
        pieces.append(len(chunks))
    assert max(pieces) > 1, pieces  # really streamed (a short answer may come as one piece)


def test_eight_concurrent_clients_all_get_correct_answers(tiny_served, held_out, tiny_answers):
    n = 16  # 8 clients, 2 requests each, half of them streaming

    def one(i: int) -> str:
        prompt = held_out[i][0]
        return "".join(_ask(tiny_served, prompt, stream=True)) if i % 2 else _ask(tiny_served, prompt)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, range(n)))
    assert _score(answers, held_out[:n]) >= 0.9, answers
    assert answers == tiny_answers[:n]  # batching changes nothing


# -- the CLI --------------------------------------------------------------------------------------
def test_a_new_process_lists_the_servers_and_serving_again_reuses_them(
    tiny_served, backend, trained_tiny_job, session_home
):
    result = _cli("servers", "--json", home=session_home)
    assert result.returncode == 0, result.stderr
    listed = {(e["url"], e["model"], e["kind"], e["job_id"]) for e in json.loads(result.stdout)}
    assert (tiny_served.url, tiny_served.model, "fine-tuned", trained_tiny_job.id) in listed
    record = json.loads((session_home / "servers" / f"{tiny_served.name}.json").read_text())
    assert {"pid", "port", "url", "model_dir", "job_id", "kind", "log", "engine"} <= set(record)
    assert Path(record["log"]).is_file()
    assert backend.serve(trained_tiny_job.id) == tiny_served  # the running server; no second one starts
    result = _cli("serve", trained_tiny_job.id, "--json", home=session_home)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["url"] == tiny_served.url
    result = _cli("servers", home=session_home)
    assert tiny_served.url in result.stdout and "fine-tuned" in result.stdout


def test_serve_port_that_is_bad_or_taken_is_one_line_exit_2_and_starts_nothing(
    tiny_served, trained_tiny_job, session_home
):
    """``playground serve JOB --port N`` (and ``playground.api.serve``): an invalid port, a port another process
    listens on, or a port other than the one the job's running server has, each in one line naming --port."""
    from playground import api

    job = trained_tiny_job.id
    before = sorted((r["name"], r["pid"]) for r in LocalServers(session_home).records())
    running = _port(tiny_served.url)
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
            result = _cli("serve", job, "--base", "--port", port, home=session_home)
            assert result.returncode == 2 and result.stderr.count("\n") == 1, (port, result.stderr)
            assert result.stderr.startswith(f"playground: error: {message}"), result.stderr
        with pytest.raises(UserError, match=f"--port {busy} is taken") as refused:
            api.serve(job, port=busy)
        assert refused.value.field == "--port"
    other = free_port()
    result = _cli("serve", job, "--port", str(other), home=session_home)  # the job's server runs elsewhere
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"--port {other}: server {tiny_served.name} already serves" in result.stderr
    assert f"on port {running}; stop it first" in result.stderr
    with pytest.raises(UserError, match="--port must be a whole number from 1 to 65535, got -1"):
        api.serve(job, port=-1)
    assert api.serve(job, port=running) == tiny_served  # the running server, on the port asked for
    result = _cli("serve", job, "--port", "8080", "--backend", "kubernetes", home=session_home)
    assert result.returncode == 2 and "--port applies to the local backend's model servers" in result.stderr
    assert sorted((r["name"], r["pid"]) for r in LocalServers(session_home).records()) == before
    assert not port_in_use(other)


def test_cli_chat(tiny_served, trained_tiny_job, session_home):
    result = _cli("chat", tiny_served.url, "reverse: flow", "--max-tokens", "12", home=session_home)
    assert (result.returncode, result.stdout.strip()) == (0, "wolf"), result.stderr
    streamed = ("chat", tiny_served.url, "reverse: serve", "--stream", "--model", tiny_served.model)
    result = _cli(*streamed, home=session_home)
    assert (result.returncode, result.stdout.strip()) == (0, "evres"), result.stderr
    result = _cli("chat", trained_tiny_job.id, "reverse: kube", home=session_home)  # a job id finds its server
    assert (result.returncode, result.stdout.strip()) == (0, "ebuk"), result.stderr
    result = _cli("unserve", "http://127.0.0.1:1/v1", home=session_home)
    assert result.returncode == 2 and "no local model server matches" in result.stderr
    with pytest.raises(UserError, match="cannot reach"):
        chat(f"http://127.0.0.1:{unused_port()}/v1", "hi", model="m")
    with pytest.raises(UserError, match="must look like"):
        chat("localhost:8000", "hi")
    assert base_url("http://127.0.0.1:9") == "http://127.0.0.1:9/v1"


# -- 4. a crashed server; unserve ------------------------------------------------------------------
def test_a_crashed_server_is_dropped_and_serving_again_starts_a_new_one(
    tiny_served, trained_tiny_job, backend, session_home, held_out, tiny_answers
):
    """kill -9 of a server: listing drops it, a chat gets a one-line error, the job is untouched, and serving it
    again starts a new server that answers as before."""
    servers = LocalServers(session_home)
    pid = next(int(r["pid"]) for r in servers.records() if r["url"] == tiny_served.url)
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 30, "the killed server's process gone", interval=0.2)
    assert tiny_served.url not in {e.url for e in servers.list()}
    assert not (session_home / "servers" / f"{tiny_served.name}.json").exists()
    with pytest.raises(UserError) as unreachable:
        _ask(tiny_served, "reverse: kube")
    assert "cannot reach" in str(unreachable.value) and "\n" not in str(unreachable.value)
    job = backend.get(trained_tiny_job.id)
    assert job.phase == trained_tiny_job.phase and job.model_dir == trained_tiny_job.model_dir
    assert Path(job.model_dir, "config.json").is_file()
    again = backend.serve(trained_tiny_job.id)
    assert again.url != tiny_served.url or pid not in {r["pid"] for r in servers.records()}
    assert [_ask(again, p) for p, _ in held_out[:4]] == tiny_answers[:4]


def test_a_crashed_base_server_drops_its_adapters(shared_base, smollm2_job, session_home):
    """The record of a base server whose process is gone (here a copy of the shared one's, with a dead pid) is
    dropped when listed, and with it every adapter it held; the running one keeps its own."""
    _, job, _ = smollm2_job
    servers = LocalServers(session_home)
    tuned = servers.serve(job)
    record = next(r for r in servers.records() if r["url"] == shared_base.url)
    assert job.id in record["adapters"]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    url = f"http://127.0.0.1:{unused_port()}/v1"
    ghost = {**record, "name": "ghost-base", "pid": dead.pid, "url": url}
    (session_home / "servers" / "ghost-base.json").write_text(json.dumps(ghost))
    listed = {(e.url, e.model) for e in servers.list()}
    assert not any(u == url for u, _ in listed) and (tuned.url, job.id) in listed
    assert not (session_home / "servers" / "ghost-base.json").exists()


def test_unserve_by_job_id_stops_its_server(trained_tiny_job, backend, session_home):
    served = backend.serve(trained_tiny_job.id)  # the running one (started again by the crash test)
    job = trained_tiny_job.id
    result = _cli("unserve", job, home=session_home)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"stopped fine-tuned server {served.name} of job {job} ({served.url})"]
    assert not any(e.job_id == job for e in backend.endpoints())
    assert not port_in_use(_port(served.url))
    result = _cli("chat", job, "reverse: kube", home=session_home)  # the job is known; its server is gone
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"job {job} has no running model server; start one with `playground serve {job}`" in result.stderr


# -- engine-independent lifecycle (the suite's default engine) -------------------------------------
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


@pytest.mark.parametrize("damage", ["adapter_model.safetensors", "truncated", "rank"])
def test_an_incomplete_adapter_dir_names_the_file(random_adapters, tmp_path, damage):
    from playground.serving.validate import check_adapter_dir

    adapter = tmp_path / "adapter"
    shutil.copytree(random_adapters[0], adapter)
    check_adapter_dir(adapter)
    weights = adapter / "adapter_model.safetensors"
    if damage == "adapter_model.safetensors":
        weights.unlink()
        needle = "missing weights file adapter_model.safetensors"
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        needle = r"incomplete adapter_model\.safetensors"
    else:
        config = json.loads((adapter / "adapter_config.json").read_text())
        config.pop("r")
        (adapter / "adapter_config.json").write_text(json.dumps(config))
        needle = "not a LoRA adapter with a rank 'r'"
    with pytest.raises(UserError, match=needle) as caught:
        check_model_dir(adapter)
    assert "\n" not in str(caught.value)


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
        port = _port(base.url)
    finally:
        backend.delete(job.id)  # cancels the job and stops its servers
    assert not any(e.job_id == job.id for e in backend.endpoints())
    assert not port_in_use(port)


def test_the_guard_renders_an_adapters_chats_with_its_own_template(tmp_path, monkeypatch):
    """vLLM renders every model of a server with the base model's chat template; the guard in front of it puts the
    adapter's own (the one its job trained and evaluated with) into the adapter's chat requests, drops one a client
    sends, and keeps Content-Length right. No server: the middleware around a stand-in app."""
    import asyncio

    from playground.serving.vllm_guard import PlaygroundGuard, template_file

    template_file(tmp_path, "job-1").write_text("{{ messages[0]['content'] }}")
    monkeypatch.setenv("PLAYGROUND_GUARD_TEMPLATES_DIR", str(tmp_path))
    seen: dict = {}

    async def app(scope, receive, send) -> None:
        message = await receive()
        seen.update(body=json.loads(message["body"]), length=int(dict(scope["headers"])[b"content-length"]))
        seen["raw"] = len(message["body"])

    async def ask(body: dict) -> dict:
        raw = json.dumps(body).encode()
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                 "headers": [(b"content-length", str(len(raw)).encode())]}  # fmt: skip
        messages = iter([{"type": "http.request", "body": raw, "more_body": False}])

        async def receive() -> dict:
            return next(messages)

        async def send(_message) -> None:
            return None

        await PlaygroundGuard(app)(scope, receive, send)
        assert seen["length"] == seen["raw"]
        return seen["body"]

    hello = [{"role": "user", "content": "hi"}]
    adapter = asyncio.run(ask({"model": "job-1", "messages": hello, "chat_template": "{{ 'injected' }}"}))
    assert adapter["chat_template"] == "{{ messages[0]['content'] }}"
    base = asyncio.run(ask({"model": "base", "messages": hello, "chat_template": "{{ 'injected' }}"}))
    assert "chat_template" not in base and base["messages"] == hello
