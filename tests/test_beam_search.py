"""Beam search against oracles: exhaustive enumeration, hand-computed cases, greedy, and itself run to the end.

Search logic is checked on cheap table models (step functions over a hashed prefix), whose log-probabilities
a few lines of numpy reproduce; one exhaustive check and one batch check run the real Transformer.
"""

import functools
import itertools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import config as config_lib
from transformer_jax.decoding import (
    DecodeConfig,
    beam_search,
    beam_search_core,
    greedy_search,
    length_penalty,
    uncached_step_fn,
)
from transformer_jax.model import Transformer

PAD, BOS, EOS = 0, 1, 2
HASH_STATES = 1009


# ----------------------------------------------------------------------------------------------- table models
def hash_step(tokens, cache, table):
    """A model whose next-token logits depend on the whole prefix through a hashed state per row."""
    state = (cache["state"] * 31 + tokens + 7) % HASH_STATES  # [n]
    return table[state], {"state": state}


def oracle_log_prob(table, seed, sequence):
    """log P(sequence) under hash_step, in numpy (float64)."""
    state, previous, total = seed, BOS, 0.0
    for token in sequence:
        state = (state * 31 + previous + 7) % HASH_STATES
        logits = table[state].astype(np.float64)
        total += logits[token] - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
        previous = token
    return total


def all_hypotheses(vocab, limit):
    """Every output the searches may produce: tokens other than pad, EOS only last, length <= limit;
    outputs of length `limit` may also end without EOS (cut at the limit)."""
    words = [t for t in range(vocab) if t not in (PAD, EOS)]
    for n in range(limit):
        for prefix in itertools.product(words, repeat=n):
            yield prefix + (EOS,)
    yield from itertools.product(words, repeat=limit)


def random_table(seed, vocab, eos_bonus=0.0, scale=2.0):
    table = scale * np.random.default_rng(seed).normal(size=(HASH_STATES, vocab)).astype(np.float32)
    table[:, EOS] += eos_bonus
    return table


@functools.partial(
    jax.jit, static_argnames=("beam", "alpha", "length", "early_stopping", "one_hot", "nbest", "penalty")
)
def _run_beam(table, seeds, limits, *, beam, alpha, length, early_stopping, one_hot, nbest, penalty):
    cache = {"state": jnp.repeat(seeds, beam)}  # [batch * beam]
    return beam_search_core(
        lambda tokens, cache: hash_step(tokens, cache, table),
        cache,
        batch_size=seeds.shape[0],
        beam_size=beam,
        alpha=alpha,
        max_decode_len=length,
        max_lengths=limits,
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
        one_hot=one_hot,
        early_stopping=early_stopping,
        nbest=nbest,
        length_penalty=penalty,
        return_state=True,
    )


def run_beam(
    table, seeds, *, beam, alpha, length, limits=None, early_stopping=True, one_hot=False, nbest=None, penalty="gnmt"
):
    seeds = jnp.asarray(seeds, jnp.int32)
    limits = jnp.full(seeds.shape, length, jnp.int32) if limits is None else jnp.asarray(limits, jnp.int32)
    sequences, scores, state = _run_beam(
        jnp.asarray(table),
        seeds,
        limits,
        beam=beam,
        alpha=alpha,
        length=length,
        early_stopping=early_stopping,
        one_hot=one_hot,
        nbest=nbest,
        penalty=penalty,
    )
    return np.asarray(sequences), np.asarray(scores), int(state.step)


def strip(sequence):
    return tuple(int(t) for t in sequence if t != PAD)


# ------------------------------------------------------------------------------------------------ unit checks
def test_length_penalty_is_gnmt_formula():
    assert float(length_penalty(1, 0.6)) == pytest.approx(1.0)  # |Y| = 1: a lone EOS
    assert float(length_penalty(7, 0.6)) == pytest.approx(2.0**0.6)
    assert float(length_penalty(30, 0.0)) == 1.0


def test_length_penalty_hf_is_transformers_formula():
    assert float(length_penalty(7, 0.6, "hf")) == pytest.approx(7.0**0.6)  # |Y| counts EOS, not the start token
    assert float(length_penalty(7, -1.0, "hf")) == pytest.approx(1 / 7)
    with pytest.raises(ValueError, match="length_penalty"):
        DecodeConfig(length_penalty="t5")


def test_decode_config_defaults_are_the_papers_and_bad_values_fail():
    cfg = DecodeConfig()
    assert (cfg.beam_size, cfg.alpha, cfg.extra_length) == (4, 0.6, 50)  # §6.1
    with pytest.raises(ValueError, match="beam_size"):
        DecodeConfig(beam_size=0)
    with pytest.raises(ValueError, match="gather"):
        DecodeConfig(gather="scatter")


# --------------------------------------------------------------------------------- exhaustive (table models)
@pytest.mark.parametrize("alpha, penalty", [(0.6, "gnmt"), (0.0, "gnmt"), (1.0, "hf")])
def test_wide_beam_equals_exhaustive_enumeration(alpha, penalty):
    vocab, length, beam = 5, 5, 81  # 3 words besides EOS: 3**4 = 81 live prefixes before the last step
    table = random_table(0, vocab, eos_bonus=0.5)
    seeds, limits = [11, 42], [5, 3]  # the second sentence has a shorter length limit
    sequences, scores, _ = run_beam(table, seeds, beam=beam, alpha=alpha, length=length, limits=limits, penalty=penalty)
    for b, (seed, limit) in enumerate(zip(seeds, limits)):
        lp = (lambda n: ((5 + n) / 6) ** alpha) if penalty == "gnmt" else (lambda n: n**alpha)
        oracle = sorted(
            ((oracle_log_prob(table, seed, y) / lp(len(y)), y) for y in all_hypotheses(vocab, limit)), reverse=True
        )
        found = [(float(s), strip(y)) for s, y in zip(scores[b], sequences[b]) if np.isfinite(s)]
        expected = oracle[:beam]
        assert len(found) == len(expected)
        assert found[0][1] == expected[0][1]
        np.testing.assert_allclose([s for s, _ in found], [s for s, _ in expected], rtol=1e-5, atol=1e-5)
        by_sequence = dict((y, s) for s, y in oracle)
        for score, y in found:  # each returned score is that sequence's true score
            assert by_sequence[y] == pytest.approx(score, rel=1e-5, abs=1e-5)
        assert all(len(y) <= limit for _, y in found)


@pytest.mark.parametrize("alpha, penalty", [(0.6, "gnmt"), (0.3, "hf"), (-0.5, "hf")])
def test_early_stopping_returns_what_running_to_the_limit_returns(alpha, penalty):
    stopped_early = 0
    for seed in range(4):  # same shapes: one compilation per setting
        table = random_table(seed, 8, eos_bonus=1.5)
        early = run_beam(table, [3, 17, 99], beam=3, alpha=alpha, length=12, penalty=penalty)
        full = run_beam(table, [3, 17, 99], beam=3, alpha=alpha, length=12, early_stopping=False, penalty=penalty)
        np.testing.assert_array_equal(early[0], full[0])
        np.testing.assert_allclose(early[1], full[1], rtol=1e-6)
        assert full[2] == 12
        stopped_early += early[2] < 12
    assert stopped_early > 0  # the bound did end some searches before the limit


def test_asking_for_fewer_hypotheses_stops_sooner_with_the_same_best():
    """nbest=k returns the k best of the full search (run to the limit), exactly, and never takes more steps."""
    sooner = 0
    for seed in range(4):
        table = random_table(seed, 8, eos_bonus=1.5)
        full = run_beam(table, [3, 17, 99], beam=3, alpha=1.0, length=12, early_stopping=False)
        previous_steps = 12
        for nbest in (3, 2, 1):
            found = run_beam(table, [3, 17, 99], beam=3, alpha=1.0, length=12, nbest=nbest)
            assert found[0].shape == (3, nbest, 12) and found[1].shape == (3, nbest)
            np.testing.assert_array_equal(found[0], full[0][:, :nbest])
            np.testing.assert_allclose(found[1], full[1][:, :nbest], rtol=1e-6)
            assert found[2] <= previous_steps
            sooner += found[2] < previous_steps
            previous_steps = found[2]
    assert sooner > 0  # fewer hypotheses did end some searches earlier
    with pytest.raises(ValueError, match="nbest=4 must lie in"):
        run_beam(random_table(0, 8), [3], beam=3, alpha=1.0, length=12, nbest=4)


def test_one_hot_gather_equals_take_along_axis():
    table = random_table(5, 8, eos_bonus=1.5)
    take = run_beam(table, [3, 17, 99], beam=3, alpha=0.6, length=12)  # shapes of the test above
    one_hot = run_beam(table, [3, 17, 99], beam=3, alpha=0.6, length=12, one_hot=True)
    np.testing.assert_array_equal(take[0], one_hot[0])
    np.testing.assert_array_equal(take[1], one_hot[1])


# ------------------------------------------------------------------------------- beam 1 against greedy search
@functools.partial(jax.jit, static_argnames=("length",))
def _run_greedy(table, seeds, *, length):
    return greedy_search(
        lambda tokens, cache: hash_step(tokens, cache, table),
        {"state": seeds},
        batch_size=seeds.shape[0],
        max_decode_len=length,
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
    )


def run_greedy(table, seeds, length):
    tokens, lengths, log_probs = _run_greedy(jnp.asarray(table), jnp.asarray(seeds, jnp.int32), length=length)
    return np.asarray(tokens), np.asarray(lengths), np.asarray(log_probs)


def eos_is_runner_up_on_path(table, seed, sequence):
    """True when, along `sequence`, EOS was ever the second most likely token (pad excluded)."""
    state, previous = seed, BOS
    for token in sequence:
        state = (state * 31 + previous + 7) % HASH_STATES
        logits = table[state].copy()
        logits[PAD] = -np.inf
        if np.argsort(-logits)[1] == EOS:
            return True
        previous = token
    return False


def test_beam_one_equals_greedy_unless_eos_is_the_runner_up():
    """With 2*beam candidates, beam 1 also finishes the runner-up when it is EOS, and keeps it if it scores
    better: then it beats greedy. Otherwise beam 1 follows greedy token by token."""
    seeds, length, alpha = list(range(0, 400, 7)), 7, 0.6
    table = random_table(3, 9, eos_bonus=0.5)
    tokens, lengths, log_probs = run_greedy(table, seeds, length)
    sequences, scores, _ = run_beam(table, seeds, beam=1, alpha=alpha, length=length)
    same = differ = 0
    for b, seed in enumerate(seeds):
        greedy = strip(tokens[b])
        assert len(greedy) == lengths[b]
        greedy_score = log_probs[b] / ((5 + lengths[b]) / 6) ** alpha
        assert oracle_log_prob(table, seed, greedy) == pytest.approx(log_probs[b], rel=1e-5, abs=1e-5)
        if not eos_is_runner_up_on_path(table, seed, greedy):
            assert strip(sequences[b, 0]) == greedy
            assert scores[b, 0] == pytest.approx(greedy_score, rel=1e-5, abs=1e-5)
            same += 1
        else:
            assert scores[b, 0] >= greedy_score - 1e-5
            differ += strip(sequences[b, 0]) != greedy
    assert same > 0 and differ > 0  # both cases occur in this sample


def script_step(tokens, cache, probabilities):
    """A model that ignores the prefix: row r at step t draws from probabilities[r, t]."""
    logits = jnp.log(probabilities[cache["row"], cache["step"]])  # [n, vocab]
    return logits, {"row": cache["row"], "step": cache["step"] + 1}


def test_beam_one_hand_computed_case_where_it_beats_greedy():
    # vocab: pad, bos, eos, a=3, b=4. Step 0: a 0.5, eos 0.4; step 1: b 0.6, eos 0.3; step 2: eos 0.9.
    probabilities = np.full((1, 3, 5), 1e-9, np.float32)
    probabilities[0, 0, [3, 2, 4]] = [0.5, 0.4, 0.1]
    probabilities[0, 1, [4, 2, 3]] = [0.6, 0.3, 0.1]
    probabilities[0, 2, [2, 3, 4]] = [0.9, 0.05, 0.05]
    probabilities = jnp.asarray(probabilities)
    step = lambda tokens, cache: script_step(tokens, cache, probabilities)
    tokens, lengths, _ = greedy_search(
        step,
        {"row": jnp.zeros(1, jnp.int32), "step": jnp.array(0)},
        batch_size=1,
        max_decode_len=3,
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
    )
    assert tokens.tolist() == [[3, 4, 2]] and lengths.tolist() == [3]
    # alpha = 0: log 0.4 = -0.92 for [eos] beats log(0.5 * 0.6 * 0.9) = -1.31 for [a, b, eos].
    sequences, scores = beam_search_core(
        step,
        {"row": jnp.zeros(1, jnp.int32), "step": jnp.array(0)},
        batch_size=1,
        beam_size=1,
        alpha=0.0,
        max_decode_len=3,
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
    )
    assert sequences.tolist() == [[[2, 0, 0]]]
    assert float(scores[0, 0]) == pytest.approx(math.log(0.4), rel=1e-5)
    # alpha = 2 favours length: lp(1) = 1, lp(3) = (8/6)^2; -1.31 / 1.78 = -0.74 beats -0.92.
    sequences, scores = beam_search_core(
        step,
        {"row": jnp.zeros(1, jnp.int32), "step": jnp.array(0)},
        batch_size=1,
        beam_size=1,
        alpha=2.0,
        max_decode_len=3,
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
    )
    assert sequences.tolist() == [[[3, 4, 2]]]
    assert float(scores[0, 0]) == pytest.approx(math.log(0.5 * 0.6 * 0.9) / (8 / 6) ** 2, rel=1e-5)


def test_eos_first_gives_length_one_and_pad_after_eos():
    probabilities = np.full((2, 4, 5), 0.05, np.float32)
    probabilities[0, :, EOS] = 0.8  # sentence 0: EOS is by far the most likely first token
    probabilities[1, :, 3] = 0.8  # sentence 1: never ends on its own; cut at its limit
    probabilities = jnp.asarray(probabilities)
    cache = {"row": jnp.repeat(jnp.arange(2), 2), "step": jnp.array(0)}
    sequences, scores = beam_search_core(
        lambda t, c: script_step(t, c, probabilities),
        cache,
        batch_size=2,
        beam_size=2,
        alpha=0.6,
        max_decode_len=4,
        max_lengths=jnp.array([4, 3]),
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
    )
    assert sequences[0, 0].tolist() == [EOS, PAD, PAD, PAD]
    assert float(scores[0, 0]) == pytest.approx(math.log(0.8), rel=1e-5)
    assert sequences[1, 0].tolist() == [3, 3, 3, PAD]  # |Y| = 3 = its limit, no EOS
    assert float(scores[1, 0]) == pytest.approx(3 * math.log(0.8) / (8 / 6) ** 0.6, rel=1e-5)
    for row in np.asarray(sequences).reshape(-1, 4):  # nothing but pad after the first EOS or pad
        stop = next((i for i, t in enumerate(row) if t in (EOS, PAD)), 4)
        assert all(t == PAD for t in row[stop + 1 :])


def scripted_beam(rows, *, beam, alpha):
    """beam_search_core over script_step for one sentence, rows[t] the probabilities of step t (its length limit
    is len(rows)): (sequences [beam, limit], scores [beam], steps run)."""
    probabilities = jnp.asarray([rows], jnp.float32)
    sequences, scores, state = beam_search_core(
        lambda t, c: script_step(t, c, probabilities),
        {"row": jnp.zeros(beam, jnp.int32), "step": jnp.array(0)},
        batch_size=1,
        beam_size=beam,
        alpha=alpha,
        max_decode_len=len(rows),
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
        return_state=True,
    )
    return np.asarray(sequences[0]), np.asarray(scores[0]), int(state.step)


def test_termination_bound_uses_the_penalty_at_the_length_limit():
    """A live hypothesis with log-probability s can still finish with s / lp(limit): the search stops once no such
    bound beats the worst of the `beam` finished scores, and not before (nor while fewer than `beam` finished)."""
    # Tokens: pad, bos, eos, a=3, b=4, c=5; each row sums to 1. Limit 5, alpha 0.6: lp(5) = (10/6)**0.6 = 1.3587.
    rows = [
        [0.01, 0.01, 0.5, 0.45, 0.02, 0.01],  # [eos] finishes: log 0.5 = -0.693; [a] lives: log 0.45 = -0.799
        [0.01, 0.01, 0.04, 0.02, 0.9, 0.02],  # [a, b] lives: -0.904
        [0.02, 0.02, 0.04, 0.02, 0.4, 0.5],  # [a, b, c] lives: -1.597
        [0.2] * 6,
        [0.2] * 6,
    ]
    sequences, scores, steps = scripted_beam(rows, beam=1, alpha=0.6)
    # After step 1 the bound is -0.799 / 1.3587 = -0.588 > -0.693: go on, although the penalty at the next length,
    # lp(2) = 1.097, would give -0.728 and stop. After step 2: -0.904 / 1.3587 = -0.665, go on. After step 3:
    # -1.597 / 1.3587 = -1.175 < -0.693: stop, 2 steps before the limit.
    assert steps == 3
    assert sequences.tolist() == [[EOS, PAD, PAD, PAD, PAD]]
    assert float(scores[0]) == pytest.approx(math.log(0.5), rel=1e-5)
    # Beam 2: [eos] (log 0.9) beats every live bound from step 1 on, but the list has a second slot and no other
    # hypothesis reaches EOS before the limit (eos 0.001 never is among the 4 best extensions): the search runs to
    # the limit 4, where [a, a, a, a] is cut and fills that slot.
    rows = [[0.01, 0.01, 0.9, 0.04, 0.03, 0.01]] + [[0.01, 0.01, 0.001, 0.5, 0.469, 0.01]] * 3
    sequences, scores, steps = scripted_beam(rows, beam=2, alpha=0.6)
    assert steps == 4
    assert sequences.tolist() == [[EOS, PAD, PAD, PAD], [3, 3, 3, 3]]
    expected = (math.log(0.04) + 3 * math.log(0.5)) / (9 / 6) ** 0.6
    np.testing.assert_allclose(scores, [math.log(0.9), expected], rtol=1e-5)


# ------------------------------------------------------------------------------------- the real Transformer
TINY = config_lib.tiny(
    vocab_size=7,
    d_model=16,
    num_heads=2,
    d_ff=32,
    num_encoder_layers=1,
    num_decoder_layers=2,
    max_len=16,
    dropout_rate=0.0,
)


# Queries/keys of d_k = 3 and values of d_v = 5 per head, both unlike d_model / num_heads = 8 (§3.2.2).
UNEVEN = TINY.replace(key_dim=3, value_dim=5)


def random_model(cfg):
    model = Transformer(cfg)
    sources = jnp.array([[5, 6, 3, 4, 2], [4, 3, 2, 0, 0]], jnp.int32)  # the second padded
    # Random parameters without compiling model.init (only its shapes are traced).
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), sources, sources)["params"])
    leaves, treedef = jax.tree.flatten(shapes)
    rng = np.random.default_rng(7)
    params = jax.tree.unflatten(treedef, [jnp.asarray(rng.normal(size=x.shape), jnp.float32) for x in leaves])
    return model, params, sources


@pytest.fixture(scope="module")
def tiny_model():
    return random_model(TINY)


def test_transformer_wide_beam_equals_exhaustive_enumeration_in_a_padded_batch(tiny_model):
    """The oracle scores each source alone (unpadded), so this also shows the padded batch decodes as alone."""
    model, params, sources = tiny_model
    length, beam, alpha = 3, 25, 0.6  # words: bos, 3, 4, 5, 6 -> 5**2 = 25 live prefixes at the last step
    sequences, scores = beam_search(model, params, sources, beam_size=beam, alpha=alpha, max_decode_len=length)
    sequences, scores = np.asarray(sequences), np.asarray(scores)
    assert sequences.shape == (2, beam, length) and scores.shape == (2, beam)
    hypotheses = list(all_hypotheses(TINY.vocab_size, length))  # 156 of them
    decoder_inputs = jnp.array([[BOS] + list(y[:-1]) + [PAD] * (length - len(y)) for y in hypotheses])
    forward = jax.jit(
        lambda source: model.apply({"params": params}, jnp.repeat(source[None], len(hypotheses), 0), decoder_inputs)
    )  # one teacher-forced pass per source
    for b in range(2):
        source = sources[b][sources[b] != PAD]
        log_probs = np.asarray(jax.nn.log_softmax(forward(source), axis=-1), np.float64)  # [156, length, vocab]
        oracle = sorted(
            (
                (sum(log_probs[k, i, t] for i, t in enumerate(y)) / ((5 + len(y)) / 6) ** alpha, y)
                for k, y in enumerate(hypotheses)
            ),
            reverse=True,
        )
        assert strip(sequences[b, 0]) == oracle[0][1]
        np.testing.assert_allclose(scores[b], [s for s, _ in oracle[:beam]], rtol=1e-5, atol=1e-5)
        by_sequence = {y: s for s, y in oracle}
        for score, y in zip(scores[b], sequences[b]):
            assert by_sequence[strip(y)] == pytest.approx(score, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize(
    "cfg, beam, num_sources",
    [(TINY, 3, 2), (TINY, 4, 2), (TINY, 3, 1), (UNEVEN, 3, 2)],
    ids=["beam3-sources2", "beam4-sources2", "beam3-sources1", "beam3-sources2-dk!=dv"],
)
def test_transformer_beam_over_the_cache_equals_beam_over_uncached_steps(cfg, beam, num_sources):
    """The oracle re-runs the decoder over each hypothesis's whole prefix at every step (no cache, nothing kept
    per row), so it checks the lineage that lets beam search leave keys/values where they were computed.
    One source alone is its own case: a product-and-sum form of the block attention was miscompiled by XLA's
    CPU (YNN) fusion exactly when the block's leading dimension was 1. UNEVEN has keys and values of different
    sizes in the cache (d_k != d_v)."""
    model, params, sources = random_model(cfg)
    sources = sources[:num_sources]
    params = jax.tree.map(lambda x: 0.3 * x, params)  # flatter distributions: hypotheses change parents often
    length, alpha = 12, 0.6
    sequences, scores = beam_search(model, params, sources, beam_size=beam, alpha=alpha, max_decode_len=length)
    encoded = model.apply({"params": params}, sources, method="encode")  # [num_sources, src_len, d_model]
    rows = lambda x: jnp.repeat(x, beam, axis=0)  # noqa: E731 - [num_sources * beam, ...], a source's rows adjacent
    step_fn, prefixes = uncached_step_fn(model, params, rows(encoded), rows(sources), length, PAD)
    oracle_sequences, oracle_scores = beam_search_core(
        step_fn,
        prefixes,
        batch_size=num_sources,
        beam_size=beam,
        alpha=alpha,
        max_decode_len=length,
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
    )
    np.testing.assert_array_equal(sequences, oracle_sequences)
    np.testing.assert_allclose(scores, oracle_scores, rtol=1e-5, atol=1e-5)


def test_beam_search_defaults_come_from_the_config(tiny_model):
    """Without beam_size / alpha / config, beam_search decodes with §6.1's beam 4, alpha 0.6 and limit source length
    + 50 (DecodeConfig()); given a config, with that config's settings."""
    model, params, sources = tiny_model
    run = functools.partial(beam_search, model, params, sources)
    default = run()
    assert default[0].shape == (2, 4, TINY.max_len)  # beam 4; padded width 5 + 50, clipped to max_len
    np.testing.assert_equal(default, run(beam_size=4, alpha=0.6, max_decode_len=TINY.max_len))
    assert not np.allclose(default[1], run(alpha=1.0)[1])  # the comparison sees alpha
    config = DecodeConfig(beam_size=3, alpha=1.0, extra_length=2)
    chosen = run(config=config)
    assert chosen[0].shape == (2, 3, 5 + 2)  # its beam; padded width 5 + its extra_length
    np.testing.assert_equal(chosen, run(beam_size=3, alpha=1.0, config=DecodeConfig(extra_length=2)))


def test_beam_search_refuses_a_bad_beam_size_or_a_buffer_past_the_position_table():
    model = Transformer(TINY)
    with pytest.raises(ValueError, match="max_len"):
        beam_search(model, {}, jnp.ones((1, 3), jnp.int32), max_decode_len=TINY.max_len + 1)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, {}, jnp.ones((1, 3), jnp.int32), beam_size=0)
