"""Distillation under torchrun: 2 CPU processes with gloo match one process.

Each rank takes half of every global batch, so a 2-process run must follow the
same loss curve as a single process (up to float summation order). One torchrun
launch runs every case (starting 2 interpreters is most of the cost here):

- ``ddp``: DDP with the hidden-state loss, straight through;
- ``fsdp``: FSDP, killed at step 3, resumed by the same 2 processes;
- ``cross``: DDP killed at step 3, resumed by this single test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[1]

# Builds the same tiny teacher/student/data in every process, then distils.
WORKER = textwrap.dedent('''
    import sys
    from pathlib import Path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from autocompress import distributed
    from autocompress.distill import DistillConfig, DistillData, WindowBatches, distill

    torch.set_num_threads(1)
    VOCAB, SEQ = 96, 16
    CASES = {"ddp": ("ddp", 0.5), "fsdp": ("fsdp", 0.0), "cross": ("ddp", 0.0)}

    def tiny_llama(layers, hidden, seed):
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
            head_dim=hidden // 4, max_position_embeddings=64, tie_word_embeddings=True,
            initializer_range=0.2))

    def run(out, parallel="ddp", alpha=0.0, resume=False, crash_at=None, student_seed=1):
        windows = torch.randint(0, VOCAB, (40, SEQ), generator=torch.Generator().manual_seed(0))
        data = DistillData(train=WindowBatches(windows[:32]), heldout=windows[32:])
        cfg = DistillConfig(tokens=8 * SEQ * 6, seq_len=SEQ, batch_size=8, warmup_steps=2,
                            lr=3e-3, ckpt_every=2, eval_batches=1, bf16=False,
                            parallel=parallel, alpha=alpha)

        def crash(step, loss):
            if step == crash_at:
                raise KeyboardInterrupt("simulated kill")

        return distill(tiny_llama(4, 64, 0), tiny_llama(2, 32, student_seed), data, cfg,
                       Path(out), resume=resume, on_step=crash)

    def interrupted(out, parallel, alpha):
        try:
            run(out, parallel, alpha, crash_at=3)
        except KeyboardInterrupt:
            pass

    if __name__ == "__main__":
        ctx = distributed.init_from_env()
        root = Path(sys.argv[1])
        results = {"ddp": run(root / "ddp", *CASES["ddp"])}
        interrupted(root / "fsdp", *CASES["fsdp"])
        results["fsdp"] = run(root / "fsdp", *CASES["fsdp"], resume=True, student_seed=9)
        interrupted(root / "cross", *CASES["cross"])
        if ctx.is_main:
            for name, result in results.items():
                (root / f"{name}.result.json").write_text(result.model_dump_json())
        distributed.shutdown()
''')


@pytest.fixture()
def worker(tmp_path):
    """The worker module, imported here too, to build the same single-process runs."""
    (tmp_path / "worker.py").write_text(WORKER)
    sys.path.insert(0, str(tmp_path))
    os.environ["AUTOCOMPRESS_QUIET"] = "1"
    torch.set_num_threads(1)
    try:
        import worker as module

        yield module
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("worker", None)


def _torchrun(script: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOCOMPRESS_QUIET": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", "2", str(script), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _assert_same_run(multi: dict, single, multi_dir: Path, single_dir: Path, tol: float):
    assert [h["step"] for h in multi["history"]] == [h["step"] for h in single.history]
    for a, b in zip(multi["history"], single.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=tol)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3, abs=tol)
    a = AutoModelForCausalLM.from_pretrained(multi_dir)
    b = AutoModelForCausalLM.from_pretrained(single_dir)
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.allclose(pa, pb, atol=tol * 10), name


@pytest.mark.slow  # ~30-60 s: two interpreters import torch + transformers
def test_two_gloo_processes_match_one(tmp_path, worker):
    multi = tmp_path / "multi"
    _torchrun(tmp_path / "worker.py", multi)
    for name in ("ddp", "fsdp"):
        record = json.loads((multi / f"{name}.result.json").read_text())
        assert record["world_size"] == 2
        single = worker.run(tmp_path / f"single-{name}", *worker.CASES[name])
        _assert_same_run(record, single, multi / name, tmp_path / f"single-{name}", tol=1e-5)

    # A 2-process checkpoint resumed by 1 process continues the same curve.
    resumed = worker.run(multi / "cross", *worker.CASES["cross"], resume=True, student_seed=9)
    assert resumed.world_size == 1
    single = worker.run(tmp_path / "single-cross", *worker.CASES["cross"])
    _assert_same_run(resumed.model_dump(), single, multi / "cross", tmp_path / "single-cross",
                     tol=1e-5)
