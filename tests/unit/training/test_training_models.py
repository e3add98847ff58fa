import pytest
import torch
from torch import nn

from distributed_testing.errors import ExecutionError
from distributed_testing.training.loop import StepTiming, window_throughput
from distributed_testing.training.models import NUM_CLASSES, load_model_source


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_builtin_sources_produce_trainable_models(name: str) -> None:
    model, make_batch = load_model_source(name)()
    inputs, targets = make_batch(3)
    logits = model(inputs)
    assert logits.shape == (3, NUM_CLASSES)
    assert targets.shape == (3,)
    torch.nn.functional.cross_entropy(logits, targets).backward()
    assert all(p.grad is not None for p in model.parameters())


def factory() -> tuple[nn.Module, object]:
    return nn.Linear(2, NUM_CLASSES), lambda n: (torch.zeros(n, 2), torch.zeros(n, dtype=torch.long))


def test_factory_path_is_imported() -> None:
    assert load_model_source(f"{__name__}:factory") is factory


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nonexistent_module_xyz:factory", "cannot import"),
        (f"{__name__}:missing", "missing or not callable"),
        (f"{__name__}:NUM_CLASSES", "missing or not callable"),
        ("resnet", "not a built-in"),
    ],
)
def test_bad_sources_raise(name: str, message: str) -> None:
    with pytest.raises(ExecutionError, match=message):
        load_model_source(name)


def timing(samples: int, compute_s: float) -> StepTiming:
    return StepTiming(samples=samples, step_s=compute_s * 2, compute_s=compute_s, allreduce_wait_s=compute_s)


def test_window_throughput_is_the_median_rate_after_the_setup_steps() -> None:
    window = [(0, timing(10, 5.0)), (1, timing(10, 2.0)), (2, timing(10, 0.5)), (3, timing(30, 1.0)),
              (4, timing(10, 0.4)), (5, timing(10, 10.0))]  # fmt: skip
    assert window_throughput(window) == pytest.approx((20 + 25) / 2)
    assert window_throughput([(0, timing(10, 5.0)), (1, timing(10, 2.0))]) == pytest.approx((2 + 5) / 2)
    assert window_throughput([(7, timing(10, 0.1))]) == pytest.approx(100.0)
    with pytest.raises(RuntimeError, match="no step"):
        window_throughput([(7, timing(10, 0.0))])
