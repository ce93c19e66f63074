"""A deterministic multi-turn chat workload whose conversations share long prefixes.

Shape (all sizes in words; SmolLM2's tokenizer gives roughly 1.3 tokens per word of this text):
- `prefixes` shared documents, each a system prompt of `prefix_words` words (default 900, about 1.2k tokens),
  standing for a shared instruction block / retrieved document that many conversations start with;
- `conversations_per_prefix` conversations on each document, each `turns` user turns long; turn k's messages
  are the document, the k-1 earlier user/assistant exchanges and the new user message, so each request extends
  the previous request of its conversation (the multi-turn prefix a server's cache can reuse);
- assistant replies in the history are fixed text from the workload, not what the model said, so every
  strategy replays byte-identical requests.

Order: turn-major, conversations shuffled within a turn, so several documents are active at once and the
cache of each server sees interleaved prefixes (the case where routing decides hits).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

_VOCAB = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will more can out about up what some "
    "time could them into only other then its new two these may first any like now my over such our man me even "
    "most made after also did many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off come "
    "since against go came right used take three system water river market engine report signal cache server "
    "route window table number model request token prefix block endpoint gateway cluster node policy latency"
).split()


@dataclass(frozen=True)
class WorkloadSpec:
    """Sizes of the workload (see the module doc). `max_tokens` caps each completion (tokens)."""

    prefixes: int = 6
    prefix_words: int = 900
    conversations_per_prefix: int = 2
    turns: int = 3
    user_words: int = 24
    assistant_words: int = 32
    max_tokens: int = 8
    seed: int = 7


@dataclass(frozen=True)
class Request:
    """One chat request: conversation `conv`, 0-based `turn`, shared document `prefix`, OpenAI `messages`."""

    conv: int
    turn: int
    prefix: int
    messages: tuple


def _text(rng: random.Random, words: int) -> str:
    out, n = [], 0
    while n < words:
        k = min(rng.randint(8, 18), words - n)
        sentence = " ".join(rng.choice(_VOCAB) for _ in range(k))
        out.append(sentence[0].upper() + sentence[1:] + ".")
        n += k
    return " ".join(out)


def documents(spec: WorkloadSpec) -> list[str]:
    """The shared system prompts, one per prefix; each starts with its own title so prefixes differ early."""
    rng = random.Random(spec.seed)
    return [f"Reference document {p} (handbook {rng.randrange(10**6):06d}). Answer questions using it.\n\n"
            + _text(rng, spec.prefix_words) for p in range(spec.prefixes)]


def build(spec: WorkloadSpec) -> list[Request]:
    """All requests in issue order (turn-major; conversation order shuffled per turn with `spec.seed`)."""
    rng = random.Random(spec.seed + 1)
    docs = documents(spec)
    convs = []
    for p in range(spec.prefixes):
        for _ in range(spec.conversations_per_prefix):
            exchanges = [(_text(rng, spec.user_words), _text(rng, spec.assistant_words)) for _ in range(spec.turns)]
            convs.append((p, exchanges))
    out = []
    for turn in range(spec.turns):
        order = list(range(len(convs)))
        rng.shuffle(order)
        for c in order:
            p, exchanges = convs[c]
            msgs = [{"role": "system", "content": docs[p]}]
            for user, assistant in exchanges[:turn]:
                msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
            msgs.append({"role": "user", "content": exchanges[turn][0]})
            out.append(Request(conv=c, turn=turn, prefix=p, messages=tuple(msgs)))
    return out
