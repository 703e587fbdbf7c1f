"""A two-step pipeline whose training step asks for the light-training profile (docs/kfp.md).

python examples/kfp/pipeline.py  # writes examples/kfp/pipeline.yaml, or says which step the
                                 # policies (./policies) refuse in namespace tenant-a
"""

from pathlib import Path

from kfp import dsl

from gpuwarden.kfp import ProfileError, compile_pipeline, use_profile


@dsl.component(base_image="python:3.11")
def load_data(rows: int) -> str:
    return ",".join(str(i) for i in range(rows))


@dsl.component(base_image="pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime")
def train(dataset: str, epochs: int) -> float:
    import torch

    values = torch.tensor([float(v) for v in dataset.split(",")], device="cuda")
    return float(values.mean()) * epochs


@dsl.pipeline(name="gpu-aware-training")
def gpu_aware_training(rows: int = 1000, epochs: int = 3) -> None:
    data = load_data(rows=rows)
    trained = train(dataset=data.output, epochs=epochs)
    # One GPU, shared under the light-training profile's MPS cap.
    trained.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)
    use_profile(trained, "light-training")


if __name__ == "__main__":
    try:
        check = compile_pipeline(
            gpu_aware_training,
            Path(__file__).with_suffix(".yaml"),
            policies="policies",
            namespace="tenant-a",
        )
    except ProfileError as refused:
        raise SystemExit(str(refused)) from None
    for step in check.steps:
        print(f"{step.step.label}: profile {step.profile or '-'}")
