"""benchmarks/profile_event.py's reading of XLA's optimized HLO text: the ENTRY
computation's kernels by kind, and each kernel's output shape and source operation."""

from __future__ import annotations

from benchmarks import profile_event

HLO = """HloModule jit_step, entry_computation_layout={(s32[4,2]{1,0})->s32[4,2]{1,0}}

%f (param_0: s32[4,2]) -> s32[4,2] {
  %param_0 = s32[4,2]{1,0} parameter(0)
  ROOT %add.9 = s32[4,2]{1,0} add(%param_0, %param_0)
}

ENTRY %main.5 (Arg_0.1: s32[4,2]) -> s32[4,2] {
  %Arg_0.1 = s32[4,2]{1,0} parameter(0)
  %constant.2 = s32[] constant(0)
  %copy.3 = s32[4,2]{1,0} copy(%Arg_0.1)
  %add_fusion = s32[4,2]{1,0} fusion(%copy.3), kind=kLoop, calls=%f, metadata={op_name="jit(step)/vmap()/add" stack_frame_id=3}
  %gather_fusion.1 = s32[4,1]{1,0} fusion(%add_fusion), kind=kLoop, calls=%f, metadata={op_name="jit(step)/gather"}
  ROOT %wrapped_scatter = s32[4,2]{1,0} scatter(%add_fusion, %gather_fusion.1), metadata={op_name="jit(step)/scatter-add"}
}
"""


def test_entry_kernels_count_the_entry_computations_work_only():
    kinds = profile_event.entry_kernels(HLO)
    # the fused computation's add and the parameter/constant are not kernels
    assert dict(kinds) == {"copy": 1, "fusion": 2, "scatter": 1}


def test_kernel_descriptions_name_shape_and_operation():
    found = {m.group(1): (m.group(2), m.group(3).split("/")[-1]) for m in profile_event._KERNEL.finditer(HLO)}
    assert found["add_fusion"] == ("s32[4,2]{1,0}", "add")
    assert found["gather_fusion.1"] == ("s32[4,1]{1,0}", "gather")
    assert found["wrapped_scatter"] == ("s32[4,2]{1,0}", "scatter-add")
    assert "copy.3" not in found  # no metadata: described only by the trace's name


TABLES = """
FileNames
1 "/repo/vtc_jax/engines/engine.py"

FunctionNames
1 "step_lane"
2 "_waiting"

FileLocations
1 {file_name_id=1 function_name_id=1 line=460 end_line=460 column=1 end_column=9}
2 {file_name_id=1 function_name_id=2 line=222 end_line=222 column=5 end_column=30}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
"""


def test_source_lines_name_the_innermost_frame():
    lines = profile_event.source_lines(HLO.replace("stack_frame_id=3", "stack_frame_id=2") + TABLES)
    assert lines == {"add_fusion": "engine.py:222 _waiting"}
    # a frame the tables do not hold: no source, not an error
    assert profile_event.source_lines(HLO + TABLES) == {"add_fusion": ""}
