"""One output rule for every command that writes; real kills, real locks (#54).

Nothing the user owns is overwritten, an input is never its own output, links
are followed before the check, the wrong kind of path is refused before the
work, a killed writer's temporary is removed by the next write, and a second
run into the same output is refused at its start.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_runner import cli

from autocompress.artifacts import sha256_path
from autocompress.atomic import publishing_dir, write_json_atomic
from autocompress.data.corpus import check_corpus_out
from autocompress.errors import AutoCompressError
from autocompress.paths import default_teacher_dir

ROOT = Path(__file__).resolve().parent.parent


def one_error(err: str) -> str:
    """The ``error:`` line of a usage error, after checking it is one line plus a hint
    (progress bars drawn before it with carriage returns aside) and no traceback."""
    lines = [line for line in re.split(r"[\r\n]", err) if line.strip()]
    assert "Traceback" not in err and len(lines) >= 2, err
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), err
    assert not any(line.startswith("error: ") for line in lines[:-2]), err
    return lines[-2]


def python(script: str, **kwargs) -> subprocess.Popen:
    """Start ``script`` in a fresh Python process (the project on its path)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def wait_for_line(proc: subprocess.Popen, expected: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if expected in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"the subprocess ended early: {proc.stderr.read()[-2000:]}")
    raise AssertionError(f"no {expected!r} from the subprocess within {timeout} s")


def model_copy(tmp_path) -> Path:
    model = tmp_path / "M"
    shutil.copytree(default_teacher_dir(), model)
    return model


# ---------------------------------------------------------------- never the user's files


def test_data_prepare_never_overwrites_a_users_folder(tmp_path, capsys, monkeypatch,
                                                      tiny_corpus):
    user = tmp_path / "notes"
    user.mkdir()
    (user / "manifest.json").write_text('{"mine": true}')
    (user / "train.jsonl").write_text("my own data\n")
    before = sha256_path(user)

    code, err = cli(capsys, monkeypatch, "data", "prepare", "--out", user)

    assert code == 2 and "holds files that are not a corpus" in one_error(err)
    assert sha256_path(user) == before
    # A corpus this command wrote is rebuilt in place; the source is never the output.
    ours = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, ours)
    assert check_corpus_out(ours) == ours.resolve()
    with pytest.raises(AutoCompressError, match="never its own output"):
        check_corpus_out(tmp_path / "src" / "out", source=str(tmp_path))


def test_export_never_replaces_its_own_input(tmp_path, capsys, monkeypatch):
    model = model_copy(tmp_path)
    (tmp_path / "link").symlink_to(model)
    before = sha256_path(model)
    for out in (model, tmp_path / "link", model / "sub"):
        code, err = cli(capsys, monkeypatch, "export", "--model", model, "--out", out,
                        "--overwrite")
        assert code == 2 and "an input is never its own output" in one_error(err), out
    assert sha256_path(model) == before  # training.json, eval.json and the weights kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["M", "link"]  # no lock, no temp


@pytest.mark.parametrize("command", [
    ["importance", "--model", "default", "--out", "{dir}"],
    ["verify", "--model", "default", "--max-tpot-ms", "5", "--json", "{dir}"],
    ["eval", "--model", "default", "--json", "{dir}"],
])
def test_a_directory_where_a_file_is_wanted_is_refused_before_the_work(
        tmp_path, capsys, monkeypatch, command):
    folder = tmp_path / "results"
    folder.mkdir()
    started = time.perf_counter()
    code, err = cli(capsys, monkeypatch, *[a.format(dir=folder) for a in command])
    assert code == 2 and "is a directory; a file name is needed here" in one_error(err)
    assert time.perf_counter() - started < 20  # refused up front, not after measuring
    assert list(folder.iterdir()) == []


def test_links_are_followed_before_the_output_rule(tmp_path):
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "target")
    with publishing_dir(dangling) as tmp:
        (tmp / "a.txt").write_text("a")
    assert (tmp_path / "target" / "a.txt").read_text() == "a"
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "to-empty").symlink_to(empty)
    with publishing_dir(tmp_path / "to-empty") as tmp:
        (tmp / "b.txt").write_text("b")
    assert (empty / "b.txt").read_text() == "b"
    (tmp_path / "to-full").symlink_to(tmp_path / "target")
    with pytest.raises(AutoCompressError, match=f"{tmp_path / 'target'} exists and is not empty"):
        with publishing_dir(tmp_path / "to-full"):
            pass


def test_published_weights_are_readable_like_their_siblings(tmp_path):
    from test_distill_run import tiny_llama

    with publishing_dir(tmp_path / "student") as tmp:
        tiny_llama(1, 32, 0).save_pretrained(tmp)  # writes the weights 0600 itself
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "student").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"], modes
    assert modes["model.safetensors"] & 0o044 == 0o044 & ~_umask()


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


# ---------------------------------------------------------------- killed runs, locks


def test_a_sigkilled_publish_leaves_a_temporary_that_the_next_write_removes(tmp_path):
    out = tmp_path / "student"
    writer = python(f"""
        import time
        from autocompress.atomic import publishing_dir
        with publishing_dir({str(out)!r}) as tmp:
            (tmp / "model.safetensors").write_bytes(b"x" * 1_000_000)
            print("writing", flush=True)
            time.sleep(120)
    """)
    try:
        wait_for_line(writer, "writing")
        writer.send_signal(signal.SIGKILL)  # no finally, no atexit: what a kill does
        writer.wait(timeout=30)
    finally:
        writer.kill()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert any(name.startswith(".student.tmp-") for name in left), left

    with publishing_dir(out) as tmp:  # the next write
        (tmp / "model.safetensors").write_bytes(b"new")

    assert sorted(p.name for p in tmp_path.iterdir()) == ["student"]
    assert (out / "model.safetensors").read_bytes() == b"new"


def test_a_second_distill_into_the_same_out_is_refused_at_its_start(tmp_path):
    from test_distill_run import config, tiny_data, tiny_llama

    from autocompress.distill import distill

    out = tmp_path / "student"
    first = python(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from test_distill_run import config, tiny_data, tiny_llama
        from autocompress.distill import distill

        def hold(step, loss):
            print("training", flush=True)
            time.sleep(120)

        distill(tiny_llama(4, 64, 0), tiny_llama(2, 32, 1), tiny_data(), config(), {str(out)!r},
                on_step=hold)
    """)
    try:
        wait_for_line(first, "training")
        teacher = tiny_llama(4, 64, 0)
        calls = []
        teacher.register_forward_hook(lambda *_: calls.append(1))
        with pytest.raises(AutoCompressError, match="another run is writing into"):
            distill(teacher, tiny_llama(2, 32, 1), tiny_data(), config(), out,
                    on_step=lambda step, loss: calls.append(step))
        assert calls == []  # refused before a single forward pass
    finally:
        first.kill()
        first.wait(timeout=30)
    checkpoints = out.with_name("student.work") / "checkpoints"
    assert not checkpoints.exists() or all(p.name.startswith("step-")
                                           for p in checkpoints.iterdir())


# ---------------------------------------------------------------- exit codes, disk errors


def test_an_internal_error_is_exit_3_with_a_pointer_to_its_traceback(tmp_path, capsys,
                                                                    autocompress_home):
    from autocompress.cli import report_errors

    def buggy():
        return {}["missing key"]

    with pytest.raises(SystemExit) as exit_info:
        report_errors(buggy)
    assert exit_info.value.code == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "error: internal error: KeyError: 'missing key'" and len(lines) == 2
    log = Path(lines[1].rsplit(" ", 1)[-1])
    assert log.parent == autocompress_home / "logs"
    assert "Traceback" in log.read_text() and "def buggy" not in lines[1]


def test_a_file_size_limit_is_one_line_and_keeps_the_old_output(tmp_path, capsys, monkeypatch,
                                                               autocompress_home):
    import resource

    out = tmp_path / "exported"
    out.mkdir()
    (out / "old.txt").write_text("old")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))  # `ulimit -f 1024`: 1 MiB
    try:  # the 28 MB weights of the bundled teacher cannot be written
        code, err = cli(capsys, monkeypatch, "export", "--model", "default", "--out", out,
                        "--overwrite")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2 and "larger than this process may write" in one_error(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]  # no temporaries
    assert [p.name for p in out.iterdir()] == ["old.txt"]  # the old output intact


def test_an_unwritable_home_is_one_line(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere a mode forbids: use a file system that refuses
        home = Path("/sys/kernel/autocompress-home")
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(home))
    code, err = cli(capsys, monkeypatch, "data", "prepare")
    assert code == 2 and f"cannot write {home}" in one_error(err)
    # A home that cannot even be made (its parent cannot exist): one line, not a crash.
    home = Path("/proc/autocompress-no-such-process/home")
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(home))
    code, err = cli(capsys, monkeypatch, "costmodel", "predict", "--model", "default",
                    "--workload", "interactive-cpu")
    assert code == 2 and f"cannot write {home} (the AutoCompress home)" in one_error(err)


def test_strict_json_and_finite_limits(tmp_path, capsys, monkeypatch):
    import json

    path = write_json_atomic(tmp_path / "r.json", {"a": float("nan"), "b": [float("inf"), 1.5]})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c)) == {
        "a": None, "b": [None, 1.5]}
    code, err = cli(capsys, monkeypatch, "verify", "--model", "default", "--max-tpot-ms", "inf")
    assert code == 2 and "max_tpot_ms: Input should be a finite number" in one_error(err)


# ---------------------------------------------------------------- fail early


@pytest.mark.parametrize("name", ["a/b", "teacher.v2", "x@1"])
def test_teacher_register_refuses_a_bad_name_before_publishing(tmp_path, capsys, monkeypatch,
                                                              autocompress_home, name):
    code, err = cli(capsys, monkeypatch, "teacher", "register", default_teacher_dir(),
                    "--name", name)
    assert code == 2 and "is not a usable registry name" in one_error(err)
    assert not (autocompress_home / "artifacts").exists()  # nothing was published


def test_run_refuses_a_bad_register_name_at_its_start(capsys, monkeypatch, autocompress_home):
    started = time.perf_counter()
    code, err = cli(capsys, monkeypatch, "run", "--register-as", "bad.name",
                     "--budget-fraction", "0.5")
    assert code == 2 and "--register-as 'bad.name'" in one_error(err)
    assert time.perf_counter() - started < 10 and not (autocompress_home / "artifacts").exists()


def test_teacher_card_needs_a_training_record(tmp_path, capsys, monkeypatch):
    model = model_copy(tmp_path)
    (model / "training.json").unlink()
    code, err = cli(capsys, monkeypatch, "teacher", "card", "--model", model)
    assert code == 2 and "has no training.json" in one_error(err)
