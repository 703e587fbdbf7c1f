"""Kubeflow Pipelines' compiled IR, read without the kfp SDK: each step's GPU profile checked
against the policies as the webhook would decide the step's pod (`gpuwarden check-pipeline`,
and `gpuwarden.kfp` on top)."""

from gpuwarden.pipelines.check import PipelineCheck, StepCheck, check_steps
from gpuwarden.pipelines.ir import IRError, Step, read_ir, step_pod, steps_of

__all__ = [
    "IRError",
    "PipelineCheck",
    "Step",
    "StepCheck",
    "check_steps",
    "read_ir",
    "step_pod",
    "steps_of",
]
