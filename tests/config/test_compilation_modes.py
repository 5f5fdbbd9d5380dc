"""CompilationMode and every CUDAGraphMode method."""

from __future__ import annotations

import pytest

from minivllm.config.compilation import CompilationMode, CUDAGraphMode

NONE = CUDAGraphMode.NONE
PIECEWISE = CUDAGraphMode.PIECEWISE
FULL = CUDAGraphMode.FULL
FDO = CUDAGraphMode.FULL_DECODE_ONLY
FAP = CUDAGraphMode.FULL_AND_PIECEWISE


def test_compilation_mode_values() -> None:
    assert [(m.name, int(m)) for m in CompilationMode] == [
        ("NONE", 0),
        ("STOCK_TORCH_COMPILE", 1),
        ("DYNAMO_TRACE_ONCE", 2),
        ("VLLM_COMPILE", 3),
    ]
    assert CompilationMode.VLLM_COMPILE > CompilationMode.NONE


def test_cudagraph_mode_values() -> None:
    assert NONE.value == 0 and PIECEWISE.value == 1 and FULL.value == 2
    assert FDO.value == (2, 0)
    assert FAP.value == (2, 1)


# member: (decode_mode, mixed_mode, separate_routine, max_mode, without_piecewise)
TABLE = {
    NONE: (NONE, NONE, False, NONE, NONE),
    PIECEWISE: (PIECEWISE, PIECEWISE, False, PIECEWISE, NONE),
    FULL: (FULL, FULL, False, FULL, FULL),
    FDO: (FULL, NONE, True, FULL, FDO),
    FAP: (FULL, PIECEWISE, True, FULL, FDO),
}


@pytest.mark.parametrize("mode", list(CUDAGraphMode))
def test_routines_and_downgrades(mode: CUDAGraphMode) -> None:
    decode, mixed, separate, max_mode, without_pw = TABLE[mode]
    assert mode.decode_mode() is decode
    assert mode.mixed_mode() is mixed
    assert mode.separate_routine() is separate
    assert mode.max_cudagraph_mode() is max_mode
    assert mode.without_piecewise() is without_pw
    assert not mode.without_piecewise().requires_piecewise_compilation()


@pytest.mark.parametrize(
    "mode, has_none, has_piecewise, has_full",
    [
        (NONE, True, False, False),
        (PIECEWISE, False, True, False),
        (FULL, False, False, True),
        (FDO, True, False, True),
        (FAP, False, True, True),
    ],
)
def test_has_mode(mode: CUDAGraphMode, has_none: bool, has_piecewise: bool, has_full: bool) -> None:
    assert mode.has_mode(NONE) is has_none
    assert mode.has_mode(PIECEWISE) is has_piecewise
    assert mode.has_mode(FULL) is has_full
    assert mode.requires_piecewise_compilation() is has_piecewise
    assert mode.has_piecewise_cudagraphs() is has_piecewise
    assert mode.has_full_cudagraphs() is has_full


@pytest.mark.parametrize("bad", [FDO, FAP])
def test_has_mode_rejects_composite_mode(bad: CUDAGraphMode) -> None:
    with pytest.raises(ValueError, match="runtime mode"):
        FAP.has_mode(bad)


def test_valid_runtime_modes() -> None:
    assert CUDAGraphMode.valid_runtime_modes() == frozenset({NONE, PIECEWISE, FULL})
    assert [m for m in CUDAGraphMode if m.is_valid_runtime_mode()] == [NONE, PIECEWISE, FULL]
    # The runtime modes of any member are valid runtime modes.
    for mode in CUDAGraphMode:
        assert mode.decode_mode().is_valid_runtime_mode()
        assert mode.mixed_mode().is_valid_runtime_mode()


def test_str_and_bool() -> None:
    assert str(FAP) == "FULL_AND_PIECEWISE"
    assert f"{PIECEWISE}" == "PIECEWISE"
    assert not NONE
    assert all(bool(m) for m in CUDAGraphMode if m is not NONE)
