"""The context-lookup bound: the fewest target forwards any drafter that copies its drafts from a row's own text
(prompt and output so far) could take to produce a given greedy output.

Model-free drafters (``ngram``, ``suffix``, transformers' prompt lookup) draft a continuation of an earlier
occurrence of the row's last tokens. An oracle that always picks, among every earlier occurrence of the last
``min_match`` tokens, the one whose continuation agrees longest with the true output, up to ``depth`` tokens, sets
what such drafters can reach: each round it commits that agreement plus the target's own next token. A tree drafter
covering every occurrence at once reaches it; a chain drafter that guesses the occurrence falls short. The bound
says how far a drafter is from it (its tokens a forward against the bound's) and, from the forward costs of the
machine, whether any lookup drafter could beat another method there: docs/benchmarks.md, "How far the model-free
drafters are from what lookup can give".

    lookup_tokens_per_forward(prompts, outputs, depth=8)  # e.g. 2.65 on 4 HumanEval prompts, SmolLM2 greedy
    lookup_speedup_bound(prompts, outputs, costs)  # {depth: speedup}, at a machine's measured forward costs

    python -m decodekit.bench.lookup_bound --task humaneval --prompts 4 --tokens 64 --max-len 16
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from decodekit.checks import check_int
from decodekit.policies.analytic import CostModel

DEPTHS = (4, 8, 16)


def lookup_matches(prompt: Sequence[int], output: Sequence[int], depth: int, min_match: int = 1) -> list[int]:
    """Tokens the oracle lookup drafter gets accepted in each round (after prefill) producing ``output``.

    Prefill gives ``output[0]``. With ``n`` tokens of ``output`` committed, a round drafts the continuation (at most
    ``depth`` tokens, and never past the row's last token) of the earlier occurrence of the text's last
    ``min_match`` tokens whose continuation matches ``output[n:]`` longest, and commits the matched tokens plus one.
    Committing the most each round is optimal: from further on, the same occurrence, shifted, matches at least as
    far (``tests/unit/test_lookup_bound.py`` checks it against every choice on small texts).

    Args:
        prompt: the row's prompt ids.
        output: its generated ids (the greedy output every lossless method produces).
        depth: the longest draft.
        min_match: tokens of the text's end an occurrence must match (1: the last token, as a suffix tree's shortest
            match; prompt lookup's ``max_matching_ngram_size`` tries up to 3 but accepts 1).

    Returns:
        one entry per round, empty for an output of at most one token.
    """
    depth = check_int("depth", depth, low=1)
    min_match = check_int("min_match", min_match, low=1)
    text = list(prompt) + list(output)
    start, end = len(prompt), len(prompt) + len(output)
    seen: dict[tuple[int, ...], list[int]] = {}  # last min_match tokens -> where their continuations start
    indexed = min_match  # continuations starting before this are indexed
    matches, n = [], 1
    while n < len(output):
        here = start + n  # the text known this round is text[:here]
        for j in range(indexed, here):
            seen.setdefault(tuple(text[j - min_match : j]), []).append(j)
        indexed = max(indexed, here)
        longest = 0
        limit = min(depth, end - here - 1)  # the last round may not pass the row's last token
        for j in seen.get(tuple(text[here - min_match : here]), ()):
            size = 0
            while size < limit and j + size < here and text[j + size] == text[here + size]:
                size += 1
            longest = max(longest, size)
        matches.append(longest)
        n += longest + 1
    return matches


def lookup_rounds(prompt: Sequence[int], output: Sequence[int], depth: int, min_match: int = 1) -> int:
    """Target forwards after prefill the oracle lookup drafter needs (:func:`lookup_matches`)."""
    return len(lookup_matches(prompt, output, depth, min_match))


def lookup_tokens_per_forward(
    prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], depth: int, min_match: int = 1
) -> float:
    """Tokens committed per target forward after prefill (as :attr:`~decodekit.SpecStats.tokens_per_step`) by the
    oracle lookup drafter of :func:`lookup_rounds` over all rows; ``1.0`` when no row has a round."""
    if len(prompts) != len(outputs):
        raise ValueError(f"got {len(prompts)} prompts for {len(outputs)} outputs")
    rounds = sum(lookup_rounds(p, o, depth, min_match) for p, o in zip(prompts, outputs))
    tokens = sum(max(len(o) - 1, 0) for o in outputs)
    return tokens / rounds if rounds else 1.0


def lookup_speedup_bound(
    prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], cost: CostModel, min_match: int = 1
) -> dict[int, float]:
    """``{depth: speedup over plain decoding}`` for depths ``1 .. cost.max_len``: the oracle lookup drafter of
    :func:`lookup_matches`, drafting for free, at ``cost``'s measured verification and loop times (batch 1), against
    plain decoding at the same costs. A round that gets ``m`` tokens accepted pays the cheapest
    forward of ``m + 1`` to ``depth + 1`` positions: where a wider forward costs less (oneDNN's one-row kernel is
    slower than its 4-8 row one on some CPUs), padding the draft never lowers acceptance. So no drafter that copies
    from the row's text, drafting at most ``depth`` tokens, runs faster on that machine: it accepts no more a round,
    and its rounds cost no less.
    """
    plain = sum(max(len(o) - 1, 0) for o in outputs) * (cost.verify[0] + cost.overhead)
    bounds = {}
    for depth in range(1, cost.max_len + 1):
        cheapest = [min(cost.verify[m : depth + 1]) for m in range(depth + 1)]  # m accepted: m + 1 .. depth + 1
        matches = [m for p, o in zip(prompts, outputs) for m in lookup_matches(p, o, depth, min_match)]
        time = sum(cheapest[m] + cost.overhead for m in matches)
        bounds[depth] = plain / time if time else 1.0
    return bounds


def main(argv: Sequence[str] | None = None) -> None:
    """Print the bound on SmolLM2 (onednn kernels) for a task's first prompts: tokens a forward and speedup per
    depth, the target's forward costs profiled on this machine first (``max_len + 1`` timed calls of ``4 max_len``
    tokens, each after a warm-up call)."""
    import decodekit as dk
    from decodekit.bench.tasks import TASKS, load_task
    from decodekit.policies import profile_costs

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--task", default="humaneval", choices=TASKS)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--max-len", type=int, default=16, help="deepest draft")
    parser.add_argument("--min-match", type=int, default=1)
    args = parser.parse_args(argv)
    model = dk.load_model("smollm2-135m-instruct", kernels="onednn")
    prompts = [list(r["input_ids"]) for r in load_task(args.task, model.tokenizer, num_prompts=args.prompts)]
    outputs = [dk.generate(model, [p], max_new_tokens=args.tokens).sequences[0] for p in prompts]
    cost = profile_costs(model, None, prompts[:1], max_len=args.max_len, new_tokens=4 * args.max_len)[1]
    bound = lookup_speedup_bound(prompts, outputs, cost, args.min_match)
    print(
        f"{args.task}, {len(prompts)} prompts, {args.tokens} new tokens, greedy, batch 1; one forward of k + 1 "
        f"positions costs verify[k]; the loop {1000 * cost.overhead:.1f} ms a round"
    )
    print("| depth | verify[depth] ms | tokens a forward | speedup bound |\n|---:|---:|---:|---:|")
    for depth, speedup in bound.items():
        tokens = lookup_tokens_per_forward(prompts, outputs, depth, args.min_match)
        print(f"| {depth} | {1000 * cost.verify[depth]:.1f} | {tokens:.2f} | {speedup:.2f}x |")
    print(f"verify[0] (plain decoding) {1000 * cost.verify[0]:.1f} ms")


if __name__ == "__main__":
    main()
