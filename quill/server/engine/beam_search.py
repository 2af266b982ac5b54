"""Beam search over one request's live beams, step by step, as Hugging Face `generate` does it.

Kept to the same rules as `transformers` (so its outputs are a reference we can test
against): each step takes the top (1 + number of EOS ids, at least 2) x W
continuations of all beams by summed log-probability; the best W that do not end
become the next beams; those among the top W that end (EOS, or max_tokens reached)
become finished hypotheses scored sum_logprob / generated_length ** length_penalty
(or, `length_penalty_type` "wu", / ((5 + generated_length) / 6) ** length_penalty, as OpenNMT
scores them), and the W best hypotheses are kept. `early_stopping` picks when to stop looking
(True: once W hypotheses exist; False: when the best running beam, scored at the
current length, cannot beat the worst kept one; "never": scored at max length when
length_penalty > 0).
A coverage penalty (OpenNMT's, for encoder-decoders) takes beta * penalty(coverage) off a finished hypothesis'
score, its coverage being each source token's attention summed over the hypothesis' steps (sampling/coverage.py);
running beams are ranked without it, as OpenNMT ranks them, and as the penalty is never negative a running beam's
score stays an upper bound for `early_stopping`; where the penalty never falls as coverage grows ("summary"), the
bound takes off the penalty each running beam has already earned, so that the search settles as soon as without one.
With `stepwise` (OpenNMT's -stepwise_penalty) the penalty is inside every step's ranking instead: the runner takes
each beam's current penalty off its score before the step's candidates are picked, and a finished hypothesis scores
(sum_logprob - penalty) / normalizer; beams keep their plain summed log-probabilities between steps.

Pure bookkeeping on the host: the runner finds every beam request's best continuations in one
batched top-k (`server.sampling.beam`), `advance` turns them into the next beams and finished
hypotheses, and the engine maps the chosen (parent, token) pairs onto sequences, forking and
freeing their cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NEG = -1.0e9  # "impossible", the same constant transformers uses


@dataclass
class Hypothesis:
    token_ids: list[int]  # generated tokens, the final EOS included
    score: float  # length-penalised
    sum_logprob: float
    cut: bool = False  # its EOS was forced at the length limit (forced_eos_token_id), not chosen


@dataclass
class BeamStep:
    running: list[tuple[int, int, float]]  # next beams: (parent beam index, token id, summed log-prob)
    done: bool


@dataclass
class BeamSearch:
    width: int
    max_tokens: int
    eos_token_ids: list[int]
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    length_penalty_type: str = "power"  # or "wu" (Wu et al. 2016)
    min_tokens: int = 0
    forced_eos_token_ids: list[int] = field(default_factory=list)  # transformers' forced_eos_token_id
    penalty_never_falls: bool = False  # the coverage penalty only grows with the steps ("summary"'s; "wu"'s falls)
    stepwise: bool = False  # the coverage penalty ranks every step's candidates (OpenNMT's -stepwise_penalty)
    scores: list[float] = field(default_factory=lambda: [0.0])  # summed log-prob of each live beam
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most `width`
    can_improve: bool = True

    @property
    def num_candidates(self) -> int:
        """Continuations to rank per step: enough that W survive even if the best ones all end."""
        return max(2, 1 + len(self.eos_token_ids)) * self.width

    def banned_next(self, num_generated: int) -> tuple[int, ...]:
        """Tokens the next step may not choose: EOS until min_tokens are generated."""
        return tuple(self.eos_token_ids) if num_generated + 1 <= self.min_tokens else ()

    def advance(self, top_scores: list[float], flat_indices: list[int], vocab_size: int,
                outputs: list[list[int]], penalties: list[float] | None = None) -> BeamStep:
        """The step's best continuations, descending (summed log-prob, less the parent's penalty when `stepwise`;
        index = parent beam * V + token), and each live beam's tokens so far -> the next beams. `penalties`: each
        live beam's coverage penalty, this step's attention included (None: none)."""
        penalties = penalties or [0.0] * len(outputs)
        generated = len(outputs[0]) + 1  # tokens each candidate would have
        parents = [i // vocab_size for i in flat_indices]
        tokens = [i % vocab_size for i in flat_indices]
        at_limit = generated >= self.max_tokens
        ends = [at_limit or t in self.eos_token_ids for t in tokens]
        # plain summed log-probabilities, what beams carry
        sums = [s + penalties[p] for s, p in zip(top_scores, parents)] if self.stepwise else top_scores

        # The W best continuations that go on, ranked as the runner ranked them (in its order where none ends).
        if any(ends):
            ranked = sorted(range(len(tokens)), key=lambda i: -(top_scores[i] + (NEG if ends[i] else 0.0)))
            running = [(parents[i], tokens[i], sums[i] + (NEG if ends[i] else 0.0)) for i in ranked[: self.width]]
        else:
            running = list(zip(parents[: self.width], tokens[: self.width], sums[: self.width]))

        # Those of the top W that end become hypotheses, unless the search has already settled.
        full = len(self.finished) >= self.width
        settled = (full and self.early_stopping is True) or not self.can_improve
        if not settled:
            self._keep([Hypothesis(outputs[parents[i]] + [tokens[i]],
                                   self._final(sums[i], penalties[parents[i]], generated), sums[i])
                        for i in range(min(self.width, len(tokens))) if ends[i]])

        self.scores = [score for _, _, score in running]
        earned = [penalties[parent] if self.penalty_never_falls else 0.0 for parent, _, _ in running]
        self._update_can_improve(generated, earned)
        full = len(self.finished) >= self.width
        done = not self.can_improve or (full and self.early_stopping is True) or all(ends)
        if not done and self.forced_eos_token_ids and generated + 1 == self.max_tokens:
            self._end_with_forced_eos(running, outputs, generated + 1, penalties)
            done = True
        return BeamStep(running=[] if done else running, done=done)

    def _end_with_forced_eos(self, running: list[tuple[int, int, float]], outputs: list[list[int]],
                             length: int, penalties: list[float]) -> None:
        """The last step of a search that has not settled, where EOS is the only continuation of each beam (its
        log-probability 0): every beam becomes a hypothesis (its coverage without the forced step, never run)."""
        eos = self.forced_eos_token_ids[0]
        self._keep([Hypothesis(outputs[parent] + [token, eos], self._final(score, penalties[parent], length),
                               score, cut=True)
                    for parent, token, score in running if score > NEG / 2])  # beams that really are ones

    def _keep(self, hypotheses: list[Hypothesis]) -> None:
        """Add `hypotheses` to the finished ones, keeping the best `width`."""
        self.finished += hypotheses
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.width :]

    def _final(self, sum_logprob: float, penalty: float, length: int) -> float:
        """A hypothesis' score: length-normalised, its coverage penalty taken off after (OpenNMT's default) or
        before (stepwise)."""
        if self.stepwise:
            return (sum_logprob - penalty) / self._normalizer(length)
        return sum_logprob / self._normalizer(length) - penalty

    def _normalizer(self, length: int) -> float:
        base = (5 + length) / 6 if self.length_penalty_type == "wu" else length
        return base**self.length_penalty

    def _update_can_improve(self, generated: int, earned: list[float]) -> None:
        """`earned`: each running beam's least final coverage penalty."""
        if len(self.finished) < self.width:
            return  # an empty hypothesis slot can always be filled
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_tokens
        else:
            best_length = generated
        best_running = max(self._final(score, floor, best_length) for score, floor in zip(self.scores, earned))
        worst = self.finished[-1].score
        self.can_improve = self.can_improve and best_running > worst
