"""A workdir's weights to and from other engines: `export-torch`, `export-ctranslate2`, `import-torch`, `import-hf`,
`export-hf`."""

from __future__ import annotations

import argparse

from transformer_jax.cli.command import CHECKPOINT_HELP, Command
from transformer_jax.errors import UsageError


def _declare_export_torch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument("--output", required=True, help="path of the .pt file to write")


def _run_export_torch(args: argparse.Namespace) -> None:
    from transformer_jax import workdir
    from transformer_jax.interop import export_torch_state_dict

    model_config, params, _ = workdir.load_model_for_inference(args.workdir, args.checkpoint)
    export_torch_state_dict(params, model_config, args.output)
    print(f"wrote {args.output}: load it into transformer_jax.interop.torch.TorchTransformer(config)")


def _declare_export_ctranslate2(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument("--output", required=True, help="the model directory to write (new or empty)")
    parser.add_argument("--quantization", default=None, help="weight type, e.g. int8 or float16 (default float32)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --output")


def _run_export_ctranslate2(args: argparse.Namespace) -> None:
    from transformer_jax import workdir
    from transformer_jax.interop.ctranslate2 import (
        QUANTIZATIONS,
        check_expressible,
        check_output_dir,
        export_ctranslate2,
    )

    if args.quantization not in (None, *QUANTIZATIONS):
        raise UsageError(f"--quantization {args.quantization} is unknown; use one of {', '.join(QUANTIZATIONS)}.")
    check_output_dir(args.output, force=args.force)  # before loading anything
    check_expressible(workdir.model_config_from_workdir(args.workdir))
    model_config, params, tokenizer = workdir.load_model_for_inference(args.workdir, args.checkpoint)
    export_ctranslate2(params, model_config, tokenizer, args.output, quantization=args.quantization, force=args.force)
    print(
        f"wrote {args.output}: load it with ctranslate2.Translator({args.output!r}) and translate SentencePiece pieces"
    )


def _declare_import_torch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True, help="a workdir whose config.json describes the model")
    parser.add_argument("--input", required=True, help="the .pt state_dict file")


def _run_import_torch(args: argparse.Namespace) -> None:
    from transformer_jax import workdir
    from transformer_jax.interop import import_torch_state_dict

    workdir.check_workdir(args.workdir)
    model_config = workdir.model_config_from_workdir(args.workdir)
    params = import_torch_state_dict(args.input, model_config)
    directory = workdir.save_named_params(args.workdir, "imported", params, steps=[])
    print(f"imported {args.input} into {directory}; use it with --checkpoint imported")


def _declare_import_hf(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="a MarianMT model directory (save_pretrained of the model and its tokenizer)"
    )
    parser.add_argument("--workdir", required=True, help="the workdir to write (new or empty)")


def _run_import_hf(args: argparse.Namespace) -> None:
    from transformer_jax.interop.marian import import_marian

    model_config = import_marian(args.model, args.workdir)
    print(
        f"imported {args.model} into {args.workdir} ({model_config.num_encoder_layers}+"
        f"{model_config.num_decoder_layers} layers, d_model={model_config.d_model}, vocab {model_config.vocab_size}); "
        f"translate with `transformer-jax translate --workdir {args.workdir}`"
    )


def _declare_export_hf(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument("--output", required=True, help="the model directory to write (new or empty)")


def _run_export_hf(args: argparse.Namespace) -> None:
    from transformer_jax import workdir
    from transformer_jax.interop.marian_export import check_exportable, check_output_dir, export_marian

    check_output_dir(args.output)  # before loading anything
    check_exportable(workdir.model_config_from_workdir(args.workdir))
    model_config, params, tokenizer = workdir.load_model_for_inference(args.workdir, args.checkpoint)
    data = workdir.load_config(args.workdir)["data"]
    languages = {key: data[key] for key in ("source_lang", "target_lang") if data.get(key)}
    export_marian(params, model_config, tokenizer, args.output, languages=languages)
    print(
        f"wrote {args.output}: load it with transformers' MarianMTModel.from_pretrained({args.output!r}) and "
        f"MarianTokenizer.from_pretrained({args.output!r})"
    )


COMMANDS = (
    Command(
        "export-torch",
        help="Write a checkpoint's parameters as a torch state_dict file (needs torch).",
        declare=_declare_export_torch,
        run=_run_export_torch,
        examples=("transformer-jax export-torch --workdir runs/tiny --checkpoint averaged --output model.pt",),
    ),
    Command(
        "export-ctranslate2",
        help="Write a checkpoint as a CTranslate2 model directory (needs ctranslate2).",
        declare=_declare_export_ctranslate2,
        run=_run_export_ctranslate2,
        examples=(
            "transformer-jax export-ctranslate2 --workdir runs/tiny --checkpoint averaged --output ct2 "
            "--quantization int8",
        ),
    ),
    Command(
        "import-torch",
        help="Load a torch state_dict file into a workdir as --checkpoint imported.",
        declare=_declare_import_torch,
        run=_run_import_torch,
        examples=("transformer-jax import-torch --workdir runs/tiny --input model.pt",),
    ),
    Command(
        "import-hf",
        help="Write a Hugging Face MarianMT (OPUS-MT) model as a workdir (needs safetensors).",
        declare=_declare_import_hf,
        run=_run_import_hf,
        examples=("transformer-jax import-hf --model opus-mt-en-de --workdir runs/opus-en-de",),
    ),
    Command(
        "export-hf",
        help="Write a checkpoint as a Hugging Face MarianMT model directory (needs safetensors).",
        declare=_declare_export_hf,
        run=_run_export_hf,
        examples=("transformer-jax export-hf --workdir runs/opus-en-de --output opus-en-de-finetuned",),
    ),
)
