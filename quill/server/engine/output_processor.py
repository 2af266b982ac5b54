"""From tokens the runner chose to what each request's client receives.

Appends a sequence's new token, detokenizes it incrementally (the text of the outputs is
decode(prompt + output) minus decode(prompt)), advances a constrained sequence's grammar, applies the
stop rules (EOS, stop ids, stop strings held back from streams until they can no longer match, length,
a grammar that is complete and allows nothing more), and turns each
request's progress into a `RequestOutput` delta. Plain Python: no tensors.
"""

from __future__ import annotations

import logging

from quill.models.text.tokenizer import IncrementalDecoder, Tokenizer
from quill.server.sampling import StopChecker

from .outputs import CompletionOutput, RequestOutput, TokenLogprob
from .sequence import Sequence, SequenceGroup

log = logging.getLogger("quill.engine")


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: list[int], forced_eos_token_ids: list[int] = ()):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        # A checkpoint's forced_eos_token_id: the last token max_tokens allows is EOS, taken as generated with
        # probability 1 without a step of its own (beam search: BeamSearch).
        self.forced_eos = forced_eos_token_ids[0] if forced_eos_token_ids else None

    def start(self, seq: Sequence) -> None:
        """Give a new sequence its detokenizer and stop rules; not a beam forked from the prompt's sequence (beam
        search answers from its finished hypotheses, `_collect_beams`; only tokens forced before the fork, a target
        language, go through `append`), as beams fork at every step."""
        params = seq.group.params
        if params.use_beam_search and seq.group.is_forked:
            return
        seq.decoder = IncrementalDecoder(self.tokenizer, seq.token_ids[: seq.num_prompt_tokens],
                                         params.skip_special_tokens)
        seq.stop = StopChecker(params, self.eos_token_ids)

    def append(self, seq: Sequence, token: int, logprob: float, entry: TokenLogprob | None) -> None:
        token_ids = seq.token_ids
        token_ids.append(token)
        seq.cumulative_logprob += logprob
        if entry is not None:
            seq.output_logprobs.append(entry)
        seq.text = text = seq.text + seq.decoder.push(token)
        decision = seq.stop.check(token, text, len(token_ids) - seq.num_prompt_tokens)
        if seq.grammar is not None:
            if not seq.grammar.consume(token):  # only when its mask allowed nothing (a vocabulary that cannot spell it)
                log.warning("request %s: token %d does not follow its grammar (%s); its sequence ends",
                            seq.group.request_id, token, seq.grammar.error)
            if not decision.finished and seq.grammar.is_done:  # nothing may follow: end here, not at max_tokens
                seq.text += seq.decoder.flush()
                seq.finish_reason = "stop"
                return
        if decision.finished:
            if decision.finish_reason == "length":  # a character cut in half by the limit still counts
                seq.text += seq.decoder.flush()
            elif isinstance(seq.stop.stop_reason, str):  # a stop string: it and what follows are not output
                seq.text = text[: len(text) - decision.trim]
            else:  # EOS or a stop id: the text of the tokens before it, a character they left unfinished included
                prompt = token_ids[: seq.num_prompt_tokens]
                seq.text = self.tokenizer.decode_continuation(prompt, token_ids[seq.num_prompt_tokens : -1],
                                                              seq.group.params.skip_special_tokens)
            seq.finish_reason = decision.finish_reason
        elif self.forced_eos is not None and self._forces_eos(seq, len(token_ids) - seq.num_prompt_tokens):
            params = seq.group.params
            forced = TokenLogprob(self.forced_eos, 0.0, [(self.forced_eos, 0.0)] if params.logprobs else [])
            self.append(seq, self.forced_eos, 0.0, forced if params.logprobs is not None else None)
            seq.finish_reason = "length"  # the limit ended it; the model did not choose to

    def _forces_eos(self, seq: Sequence, num_output_tokens: int) -> bool:
        """After a generated token (a token forced at admission, a target language, is followed by a step: a
        sequence may not end before it is scheduled), when the next is the last max_tokens allows."""
        params = seq.group.params
        return (seq.num_computed > 0 and num_output_tokens + 1 == params.max_tokens and not params.ignore_eos
                and not params.use_beam_search and params.min_tokens < params.max_tokens and params.structured is None)

    def collect(self, group: SequenceGroup) -> tuple[RequestOutput | None, list[Sequence]]:
        """The request's delta since its last output (None if nothing new), and the sequences that finished
        (moved from `group.seqs` to `group.finished_seqs`; the caller frees their cache)."""
        if group.params.use_beam_search:
            return self._collect_beams(group), []
        outs, finished = [], []
        want_logprobs = group.params.logprobs is not None
        for seq in group.seqs:
            num_new = len(seq.token_ids) - seq.num_prompt_tokens - seq.num_sent_tokens
            done = seq.finish_reason is not None
            text = seq.text
            upto = len(text)
            if not done and seq.stop.stop_strings:  # text that may yet turn out to start a stop string waits
                upto -= seq.stop.hold_back(text)
            delta_text = text[seq.num_sent_chars : upto] if upto > seq.num_sent_chars else ""
            if num_new or delta_text or done:
                logprobs = seq.output_logprobs[seq.num_sent_tokens :] if want_logprobs else None
                outs.append(CompletionOutput(seq.index, delta_text, seq.token_ids[len(seq.token_ids) - num_new :],
                                             logprobs, seq.finish_reason, seq.cumulative_logprob))
            seq.num_sent_tokens += num_new
            seq.num_sent_chars = max(seq.num_sent_chars, upto)
            if done:
                finished.append(seq)
        for seq in finished:
            group.seqs.remove(seq)
            group.finished_seqs.append(seq)
        if not group.seqs:
            return self.output(group, outs, finished=True), finished
        return (self.output(group, outs, finished=False) if outs else None), finished

    def _collect_beams(self, group: SequenceGroup) -> RequestOutput | None:
        """Beam search answers once, at the end: the n best hypotheses."""
        if group.seqs:
            return None
        outs = []
        eos = set(self.eos_token_ids)
        params = group.params
        for i, hyp in enumerate(group.beam.finished[: params.n]):
            ids = hyp.token_ids
            text_ids = ids[:-1] if ids and (hyp.cut or ids[-1] in eos and not params.ignore_eos) else ids
            finish = "stop" if len(text_ids) < len(ids) and not hyp.cut else "length"
            text = self.tokenizer.decode_continuation(group.prompt_token_ids, text_ids, params.skip_special_tokens)
            outs.append(CompletionOutput(i, text, ids, None, finish, hyp.sum_logprob, hyp.score))
        return self.output(group, outs, finished=True)

    def output(self, group: SequenceGroup, outs: list[CompletionOutput], finished: bool,
               error: str | None = None) -> RequestOutput:
        if group.has_output and error is None:  # the common case, kept cheap: a delta of a running request
            return RequestOutput(group.request_id, outs, finished, len(group.prompt_token_ids))
        first = not group.has_output
        out = RequestOutput(
            group.request_id, outs, finished, len(group.prompt_token_ids),
            prompt_logprobs=group.prompt_logprobs if first else None,
            error=error,
            queue_time=(group.first_scheduled_time - group.arrival_time
                        if first and group.first_scheduled_time else None),
        )
        group.has_output = True
        return out

    def failed(self, group: SequenceGroup, message: str) -> RequestOutput:
        outs = [CompletionOutput(i, "", [], None, "error") for i in range(group.params.n)]
        return self.output(group, outs, finished=True, error=message)
