"""Inductor's vector ISA check is recorded once per machine and trusted only when it
passed every instruction set the CPU reports (`minivllm.kernels.inductor_isa`)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from torch._inductor import config, cpu_vec_isa

from minivllm.kernels import inductor_isa

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="Inductor checks x86 ISAs only"
)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A clean module state, an empty cache root, Inductor's setting and env restored."""
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setattr(inductor_isa, "_state", {})
    saved_env = os.environ.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    saved = config.cpp.vec_isa_ok
    config.cpp.vec_isa_ok = None
    yield tmp_path
    config.cpp.vec_isa_ok = saved
    os.environ.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    if saved_env is not None:
        os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = saved_env


def test_passing_check_is_recorded_and_trusted(fresh, monkeypatch):
    reported = inductor_isa.reported_isas()
    calls = []

    def probe():
        calls.append(1)
        return [isa for isa in cpu_vec_isa.supported_vec_isa_list if str(isa) in reported]

    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", probe)
    assert inductor_isa.settle_vec_isa() is True
    assert config.cpp.vec_isa_ok is True
    assert os.environ["TORCHINDUCTOR_VEC_ISA_OK"] == "1"  # compile workers inherit it
    (record,) = (fresh / "inductor_vec_isa").glob("*.json")
    assert json.loads(record.read_text()) == {"reported": reported, "passed": reported}
    assert calls == [1]

    # A later start reads the record: no check runs.
    monkeypatch.setattr(inductor_isa, "_state", {})
    config.cpp.vec_isa_ok = None
    del os.environ["TORCHINDUCTOR_VEC_ISA_OK"]

    def no_probe():
        raise AssertionError("the recorded verdict should have been used")

    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", no_probe)
    assert inductor_isa.settle_vec_isa() is True
    assert config.cpp.vec_isa_ok is True


def test_failed_isa_is_not_trusted(fresh, monkeypatch):
    reported = inductor_isa.reported_isas()
    if len(reported) < 2:
        pytest.skip("needs a CPU reporting two vector ISAs")
    # The best instruction set failed (say the compiler is too old for AMX).
    monkeypatch.setattr(
        cpu_vec_isa,
        "valid_vec_isa_list",
        lambda: [isa for isa in cpu_vec_isa.supported_vec_isa_list if str(isa) in reported[1:]],
    )
    assert inductor_isa.settle_vec_isa() is False
    assert config.cpp.vec_isa_ok is None  # Inductor keeps checking and choosing itself
    assert "TORCHINDUCTOR_VEC_ISA_OK" not in os.environ


def test_explicit_setting_is_left_alone(fresh, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", "0")
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: pytest.fail("checked"))
    assert inductor_isa.settle_vec_isa() is False
    assert not (fresh / "inductor_vec_isa").exists()


def test_background_check_settles_in_the_calling_thread(tmp_path):
    """The real check, run in the background as a start-up does, then applied in the
    main thread (Inductor's config is per thread), and trusted by the next process."""
    script = (
        "from minivllm.kernels import inductor_isa as i\n"
        "from torch._inductor import config\n"
        "i.start_checking()\n"
        "print(i.settle_vec_isa(), config.cpp.vec_isa_ok)\n"
    )
    env = {**os.environ, "MINIVLLM_CACHE_ROOT": str(tmp_path)}
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    records = list(Path(tmp_path, "inductor_vec_isa").glob("*.json"))
    assert len(records) == 1
    verdict = json.loads(records[0].read_text())
    trusted = verdict["passed"] == verdict["reported"]
    expected = ["True", "True"] if trusted else ["False", "None"]
    assert runs == [expected, expected]
