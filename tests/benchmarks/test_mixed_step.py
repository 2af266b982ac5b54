import pytest

from benchmarks import mixed_step


def test_split_and_padded_steps_agree_for_every_family(tmp_path):
    out = tmp_path / "mixed.json"
    results = mixed_step.main(["--chunk", "9", "--decodes", "3", "--repeats", "1", "--out", str(out)])
    assert set(results["models"]) == set(mixed_step.DEFAULT_MODELS) and out.exists()
    for name, run in results["models"].items():
        # the same logits either way (padded_step raises if the model did not ask to be split: nothing was padded)
        assert run["max_logit_difference"] < 1e-3, name


def test_a_step_that_does_not_ask_the_patched_module_is_refused():
    """Were a family's step to stop calling its module's split_decodes, the 'padded' contender would time the split
    step: here fconv's step, with Mamba's module patched."""
    from quill.models.families import mamba

    _, shape, _ = mixed_step.SHAPES["fconv"]
    config_cls, model_cls = mixed_step.ARCHITECTURES["fconv"]
    model = model_cls(config_cls(vocab_size=mixed_step.VOCAB, **shape))
    with pytest.raises(RuntimeError, match="does not split its step"):
        mixed_step.padded_step(model, mamba, mixed_step.mixed_batch(chunk=3, decodes=2), model.new_state(3))
