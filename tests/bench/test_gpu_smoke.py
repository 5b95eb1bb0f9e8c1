"""bench/gpu.py, the script prepared for one H200, in its tiny CPU mode: every section runs and
prints its figures, so the GPU run does not fail on a typo."""

from bench import gpu


def test_the_smoke_run_prints_every_section(capsys):
    gpu.main(["--smoke"])
    out = capsys.readouterr().out
    for line in ("copy bandwidth", "of the bound", "transformers bf16", "engine int8 (W8A16)", "CUDA graphs",
                 "prefill", "GLM-4.7-Flash-shaped"):
        assert line in out, line
    assert out.count("engine bf16") >= 5
