"""plan/: the train step compiled for a TPU slice or GPU node on a machine without one.

The target names, the roofline arithmetic, the tile sizes, the compiler's out-of-memory message and the meshes of a
slice are checked everywhere. The compiles need the TPU compiler (libtpu, `pip install 'jax[tpu]'`) or, for GPUs,
jax's CUDA plugin (`pip install 'jax[cuda12-local]'`); `make test-plan` builds a venv with both: without them those
tests are skipped, saying so.
"""

import json
import sys
import types
from pathlib import Path

import pytest

from transformer_jax import plan as planning
from transformer_jax.accounting import count_parameters, forward_flops
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.experiment import load_experiment

TINY = Path(__file__).resolve().parents[1] / "experiments" / "tiny.py"

# The compiler's words for a step that does not fit (libtpu 0.0.50, a v5e).
OOM_MESSAGE = (
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (20.05G) exceeds available HBM (15.75G). HLO module: jit_train_step.\n"
    "See https://openxla.org/xla/errors/error_1000 for more details."
)


# ------------------------------------------------------------------------------------------- without the compiler


@pytest.mark.parametrize(
    ("name", "generation", "topology", "chips"),
    [
        ("v5e:2x2", "v5e", (2, 2), 4),
        (" V5E:4x4 ", "v5e", (4, 4), 16),
        ("v6e:16x16", "v6e", (16, 16), 256),
        ("v4:2x2x2", "v4", (2, 2, 2), 8),
        ("v5p:2x2x4", "v5p", (2, 2, 4), 16),
        ("h100:8", "h100", (8,), 8),
        ("A100:2x8", "a100", (2, 8), 16),
    ],
)
def test_target_names(name, generation, topology, chips):
    target = planning.parse_target(name)
    assert (target.generation, target.topology, target.chips) == (generation, topology, chips)
    assert target.name == name.strip().lower() and target.chip is planning.CHIPS[generation]


@pytest.mark.parametrize(
    "name",
    ["v5e", "v5e-8", "v5litepod-4", "v7:2x2", "h200:8", "h100:1x2x8", "v5e:2x2x2", "v5p:2x2", "v5e:0x2", "a100:0"],
)
def test_a_bad_target_is_one_clear_error(name):
    with pytest.raises(UserError) as error:
        planning.parse_target(name)
    message = str(error.value)
    assert repr(name) in message and all(form in message for form in ("v5e:2x2", "v5p:2x2x4", "h100:8"))


def test_without_libtpu_the_error_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` raises ImportError
    with pytest.raises(UserError, match=r"pip install 'jax\[tpu\]'"):
        planning.target_devices(planning.parse_target("v5e:2x2"))


def test_without_the_cuda_plugin_the_error_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax_cuda12_plugin", None)
    with pytest.raises(UserError, match=r"pip install 'jax\[cuda12-local\]'"):
        planning.target_devices(planning.parse_target("h100:8"))


def test_roofline_by_hand():
    """A v5e step of 3.94 TFLOP and 16.38 GB: 20 ms of compute, 20 ms of HBM traffic at 819 GB/s."""
    v5e = planning.CHIPS["v5e"]
    assert (v5e.peak_flops, v5e.hbm_bandwidth, v5e.hbm_bytes) == (197e12, 819e9, 16 * 2**30)
    compute_bound = planning.roofline(3.94e12, 8.19e9, v5e, analytic_flops=1.97e12, rows=100, length=200)
    assert compute_bound.compute_s == pytest.approx(0.020)  # 3.94e12 / 197e12
    assert compute_bound.memory_s == pytest.approx(0.010)  # 8.19e9 / 819e9
    assert compute_bound.step_s == pytest.approx(0.020)
    assert compute_bound.tokens_per_s == pytest.approx(100 * 200 / 0.020)  # 1,000,000
    assert compute_bound.mfu == pytest.approx(0.5)  # 1.97e12 / (0.020 * 197e12)
    memory_bound = planning.roofline(1.97e12, 16.38e9, v5e, analytic_flops=1.97e12, rows=100, length=200)
    assert memory_bound.compute_s == pytest.approx(0.010) and memory_bound.step_s == pytest.approx(0.020)
    assert memory_bound.mfu == pytest.approx(0.5)
    unknown_bytes = planning.roofline(1.97e12, None, v5e, analytic_flops=1.97e12, rows=100, length=200)
    assert unknown_bytes.memory_s is None and unknown_bytes.step_s == pytest.approx(0.010)


def test_analytic_train_flops_are_three_forward_passes():
    experiment = load_experiment(TINY)
    forward = forward_flops(experiment.model, 8, 16, 16)["total"]
    assert planning.train_flops(experiment.model, 8, 16) == 3 * forward


def test_the_compilers_out_of_memory_figures_are_read():
    required, available = planning.parse_oom(OOM_MESSAGE)
    assert required == round(20.05 * 2**30) and available == round(15.75 * 2**30)
    assert planning.parse_oom("Used 18.5G of 15.75G hbm. Exceeded hbm capacity by 2.75G.") == (
        round(18.5 * 2**30),
        round(15.75 * 2**30),
    )
    assert planning.parse_oom("RESOURCE_EXHAUSTED: something else") == (None, None)


def test_collective_bytes_by_hand():
    """Result shapes of collective instructions in compiled HLO text (a TPU's tiled layouts, tuples, an async pair
    whose -start holds operand and output), summed by kind; other instructions and names are not counted."""
    hlo = """
HloModule jit_train_step, entry_computation_layout={(f32[128,32]{0,1})->f32[128,32]{0,1}}

%fused_computation (param_0.1: bf16[4,32]) -> bf16[16,32] {
  %param_0.1 = bf16[4,32]{1,0:T(8,128)(2,1)} parameter(0)
  ROOT %all-gather.2 = bf16[16,32]{1,0:T(8,128)(2,1)} all-gather(%param_0.1), dimensions={0}
}

ENTRY %main {
  %all-reduce.19 = f32[128,32]{0,1:T(8,128)S(1)} all-reduce(%fusion.443), channel_id=20, to_apply=%add.10
  %all-reduce.38 = (f32[]{:T(128)}, f32[32]{0:T(128)S(1)}, bf16[2,16,32]{2,1,0}) all-reduce(%a, %b, %c)
  %all-gather-start.5 = ((s32[2,32]{1,0}, pred[2,32]{1,0}), (s32[16,32]{1,0}, pred[16,32]{1,0})) all-gather-start(%x)
  %all-gather-done.5 = (s32[16,32]{1,0}, pred[16,32]{1,0}) all-gather-done(%all-gather-start.5)
  %reduce-scatter.1 = f32[8]{0} reduce-scatter(%y), dimensions={0}, metadata={op_name="all-reduce(x)"}
  %all-reduce-not = f32[1000]{0} add(%all-reduce.19, %all-reduce.19)
  ROOT %fusion.1 = bf16[16,32]{1,0} fusion(%z), kind=kLoop, calls=%fused_computation
}
"""
    assert planning.collective_bytes(hlo) == {
        "all-reduce": 128 * 32 * 4 + (4 + 32 * 4 + 2 * 16 * 32 * 2),
        "all-gather": 16 * 32 * 2 + (16 * 32 * 4 + 16 * 32 * 1),
        "reduce-scatter": 8 * 4,
        "all-to-all": 0,
        "collective-permute": 0,
    }


def test_tiled_bytes_by_hand():
    """A TPU's layouts: the minor dimensions (in the layout's order) padded to the first tile."""

    def layout(major_to_minor, *tile):
        return types.SimpleNamespace(major_to_minor=major_to_minor, tiling=(tile,))

    assert planning.tiled_bytes((), "int32", layout((), 128)) == 128 * 4  # a scalar fills a tile
    assert planning.tiled_bytes((32,), "float32", layout((0,), 128)) == 128 * 4
    assert planning.tiled_bytes((1000,), "float32", layout((0,), 1024)) == 1024 * 4
    assert planning.tiled_bytes((256, 32), "float32", layout((1, 0), 8, 128)) == 32 * 256 * 4  # transposed
    assert planning.tiled_bytes((32, 4, 32), "float32", layout((0, 1, 2), 4, 128)) == 32 * 4 * 128 * 4
    assert planning.tiled_bytes((16, 32), "bfloat16", layout((0, 1), 8, 128)) == 16 * 128 * 2


def test_the_meshes_of_a_slice():
    shapes = planning.mesh_shapes(4)
    assert [tuple(shape.values()) for shape in shapes] == [
        (4, 1, 1),
        (2, 2, 1),
        (1, 4, 1),
        (2, 1, 2),
        (1, 2, 2),
        (1, 1, 4),
    ]
    two_heads = load_experiment(TINY, [("model.num_heads", "2")]).model  # tensor=4 would split 2 heads
    assert all(shape["tensor"] <= 2 for shape in planning.mesh_shapes(4, two_heads))


def test_layouts_are_ranked_fitting_first_then_by_speed():
    def report(name, fits, tokens_per_s):
        bucket = planning.BucketPlan(8, 8, fits, 0.0, 2**30, tokens_per_s=tokens_per_s)
        return planning.PlanReport(
            name, planning.CHIPS["v5e"], 4, {}, "dp", "jit", "float32", 512, 1, 0, {}, {}, [bucket]
        )

    ranked = planning.ranked([report("slow", True, 10.0), report("big", False, None), report("fast", True, 30.0)])
    assert [r.target for r in ranked] == ["fast", "slow", "big"]


# ----------------------------------------------------------------------------------------------- with the compiler


def _needs_libtpu():
    return pytest.importorskip(
        "libtpu", reason="the TPU compiler (libtpu) is not installed: `make test-plan` runs these in .venv-tpu"
    )


def _tiny(**changes) -> list[tuple[str, str]]:
    """A 1+1-layer model on one bucket of 32: compiles in seconds."""
    values = {
        "model.d_model": 32,
        "model.num_heads": 2,
        "model.d_ff": 64,
        "model.num_encoder_layers": 1,
        "model.num_decoder_layers": 1,
        "model.max_len": 32,
        "model.dtype": "bfloat16",
        "data.vocab_size": 128,
        "data.max_len": 32,
        "data.tokens_per_batch": 512,
        "data.bucket_boundaries": (32,),
        **changes,
    }
    return [(key, value if isinstance(value, str) else repr(value)) for key, value in values.items()]


@pytest.fixture(scope="module")
def v5e_2x2():
    _needs_libtpu()
    return planning.target_devices(planning.parse_target("v5e:2x2"))


def test_a_tiny_fsdp_plan_holds_the_shards_of_our_rules(v5e_2x2):
    experiment = load_experiment(TINY, _tiny(**{"mesh.fsdp": 4, "mesh.data": 1}))
    report = planning.plan(experiment, "v5e:2x2", devices=v5e_2x2)
    print(planning.format_report(report))
    assert (report.mesh, report.rules, report.dtype, report.chips) == (
        {"data": 1, "fsdp": 4, "tensor": 1},
        "fsdp",
        "bfloat16",
        4,
    )
    (bucket,) = report.buckets
    assert (bucket.rows, bucket.length, bucket.fits) == (16, 32, True)  # 512 tokens / 32, a multiple of 4 rows
    # From our rules: every parameter is split 4 ways over 'fsdp' (float32), Adam's two moments with it; the
    # optimizer also holds two int32 step counts (Adam's, the schedule's).
    params = count_parameters(experiment.model).total
    assert report.state_bytes["params"] == params * 4 // 4
    assert report.state_bytes["optimizer"] == 2 * params * 4 // 4 + 2 * 4
    # experiments/tiny.py packs: inputs, targets, decoder_inputs and 4 segment / position arrays, 4 rows a chip
    assert report.batch_bytes == {32: 7 * (16 // 4) * 32 * 4}
    # The compiler's per-chip arguments are exactly those shards (and the step, the key and the batch), each laid
    # out in the chip's tiles.
    assert bucket.argument_bytes == bucket.expected_argument_bytes
    assert bucket.alias_bytes > 0.9 * (report.state_bytes["params"] + report.state_bytes["optimizer"])  # donated
    assert (
        0 < bucket.needed_bytes < bucket.hbm_bytes and bucket.headroom_bytes == bucket.hbm_bytes - bucket.needed_bytes
    )
    assert bucket.flops > bucket.analytic_flops > 0  # the compiler also counts softmax, LayerNorm, Adam, ...
    assert bucket.step_s > 0 and bucket.tokens_per_s == pytest.approx(16 * 32 / bucket.step_s)
    # FSDP gathers every parameter (bfloat16 in the forward pass at least) onto each chip for the step.
    assert bucket.collective_bytes["all-gather"] >= 2 * params
    json.dumps(report.to_dict())


def test_an_oversized_model_does_not_fit_with_the_compilers_figures(v5e_2x2):
    """About 1.08e9 parameters (a 2M-token vocabulary): 16 B each for the state and its gradient, on 16 GiB chips."""
    experiment = load_experiment(
        TINY, _tiny(**{"data.vocab_size": 2**21, "model.d_model": 512, "model.num_heads": 4, "model.d_ff": 512})
    )
    report = planning.plan(experiment, "v5e:2x2", devices=v5e_2x2)
    text = planning.format_report(report)
    print(text)
    (bucket,) = report.buckets
    assert not bucket.fits and not report.fits
    assert "CompileTimeHbmOom" in bucket.compiler_message and "does not fit" in text
    assert bucket.available_bytes == round(15.75 * 2**30)  # what the compiler gives a program on a v5e
    assert bucket.required_bytes > report.state_bytes["params"] + report.state_bytes["optimizer"]
    assert bucket.headroom_bytes == bucket.available_bytes - bucket.required_bytes < 0
    assert bucket.argument_bytes is None and bucket.tokens_per_s is None
    json.dumps(report.to_dict())


def test_targets_and_meshes_that_cannot_be_planned_are_clear_errors(v5e_2x2):
    with pytest.raises(UserError, match=r"v5e:3x3.*v5e:2x2"):  # a topology the TPU software refuses
        planning.target_devices(planning.parse_target("v5e:3x3"))
    experiment = load_experiment(TINY, _tiny(**{"mesh.data": 8}))
    with pytest.raises(ConfigError, match=r"mesh section on v5e:2x2 \(4 chips\)"):
        planning.plan(experiment, "v5e:2x2", devices=v5e_2x2)
    with pytest.raises(ConfigError, match="bucket lengths"):
        planning.plan(load_experiment(TINY, _tiny()), "v5e:2x2", lengths=(16,), devices=v5e_2x2)


def test_search_ranks_layouts_and_prints_their_overrides(v5e_2x2):
    """Two meshes of the tiny model; a third whose 32-token batch cannot give each of 64 devices a row is left out."""
    experiment = load_experiment(TINY, _tiny())
    meshes = [
        {"data": 4, "fsdp": 1, "tensor": 1},
        {"data": 2, "fsdp": 1, "tensor": 2},
        {"data": 64, "fsdp": 1, "tensor": 1},
    ]
    seen = []
    reports = planning.search(experiment, "v5e:2x2", meshes=meshes, progress=seen.append)
    text = planning.format_search(reports)
    print(text)
    assert len(reports) == len(seen) == 2 and all(report.fits for report in reports)
    assert reports[0].tokens_per_s >= reports[1].tokens_per_s
    assert {report.rules for report in reports} == {"dp", "tensor"}
    assert "--config.mesh.data=2 --config.mesh.fsdp=1 --config.mesh.tensor=2" in text


def test_search_splits_an_update_too_large_for_a_chip_into_accumulated_micro_batches(v5e_2x2):
    """A 1M-token vocabulary makes the logits about 1 MB a position (float32, and their gradient): the update's
    24,576 positions a side need 24.5 GiB of a v5e in one micro-batch (the compiler refuses) and fit in two."""
    changes = {"data.vocab_size": 2**20, "data.pack": False, "data.tokens_per_batch": 12288, "train.accum_steps": 2}
    experiment = load_experiment(TINY, _tiny(**changes))
    reports = planning.search(experiment, "v5e:2x2", meshes=[{"data": 4, "fsdp": 1, "tensor": 1}])
    text = planning.format_search(reports)
    print(text)
    fitting, refused = reports  # ranked: what fits first
    assert (fitting.tokens_per_batch, fitting.accum_steps, fitting.fits) == (12288, 2, True)
    assert (refused.tokens_per_batch, refused.accum_steps, refused.fits) == (24576, 1, False)
    assert "CompileTimeHbmOom" in refused.buckets[0].compiler_message
    assert refused.buckets[0].required_bytes > 16 * 2**30 > fitting.buckets[0].needed_bytes
    assert "--config.data.tokens_per_batch=12288 --config.train.accum_steps=2" in text.splitlines()[-1]


def test_the_plan_command_refuses_a_bad_target_in_one_line(capsys):
    from transformer_jax import cli

    assert cli.main(["plan", "--config", str(TINY), "--target", "v9:2x2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'v9:2x2' is not a known slice" in err[0] and "Traceback" not in err[0]
    assert cli.main(["plan", "--config", str(TINY), "--target", "v5e:2x2", "--lengths", "32,x"]) == 2


def test_the_plan_command_prints_the_table_and_writes_json(v5e_2x2, tmp_path, capsys):
    from transformer_jax import cli

    overrides = [f"--config.{key}={value}" for key, value in _tiny(**{"mesh.data": 4})]
    argv = ["plan", "--config", str(TINY), "--target", "v5e:2x2", "--json", str(tmp_path / "plan.json"), *overrides]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["fits"] and saved["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1} and len(saved["buckets"]) == 1
    assert "v5e:2x2" in out and f"wrote {tmp_path / 'plan.json'}" in out


# ------------------------------------------------------------------------------------------------ translation


def _self_attention_cache_bytes(experiment, max_decode_len: int) -> int:
    """By hand: beam_size hypotheses x decoder layers x keys and values x positions x d_model, in the model's dtype."""
    model, beam = experiment.model, experiment.decode.beam_size
    itemsize = 2 if model.dtype == "bfloat16" else 4
    return beam * model.num_decoder_layers * 2 * max_decode_len * model.d_model * itemsize


def test_a_decode_plan_holds_a_cache_per_hypothesis(v5e_2x2):
    """Per sentence, what a segment continues from is at least the hand-counted self-attention cache of its beam
    (one per hypothesis, in bfloat16) and at most that plus, in float32, its cross-attention keys and values, its
    encoder output and a few int32 rows per hypothesis: a cache kept once per sentence, or in float32, fails."""
    experiment = load_experiment(TINY, _tiny(**{"model.max_len": 128, "data.max_len": 64}))
    small, large = (
        planning.plan_decode(experiment, "v5e:2x2", batch=b, source_length=20, devices=v5e_2x2) for b in (8, 16)
    )
    print(planning.format_decode([small, large]))
    assert small.fits and large.fits and small.max_decode_len == 20 + experiment.decode.extra_length
    per_sentence = (large.carry_bytes - small.carry_bytes) / 8
    model, beam, length = experiment.model, experiment.decode.beam_size, small.max_decode_len
    lower = _self_attention_cache_bytes(experiment, length)
    upper = lower + (2 * model.num_decoder_layers + 1) * 20 * model.d_model * 4 + 8 * beam * length * 4
    assert lower <= per_sentence <= upper, (lower, per_sentence, upper)
    assert small.params_bytes == count_parameters(experiment.model).total * 4
    assert small.needed_bytes >= small.params_bytes + small.carry_bytes and small.headroom_bytes > 0
    json.dumps([small.to_dict(), large.to_dict()])


def test_the_largest_decode_batch_is_bracketed_by_the_compiler(v5e_2x2):
    """Long sources (448 tokens, outputs up to 498) and a 256-wide, 2-layer decoder: about 4 MiB of self-attention
    cache per sentence by hand, so the cache alone of about 4,200 sentences fills a v5e's 16 GiB. The search ends with
    a batch that fits next to one, at most 1/16 larger, that the compiler refuses; the answer is below that hand
    bound and above a quarter of it (the programs hold the cache about twice, beside the encoder's activations)."""
    changes = {"model.d_model": 256, "model.num_heads": 4, "model.num_decoder_layers": 2, "model.max_len": 512}
    experiment = load_experiment(TINY, _tiny(**changes, **{"data.max_len": 512}))
    plans = planning.largest_decode_batch(experiment, "v5e:2x2", source_length=448, smallest=1280, devices=v5e_2x2)
    print(planning.format_decode(plans))
    largest = max(plan.batch for plan in plans if plan.fits)
    refused = min(plan.batch for plan in plans if not plan.fits and plan.batch > largest)
    assert any(largest < plan.batch <= largest + largest // 16 for plan in plans if not plan.fits)
    over = next(plan for plan in plans if plan.batch == refused)
    assert over.needed_bytes > over.chip.hbm_bytes or over.headroom_bytes < 0
    bound = (over.chip.hbm_bytes - over.params_bytes) / _self_attention_cache_bytes(experiment, over.max_decode_len)
    assert bound / 4 < largest < bound, (largest, bound)


def test_the_plan_command_plans_a_translation_batch(v5e_2x2, tmp_path, capsys):
    from transformer_jax import cli

    overrides = [f"--config.{key}={value}" for key, value in _tiny()]
    argv = ["plan", "--config", str(TINY), "--target", "v5e:2x2", "--decode", "--batch", "8", "--source-length", "16"]
    assert cli.main([*argv, "--json", str(tmp_path / "decode.json"), *overrides]) == 0
    out = capsys.readouterr().out
    (saved,) = json.loads((tmp_path / "decode.json").read_text())
    assert saved["fits"] and saved["batch"] == 8 and saved["source_length"] == 16
    assert "largest batch that fits: 8 sentences" in out
    assert cli.main([*argv[:-4], "--batch", "0", *overrides]) == 2
    assert cli.main(["plan", "--config", str(TINY), "--target", "v5e:2x2", "--batch", "8"]) == 2  # without --decode
    assert "give it with --decode" in capsys.readouterr().err
    assert cli.main([*argv[:-2], "--source-length", "33", *overrides]) == 2  # past the model's max_len, 32
    assert "model.max_len=32" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- with the GPU compiler


@pytest.fixture(scope="module")
def h100_8():
    pytest.importorskip(
        "jax_cuda12_plugin", reason="jax's CUDA plugin is not installed: `make test-plan` runs these in .venv-tpu"
    )
    return planning.target_devices(planning.parse_target("h100:8"))


def test_gpu_targets_are_the_gpus_the_compiler_is_told_of(h100_8):
    assert [device.device_kind for device in h100_8] == ["NVIDIA H100 80GB HBM3"] * 8
    two_nodes = planning.target_devices(planning.parse_target("a100:2x8"))
    assert len(two_nodes) == 16 and {device.device_kind for device in two_nodes} == {"NVIDIA A100-SXM4-80GB"}
    assert sorted({device.process_index for device in two_nodes}) == [0, 1]  # a host per node


def test_a_tiny_gpu_plan_holds_the_shards_of_our_rules_and_counts_its_flops(h100_8):
    """Data parallel over 8 GPUs: each holds the whole state and 1/8 of the batch; a GPU has no tiles, so the
    arguments are the plain shard sizes; the FLOPs come from XLA's cost analysis of the GPU program."""
    experiment = load_experiment(TINY, _tiny(**{"mesh.data": 8, "data.tokens_per_batch": 1024}))
    report = planning.plan(experiment, "h100:8", devices=h100_8)
    text = planning.format_report(report)
    print(text)
    (bucket,) = report.buckets
    params = count_parameters(experiment.model).total
    assert report.state_bytes["params"] == params * 4 and report.state_bytes["optimizer"] == 2 * params * 4 + 2 * 4
    assert report.batch_bytes == {32: 7 * (32 // 8) * 32 * 4}  # 32 rows of 32, packed: 7 int32 arrays
    assert report.state_bytes["other"] == 4 + 8  # the step counter and the dropout key
    # The whole state and this GPU's rows, as the compiler lays them out.
    expected = sum(report.state_bytes.values()) + report.batch_bytes[32]
    assert bucket.argument_bytes == bucket.expected_argument_bytes == expected
    assert bucket.fits and bucket.hbm_bytes == 80 * 2**30
    assert bucket.flops > bucket.analytic_flops > 0 and bucket.bytes_accessed > bucket.argument_bytes
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in text
    # Data parallelism's one collective: the gradients summed over the GPUs, every parameter's once (in bfloat16
    # or float32, as the compiler places the all-reduce beside the cast), beside a few scalars (loss, tokens).
    collectives = bucket.collective_bytes
    assert 2 * params <= collectives.pop("all-reduce") <= 4 * params + 64
    assert set(collectives.values()) == {0}


def test_a_model_larger_than_a_gpu_is_reported_as_not_fitting(h100_8):
    """About 8.6e9 parameters (d_model 2048, a 4M-token vocabulary): 16 B each for the state and its gradient,
    137 GB on an 80 GiB GPU. The GPU compiler does not refuse it; the memory analysis says it does not fit."""
    changes = {"data.vocab_size": 2**22, "model.d_model": 2048, "model.num_heads": 4, "model.d_ff": 512}
    experiment = load_experiment(TINY, _tiny(**{"mesh.data": 8, **changes}))
    report = planning.plan(experiment, "h100:8", devices=h100_8)
    (bucket,) = report.buckets
    assert not bucket.fits and not report.fits
    assert bucket.needed_bytes > 16 * count_parameters(experiment.model).total > 80 * 2**30
    assert bucket.headroom_bytes == 80 * 2**30 - bucket.needed_bytes < 0
