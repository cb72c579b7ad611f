"""The typed experiment config: files, overrides parsed by field type, JSON round trip, old config.json files."""

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import pytest

from transformer_jax.config import ModelConfig
from transformer_jax.experiment import (
    TOKENIZER_FIELDS,
    ConfigError,
    DataConfig,
    DecodeConfig,
    Experiment,
    OptimizerConfig,
    TrainConfig,
    apply_overrides,
    load_config_file,
    load_experiment,
)
from transformer_jax.workdir import load_config, resume_changes

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def test_defaults_are_the_papers_constants():
    experiment = Experiment()
    assert (experiment.model.d_model, experiment.model.num_heads, experiment.model.d_ff) == (512, 8, 2048)  # Table 3
    assert experiment.data.vocab_size == experiment.model.vocab_size == 37000  # §5.1
    optimizer = experiment.optimizer  # §5.3
    assert (optimizer.warmup_steps, optimizer.adam_b1, optimizer.adam_b2, optimizer.adam_eps) == (4000, 0.9, 0.98, 1e-9)
    assert experiment.train.label_smoothing == 0.1 and experiment.model.dropout_rate == 0.1  # §5.4
    assert (experiment.decode.beam_size, experiment.decode.alpha, experiment.decode.extra_length) == (4, 0.6, 50)


@pytest.mark.parametrize("name", ["tiny", "base", "big", "multi30k"])
def test_every_shipped_experiment_loads_and_round_trips_through_json(name):
    experiment = load_config_file(EXPERIMENTS / f"{name}.py")
    assert experiment.model.vocab_size == experiment.data.vocab_size
    replayed = Experiment.from_dict(json.loads(json.dumps(experiment.to_dict())))
    assert replayed == experiment


def test_overrides_are_parsed_by_the_fields_type():
    experiment = apply_overrides(
        Experiment(),
        [
            ("train.steps", "7"),
            ("optimizer.lr_scale", "2"),
            ("train.async_checkpoints", "off"),
            ("data.bucket_boundaries", "(16, 32)"),
            ("data.bucket_boundaries", "[8, 64]"),
            ("model.dtype", "bfloat16"),
            ("decode.max_decode_len", "None"),
            ("distributed.num_processes", "4"),
            ("data.path", "123"),
            ("data.options.split_sizes", "{'train': 10}"),
            ("data.options.note", "free text"),
            ("data.vocab_size", "900"),
        ],
    )
    assert experiment.train.steps == 7 and isinstance(experiment.train.steps, int)
    assert experiment.optimizer.lr_scale == 2.0 and isinstance(experiment.optimizer.lr_scale, float)
    assert experiment.train.async_checkpoints is False
    assert experiment.data.bucket_boundaries == (8, 64)  # the later override wins; lists become tuples
    assert str(experiment.model.dtype) == "bfloat16"
    assert experiment.decode.max_decode_len is None and experiment.distributed.num_processes == 4
    assert experiment.data.path == "123"  # a str field keeps the text
    assert experiment.data.options == {"split_sizes": {"train": 10}, "note": "free text"}
    assert experiment.model.vocab_size == 900  # follows the tokenizer's size


@pytest.mark.parametrize(
    "override, message",
    [
        (("train.stepz", "3"), "unknown field 'stepz'; known fields of train: ['accum_steps'"),
        (("trian.steps", "3"), "no section 'trian'"),
        (("train.steps", "many"), "--config.train.steps='many': expected an int"),
        (("train.steps", "2.5"), "expected an int, got float"),
        (("train.steps", "0"), "train.steps=0 must be a positive integer"),
        (("train.progress", "maybe"), "expected true or false"),
        (("train.dropout_prng", "mersenne"), "train.dropout_prng='mersenne' is unknown; use one of ('rbg_threefry'"),
        (("model.vocab_size", "9"), "come from the SentencePiece model; set data.vocab_size"),
        (("model.num_heads", "3"), "model section: ModelConfig.d_model=512 is not divisible by num_heads=3"),
        (("data.max_len", "1024"), "data.max_len=1024 exceeds the model's max_len=512"),
        (("mesh.mode", "pmap"), None),  # fine alone; with fsdp > 1 below it is not
        (("optimizer.lr_scale", "-1"), "optimizer.lr_scale=-1.0 must be positive"),
        (("optimizer.weight_decay", "-0.1"), "optimizer.weight_decay=-0.1 must be non-negative (0: Adam"),
        (("decode.beam_size", "0"), "decode.beam_size=0 must be a positive integer"),
    ],
)
def test_bad_overrides_name_the_field_and_the_fix(override, message):
    if message is None:
        with pytest.raises(ConfigError, match="data parallel only"):
            apply_overrides(Experiment(), [("mesh.fsdp", "2"), override])
        return
    with pytest.raises(ConfigError) as error:
        apply_overrides(Experiment(), [override])
    assert message in str(error.value)


def test_sections_validate_themselves_when_made():
    with pytest.raises(ConfigError, match="train.final_bleu='sampled' is unknown"):
        TrainConfig(final_bleu="sampled")
    with pytest.raises(ConfigError, match="data.tokens_per_batch=0 must be a positive integer"):
        DataConfig(tokens_per_batch=0)
    with pytest.raises(ConfigError, match="optimizer.adam_b2=1.0 must lie in"):
        OptimizerConfig(adam_b2=1.0)
    with pytest.raises(ConfigError, match="decode.gather='scatter' is unknown"):
        DecodeConfig(gather="scatter")
    with pytest.raises(ConfigError, match="data.max_len=600 exceeds"):
        Experiment(data=DataConfig(max_len=600))


def test_a_config_file_must_return_an_experiment(tmp_path):
    path = tmp_path / "old.py"
    path.write_text("def get_config():\n    return {'train': {'steps': 3}}\n")
    with pytest.raises(ConfigError, match="returning a transformer_jax.experiment.Experiment"):
        load_config_file(path)
    path.write_text(
        "from transformer_jax.experiment import TrainConfig, Experiment\n"
        "def get_config():\n    return Experiment(train=TrainConfig(steps=-1))\n"
    )
    with pytest.raises(ConfigError, match="old.py: train.steps=-1 must be a positive integer"):
        load_config_file(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config_file(tmp_path / "missing.py")


def test_config_json_of_version_0_1_replays_and_resumes(tmp_path):
    """The config.json of an older workdir (Adam fields in `train`, a model `preset`) still loads, and resuming it
    with today's equivalent config reports no change."""
    today = load_experiment(EXPERIMENTS / "tiny.py").to_dict()
    old = json.loads(json.dumps(today))
    old["model"]["preset"] = "tiny"
    old["train"].update(old.pop("optimizer"))
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert load_config_file(tmp_path / "config.json").to_dict() == today
    assert resume_changes(load_config(tmp_path), today) == ([], [])


def test_config_json_from_before_a_field_existed_resumes_as_its_default(tmp_path):
    """A workdir written before ModelConfig.key_dim/value_dim existed ran d_k = d_v = d_model / num_heads, one written
    before the cool-down and weight decay existed ran without them: absent fields load as their defaults (None; 0)
    and resume with today's default config with nothing to report, while a real change is still refused."""
    today = load_experiment(EXPERIMENTS / "tiny.py").to_dict()
    assert today["model"]["key_dim"] is None and today["optimizer"]["cooldown_start"] == 0
    old = json.loads(json.dumps(today))
    del old["model"]["key_dim"], old["model"]["value_dim"]
    del old["optimizer"]["cooldown_start"], old["optimizer"]["cooldown_steps"], old["optimizer"]["weight_decay"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert load_config_file(tmp_path / "config.json").to_dict() == today
    assert resume_changes(load_config(tmp_path), today) == ([], [])
    changed = apply_overrides(load_experiment(EXPERIMENTS / "tiny.py"), [("model.key_dim", "8")]).to_dict()
    assert resume_changes(load_config(tmp_path), changed)[0] == ["model.key_dim: None → 8"]


def test_resume_refuses_model_and_data_changes_and_reports_the_rest():
    saved = Experiment().to_dict()
    new = apply_overrides(
        Experiment(), [("model.d_ff", "1024"), ("train.steps", "5"), ("optimizer.warmup_steps", "100")]
    ).to_dict()
    refused, allowed = resume_changes(saved, new)
    assert refused == ["model.d_ff: 2048 → 1024"]
    assert allowed == ["optimizer.warmup_steps: 4000 → 100", "train.steps: 100000 → 5"]


# A valid value other than the default for every ModelConfig field an override may set (the others come from the
# tokenizer): (command-line text, the value it must give). Each is valid alone on top of the defaults.
MODEL_OVERRIDES = {
    "d_model": ("256", 256),
    "num_heads": ("16", 16),
    "key_dim": ("32", 32),
    "value_dim": ("48", 48),
    "d_ff": ("1024", 1024),
    "num_encoder_layers": ("2", 2),
    "num_decoder_layers": ("3", 3),
    "dropout_rate": ("0.3", 0.3),
    "attention_dropout_rate": ("0.2", 0.2),
    "relu_dropout_rate": ("0.15", 0.15),
    "activation": ("swish", "swish"),
    "final_logits_bias": ("true", True),
    "norm_position": ("pre", "pre"),
    "position_encoding": ("learned", "learned"),
    "sinusoid_layout": ("halves", "halves"),
    "max_len": ("1024", 1024),
    "share_embeddings": ("false", False),
    "attention_bias": ("true", True),
    "attention_impl": ("xla", "xla"),
    "layer_norm_epsilon": ("1e-5", 1e-5),
    "dtype": ("bfloat16", jnp.dtype("bfloat16")),
    "param_dtype": ("float16", jnp.dtype("float16")),
}


def test_every_model_field_is_an_override():
    """Every ModelConfig field but the tokenizer's is a --config.model override: a value other than the default
    lands in that field and changes nothing else. A new field fails here until it has an entry above."""
    names = [field.name for field in dataclasses.fields(ModelConfig) if field.name not in TOKENIZER_FIELDS]
    assert sorted(MODEL_OVERRIDES) == sorted(names)
    default = Experiment().model
    for name, (text, expected) in MODEL_OVERRIDES.items():
        assert getattr(default, name) != expected, name  # not the default: an ignored override would show
        model = apply_overrides(Experiment(), [(f"model.{name}", text)]).model
        assert model == dataclasses.replace(default, **{name: expected}), name
