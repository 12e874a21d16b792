"""vLLM as a served engine: real servers (.venv-vllm) on a model pruned from the bundled teacher.

The pruned model is heterogeneous the ways vLLM's DeciLM reads: a layer without
attention, KV groups of 4 and 8 query heads, FFN widths 768/512/256, a layer with
neither block. One server serves the module's checks; the two tests of what happens
when its parent is interrupted or killed start one each, in a child process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from autocompress import vllm_engine
from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.errors import AutoCompressError
from autocompress.importance import random_importance
from autocompress.modeling import load_causal_lm
from autocompress.paths import default_teacher_dir
from autocompress.prune import prune

try:
    vllm_engine.vllm_python()
except AutoCompressError as err:  # an unsupported platform: the set-up said why
    pytest.skip(f"vLLM is not installed here: {err}", allow_module_level=True)

from autocompress.vllm_client import measure_serving, prompt_logprobs  # noqa: E402

torch.set_num_threads(1)
PROMPT = [5, 17, 99, 3, 64, 120, 7, 45, 88, 301, 2048, 11, 4000, 9, 512, 77]
GONE_WITHIN_S = 60.0  # vLLM's shutdown after SIGTERM, beside a busy machine


def _layer(heads: int, kv: int, ffn: int) -> LayerSpec:
    return LayerSpec(attention=AttentionSpec(num_heads=heads, num_kv_heads=kv) if heads else None,
                     ffn=FFNSpec(intermediate_size=ffn) if ffn else None)


HETEROGENEOUS = [_layer(8, 2, 768), _layer(0, 0, 512), _layer(8, 1, 256), _layer(0, 0, 0),
                 _layer(8, 2, 512)]


def _pruned(out: Path, layers: list[LayerSpec]):
    """The bundled teacher pruned to ``layers``, saved with its tokenizer."""
    teacher, _ = load_causal_lm(default_teacher_dir(), with_tokenizer=False)
    model = prune(teacher, random_importance(teacher), ArchSpec(hidden_size=256, layers=layers))
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(default_teacher_dir() / name, out / name)
    return model


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    path = tmp_path_factory.mktemp("pruned") / "model"
    return _pruned(path, HETEROGENEOUS), path


@pytest.fixture(scope="module")
def export(pruned, tmp_path_factory):
    return vllm_engine.export_for_vllm(pruned[1], tmp_path_factory.mktemp("export") / "nas")


@pytest.fixture(scope="module")
def server(export, tmp_path_factory):
    with vllm_engine.VllmServer(export, dtype="fp32", max_model_len=256, max_num_seqs=4,
                                max_logprobs=-1, log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


def test_a_heterogeneous_export_serves_pytorchs_log_probs(pruned, server):
    """Every prompt position's log-probabilities over the whole vocabulary, fp32."""
    model, _ = pruned
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0].double(), -1)[:-1]
    rows = prompt_logprobs(server, PROMPT)
    got = torch.tensor([[row[t] for t in range(expected.shape[1])] for row in rows],
                       dtype=torch.double)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-4


def test_concurrent_requests_are_timed_and_memory_is_vllms(pruned, server):
    report = measure_serving(server, isl=24, osl=6, batch=3, vocab_size=4096, rounds=1,
                             warmup=0)
    assert report.tpot_ms.n == report.ttft_ms.n == 3 and report.itl_ms.n == 3 * 5
    assert 0 < report.ttft_ms.median <= report.e2e_ms.median
    assert report.tpot_ms.p99 >= report.tpot_ms.median > 0
    assert report.output_throughput == pytest.approx(6 * report.request_throughput)
    # vLLM's engine clock: from reaching the engine, so within what the client waited
    assert report.engine_tpot_ms.n == 1 and report.engine_tpot_ms.median > 0
    assert 0 < report.engine_ttft_ms.mean <= report.ttft_ms.mean

    memory = server.memory()
    model, _ = pruned
    # The KV cache vLLM allocated holds, per token, K and V of every attention layer.
    kv_per_token = sum(2 * layer.attention.num_kv_heads * 32 * 4
                       for layer in HETEROGENEOUS if layer.attention)
    assert memory.kv_bytes_per_token == kv_per_token
    assert memory.weights_bytes == 4 * sum(p.numel() for p in model.parameters())
    blocks = -(-(24 + 6 - 1) // memory.block_size)
    assert memory.serving_bytes(24 + 6 - 1, 3) == memory.weights_bytes \
        + 3 * blocks * memory.block_size * kv_per_token


def test_the_worker_computes_on_its_cores_alone(server):
    """vLLM binds its worker's OpenMP threads; every other thread of the server is moved
    to the cores it reserves, and a client timing from those cores returns to its own."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("one core: nothing to isolate the worker from")
    assert server.worker_cpus and server.framework_cpus == cpus - server.worker_cpus
    masks = [os.sched_getaffinity(tid) for tid in vllm_engine._group_threads(server.pid)]
    assert masks.count(server.worker_cpus) >= 1  # the worker's OpenMP thread(s)
    assert set(map(frozenset, masks)) == {frozenset(server.worker_cpus),
                                          frozenset(server.framework_cpus)}
    with vllm_engine.on_cpus(server.framework_cpus):
        assert os.sched_getaffinity(0) == server.framework_cpus
    assert os.sched_getaffinity(0) == cpus


@pytest.mark.slow(seconds=60)
def test_verify_measures_the_model_as_vllm_serves_it(pruned, export, tmp_path, monkeypatch):
    """``verify`` on cpu-local/vllm exports a model directory and serves the export."""
    from autocompress.costmodel.workload import Workload
    from autocompress.limits import Limits
    from autocompress.verify import verify

    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    workload = Workload(name="tiny", isl=24, osl=6, batch=2)
    memory_limit = 1e-9 * vllm_engine.served_weight_bytes(export, "fp32")  # weights alone
    report = verify(pruned[1], "cpu-local/vllm/fp32", workload,
                    Limits(max_tpot_ms=1e5, max_memory_gb=memory_limit), repeats=2, warmup=1)
    assert report.violations == ["memory_gb"]  # the KV blocks come on top of the weights
    block = int(report.measurement["memory_detail"]["block_size"])
    kv = 2 * -(-(24 + 6 - 1) // block) * block * vllm_engine.kv_token_bytes(export, "fp32")
    assert report.measured["memory_gb"] == pytest.approx(memory_limit + 1e-9 * kv)
    assert 0 < report.measured["ttft_ms"] and 0 < report.measured["tpot_ms"] < 1e5
    assert report.measurement["device"].startswith("cpu (vLLM")
    assert "vLLM" in report.measurement["what"]
    (serving,) = report.measurement["serving"]["sessions"]
    assert serving["tpot_ms"]["n"] == 2 * 2 and serving["request_throughput"] > 0
    logits = report.measurement["serving"]["logits"]
    assert logits["compared"] == "whole vocabulary" and logits["max_abs_logprob_diff"] < 1e-4
    assert report.predicted is not None  # the analytic model, until vLLM is fitted here


def test_a_model_vllm_cannot_load_exactly_is_refused_before_any_engine_starts(tmp_path):
    """Query heads differ per layer: vLLM's DeciLM has one count (it would mis-read it)."""
    path = tmp_path / "model"
    _pruned(path, [_layer(8, 2, 768), _layer(4, 1, 768)])
    running, children, began = set(vllm_engine._running), set(_children()), time.monotonic()
    with pytest.raises(AutoCompressError, match="vllm"), \
            vllm_engine.served_model(path, tmp_path / "work"):
        pass
    assert time.monotonic() - began < 30  # no engine start (~20-40 s) was paid for
    assert vllm_engine._running == running and set(_children()) <= children
    assert not (tmp_path / "work" / "nemotron-nas").exists()  # nor was anything exported


def _children() -> list[int]:
    me = os.getpid()
    return [pid for pid in vllm_engine._pids() if _ppid(pid) == me]


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


# ------------------------------------------------------- no orphans

# The child takes Ctrl-C as a terminal's Python would: a shell that starts pytest in the
# background leaves SIGINT ignored, and children inherit that.
_CHILD = textwrap.dedent("""
    import signal, sys, time
    from autocompress.vllm_engine import VllmServer
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with VllmServer(sys.argv[1], max_model_len=128, max_num_seqs=2, log_dir=sys.argv[2]) as s:
        print(s.pid, flush=True)
        time.sleep(600)
""")


def _server_in_a_child(export, tmp_path) -> tuple[subprocess.Popen, int]:
    """A child process serving ``export``; (the child, its server's process group)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(export), str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, env=env)
    line = child.stdout.readline()
    assert line.strip().isdigit(), f"the child did not start a server: {line!r}"
    pgid = int(line)
    assert vllm_engine.group_alive(pgid)
    return child, pgid


def _gone(pgid: int) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while vllm_engine.group_alive(pgid):
        if time.monotonic() > deadline:
            os.killpg(pgid, signal.SIGKILL)  # leave nothing behind for the next test
            return False
        time.sleep(0.5)
    return True


@pytest.fixture
def server_in_a_child(export, tmp_path):
    """(child, its server's group); whatever the test leaves is killed afterwards."""
    child, pgid = _server_in_a_child(export, tmp_path)
    yield child, pgid
    child.kill()
    child.wait(timeout=30)
    if vllm_engine.group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


@pytest.mark.slow(seconds=90)
def test_ctrl_c_in_the_parent_stops_the_server(server_in_a_child):
    child, pgid = server_in_a_child
    child.send_signal(signal.SIGINT)  # KeyboardInterrupt: the with block's exit
    child.wait(timeout=GONE_WITHIN_S)
    assert _gone(pgid)


@pytest.mark.slow(seconds=90)
def test_a_killed_parent_takes_its_server_down(server_in_a_child):
    """SIGKILL: no finally, no atexit; the kernel's parent-death signal stops the server."""
    child, pgid = server_in_a_child
    child.kill()
    child.wait(timeout=30)
    assert _gone(pgid)


def test_probes_served_by_vllm_fit_a_cost_model_that_holds_vllms_memory():
    """``costmodel fit`` on cpu-local/vllm: each probe (random weights, from the space a vLLM
    search has) is exported, served by its own vLLM server and timed absolutely by the
    engine; the fitted model reproduces vLLM's memory accounting of every probe."""
    from autocompress.costmodel.fit import fit_cost_model
    from autocompress.costmodel.probes import default_base_config
    from autocompress.costmodel.target import Target
    from autocompress.costmodel.workload import Workload

    target = Target.parse("cpu-local/vllm/fp32")
    workload = Workload(name="tiny", isl=16, osl=4, batch=2)
    running = set(vllm_engine._running)
    model, rows = fit_cost_model(target, default_base_config(), [workload], n_probes=4,
                                 repeats=2, warmup=1, paired=True, progress=False)
    assert vllm_engine._running == running  # every probe's server was stopped
    assert model.fit.timing == "absolute" and model.fit.reference_spec is None
    assert [row.paired for row in rows] == [None] * 4
    assert len({json.dumps(row.spec, sort_keys=True) for row in rows}) == 4
    for row in rows:
        assert row.ttft_ms.median > 0 and row.tpot_ms.median > 0
        spec = ArchSpec.model_validate(row.spec)
        assert {layer.attention.num_heads for layer in spec.layers if layer.attention} == {8}
        assert model.memory_bytes(spec, workload).total == pytest.approx(row.memory_bytes,
                                                                         rel=0.01)
    assert model.fit.threads == rows[0].threads >= 1  # the cores vLLM computed on
