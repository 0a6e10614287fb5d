"""Customer communications for a fintech support desk: a non-verifiable, multi-channel domain.

There is no single right reply to an angry customer whose card was used by a stranger, but
there are replies a bank must never send and replies that are plainly better than others.
This example turns that into three reward channels scored by rule-based judges, in the spirit
of the ``multireward-grpo`` package's fintech example (seed 003); the scenarios, rules and
phrase lists here are this project's own.

Prompts (:func:`make_prompts`): deterministic customer messages for five scenarios, each a task
(``refund``, ``locked_account``, ``fee_dispute``, ``fraud_report``, ``limit_increase``), so the
run is multi-task and per-task metrics show which kind of conversation lags.

Channels (:func:`judge_reply`, batched as :data:`comms_judge`, columns ``comms/<channel>``):

``compliance`` (the gate; 1.0 or 0.0)
    1.0 unless the reply (a) guarantees an outcome (``I guarantee``, ``you will get a full
    refund``, ``rest assured``), (b) asks the customer for a full card number, CVV, PIN,
    password or one-time code, or (c) gives legal advice (``you should sue``, ``you have a
    strong case``). A negation earlier in the same clause (``we will never ask for your
    PIN``, ``we cannot guarantee``) cancels a trigger; a condition earlier in the same sentence
    (``if the review finds an error, we will refund the fee``) cancels a guarantee.
``politeness`` (in [0, 1]; counts only where compliance passes)
    0.25 acknowledges the customer (``thank you for letting us know``, ``I understand``),
    0.25 apologises where the scenario calls for it (always given for ``limit_increase``),
    0.30 blames no one (no ``you should have checked``, ``not our problem``), 0.20 closes
    courteously (``let us know``, ``happy to help``). An insult makes it 0; so does a reply
    of fewer than :data:`MIN_REPLY_WORDS` words (an empty reply is not polite, only silent).
``next_step`` (in [0, 1])
    0 without a concrete action for the customer or by the desk (``please open the app``,
    ``I have blocked the card``, ``the next step is``); with one, 0.5 plus 0.3 when it names
    the scenario's own means (``dispute``, ``reset``, ``replacement card``) plus 0.2 when it
    gives a timeframe or a reference (``within 3 business days``, ``case number``).

The configured reward (:data:`comms_reward`, ``configs/customer-comms.yaml``) gates politeness
on compliance in ``subgroup`` mode (ALGORITHMS.md §2): politeness is centred over the compliant
completions of the group and is 0 for the others, so a polite but non-compliant reply gains
nothing from its politeness. ``next_step`` is not gated: a concrete next step is useful
information even in a reply that must be penalised for a promise.

Robustness: every judge is a fixed set of regular expressions without nested quantifiers,
run once per sentence or clause: linear in the text, no ``eval``, no I/O. A reply longer than
:data:`MAX_REPLY_CHARS` characters (far beyond any support reply) is not judged: it scores
``(0.0, 0.0, 0.0)`` with the violation ``too_long``. Judges never raise on model output.
Known limits (rules, not a model): a negation anywhere earlier in a clause cancels a trigger
(``never, under any circumstances, ask`` hides nothing, but ``we will never ask ... and
please send your PIN`` in one clause does); paraphrases outside the phrase lists pass.
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtgrpo.algo.registry import Registry
from mtgrpo.rewards import RewardFunction, conditioned
from mtgrpo.rewards.guard import score_each
from mtgrpo.rewards.verifiers.answer import completion_text
from mtgrpo.tasks.data import write_jsonl_splits

__all__ = [
    "CHANNELS",
    "MAX_REPLY_CHARS",
    "MIN_REPLY_WORDS",
    "SCENARIOS",
    "SYSTEM_PROMPT",
    "JudgeScores",
    "Scenario",
    "comms_judge",
    "comms_reward",
    "judge_reply",
    "main",
    "make_comms_reward",
    "make_prompts",
    "write_prompts",
]

# the order of every judged tuple (JudgeScores.channels); RewardFunction fixes R from it before
# training, and the columns are comms/<channel>
CHANNELS = ("compliance", "politeness", "next_step")
MAX_REPLY_CHARS = 20_000  # far beyond any support reply: a longer one is not judged
MIN_REPLY_WORDS = 5  # below it a reply is not polite, only silent (module docstring)

SYSTEM_PROMPT = (
    "You are a support agent at Kestrel Pay, a digital bank and payments app. Answer the "
    "customer in a short message. Policy: never promise or guarantee an outcome such as a "
    "refund, a reversal or an unlock before it is decided; never ask for a full card number, "
    "CVV, PIN, password or one-time code; do not give legal advice. Acknowledge the customer's "
    "situation, apologise where it is appropriate, never blame the customer, and end with a "
    "clear, concrete next step."
)


# ------------------------------------------------------------------------------ scenarios


@dataclass(frozen=True)
class Scenario:
    """One kind of conversation (a task).

    Attributes:
        name: the task label.
        needs_apology: whether a good reply apologises (a problem the customer suffered).
        messages: customer message templates; placeholders ``{merchant}``, ``{item}``,
            ``{amount}``, ``{fee}``, ``{day}``, ``{years}``.
        next_step_terms: words naming this scenario's own means of resolution; a next step
            that mentions one is concrete.
    """

    name: str
    needs_apology: bool
    messages: tuple[str, ...]
    next_step_terms: tuple[str, ...]
    terms_pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        words = "|".join(re.escape(term) for term in self.next_step_terms)
        # Whole words: "app" must not match inside "apply" or "happy".
        object.__setattr__(self, "terms_pattern", re.compile(rf"\b(?:{words})\b"))


SCENARIOS: Registry[Scenario] = Registry("customer-communications scenario")
for _scenario in (
    Scenario(
        "refund", True,
        ("I ordered a {item} from {merchant} on {day}, paid {amount} with my Kestrel card, and "
         "it never showed up. I want my money back.",
         "{merchant} took {amount} from my account for an order I cancelled on {day}. Give me "
         "a refund or I am closing my account.",
         "I sent a {item} back to {merchant} two weeks ago and the {amount} still has not come "
         "back to my card."),
        ("dispute", "chargeback", "refund request", "merchant", "order number", "receipt",
         "proof of return", "tracking"),
    ),
    Scenario(
        "locked_account", True,
        ("My account is locked after I mistyped my password a few times. Rent is due today "
         "and I cannot log in!",
         "Why is my account frozen? I have done nothing wrong and my card was just declined "
         "at {merchant}.",
         "I got a new phone and now the app says my account is locked for security reasons. "
         "How do I get back in?"),
        ("reset", "verify your identity", "identity check", "verification", "unlock",
         "forgot password", "log in", "selfie", "app"),
    ),
    Scenario(
        "fee_dispute", True,
        ("You charged me a {fee} overdraft fee on {day} although my salary arrived that same "
         "morning. That is unfair.",
         "My statement shows a {fee} foreign transaction fee for a purchase at {merchant}, but "
         "your website says spending abroad is free.",
         "I have banked with you for {years} years and you just charged me a {fee} late fee. "
         "Take it off."),
        ("review", "statement", "fee", "reversal", "transaction history", "pricing page"),
    ),
    Scenario(
        "fraud_report", True,
        ("There are three payments to {merchant} adding up to {amount} that I never made. "
         "Someone has my card details!",
         "I just got a text that my card paid {amount} in another country. I am at home and "
         "the card is in my wallet. What do I do?",
         "A man phoned me pretending to be from Kestrel and I read him a code. Now {amount} "
         "is gone from my account."),
        ("block", "freeze", "frozen", "cancel", "new card", "replacement card", "dispute",
         "fraud team", "report"),
    ),
    Scenario(
        "limit_increase", False,
        ("I would like a higher spending limit on my card before a trip next month. What "
         "do I need to do?",
         "Can I raise my daily transfer limit to {amount}? I am buying a used car on {day}.",
         "Is it possible to increase my card limit? {merchant} keeps declining larger "
         "purchases."),
        ("limit", "settings", "request", "application", "income", "verification", "app"),
    ),
):
    SCENARIOS.add(_scenario.name, _scenario)

_MERCHANTS = ("Brightmart", "QuickFly Travel", "Lumen Electronics", "Corner Grocer",
              "StreamBox", "Harbor Hotels", "Pixel Games", "Greenleaf Pharmacy")
_ITEMS = ("pair of headphones", "winter jacket", "coffee machine", "desk lamp", "phone case",
          "set of pans")
_DAYS = ("Monday", "last Friday", "the 3rd", "the 14th", "the 21st", "Sunday")
_FEES = ("$5", "$12", "$15", "$25", "$35")
_TONES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "calm": (("Hello! ", "Hi there. ", ""), ("", " Thanks.", " Thank you for your help.")),
    "anxious": (("I am really worried. ", "Please help. ", "I am panicking a bit. "),
                ("", " Please reply soon.", " I do not know what else to do.")),
    "angry": (("This is unacceptable. ", "I am furious. ", "Seriously? "),
              ("", " Fix this today.", " I expect an answer right now.")),
}


def _customer_message(scenario: Scenario, tone: str, rng: random.Random) -> str:
    openers, closers = _TONES[tone]
    body = rng.choice(scenario.messages).format(
        merchant=rng.choice(_MERCHANTS), item=rng.choice(_ITEMS), day=rng.choice(_DAYS),
        amount=f"${rng.randint(12, 950)}.{rng.randint(0, 99):02d}", fee=rng.choice(_FEES),
        years=rng.randint(2, 15),
    )
    return f"{rng.choice(openers)}{body}{rng.choice(closers)}"


def make_prompts(
    n: int,
    seed: int = 0,
    *,
    scenarios: Sequence[str] | None = None,
    system_prompt: str | None = SYSTEM_PROMPT,
    split: str = "train",
) -> list[dict[str, Any]]:
    """``n`` customer messages as training rows, the same for the same arguments.

    Scenarios take turns (each block of ``len(scenarios)`` rows holds every scenario once, in
    a shuffled order), so tasks are balanced; the tone (calm, anxious, angry), the template
    and the details are drawn from ``random.Random(seed)``. Each row::

        {"id": "comms/train/0/0", "task": "refund", "scenario": "refund", "tone": "angry",
         "prompt": [{"role": "system", ...}, {"role": "user", ...}], "split": "train"}

    ``scenarios``: names in :data:`SCENARIOS` (default: all). ``system_prompt``: the policy
    message (``None``: the user message only). The judges read the ``scenario`` column, so
    the ``task`` labels may be renamed freely.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive integer (the number of prompts)")
    names = [SCENARIOS.canonical(s) for s in (scenarios or SCENARIOS.names())]
    if len(set(names)) != len(names):
        raise ValueError(f"scenarios={list(scenarios or [])} lists a scenario twice")
    # a private generator: the same rows for the same seed, whatever else uses `random`
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        block = list(names)
        rng.shuffle(block)  # every scenario once per block: the tasks stay balanced
        for name in block[: n - len(rows)]:
            tone = rng.choice(sorted(_TONES))
            message = _customer_message(SCENARIOS.get(name), tone, rng)
            prompt = [{"role": "user", "content": message}]
            if system_prompt is not None:
                prompt.insert(0, {"role": "system", "content": system_prompt})
            rows.append({"id": f"comms/{split}/{seed}/{len(rows)}", "task": name,
                         "scenario": name, "tone": tone, "prompt": prompt, "split": split})
    return rows


# ------------------------------------------------------------------------------ phrase rules
# Applied to lower-cased text with typographic apostrophes and spaced dashes normalised.


def _words(*alternatives: str) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(alternatives) + r")\b")


_SENTENCES = re.compile(r"[^.!?\n]+")  # fixed patterns, no nested quantifiers: linear in the text
_CLAUSES = re.compile(r"[^,;:()]+")  # a negation cancels a trigger within its own clause only
# "n't" has no leading \b: it is glued to its verb (don't, won't)
_NEGATION = re.compile(r"\b(?:no|not|never|cannot|unable|nor|neither)\b|n't\b")
# A condition earlier in the sentence cancels a guarantee.
_CONDITION = _words(r"if", r"once", r"unless", r"provided", r"assuming", r"depending",
                    r"subject to", r"in the event", r"should (?:the|your|it|this|we)")

_GUARANTEE = _words(
    r"guarantee[ds]?", r"promise[ds]?", r"rest assured", r"for sure", r"without (?:a|any) doubt",
    r"100 ?percent", r"make sure you (?:get|receive)",
    r"(?:definitely|certainly|absolutely|surely) (?:get|receive|be (?:refunded|reversed|"
    r"returned|unlocked|restored|approved|back))",
    r"you(?:'ll| will) (?:get|receive|have) (?:a |your |the |all )?(?:full )?(?:refund|money)",
    r"your (?:money|refund|funds) will be (?:back|returned|refunded|credited)",
    r"we(?:'ll| will) (?:refund|reverse|waive|remove|return|reimburse|unlock)",
)
_GUARANTEE = re.compile(_GUARANTEE.pattern + r"|\b100 ?%")  # "%" is not a word character
_SENSITIVE = _words(
    r"(?:full |long |16[- ]digit )?card (?:number|details)", r"cvv2?", r"cvc", r"security code",
    r"pin(?: number| code)?", r"passwords?", r"passcodes?", r"one[- ]time (?:pass)?codes?",
    r"otp", r"verification codes?", r"login details", r"credentials",
)
# The last four digits identify a card without exposing it: not a credential request.
_SAFE_CARD_REFERENCE = re.compile(
    r"\blast (?:4|four) digits of (?:your |the )?card(?: number)?\b"
)
# Asking the customer to hand something over: "send us", "confirm your", "what is your".
# "We will send you a new PIN" or "never share your PIN" is not a request.
_REQUEST = _words(
    r"(?:send|provide|include) (?:us|me|over|your|the|it)", r"share (?:your|the|it|with)",
    r"(?:give|tell) (?:us|me)", r"confirm (?:your|the)", r"(?:reply|respond) with",
    r"(?:email|text|message|dm) (?:us|me|it)", r"read (?:out|us|me)",
    r"what(?:'s| is) your", r"(?:i|we) (?:will )?need your", r"can (?:you|i|we) (?:have|get)",
)
_LEGAL_ADVICE = _words(
    r"you (?:should|could|can|may want to|might want to|need to) (?:sue|take (?:us|them|the "
    r"merchant|legal action)|file a lawsuit|go to court)",
    r"(?:sue|suing) (?:us|them|the merchant|the bank|him|her)", r"file a lawsuit",
    r"class action", r"you(?:'re| are) legally entitled",
    r"you have a (?:strong|good|solid|clear) (?:legal )?case", r"the law (?:says|requires)",
)

_ACKNOWLEDGE = _words(
    r"thank(?:s| you) for (?:reaching out|contacting|getting in touch|letting (?:us|me) know|"
    r"flagging|reporting|your message|telling|bringing)",
    r"i (?:completely |totally |fully )?understand", r"i can see", r"i hear you",
    r"i appreciate", r"understandabl[ey]", r"i know (?:how|this|that)",
    r"(?:that|this) (?:sounds|must be|is) (?:really |so |very )?(?:frustrating|stressful|"
    r"worrying|upsetting|difficult|alarming|annoying)",
)
_APOLOGY = _words(r"sorry", r"apologi[sz]e", r"apologies", r"regret")
_BLAME = _words(
    r"your (?:own )?fault", r"you should(?:n't| not)? have (?:checked|read|known|called|"
    r"contacted|reported|noticed|been|kept|done|paid|looked|waited|used|listened)",
    r"you should've", r"you (?:failed|forgot|neglected) to", r"as you (?:were|have been) told",
    r"you were warned", r"(?:it's|it is|that's|that is) on you", r"not our (?:problem|fault)",
    r"calm down", r"you clearly", r"obviously", r"read the (?:terms|fine print|instructions)",
)
_INSULT = _words(r"stupid", r"idiot(?:ic)?", r"dumb", r"moron(?:ic)?", r"pathetic",
                 r"shut up", r"get lost", r"deal with it", r"not my problem")
_CLOSING = _words(
    r"let (?:me|us) know", r"(?:happy|glad) to help", r"here (?:to|for) (?:help|you)",
    r"anything else", r"(?:kind|best|warm) regards", r"take care",
    r"thank(?:s| you) for your (?:patience|understanding)",
    r"have a (?:good|great|nice|lovely) (?:day|evening|week)",
)
_ACTION = _words(
    r"please (?:go|open|visit|call|reply|reset|check|contact|tap|log|sign|use|submit|fill|"
    r"upload|follow|review|select|choose|update|keep|send)",
    r"you can (?:now )?(?:reset|call|visit|open|tap|submit|request|use|track|follow|check|"
    r"update|find|go|reply|upload|download|freeze|unlock|raise|dispute|apply|change)",
    r"(?:i|we)(?:'ve| have) (?:just |now )?(?:raised|opened|escalated|submitted|blocked|"
    r"frozen|cancelled|canceled|filed|logged|started|sent|created|flagged|placed|ordered|"
    r"referred|forwarded)",
    r"(?:i|we)(?:'ll| will) (?:now )?(?:escalate|raise|open|submit|block|freeze|cancel|file|"
    r"log|start|send|create|flag|look into|review|investigate|contact|refer|forward|order|call)",
    r"(?:the )?next steps? (?:is|are|will be)", r"here(?:'s| is) what (?:to do|you can do|"
    r"happens next)", r"to get started",
)
_TIMEFRAME = _words(
    r"within (?:\d+|one|two|three|five|seven|ten|a few) (?:business |working )?"
    r"(?:days?|hours?|minutes?|weeks?)",
    r"(?:in|over) the next (?:\d+|one|two|three|few) (?:business |working )?"
    r"(?:days?|hours?|minutes?)",
    r"(?:reference|case|ticket|claim|dispute) (?:number|id|no|#)",
    r"today", r"tomorrow", r"by (?:monday|tuesday|wednesday|thursday|friday|the end of the day)",
)


def _first(pattern: re.Pattern[str], text: str) -> int:
    match = pattern.search(text)
    return len(text) if match is None else match.start()


def _asserted(trigger: re.Pattern[str], text: str, *, conditions: bool = False) -> bool:
    """Whether ``trigger`` occurs with no negation earlier in its clause (and, with
    ``conditions``, no condition earlier in its sentence).

    Only the first match of a clause needs checking: any later match sits after the same
    negation or condition. One search per pattern per clause keeps this linear in the text.
    """
    for sentence in _SENTENCES.finditer(text):
        body = sentence.group()
        condition_at = _first(_CONDITION, body) if conditions else len(body)
        for clause in _CLAUSES.finditer(body):
            match = trigger.search(clause.group())
            if match is None:
                continue
            if match.start() < _first(_NEGATION, clause.group()) and (
                clause.start() + match.start() < condition_at
            ):
                return True
    return False


def _asks_for_credentials(text: str) -> bool:
    """A clause that names a secret and asks for something, the asking not negated."""
    # So the "card number" in "last 4 digits of your card number" is no trigger.
    text = _SAFE_CARD_REFERENCE.sub("card ending", text)
    return any(
        _SENSITIVE.search(clause.group()) and _asserted(_REQUEST, clause.group())
        for sentence in _SENTENCES.finditer(text)
        for clause in _CLAUSES.finditer(sentence.group())
    )


def _normalise(text: str) -> str:
    # typographic apostrophes: "don’t" must meet the "n't" of _NEGATION, "we’ll" the
    # "we'll" of _GUARANTEE
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    # A spaced dash separates clauses as a semicolon does.
    for dash in (" - ", " \u2013 ", " \u2014 ", "\u2014"):
        text = text.replace(dash, "; ")
    return text


# ------------------------------------------------------------------------------ judges


@dataclass(frozen=True)
class JudgeScores:
    """The three channels of one reply and why compliance failed.

    Attributes:
        compliance: 1.0 or 0.0.
        politeness: in [0, 1].
        next_step: in [0, 1].
        violations: the compliance rules broken, among ``guarantee``,
            ``credential_request``, ``legal_advice``, ``too_long`` (empty when compliant).
    """

    compliance: float
    politeness: float
    next_step: float
    violations: tuple[str, ...] = ()

    @property
    def channels(self) -> tuple[float, float, float]:
        """``(compliance, politeness, next_step)``, in :data:`CHANNELS` order."""
        return (self.compliance, self.politeness, self.next_step)


def _violations(text: str) -> tuple[str, ...]:
    found = []
    if _asserted(_GUARANTEE, text, conditions=True):
        found.append("guarantee")
    if _asks_for_credentials(text):
        found.append("credential_request")
    if _asserted(_LEGAL_ADVICE, text):
        found.append("legal_advice")
    return tuple(found)


def _politeness(text: str, scenario: Scenario) -> float:
    if len(text.split()) < MIN_REPLY_WORDS or _INSULT.search(text):
        return 0.0
    # No apology needed (limit_increase): the points are given.
    apology_ok = not scenario.needs_apology or _asserted(_APOLOGY, text)
    points = (25 * bool(_ACKNOWLEDGE.search(text)) + 25 * apology_ok
              + 30 * (not _asserted(_BLAME, text)) + 20 * bool(_CLOSING.search(text)))
    return points / 100


def _next_step(text: str, scenario: Scenario) -> float:
    if len(text.split()) < MIN_REPLY_WORDS or not _asserted(_ACTION, text):
        return 0.0
    points = (50 + 30 * bool(scenario.terms_pattern.search(text))
              + 20 * bool(_TIMEFRAME.search(text)))
    return points / 100


def judge_reply(reply: Any, scenario: str) -> JudgeScores:
    """Score one support reply on the three channels (module docstring for the rules).

    ``reply``: the completion (text or TRL's conversational form; anything else is an empty
    reply). ``scenario``: a name in :data:`SCENARIOS` (a ``ValueError`` listing them
    otherwise). Linear in the reply's length; never raises on the reply.

    >>> judge_reply("I'm sorry about this. I guarantee you'll get your money back.",
    ...             "refund").violations
    ('guarantee',)
    """
    spec = SCENARIOS.get(scenario)
    raw = completion_text(reply)
    if len(raw) > MAX_REPLY_CHARS:  # checked on the raw text, before any pattern runs
        return JudgeScores(0.0, 0.0, 0.0, ("too_long",))
    text = _normalise(raw)
    violations = _violations(text)
    return JudgeScores(
        compliance=0.0 if violations else 1.0,
        politeness=_politeness(text, spec),
        next_step=_next_step(text, spec),
        violations=violations,
    )


def _judge_batch(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None = None,
    *,
    scenario: Sequence[str | None] | None = None,
    **columns: Any,
) -> list[tuple[float, float, float] | None]:
    """Batched :func:`judge_reply`; ``None`` for rows whose ``scenario`` is ``None``."""
    if scenario is None:
        raise TypeError(
            "the customer-communications judge needs the dataset column 'scenario' (one of "
            f"{', '.join(SCENARIOS.names())} per row), which make_prompts writes; add it to "
            "your rows"
        )
    if isinstance(completions, str) or len(scenario) != len(completions):
        raise ValueError(
            f"the customer-communications judge got {len(scenario)} scenario values for "
            f"{len(completions)} completions; a column holds one value per completion"
        )
    for name in {s for s in scenario if s is not None}:
        SCENARIOS.canonical(name)  # an unknown scenario is a data error: raise before judging

    def judge(row: tuple[Any, str | None]) -> tuple[float, float, float] | None:
        completion, name = row
        return None if name is None else judge_reply(completion, name).channels

    # Model output is hostile input: a judge that raises scores the row 0 on every channel.
    return score_each("comms", zip(completions, scenario, strict=True), judge,
                      fallback=(0.0, 0.0, 0.0))  # fmt: skip


comms_judge = RewardFunction(_judge_batch, name="comms", channels=CHANNELS)
"""The three judges as one batched reward function without a gate (columns
``comms/compliance``, ``comms/politeness``, ``comms/next_step``)."""


def make_comms_reward(gate_mode: str | None = "subgroup") -> RewardFunction:
    """The judges with politeness gated on compliance (``gate_mode``: ``subgroup`` or
    ``zero_fill``, see :func:`mtgrpo.rewards.conditioned`), or ungated with ``None`` (the
    ablation). In a config: ``{name: mtgrpo.examples.customer_comms:make_comms_reward,
    gate_mode: zero_fill}``."""
    if gate_mode is None:
        return comms_judge
    # compliance is 1.0 or 0.0: conditioned's default threshold, 1.0, passes exactly the
    # compliant replies; next_step stays ungated (module docstring)
    return conditioned(comms_judge, on="compliance", mode=gate_mode, channels=("politeness",))


comms_reward = make_comms_reward()
"""The example's reward: the judges, politeness gated on compliance in ``subgroup`` mode."""


# ------------------------------------------------------------------------------ data files


def write_prompts(
    out_dir: str | Path, train_size: int = 2000, eval_size: int = 200, seed: int = 0
) -> dict[str, Path]:
    """Write ``train.jsonl`` (``train_size`` rows, ``seed``) and ``eval.jsonl`` (``eval_size``
    rows drawn with ``seed + 1``, none repeating a training message) under ``out_dir``."""
    train = make_prompts(train_size, seed)
    seen = {row["prompt"][-1]["content"] for row in train}
    # four times as many: spares for the candidates that repeat a training message
    candidates = make_prompts(4 * eval_size, seed + 1, split="eval")
    evaluation = [row for row in candidates if row["prompt"][-1]["content"] not in seen]
    if len(evaluation) < eval_size:
        raise ValueError(
            f"only {len(evaluation)} evaluation messages differ from the {train_size} training "
            f"ones; lower eval_size={eval_size} or train_size"
        )
    return write_jsonl_splits(out_dir, {"train": train, "eval": evaluation[:eval_size]})


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mtgrpo.examples.customer_comms OUT_DIR``: the example's prompt files."""
    parser = argparse.ArgumentParser(
        prog="python -m mtgrpo.examples.customer_comms",
        description="Write customer-communications prompts (train.jsonl, eval.jsonl).",
    )
    parser.add_argument("out_dir", help="directory for train.jsonl and eval.jsonl")
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        written = write_prompts(args.out_dir, args.train_size, args.eval_size, args.seed)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
