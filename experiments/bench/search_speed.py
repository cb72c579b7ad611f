"""Decoding speed on real sentences, side by side with CTranslate2 on the same weights: sentences/s, BLEU and how
many outputs are identical. --top-p adds sampling runs (back-translation) beside greedy and beam.

    python experiments/bench/search_speed.py --workdir runs/m30k --checkpoint averaged \\
        --source /path/to/multi30k/test_2016_flickr.en --reference /path/to/multi30k/test_2016_flickr.de

Text in, text out, warm: each method translates the whole file once untimed (compiling every padded width it
meets), then --repeats times, timed; the best pass counts. Both engines get the same length-sorted batches of
--batch-size sentences and the same length limit (source + 50, §6.1; CTranslate2's limit is per batch, the
longest source's). With the `ctranslate2` extra installed, the checkpoint is exported (export-ctranslate2) in
float32 and each --quantizations, and CTranslate2 runs greedy and each beam twice: with its own length penalty
(|Y|^alpha, stopping at `beam` finished hypotheses), and with the paper's GNMT penalty applied by re-ranking all
its finished hypotheses (length_penalty 0, patience 2), the form whose best can equal ours. 'same' counts the
sentences whose text equals the project's output of the same search. Run it alone on an idle machine; no
numbers are asserted anywhere. Writes JSON (experiments/bench/results/search_<time>.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import sacrebleu

from transformer_jax.decoding import DecodeConfig, length_penalty
from transformer_jax.machine import cpu_model
from transformer_jax.translate import Translator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402


def best_time(translate: Callable[[], list[str]], repeats: int) -> tuple[float, float, list[str]]:
    """(seconds of the untimed-for-the-table first pass, best of `repeats` warm passes, the outputs)."""
    start = time.perf_counter()
    outputs = translate()
    cold = time.perf_counter() - start
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        translate()
        warm.append(time.perf_counter() - start)
    return cold, min(warm), outputs


def project_runs(base: Translator, beams: list[int], top_ps: list[float], decode: DecodeConfig, batch_size: int):
    """(name, translate function) for greedy, each beam size and sampling with each top-p through the library's
    Translator."""
    runs = [("greedy", decode, "greedy")] if 1 in beams else []
    runs += [(f"beam {k}", decode.replace(beam_size=k), "beam") for k in beams if k > 1]
    runs += [(f"sample top-p {p}", decode.replace(top_p=p), "sample") for p in top_ps]
    for name, decode_config, method in runs:
        translator = Translator(
            base.model_config,
            base.params,
            base.tokenizer,
            decode_config=decode_config,
            method=method,
            batch_size=batch_size,
        )
        yield name, decode_config, translator.translate


def ctranslate2_runs(base: Translator, directory: Path, beams: list[int], alpha: float, batch_size: int):
    """(name, translate function) for CTranslate2 greedy and each beam size, own penalty and GNMT re-ranked."""
    import ctranslate2

    translator = ctranslate2.Translator(str(directory), device="cpu", inter_threads=1, intra_threads=os.cpu_count())
    processor = base.tokenizer.processor
    pad_piece = processor.id_to_piece(base.model_config.pad_id)
    extra, max_len = DecodeConfig().extra_length, base.model_config.max_len

    def translate(lines: list[str], gnmt: bool, **options) -> list[str]:
        pieces = [processor.encode(line, out_type=str) for line in lines]
        order = sorted((i for i, line in enumerate(lines) if line.strip()), key=lambda i: len(pieces[i]))
        outputs = [""] * len(lines)  # a blank line gives an empty line, as Translator does
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            results = translator.translate_batch(
                [pieces[i] for i in batch],
                max_decoding_length=min(max(len(pieces[i]) + 1 for i in batch) + extra, max_len),
                min_decoding_length=0,
                suppress_sequences=[[pad_piece]],  # the project never emits pad
                return_scores=gnmt,
                **options,
            )
            for i, result in zip(batch, results):
                best = 0
                if gnmt:  # scores are log P (length_penalty 0); |Y| counts the EOS CTranslate2 does not return
                    penalised = [
                        s / float(length_penalty(len(h) + 1, alpha)) for h, s in zip(result.hypotheses, result.scores)
                    ]
                    best = max(range(len(penalised)), key=penalised.__getitem__)
                outputs[i] = processor.decode(result.hypotheses[best])
        return outputs

    def run(gnmt: bool, **options) -> Callable[[list[str]], list[str]]:
        return lambda lines: translate(lines, gnmt, **options)

    if 1 in beams:
        yield "greedy", "greedy", run(False, beam_size=1)
    for k in (k for k in beams if k > 1):
        yield f"beam {k}", f"beam {k}", run(False, beam_size=k, length_penalty=alpha)
        yield (
            f"beam {k} GNMT re-ranked",
            f"beam {k}",
            run(True, beam_size=k, num_hypotheses=k, length_penalty=0, patience=2),
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="a trained run's --workdir")
    parser.add_argument("--checkpoint", default=None, help="a step, 'averaged', or nothing for the latest")
    parser.add_argument("--source", required=True, help="a text file, one source sentence a line")
    parser.add_argument("--reference", default=None, help="its reference translations, for BLEU (lowercased)")
    parser.add_argument("--lines", type=int, default=None, help="only the first N lines")
    parser.add_argument("--batch-size", type=int, default=100, help="sentences per batch (every engine)")
    parser.add_argument("--beams", default="1,4,5", help="comma-separated beam sizes (1 = greedy)")
    parser.add_argument("--top-p", default="", help="comma-separated top-p of sampling runs (1 = the full softmax)")
    parser.add_argument(
        "--cache-segment", type=int, default=DecodeConfig().cache_segment, help="decode.cache_segment of the project"
    )
    parser.add_argument("--alpha", type=float, default=1.0, help="length penalty of beam search")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per method; the best counts")
    parser.add_argument("--quantizations", default="int8", help="CTranslate2 rows besides float32 ('' = none)")
    parser.add_argument("--no-ctranslate2", action="store_true", help="the project's rows only")
    parser.add_argument("--out", default=None, help="JSON path (default experiments/bench/results/search_<time>.json)")
    args = parser.parse_args(argv)

    with open(args.source, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f][: args.lines]
    references = None
    if args.reference:
        with open(args.reference, encoding="utf-8") as f:
            references = [line.rstrip("\n") for line in f][: len(lines)]
    beams = [int(k) for k in args.beams.split(",") if k]
    base = Translator.from_workdir(args.workdir, checkpoint=args.checkpoint, batch_size=args.batch_size)
    rows: list[dict] = []
    ours: dict[str, list[str]] = {}

    def record(engine: str, name: str, search: str, translate: Callable[[list[str]], list[str]], **extra) -> None:
        cold, warm, outputs = best_time(lambda: translate(lines), args.repeats)
        row = {"engine": engine, "method": name, "cold_s": cold, "warm_s": warm, "sentences_per_s": len(lines) / warm}
        row.update(extra)
        if references is not None:
            row["bleu_lc"] = sacrebleu.corpus_bleu(outputs, [references], lowercase=True).score
        if engine == "transformer_jax":
            ours[search] = outputs
        else:
            row["same_as_project"] = sum(a == b for a, b in zip(outputs, ours[search]))
            project = next(r for r in rows if r["engine"] == "transformer_jax" and r["method"] == search)
            row["project_over_this"] = project["sentences_per_s"] / row["sentences_per_s"]
        rows.append(row)
        same = f"{row['same_as_project']:>5}/{len(lines)}" if "same_as_project" in row else " " * 10
        ratio = f"{row['project_over_this']:9.2f}" if "project_over_this" in row else " " * 9
        bleu = f"{row['bleu_lc']:6.2f}" if "bleu_lc" in row else "   n/a"
        print(f"{engine:24} {name:24} {row['sentences_per_s']:8.1f} {warm:7.2f} {bleu} {same} {ratio}", flush=True)

    print(f"{len(lines)} sentences, batch {args.batch_size}, alpha {args.alpha}, {cpu_model()}")
    print(f"{'engine':24} {'method':24} {'sent/s':>8} {'warm s':>7} {'BLEU':>6} {'same':>10} {'JAX/this':>9}")
    decode = DecodeConfig(alpha=args.alpha, cache_segment=args.cache_segment)
    top_ps = [float(p) for p in args.top_p.split(",") if p]
    for name, decode_config, translate in project_runs(base, beams, top_ps, decode, args.batch_size):
        record("transformer_jax", name, name, translate, decode=dataclasses.asdict(decode_config))
    if not args.no_ctranslate2:
        import ctranslate2

        from transformer_jax.interop.ctranslate2 import export_ctranslate2

        with tempfile.TemporaryDirectory() as exported:
            for quantization in ["float32"] + [q for q in args.quantizations.split(",") if q]:
                directory = Path(exported) / quantization
                export_ctranslate2(base.params, base.model_config, base.tokenizer, directory, quantization=quantization)
                engine = f"ctranslate2 {ctranslate2.__version__} {quantization}"
                for name, search, translate in ctranslate2_runs(base, directory, beams, args.alpha, args.batch_size):
                    record(engine, name, search, translate)

    payload = {
        "jax": jax.__version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "load_average_at_end": os.getloadavg(),
        "args": vars(args),
        "rows": rows,
    }
    out = write_results("search", payload, args.out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
