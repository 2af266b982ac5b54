from benchmarks import mixed_step


def test_split_and_padded_steps_agree_for_every_family(tmp_path):
    out = tmp_path / "mixed.json"
    results = mixed_step.main(["--chunk", "9", "--decodes", "3", "--repeats", "1", "--out", str(out)])
    assert set(results["models"]) == set(mixed_step.SHAPES) and out.exists()
    for name, run in results["models"].items():
        assert run["max_logit_difference"] < 1e-3, name  # the same logits either way
        assert run["split_ms"] > 0 and run["padded_ms"] > 0
